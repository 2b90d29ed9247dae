//! `mxswitch train` keeps runs whole: honest resume, refused run folders,
//! no temp files after a failed save, and a clean stop on Ctrl-C. Every
//! test runs the binary.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use safetensors::tensor::TensorView;
use safetensors::SafeTensors;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mxswitch"))
}

fn mxswitch(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Succeeds; returns stdout.
fn ok(args: &[&str]) -> String {
    let out = mxswitch(args);
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Fails with exactly one `error:` line on stderr that holds every needle.
fn fails_with(args: &[&str], needles: &[&str]) -> String {
    fails_with_status(1, args, needles)
}

/// As [`fails_with`], with exit status `code` (2 for a command line that
/// does not parse).
fn fails_with_status(code: i32, args: &[&str], needles: &[&str]) -> String {
    let out = mxswitch(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: one line expected, got {err:?}");
    for n in needles {
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(n),
            "{args:?}: `{n}` not in {err:?}"
        );
    }
    lines[0].to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The `metrics.jsonl` rows of a run folder.
fn rows(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn iters_of(rows: &[serde_json::Value]) -> Vec<u64> {
    rows.iter().map(|r| r["iter"].as_u64().unwrap()).collect()
}

/// Train flux-tiny for `iters` into `dir`, with the switch at `switch_at`.
fn train(dir: &Path, iters: u64, switch_at: u64) {
    ok(&[
        "train",
        "--config",
        "flux-tiny",
        "--iters",
        &iters.to_string(),
        "--switch-at",
        &switch_at.to_string(),
        "--out",
        s(dir),
    ]);
}

fn leftovers(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(".tmp"))
        .collect()
}

/// The bytes of a run folder's three files.
fn run_files(dir: &Path) -> Vec<Vec<u8>> {
    ["checkpoint.safetensors", "metrics.jsonl", "loss.png"]
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect()
}

/// Issue item 4: `--iters` at or below the checkpoint's iteration is an
/// error naming both numbers, and the run folder is left as it was.
#[test]
fn a_short_resume_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("R");
    train(&r, 6, 3);
    let ckpt = r.join("checkpoint.safetensors");
    let before = run_files(&r);
    for iters in ["3", "6"] {
        fails_with(
            &[
                "train",
                "--config",
                "flux-tiny",
                "--iters",
                iters,
                "--switch-at",
                "3",
                "--resume",
                s(&ckpt),
                "--out",
                s(&r),
            ],
            &[&format!("--iters {iters}"), "iteration 6"],
        );
    }
    let after = run_files(&r);
    assert!(before == after, "a refused resume changed the run folder");
}

/// Issue item 5: the checkpoint's run decides the schedule, the seed and the
/// model; a flag that contradicts it names both values.
#[test]
fn resume_follows_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("R");
    train(&r, 5, 3);
    let ckpt = r.join("checkpoint.safetensors");
    // No --switch-at and no --config: still fp8 after the recorded switch at 3.
    ok(&[
        "train",
        "--iters",
        "7",
        "--resume",
        s(&ckpt),
        "--out",
        s(&r),
    ]);
    let all = rows(&r);
    assert_eq!(
        iters_of(&all),
        (0..7).collect::<Vec<_>>(),
        "earlier rows kept"
    );
    assert!(all[3..].iter().all(|m| m["recipe"] == "fp8"), "{all:?}");

    let resume = |extra: &[&str]| {
        let mut a = vec![
            "train",
            "--iters",
            "9",
            "--resume",
            s(&ckpt),
            "--out",
            s(&r),
        ];
        a.extend_from_slice(extra);
        a.iter().map(|x| x.to_string()).collect::<Vec<_>>()
    };
    let args = resume(&["--seed", "5"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails_with(&args, &["--seed 5", "seed 0"]);
    let args = resume(&["--switch-at", "4"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails_with(&args, &["--switch-at 4", "switch at 3"]);

    let shallow = dir.path().join("shallow.ron");
    let tiny = include_str!("../models/configs/flux-tiny.ron");
    std::fs::write(&shallow, tiny.replace("depth: 2,", "depth: 1,")).unwrap();
    let args = resume(&["--config", s(&shallow)]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails_with(&args, &["model.depth to 1", "model.depth = 2"]);
}

/// A checkpoint's tensors as (name, shape, bytes).
type Tensors = Vec<(String, Vec<usize>, Vec<u8>)>;

/// Rewrite a checkpoint with `edit` applied to its tensors and metadata.
fn rewrite(src: &Path, dst: &Path, edit: impl FnOnce(&mut Tensors, &mut HashMap<String, String>)) {
    let bytes = std::fs::read(src).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta = meta.metadata().clone().unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Tensors = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut tensors, &mut meta);
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, shape, data)| {
            let v = TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap();
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, &Some(meta), dst).unwrap();
}

/// Issue item 5: any missing, extra or misshapen tensor, and moments
/// without step counts, are errors that name them.
#[test]
fn a_damaged_checkpoint_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("R");
    train(&r, 2, 1);
    let ckpt = r.join("checkpoint.safetensors");
    let bad = dir.path().join("bad.safetensors");
    let check = |edit: &dyn Fn(&mut Tensors, &mut HashMap<String, String>), needles: &[&str]| {
        rewrite(&ckpt, &bad, edit);
        let out = dir.path().join("out");
        let _ = std::fs::remove_dir_all(&out);
        fails_with(
            &[
                "train",
                "--iters",
                "4",
                "--resume",
                s(&bad),
                "--out",
                s(&out),
            ],
            needles,
        );
    };
    let first = "param.img_in.weight";
    check(
        &|t, _| t.retain(|(n, _, _)| n != first),
        &[&format!("tensor `{first}` is missing")],
    );
    check(
        &|t, _| t.push(("param.extra".into(), vec![1], vec![0; 4])),
        &["tensor `param.extra` is not a parameter"],
    );
    check(
        &|t, _| {
            let e = t.iter_mut().find(|(n, _, _)| n == first).unwrap();
            e.1 = vec![e.2.len() / 4];
        },
        &[first, "has shape"],
    );
    check(
        &|_, m| {
            m.insert("adamw.steps".into(), "{}".into());
        },
        &["no AdamW state"],
    );
    check(
        &|_, m| {
            let steps: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&m["adamw.steps"]).unwrap();
            let mut steps = steps;
            steps.remove("img_in.weight");
            m.insert(
                "adamw.steps".into(),
                serde_json::Value::Object(steps).to_string(),
            );
        },
        &["adamw.m.img_in.weight", "no step count"],
    );
    check(
        &|_, m| {
            m.insert("iteration".into(), "two".into());
        },
        &["metadata `iteration`", "not a whole number"],
    );
    check(
        &|_, m| {
            m.insert("samples".into(), "-1".into());
        },
        &["metadata `samples`", "not a whole number"],
    );
    check(
        &|_, m| {
            m.remove("samples");
        },
        &["metadata `samples` is missing"],
    );
    check(
        &|_, m| {
            m.insert("samples".into(), "3".into());
        },
        &[
            "metadata `samples` is 3",
            "another number of samples a step",
        ],
    );
    check(
        &|t, _| t.push(("param.\u{1b}[31mred".into(), vec![1], vec![0; 4])),
        &["\\x1b"],
    );
    check(
        &|_, m| {
            let mut run: serde_json::Value = serde_json::from_str(&m["run"]).unwrap();
            run["config"]["model"]["mlp_ratio"] = 0.0.into();
            m.insert("run".into(), run.to_string());
        },
        &["metadata `run`", "mlp_ratio"],
    );
    // Not a checkpoint at all, and a reader that must not grow without bound.
    fails_with(
        &[
            "train",
            "--iters",
            "4",
            "--resume",
            "/dev/zero",
            "--out",
            s(&dir.path().join("z")),
        ],
        &["/dev/zero", "not a regular file"],
    );
}

/// Issue item 6: a folder with a previous run is refused unless the run
/// resumes from it or `--overwrite` is given; overwriting leaves no old file.
#[test]
fn a_previous_run_is_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("R");
    train(&r, 3, 1);
    let before = std::fs::read(r.join("checkpoint.safetensors")).unwrap();
    fails_with(
        &[
            "train",
            "--config",
            "flux-tiny",
            "--iters",
            "2",
            "--out",
            s(&r),
        ],
        &["holds a previous run", "--overwrite", "--resume"],
    );
    assert_eq!(
        std::fs::read(r.join("checkpoint.safetensors")).unwrap(),
        before
    );
    ok(&[
        "train",
        "--config",
        "flux-tiny",
        "--iters",
        "2",
        "--switch-at",
        "1",
        "--out",
        s(&r),
        "--overwrite",
    ]);
    assert_eq!(iters_of(&rows(&r)), [0, 1]);
    assert_ne!(
        std::fs::read(r.join("checkpoint.safetensors")).unwrap(),
        before
    );
}

/// Issue items 3 and wording: a checkpoint save that fails (the file size
/// limit makes the write fail, as a full disk would) leaves no temp file
/// and is one line without a Rust debug dump.
#[test]
fn a_failed_save_leaves_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("R");
    // 256 KiB: the metrics and the plot fit, the checkpoint does not.
    let script = format!(
        "trap '' XFSZ; ulimit -f 256; exec '{}' train --config flux-tiny --iters 2 --switch-at 1 --out '{}'",
        env!("CARGO_BIN_EXE_mxswitch"),
        s(&r)
    );
    let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("checkpoint.safetensors"), "{err}");
    assert!(
        !err.contains("Os {") && !err.contains("kind:"),
        "debug dump: {err}"
    );
    assert!(leftovers(&r).is_empty(), "{:?}", leftovers(&r));
    assert!(!r.join("checkpoint.safetensors").exists());
}

