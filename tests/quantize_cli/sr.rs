//! `--sr SEED,STEP,TENSOR_ID`: stochastic rounding (SPEC sections 2 and 2b).

use super::*;

use mxswitch::runtime::quant::{quantize_mx, quantize_nvfp4, MxConfig, Nvfp4Config, SrKey};

/// What the runtime's quantizer of `format` gives for `x` of `shape` along
/// the last axis with `sr`: (codes, scales, dequant) in the CLI's layout.
fn library_quantize(
    format: &str,
    x: &[f32],
    shape: &[usize],
    hadamard: bool,
    sr: Option<SrKey>,
) -> (Vec<u8>, Vec<u8>, Vec<f32>) {
    match format {
        "nvfp4" => {
            let cfg = Nvfp4Config {
                tile2d: false,
                hadamard,
                sr,
            };
            let q = quantize_nvfp4(x, shape, -1, &cfg).unwrap();
            (
                q.codes_in_input_layout(),
                q.scales_in_input_layout(),
                q.dequantize(),
            )
        }
        "mxfp4" | "mxfp8" => {
            let base = if format == "mxfp4" {
                MxConfig::mxfp4()
            } else {
                MxConfig::mxfp8()
            };
            let cfg = MxConfig {
                hadamard,
                sr,
                ..base
            };
            let q = quantize_mx(x, shape, -1, &cfg).unwrap();
            (
                q.codes_in_input_layout(),
                q.scales_in_input_layout(),
                q.dequantize(),
            )
        }
        _ => unreachable!("{format}"),
    }
}

/// The E2M1 codes of packed bytes, low nibble first.
fn nibbles(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|b| [b & 0xF, b >> 4]).collect()
}

#[test]
fn sr_codes_are_the_runtime_quantizers_under_that_key_and_not_rne() {
    let dir = TempDir::new().unwrap();
    let shape = [6, 64];
    // Spread magnitudes: almost no value is a code times its block's scale.
    let x = spread(6 * 64, 31);
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&shape, &x))],
    );
    let key = SrKey {
        seed: 7,
        step: 3,
        tensor_id: 1,
    };
    for format in ["nvfp4", "mxfp4", "mxfp8"] {
        for hadamard in [false, true] {
            let what = format!("{format} hadamard={hadamard}");
            let mut args = vec!["--format", format];
            if hadamard {
                args.push("--hadamard");
            }
            let rne_path = dir.path().join("rne.safetensors");
            assert_ok(&quantize(&args, &input, &rne_path));
            args.extend(["--sr", "7,3,1"]);
            let sr_path = dir.path().join("sr.safetensors");
            let out = quantize(&args, &input, &sr_path);
            assert_ok(&out);
            let (sr, rne) = (read_output(&sr_path), read_output(&rne_path));

            // Exactly the runtime's quantizer under SrKey { 7, 3, 1 }.
            let (codes, scales, dequant) =
                library_quantize(format, &x, &shape, hadamard, Some(key));
            assert_eq!(sr["w.codes"].data, codes, "{what}");
            assert_eq!(sr["w.scales"].data, scales, "{what}");
            assert_eq!(
                f32_bits(&sr["w.dequant"].values()),
                f32_bits(&dequant),
                "{what}"
            );
            // Not a key with the fields in another order.
            let swapped = SrKey {
                step: 1,
                tensor_id: 3,
                ..key
            };
            let (other, _, _) = library_quantize(format, &x, &shape, hadamard, Some(swapped));
            assert_ne!(sr["w.codes"].data, other, "{what}");
            // The RNE run is the runtime's RNE quantizer.
            let (rne_codes, rne_scales, _) = library_quantize(format, &x, &shape, hadamard, None);
            assert_eq!(rne["w.codes"].data, rne_codes, "{what}");

            // Rounding changes codes, never scales: the scales are RNE's,
            // and many codes are the other neighbour of the value.
            assert_eq!(sr["w.scales"].data, rne_scales, "{what}");
            if format != "mxfp8" {
                let (s, r) = (nibbles(&sr["w.codes"].data), nibbles(&rne["w.codes"].data));
                let differing = s.iter().zip(&r).filter(|(a, b)| a != b).count();
                assert!(
                    differing > s.len() / 5,
                    "{what}: {differing} of {}",
                    s.len()
                );
                // SR picks one of the two codes around the value, RNE the
                // nearer: the magnitudes are at most one code apart.
                for (i, (&a, &b)) in s.iter().zip(&r).enumerate() {
                    let (ma, mb) = (i32::from(a & 7), i32::from(b & 7));
                    assert!(
                        (ma - mb).abs() <= 1,
                        "{what}: element {i}: {a:#x} vs {b:#x}"
                    );
                }
            } else {
                let s = &sr["w.codes"].data;
                let differing = s
                    .iter()
                    .zip(&rne["w.codes"].data)
                    .filter(|(a, b)| a != b)
                    .count();
                assert!(
                    differing > s.len() / 5,
                    "{what}: {differing} of {}",
                    s.len()
                );
            }
            let sr_err = sqnr_db(&x, &sr["w.dequant"].values());
            let rne_err = sqnr_db(&x, &rne["w.dequant"].values());
            assert!(
                sr_err < rne_err,
                "{what}: SR {sr_err} dB vs RNE {rne_err} dB"
            );

            // Recorded as the other options are.
            let summary = stdout(&out);
            assert!(summary.contains(", sr 7,3,1)"), "{what}: {summary}");
            assert_eq!(output_metadata(&sr_path)["mxswitch.sr"], "7,3,1", "{what}");
            assert_eq!(output_metadata(&rne_path)["mxswitch.sr"], "none", "{what}");
        }
    }
}

