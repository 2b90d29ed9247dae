//! The output folder of a run: `metrics.jsonl`, `loss.png` and
//! `checkpoint.safetensors`.
//!
//! A folder that holds a previous run is refused unless this run resumes
//! from that folder's checkpoint (then the rows before the checkpoint's
//! iteration are kept and the new ones follow) or `--overwrite` is given
//! (then the old run's files are removed first, so no stale plot or
//! checkpoint is left beside new metrics). Metrics rows are flushed as they
//! are written, so a crash keeps every finished step.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use mxswitch_runtime::{Error, Result};

use super::metrics::MetricsRow;
use crate::files;

pub const METRICS: &str = "metrics.jsonl";
pub const PLOT: &str = "loss.png";
pub const CHECKPOINT: &str = "checkpoint.safetensors";
/// The files that make a folder hold a run.
const RUN_FILES: [&str; 3] = [METRICS, PLOT, CHECKPOINT];

/// A checked output folder, not yet written to.
#[derive(Debug)]
pub struct RunDir {
    pub dir: PathBuf,
    /// Metrics rows of the earlier part of a run resumed in this folder.
    pub earlier: Vec<MetricsRow>,
    /// Remove the old run's files before writing (`--overwrite`).
    clear: bool,
}

fn io(what: String, e: impl std::fmt::Display) -> Error {
    Error::Io(format!("{what}: {e}"))
}

impl RunDir {
    /// Check `dir` for a run that starts at iteration `start`, resuming from
    /// `resume` if given. Creates the folder; writes nothing in it.
    pub fn check(dir: &Path, resume: Option<&Path>, start: u64, overwrite: bool) -> Result<RunDir> {
        std::fs::create_dir_all(dir)
            .map_err(|e| io(format!("cannot create output folder {}", dir.display()), e))?;
        let found: Vec<&str> = RUN_FILES
            .into_iter()
            .filter(|f| dir.join(f).symlink_metadata().is_ok())
            .collect();
        let resumes_here = resume
            .and_then(Path::parent)
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .is_some_and(|p| files::same_file(p, dir));
        let mut run = RunDir {
            dir: dir.to_path_buf(),
            earlier: Vec::new(),
            clear: false,
        };
        if found.is_empty() {
            return Ok(run);
        }
        if resumes_here {
            run.earlier = read_metrics(&dir.join(METRICS), start)?;
            return Ok(run);
        }
        if !overwrite {
            return Err(Error::Io(format!(
                "{} holds a previous run ({}): resume it with --resume {}, replace it with --overwrite, or choose another --out",
                dir.display(),
                found.join(", "),
                dir.join(CHECKPOINT).display()
            )));
        }
        run.clear = true;
        Ok(run)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Start writing: clear an overwritten run, rewrite the kept rows of a
    /// resumed one, and open `metrics.jsonl` for the new rows.
    pub fn open_metrics(&self) -> Result<MetricsWriter> {
        let path = self.path(METRICS);
        if self.clear {
            for f in RUN_FILES {
                let p = self.path(f);
                match std::fs::remove_file(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io(format!("cannot remove {}", p.display()), e)),
                }
            }
        }
        let mut text = String::new();
        for m in &self.earlier {
            text += &row(m)?;
        }
        files::write_atomically(&path, |f| f.write_all(text.as_bytes()))?;
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| io(format!("cannot write {}", path.display()), e))?;
        Ok(MetricsWriter { path, file })
    }
}

/// Appends one JSON row per step or evaluation to `metrics.jsonl`.
#[derive(Debug)]
pub struct MetricsWriter {
    path: PathBuf,
    file: File,
}

impl MetricsWriter {
    pub fn write(&mut self, m: &MetricsRow) -> Result<()> {
        self.file
            .write_all(row(m)?.as_bytes())
            .map_err(|e| io(format!("writing {}", self.path.display()), e))
    }
}

fn row(m: &MetricsRow) -> Result<String> {
    serde_json::to_string(m)
        .map(|s| s + "\n")
        .map_err(|e| Error::Io(format!("metrics row of iteration {}: {e}", m.iter())))
}

/// The rows of an existing `metrics.jsonl` before iteration `start`; a
/// missing file has none.
fn read_metrics(path: &Path, start: u64) -> Result<Vec<MetricsRow>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(format!("cannot read {}", path.display()), e)),
    };
    let mut rows = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| io(format!("cannot read {}", path.display()), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let m: MetricsRow = serde_json::from_str(&line).map_err(|e| {
            Error::Io(format!(
                "{} line {} is not a metrics row ({e}); move the file away or pass --overwrite",
                path.display(),
                i + 1
            ))
        })?;
        if m.iter() < start {
            rows.push(m);
        }
    }
    Ok(rows)
}