/// Issue item 6: Ctrl-C (and SIGTERM) stops after the current step, flushes
/// the metrics, checkpoints the last finished step, says how to resume and
/// exits 130; the resumed run continues from there.
#[test]
fn ctrl_c_stops_cleanly_and_resumes() {
    for signal in ["INT", "TERM"] {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path().join("R");
        let child = bin()
            .args([
                "train",
                "--config",
                "flux-tiny",
                "--iters",
                "100000",
                "--out",
                s(&r),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while std::fs::read_to_string(r.join("metrics.jsonl")).map_or(0, |t| t.lines().count()) < 2
        {
            assert!(t0.elapsed() < Duration::from_secs(120), "no steps ran");
            std::thread::sleep(Duration::from_millis(50));
        }
        let killed = Command::new("kill")
            .args([format!("-{signal}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let out = child.wait_with_output().unwrap();
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(130),
            "{stdout}{}",
            text(&out.stderr)
        );
        assert!(
            stdout.contains("resume with: mxswitch train --resume"),
            "{stdout}"
        );
        let done = iters_of(&rows(&r));
        let n = done.len() as u64;
        assert_eq!(done, (0..n).collect::<Vec<_>>());
        let bytes = std::fs::read(r.join("checkpoint.safetensors")).unwrap();
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(
            meta.metadata().as_ref().unwrap()["iteration"],
            n.to_string()
        );
        assert!(leftovers(&r).is_empty());
        let ckpt = r.join("checkpoint.safetensors");
        let more = (n + 2).to_string();
        ok(&[
            "train",
            "--iters",
            &more,
            "--resume",
            s(&ckpt),
            "--out",
            s(&r),
        ]);
        assert_eq!(iters_of(&rows(&r)), (0..n + 2).collect::<Vec<_>>());
    }
}

/// Issue item 11 and wording: `--iters 0`, a negative iteration, and a
/// phase that cannot start within the run.
#[test]
fn iteration_flags_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("R");
    fails_with(
        &[
            "train",
            "--config",
            "flux-tiny",
            "--iters",
            "0",
            "--out",
            s(&out),
        ],
        &["--iters 0"],
    );
    fails_with_status(
        2,
        &[
            "train",
            "--config",
            "flux-tiny",
            "--switch-at",
            "-1",
            "--out",
            s(&out),
        ],
        &["--switch-at", "whole number", "-1"],
    );
    let run = mxswitch(&[
        "train",
        "--config",
        "flux-tiny",
        "--iters",
        "2",
        "--switch-at",
        "5",
        "--out",
        s(&out),
    ]);
    assert!(run.status.success());
    let err = text(&run.stderr);
    assert!(
        err.contains("warning: the fp8 phase starts at iteration 5")
            && err.contains("will not run"),
        "{err}"
    );
}

/// Issue item 8: a run that does not fit in memory is refused before
/// anything is allocated, with the estimate and what is available.
#[test]
fn a_run_too_big_for_memory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args([
            "train",
            "--config",
            "flux-schnell",
            "--out",
            s(&dir.path().join("R")),
        ])
        .env("MXSWITCH_MEMORY_LIMIT", (24u64 << 30).to_string())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("training flux-schnell needs about")
            && err.contains("AdamW")
            && err.contains("24.0 GiB is available"),
        "{err}"
    );
}
