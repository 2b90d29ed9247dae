//! What a run shows while it trains: a progress bar on a terminal, with the
//! last loss, the last eval loss and the recipe; plain lines otherwise (a
//! log file, CI), about twenty over the run.

use indicatif::{ProgressBar, ProgressStyle};

use super::metrics::{EvalMetrics, StepMetrics};

/// Plain progress lines over a run when there is no terminal.
const PLAIN_LINES: u64 = 20;

/// The bar, or the plain-line fallback.
pub struct Progress {
    bar: ProgressBar,
    /// Print a plain line every this many steps (no terminal, progress on).
    plain_every: Option<u64>,
    iters: u64,
    last_eval: Option<f32>,
}

impl Progress {
    /// Progress for iterations `start..iters`; `show` off prints only the
    /// lines [`Progress::say`] is given.
    pub fn new(show: bool, start: u64, iters: u64) -> Progress {
        let bar = if show {
            ProgressBar::new(iters)
        } else {
            ProgressBar::hidden()
        };
        bar.set_position(start);
        if let Ok(style) =
            ProgressStyle::with_template("{bar:40} {pos}/{len} [{elapsed_precise} < {eta}] {msg}")
        {
            bar.set_style(style);
        }
        let plain_every = (show && bar.is_hidden())
            .then(|| (iters - start.min(iters)).div_ceil(PLAIN_LINES).max(1));
        Progress {
            bar,
            plain_every,
            iters,
            last_eval: None,
        }
    }

    /// Print a line above the bar, or plainly when there is no bar.
    pub fn say(&self, line: &str) {
        if self.bar.is_hidden() {
            println!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    /// A step finished.
    pub fn step(&mut self, m: &StepMetrics) {
        let eval = self
            .last_eval
            .map(|e| format!("  eval {e:.4}"))
            .unwrap_or_default();
        let status = format!("loss {:.4}{eval}  {}", m.loss, m.recipe);
        self.bar.set_message(status.clone());
        self.bar.inc(1);
        let done = m.iter + 1;
        if let Some(every) = self.plain_every {
            if done % every == 0 || done == self.iters {
                println!(
                    "iteration {done}/{}  {status}  {:.1} ms/step",
                    self.iters, m.step_time_ms
                );
            }
        }
    }

    /// An evaluation finished: its loss joins the status, and a line says it.
    pub fn eval(&mut self, e: &EvalMetrics) {
        self.last_eval = Some(e.eval_loss);
        self.say(&format!(
            "eval after iteration {} ({} samples): loss {:.4} ({}, {:.0} ms)",
            e.iter, e.samples, e.eval_loss, e.recipe, e.eval_time_ms
        ));
    }

    /// Leave the bar as it is on the screen.
    pub fn finish(&self) {
        self.bar.abandon();
    }
}
