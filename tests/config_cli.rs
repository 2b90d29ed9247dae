//! Bad run configs through the binary: `plan` and `train` refuse each with
//! one `error:` line that names file:line:column and the field, exit status
//! 1 and no panic; `plan` prints the memory estimate and never a wrapped count.

use std::path::Path;
use std::process::Command;

const TINY: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/models/configs/flux-tiny.ron"
));

/// Runs the binary: (exit code, stdout, stderr).
fn mxswitch(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mxswitch"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// flux-tiny with each `key: value` line replaced (by key; values may hold commas).
fn tiny_with(edits: &[(&str, &str)]) -> String {
    TINY.lines()
        .map(|line| {
            let key = line.trim_start().split(':').next().unwrap_or("");
            match edits.iter().find(|(k, _)| *k == key) {
                Some((k, v)) => {
                    format!("{}{k}: {v},", &line[..line.len() - line.trim_start().len()])
                }
                None => line.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `plan` and `train` on `text` (written to `name` in a temp dir) both fail
/// with exactly one line starting `error: <file>:<want>`.
fn both_refuse(name: &str, text: &str, want: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, text).unwrap();
    let file = file.to_str().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    for args in [
        vec!["plan", "--config", file],
        vec!["plan", "--config", file, "--json"],
        vec!["train", "--config", file, "--iters", "1", "--out", out],
    ] {
        let (code, stdout, stderr) = mxswitch(&args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "{args:?}: one line expected, got {stderr:?}"
        );
        let expected = format!("error: {file}:{want}");
        assert!(
            lines[0].starts_with(&expected),
            "{args:?}:\n  got  {}\n  want {expected}",
            lines[0]
        );
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
    assert!(
        !Path::new(out).exists(),
        "train wrote {out} for a bad config"
    );
}

/// The configs of issue 11, item 7, and `theta: 0`.
#[test]
fn configs_that_used_to_panic_are_refused_at_the_field() {
    let cases: [(&[(&str, &str)], &str); 7] = [
        (
            &[("mlp_ratio", "0.0")],
            "8:9: model.mlp_ratio must be a finite number > 0, got 0",
        ),
        (
            &[("mlp_ratio", "-4.0")],
            "8:9: model.mlp_ratio must be a finite number > 0, got -4",
        ),
        (
            &[("mlp_ratio", "NaN")],
            "8:9: model.mlp_ratio must be a finite number > 0, got NaN",
        ),
        (
            &[("hidden_size", "0"), ("axes_dim", "[0, 0, 0]")],
            "7:9: model.hidden_size must be between 1 and 16777216, got 0",
        ),
        (
            &[("hidden_size", "4611686018427387904")],
            "7:9: model.hidden_size must be between 1 and 16777216, got 4611686018427387904",
        ),
        (
            &[("theta", "0")],
            "13:9: model.theta must be a finite number > 0, got 0",
        ),
        (
            &[("iters", "0")],
            "25:9: train.iters must be at least 1, got 0",
        ),
    ];
    for (edits, want) in cases {
        both_refuse("bad.ron", &tiny_with(edits), want);
    }
}

/// Sizes each in range whose parameter count overflows 64 bits.
#[test]
fn an_overflowing_count_is_an_error_naming_the_fields() {
    let text = tiny_with(&[
        ("hidden_size", "16777216"),
        ("mlp_ratio", "1.0"),
        ("num_heads", "1048576"),
        ("depth", "10000"),
        ("depth_single_blocks", "10000"),
    ]);
    both_refuse(
        "huge.ron",
        &text,
        "7:9: model.hidden_size is too large together with model.mlp_ratio, model.depth, \
         model.depth_single_blocks, model.context_in_dim, model.vec_in_dim: the parameter count \
         overflows 64 bits; use smaller sizes",
    );
}

/// Schedule errors inside a run config point at the phase's value.
#[test]
fn schedule_errors_name_file_line_and_column() {
    let phases = |p: &str| {
        TINY.replace(
            r#"[(start: 0, recipe: "mxfp4"), (start: 40, recipe: "fp8")]"#,
            p,
        )
    };
    let cases = [
        (
            phases(r#"[(start: 0, recipe: "mxfp4"), (start: 40, recipe: "fp9")]"#),
            "30:59: schedule.phases[1].recipe: unknown recipe `fp9`",
        ),
        (
            phases(r#"[(start: 0, recipe: "mxfp4", options: (pow2: true))]"#),
            "30:56: schedule.phases[0].options.pow2: option `pow2` does not apply to recipe `mxfp4`",
        ),
        (
            phases(r#"[(start: 0, recipe: "mxfp4"), (start: 0, recipe: "fp8")]"#),
            "30:48: schedule.phases[1].start: schedule phases out of order",
        ),
        (
            phases(r#"[(start: 5, recipe: "mxfp4")]"#),
            "30:19: schedule.phases[0].start: the first phase must start at iteration 0, not 5",
        ),
        (
            TINY.replace("\"deep_to_shallow\"", "\"deepest\""),
            "32:9: schedule.order: unknown order `deepest`",
        ),
        (
            phases(r#"[(start: 0, recipe: "mxfp4"), (start: 40, recipe: "bf16")]"#),
            "30:59: schedule.phases[1].recipe `bf16` is not allowed for Flux, whose #[precision] attribute names only mxfp4, fp8, nvfp4, fp8_rowwise, fp8_block",
        ),
    ];
    for (text, want) in cases {
        both_refuse("sched.ron", &text, want);
    }
}

#[test]
fn plan_prints_the_training_memory_estimate() {
    let (code, out, err) = mxswitch(&["plan", "--config", "flux-schnell"]);
    assert_eq!(code, Some(0), "{err}");
    let line = out.lines().nth(1).unwrap_or("");
    assert!(
        line.starts_with("  training needs about ")
            && line.contains("GiB (parameters 44.3 GiB, warm-up's copy 44.3 GiB, gradients 44.3 GiB, AdamW m and v 88.6 GiB, activations "),
        "{out}"
    );
    let (code, out, err) = mxswitch(&["plan", "--config", "flux-schnell", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let params = v["parameters"].as_u64().unwrap();
    let parts = &v["training_bytes"];
    let part = |k: &str| parts[k].as_u64().unwrap();
    assert_eq!(
        (
            part("parameters"),
            part("gradients"),
            part("adamw"),
            part("warmup_copy")
        ),
        (4 * params, 4 * params, 8 * params, 4 * params)
    );
    assert_eq!(
        v["training_bytes_estimate"].as_u64().unwrap(),
        20 * params + part("activations")
    );
}

/// A model of 6.8e17 parameters: counted exactly, not wrapped.
#[test]
fn plan_counts_a_huge_model_without_wrapping() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wide.ron");
    let text = tiny_with(&[
        ("hidden_size", "16777216"),
        ("mlp_ratio", "1.0"),
        ("num_heads", "1048576"),
        ("depth", "100"),
        ("depth_single_blocks", "0"),
    ]);
    std::fs::write(&file, text).unwrap();
    let (code, out, err) = mxswitch(&["plan", "--config", file.to_str().unwrap(), "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // Per double block 24 h^2 (two streams of 6h^2 modulation, 3h^2 qkv,
    // h^2 proj, 2h^2 MLP), plus 2 h^2 of the final modulation and h^2 of
    // each of the time and vector embedders' second layers.
    let h2 = (1u64 << 24) * (1 << 24);
    let params = v["parameters"].as_u64().unwrap();
    assert_eq!(params / h2, 2404, "{params}");
    assert!(v["training_bytes_estimate"].as_u64().unwrap() > 16 * params);
}

/// Runs the binary with `MXSWITCH_MEMORY_LIMIT` set: (exit code, stderr).
fn train_with_limit(limit: &str, out: &Path) -> (Option<i32>, String) {
    let run = Command::new(env!("CARGO_BIN_EXE_mxswitch"))
        .args(["train", "--config", "flux-tiny", "--iters", "1", "--out"])
        .arg(out)
        .env("MXSWITCH_MEMORY_LIMIT", limit)
        .output()
        .unwrap();
    (
        run.status.code(),
        String::from_utf8_lossy(&run.stderr).into_owned(),
    )
}

/// Training refuses a run that needs more than is available, before it
/// allocates, with the estimate and what is available on one line.
#[test]
fn train_refuses_a_run_that_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = train_with_limit("1000000", &dir.path().join("out"));
    assert_eq!(code, Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("error: training flux-tiny needs about ")
            && lines[0].contains(" (parameters 1.8 MiB, warm-up's copy 1.8 MiB, gradients 1.8 MiB, AdamW m and v 3.6 MiB, activations ")
            && lines[0].ends_with(
                "but 976.6 KiB is available under MXSWITCH_MEMORY_LIMIT; use a smaller config or batch"
            ),
        "{err}"
    );
    assert!(!dir
        .path()
        .join("out")
        .join("checkpoint.safetensors")
        .exists());
    let (code, err) = train_with_limit("lots", &dir.path().join("out2"));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.starts_with("error: invalid option: MXSWITCH_MEMORY_LIMIT must be a whole number of bytes, got `lots`"),
        "{err}"
    );
}
