//! `mxswitch quantize` never damages files: special outputs and the input
//! itself are refused, symlinks to regular files are written through, the
//! input must be a regular file, and no temporary file survives a failed
//! write, SIGINT or SIGTERM. Every test runs the binary.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mxswitch::st_file::{self, StTensor};
use safetensors::tensor::Dtype;
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_mxswitch");

/// Write a safetensors file of f32 tensors `(name, shape, values)`.
fn write_input(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<StTensor> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), data)| StTensor {
            name: name.to_string(),
            dtype: Dtype::F32,
            shape: shape.clone(),
            data,
        })
        .collect();
    let file = fs::File::create(path).unwrap();
    st_file::write(file, &views, &HashMap::new()).unwrap();
}

/// A small valid input `dir/in.safetensors`.
fn small_input(dir: &Path) -> PathBuf {
    let p = dir.join("in.safetensors");
    let x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) / 7.0).collect();
    write_input(&p, &[("w", vec![2, 32], x)]);
    p
}

fn quantize_cmd(input: &Path, output: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args(["quantize", "--format", "mxfp4", "--input"])
        .arg(input)
        .arg("--output")
        .arg(output);
    c
}

fn quantize(input: &Path, output: &Path) -> Output {
    quantize_cmd(input, output).output().unwrap()
}

/// The run failed with one `error:` line holding `needle`; returns the line.
#[track_caller]
fn fails_with(out: &Output, needle: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one error line expected, got {err:?}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(needle), "`{needle}` not in {err:?}");
    lines[0].to_string()
}

#[track_caller]
fn succeeds(out: &Output) {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Temporary outputs left in `dir`.
fn temp_files(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(".mxswitch-"))
        .collect()
}

/// Run a setup command; false (with a message saying the check is skipped)
/// if this machine cannot.
fn setup(what: &str, cmd: &str, args: &[&str]) -> bool {
    let ok = Command::new(cmd)
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped {what}: `{cmd}` failed here (not root, or not available)");
    }
    ok
}

#[test]
fn special_file_outputs_are_refused_and_left_as_they_are() {
    let dir = TempDir::new().unwrap();
    let input = small_input(dir.path());
    let s = |p: &Path| p.to_str().unwrap().to_string();

    let dev = dir.path().join("n");
    if setup(
        "the character device",
        "mknod",
        &["-m", "666", &s(&dev), "c", "1", "3"],
    ) {
        fails_with(
            &quantize(&input, &dev),
            "it exists and is a character device, not a regular file; choose another path",
        );
        assert!(fs::symlink_metadata(&dev)
            .unwrap()
            .file_type()
            .is_char_device());
    }
    let fifo = dir.path().join("fifo");
    if setup("the FIFO", "mkfifo", &[&s(&fifo)]) {
        fails_with(
            &quantize(&input, &fifo),
            "it exists and is a FIFO (named pipe), not a regular file",
        );
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    }
    let folder = dir.path().join("folder");
    fs::create_dir(&folder).unwrap();
    let line = fails_with(&quantize(&input, &folder), "it exists and is a folder");
    assert!(
        line.contains(&format!("cannot write `{}`", folder.display())),
        "{line}"
    );
    assert!(fs::read_dir(&folder).unwrap().next().is_none());

    // A symlink to a device is refused too, the link kept.
    let link = dir.path().join("null_link");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    fails_with(
        &quantize(&input, &link),
        "it is a symbolic link to a character device",
    );
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(temp_files(dir.path()).is_empty());
}

