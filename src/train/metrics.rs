//! The rows of `metrics.jsonl`: one per training step, and one per
//! evaluation.
//!
//! Each row is a JSON object with exactly the keys of its kind; a step row
//! has `loss`, an eval row `eval_loss`, so a reader tells them apart by
//! their keys alone.

use serde::{Deserialize, Serialize};

/// One training step's row: exactly these keys.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StepMetrics {
    /// The iteration trained.
    pub iter: u64,
    /// Its loss.
    pub loss: f32,
    /// The recipe the schedule is switching to (or in) at this iteration.
    pub recipe: String,
    /// Plan layers on that recipe.
    pub layers_converted: usize,
    /// Quantized linears on that recipe.
    pub linears_converted: usize,
    /// The learning rate of the step.
    pub lr: f32,
    /// Samples trained on after this step (iterations x samples per step).
    pub samples: u64,
    /// Wall-clock time of the step (forward, backward, update).
    pub step_time_ms: f64,
    /// Bytes the loss's tape saved for backward, per element.
    pub saved_bytes_per_element: f64,
    /// Peak bytes of the device's tensors so far; null on the CPU.
    pub device_peak_bytes: Option<u64>,
}

/// One evaluation's row: exactly these keys.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EvalMetrics {
    /// The iteration after which the model was evaluated.
    pub iter: u64,
    /// Samples trained on by then.
    pub samples: u64,
    /// The mean loss over the evaluation set.
    pub eval_loss: f32,
    /// The recipe the model was evaluated in.
    pub recipe: String,
    /// Wall-clock time of the evaluation.
    pub eval_time_ms: f64,
}

/// A row of `metrics.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum MetricsRow {
    /// A training step.
    Step(StepMetrics),
    /// An evaluation.
    Eval(EvalMetrics),
}

impl MetricsRow {
    /// The iteration the row belongs to.
    pub fn iter(&self) -> u64 {
        match self {
            MetricsRow::Step(m) => m.iter,
            MetricsRow::Eval(e) => e.iter,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows read back as the kind they were written as, and a row of
    /// neither kind is refused.
    #[test]
    fn rows_are_told_apart_by_their_keys() {
        let step = MetricsRow::Step(StepMetrics {
            iter: 3,
            loss: 1.5,
            recipe: "mxfp4".into(),
            layers_converted: 2,
            linears_converted: 8,
            lr: 1e-3,
            samples: 16,
            step_time_ms: 2.0,
            saved_bytes_per_element: 0.53,
            device_peak_bytes: None,
        });
        let eval = MetricsRow::Eval(EvalMetrics {
            iter: 3,
            samples: 16,
            eval_loss: 0.75,
            recipe: "fp8".into(),
            eval_time_ms: 9.0,
        });
        for row in [step, eval] {
            let text = serde_json::to_string(&row).unwrap();
            assert_eq!(serde_json::from_str::<MetricsRow>(&text).unwrap(), row);
        }
        let neither = r#"{"iter":3,"loss":1.0,"eval_loss":2.0}"#;
        assert!(serde_json::from_str::<MetricsRow>(neither).is_err());
    }
}
