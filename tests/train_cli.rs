//! `mxswitch train` and `mxswitch plan` from the command line: the plan JSON
//! and one clear error line for each bad request.

use std::process::Command;

fn mxswitch(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mxswitch"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Fails with exactly one `error:` line on stderr.
fn fails_with(args: &[&str], needle: &str) {
    let (ok, _, err) = mxswitch(args);
    assert!(!ok, "{args:?} should fail");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: one line expected, got {err:?}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(needle),
        "{args:?}: {err:?}"
    );
}

#[test]
fn plan_json_of_flux_schnell() {
    let (ok, out, err) = mxswitch(&["plan", "--config", "flux-schnell", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["layers"], 57);
    assert_eq!(v["linears"], 304);
    assert_eq!(
        v["phases"],
        serde_json::json!([{"start": 0, "recipe": "mxfp4"}, {"start": 12000, "recipe": "fp8"}])
    );
}

#[test]
fn bad_requests_get_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    fails_with(
        &["train", "--config", "flux-huge", "--out", out],
        "unknown config `flux-huge`",
    );
    fails_with(
        &["train", "--config", "missing.ron", "--out", out],
        "cannot read config missing.ron",
    );
    let bad = dir.path().join("bad.ron");
    std::fs::write(&bad, "(model: (hidden_size: 64,\n  bogus: 1))").unwrap();
    fails_with(
        &["train", "--config", bad.to_str().unwrap(), "--out", out],
        "bad.ron:",
    );
    fails_with(
        &[
            "train",
            "--config",
            "flux-tiny",
            "--device",
            "rocm",
            "--out",
            out,
        ],
        // No AMD GPU on a test machine: the libraries are missing (CI) or
        // HIP sees no device.
        "--device rocm: ",
    );
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    fails_with(
        &[
            "train",
            "--config",
            "flux-tiny",
            "--iters",
            "1",
            "--out",
            file.to_str().unwrap(),
        ],
        "cannot create output folder",
    );
    fails_with(&["plan", "--config", "flux-huge"], "unknown config");
    let tiny = ["train", "--config", "flux-tiny", "--out", out];
    for (extra, needle) in [
        (
            &["--eval-every", "8"][..],
            "--eval-every needs --val-data DIR",
        ),
        (
            &["--target-loss", "0.5"][..],
            "--target-loss needs --val-data DIR",
        ),
        (
            &["--val-data", "v", "--eval-every", "0"][..],
            "--eval-every 0: give a number of samples",
        ),
        (
            &["--val-data", "v", "--target-loss", "NaN"][..],
            "--target-loss NaN: give a finite loss >= 0",
        ),
        (
            &["--val-data", "v", "--target-loss", "-1"][..],
            "--target-loss -1: give a finite loss >= 0",
        ),
        (
            &["--val-data", "nowhere"][..],
            "data folder nowhere: it does not exist",
        ),
        (
            &["--data", "nowhere"][..],
            "data folder nowhere: it does not exist",
        ),
    ] {
        fails_with(&[&tiny[..], extra].concat(), needle);
    }
    fails_with(
        &[
            "train",
            "--config",
            "flux-tiny",
            "--resume",
            "nope.safetensors",
            "--out",
            out,
        ],
        "checkpoint nope.safetensors",
    );
}

/// Without a terminal the progress bar becomes about twenty plain lines,
/// the last one at the end of the run.
#[test]
fn progress_without_a_terminal_is_plain_lines() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let (ok, stdout, err) = mxswitch(&[
        "train",
        "--config",
        "flux-tiny",
        "--iters",
        "50",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("iteration "))
        .collect();
    assert_eq!(lines.len(), 17, "{stdout}");
    assert!(lines[0].starts_with("iteration 3/50  loss "), "{stdout}");
    assert!(lines[16].starts_with("iteration 50/50  loss "), "{stdout}");
    assert!(lines[16].contains("  fp8  "), "{stdout}");
}