#[test]
fn sr_with_one_key_is_reproducible_and_another_step_changes_the_codes() {
    let dir = TempDir::new().unwrap();
    let shape = [4, 48];
    let x = spread(4 * 48, 32);
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("g", Tensor::f32(&shape, &x))],
    );
    for format in ["nvfp4", "mxfp4"] {
        let run = |key: &str, name: &str| {
            let path = dir.path().join(name);
            assert_ok(&quantize(&["--format", format, "--sr", key], &input, &path));
            path
        };
        let (a, b) = (
            run("9,100,4", "a.safetensors"),
            run("9,100,4", "b.safetensors"),
        );
        assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap(), "{format}");
        let c = run("9,101,4", "c.safetensors");
        let (a, c) = (read_output(&a), read_output(&c));
        assert_ne!(a["g.codes"].data, c["g.codes"].data, "{format}");
        assert_eq!(a["g.scales"].data, c["g.scales"].data, "{format}");
        // Step and tensor id count modulo 2^32 (SPEC section 2), as the runtime's key does.
        let wrapped = run(&format!("9,{},4", 100 + (1u64 << 32)), "d.safetensors");
        assert_eq!(
            read_output(&wrapped)["g.codes"].data,
            a["g.codes"].data,
            "{format}"
        );
        assert_eq!(output_metadata(&wrapped)["mxswitch.sr"], "9,4294967396,4");
    }
}

#[test]
fn sr_is_refused_by_the_fp8_formats_and_a_malformed_key_is_one_line() {
    let dir = TempDir::new().unwrap();
    let input = write_input(
        dir.path(),
        "in.safetensors",
        &[("w", Tensor::f32(&[4, 32], &noise(128, 5, 1.0)))],
    );
    let output = dir.path().join("out.safetensors");
    for format in [
        "fp8-rowwise",
        "fp8-block",
        "fp8-e4m3",
        "fp8-e5m2",
        "fp8-e4m3fnuz",
    ] {
        assert_fails_cleanly(
            &quantize(&["--format", format, "--sr", "7,3,1"], &input, &output),
            &format!("--sr applies only to mxfp4, mxfp8, nvfp4, not to {format}"),
        );
        // Before the input is read.
        assert_fails_cleanly(
            &quantize(
                &["--format", format, "--sr", "7,3,1"],
                &dir.path().join("absent.safetensors"),
                &output,
            ),
            "--sr applies only",
        );
    }
    for bad in [
        "1,2",
        "1,2,3,4",
        "1,2,-3",
        "a,b,c",
        "1,,3",
        "",
        "18446744073709551616,0,0",
    ] {
        let out = quantize(&["--format", "nvfp4", "--sr", bad], &input, &output);
        assert_fails_cleanly(&out, "--sr <SEED,STEP,TENSOR_ID>");
        let err = stderr(&out);
        assert!(
            err.contains("three unsigned decimal integers") && err.contains(&format!("`{bad}`")),
            "{bad:?}: {err}"
        );
        assert_eq!(out.status.code(), Some(2), "{bad:?}: a usage error");
    }
    // The flag needs its value.
    let out = Command::new(BIN)
        .args(["quantize", "--format", "nvfp4", "--sr"])
        .output()
        .unwrap();
    assert_fails_cleanly(&out, "--sr");
    assert_eq!(
        entries(dir.path()),
        BTreeSet::from(["in.safetensors".to_string()])
    );
    // And --help says what it is.
    let help = Command::new(BIN)
        .args(["quantize", "--help"])
        .output()
        .unwrap();
    assert!(stdout(&help).contains("--sr <SEED,STEP,TENSOR_ID>"));
}