#[test]
fn symlinks_to_regular_files_are_written_through_and_dangling_ones_refused() {
    let dir = TempDir::new().unwrap();
    let input = small_input(dir.path());
    let real = dir.path().join("real.safetensors");
    fs::write(&real, b"old contents").unwrap();
    let link = dir.path().join("link.safetensors");
    let chain = dir.path().join("chain.safetensors");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    std::os::unix::fs::symlink(&link, &chain).unwrap();

    succeeds(&quantize(&input, &chain));
    for l in [&link, &chain] {
        assert!(fs::symlink_metadata(l).unwrap().file_type().is_symlink());
    }
    assert!(fs::symlink_metadata(&real).unwrap().is_file());
    let (tensors, meta) = {
        let bytes = fs::read(&real).unwrap();
        let (t, m) = st_file::parse(&bytes).unwrap();
        (t.into_iter().map(|t| t.name).collect::<Vec<_>>(), m)
    };
    assert_eq!(tensors, ["w.codes", "w.dequant", "w.scales"]);
    assert_eq!(meta["mxswitch.format"], "mxfp4");

    // A dangling symlink: neither the link nor its missing target is made.
    let missing = dir.path().join("missing.safetensors");
    let dangling = dir.path().join("dangling.safetensors");
    std::os::unix::fs::symlink(&missing, &dangling).unwrap();
    fails_with(&quantize(&input, &dangling), "which does not exist");
    assert!(!missing.exists());
    assert!(fs::symlink_metadata(&dangling)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(temp_files(dir.path()).is_empty());
}

#[test]
fn the_input_itself_is_refused_as_output_by_identity() {
    let dir = TempDir::new().unwrap();
    let input = small_input(dir.path());
    let before = fs::read(&input).unwrap();
    let hard = dir.path().join("hard.safetensors");
    fs::hard_link(&input, &hard).unwrap();
    let soft = dir.path().join("soft.safetensors");
    std::os::unix::fs::symlink(&input, &soft).unwrap();
    let respelled = dir.path().join(".").join("in.safetensors");
    for output in [&input, &hard, &soft, &respelled] {
        let line = fails_with(&quantize(&input, output), "is the input file");
        assert!(line.contains(&output.display().to_string()), "{line}");
    }
    // And the other way round: the input named through the link.
    fails_with(&quantize(&soft, &input), "is the input file");
    assert_eq!(fs::read(&input).unwrap(), before);
    assert!(temp_files(dir.path()).is_empty());
}

#[test]
fn the_input_must_be_a_regular_file() {
    let dir = TempDir::new().unwrap();
    let output = dir.path().join("out.safetensors");
    let line = fails_with(&quantize(Path::new("/dev/zero"), &output), "/dev/zero");
    assert_eq!(
        line,
        "error: cannot read `/dev/zero`: it is a character device, not a regular file"
    );
    fails_with(
        &quantize(dir.path(), &output),
        "it is a folder, not a regular file",
    );
    let fifo = dir.path().join("fifo");
    if setup("the FIFO input", "mkfifo", &[fifo.to_str().unwrap()]) {
        // Opening a FIFO would wait for a writer: the run must not block.
        let mut child = quantize_cmd(&fifo, &output)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                child.kill().unwrap();
                panic!("quantize blocked on a FIFO input");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        fails_with(
            &child.wait_with_output().unwrap(),
            "it is a FIFO (named pipe), not a regular file",
        );
    }
    assert!(!output.exists());
}

/// Start quantizing an input of about 128 MB, wait until its temporary
/// output exists, send `signal` and check the run stopped cleanly: status
/// 130, no temporary file, the old output untouched.
fn interrupt_removes_the_temp_file(signal: &str) {
    let dir = TempDir::new().unwrap();
    let input = dir.path().join("big.safetensors");
    let side = 4096;
    let x: Vec<f32> = (0..side * side)
        .map(|i| ((i % 251) as f32 - 125.0) / 16.0)
        .collect();
    write_input(
        &input,
        &[
            ("a", vec![side, side], x.clone()),
            ("b", vec![side, side], x),
        ],
    );
    let output = dir.path().join("out.safetensors");
    fs::write(&output, b"previous output").unwrap();

    let mut child = quantize_cmd(&input, &output)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while temp_files(dir.path()).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "quantize ended before its temporary output appeared"
        );
        assert!(Instant::now() < deadline, "no temporary output appeared");
        std::thread::sleep(Duration::from_millis(2));
    }
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{signal}: {status:?}");
    assert_eq!(temp_files(dir.path()), Vec::<String>::new(), "{signal}");
    assert_eq!(fs::read(&output).unwrap(), b"previous output", "{signal}");
}

#[test]
fn sigint_removes_the_temp_file_and_exits_130() {
    interrupt_removes_the_temp_file("-INT");
}

#[test]
fn sigterm_removes_the_temp_file_and_exits_130() {
    interrupt_removes_the_temp_file("-TERM");
}

#[test]
fn a_write_that_fails_leaves_no_temp_file_and_the_old_output() {
    let dir = TempDir::new().unwrap();
    let input = dir.path().join("in.safetensors");
    let x: Vec<f32> = (0..64 * 256).map(|i| (i % 13) as f32).collect();
    write_input(&input, &[("w", vec![64, 256], x)]);
    let output = dir.path().join("out.safetensors");
    fs::write(&output, b"previous output").unwrap();
    // A 32 KiB file size limit (ulimit counts 512-byte blocks in sh) makes
    // the ~74 KB write fail with EFBIG; SIGXFSZ is ignored so that the
    // write returns the error instead of killing the process.
    let out = Command::new("sh")
        .args(["-c", "trap '' XFSZ; ulimit -f 64 && exec \"$@\"", "sh", BIN])
        .args(["quantize", "--format", "mxfp4", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    let line = fails_with(&out, "File too large");
    assert!(
        line.starts_with(&format!("error: cannot write `{}`: ", output.display())),
        "{line}"
    );
    assert_eq!(fs::read(&output).unwrap(), b"previous output");
    assert!(temp_files(dir.path()).is_empty());
}
