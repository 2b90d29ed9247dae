//! Training checkpoints in safetensors: every parameter (`param.<path>`),
//! the AdamW moments (`adamw.m.<path>`, `adamw.v.<path>`) and, in the
//! metadata, the next iteration (`iteration`), the samples trained on
//! before it (`samples`: the data position), the caller's record of the
//! run (key `run`, JSON text the checkpoint does not interpret; Flux stores
//! its [`RunRecord`](super::RunRecord)) and each parameter's step count
//! (`adamw.steps`). No recipe is stored: the recipe in force is a pure
//! function of the iteration and the run's schedule, so a run resumed past
//! a switch is switched.
//!
//! Loading is strict: a missing, extra or misshapen tensor, a step count
//! without moments or moments without one, is an error that names it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::Dtype;

use mxswitch_runtime::module::{allocated, try_visit_params, Parameters};
use mxswitch_runtime::optim::AdamW;
use mxswitch_runtime::{Error, Result, Tensor};

use crate::files;
use crate::st_file::{self, printable, OwnedTensor};

/// A checkpoint read from disk, checked, before it is put into a model.
#[derive(Debug)]
pub struct Checkpoint {
    /// The next iteration to run.
    pub iteration: u64,
    /// Samples trained on before it: where the data continues.
    pub samples: u64,
    /// The caller's record of the run (metadata `run`), JSON text as written.
    pub run: String,
    /// Every tensor by name: shape and f32 values.
    tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    /// AdamW step count per parameter path.
    steps: BTreeMap<String, u64>,
}

/// An error about the checkpoint at `path`: `checkpoint <path>: <what>`.
pub(crate) fn err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Io(format!("checkpoint {}: {what}", path.display()))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Write the model and optimizer state at `iteration` (the next one to
/// run, after `samples` samples), with `run` (JSON text) as metadata
/// `run`. The file appears whole or not at all.
pub fn save_checkpoint<M: Parameters>(
    path: &Path,
    model: &mut M,
    opt: &AdamW,
    iteration: u64,
    samples: u64,
    run: &str,
) -> Result<()> {
    let mut buffers: Vec<OwnedTensor> = Vec::new();
    let mut steps = serde_json::Map::new();
    try_visit_params(model, |slot| {
        let p = allocated(&slot)?;
        let name = |kind: &str| format!("{kind}.{}", slot.path);
        buffers.push((
            name("param"),
            Dtype::F32,
            slot.shape.clone(),
            f32_bytes(&p.to_vec_f32()?),
        ));
        if let Some((step, m, v)) = opt.state(p.id())? {
            steps.insert(slot.path.clone(), step.into());
            buffers.push((
                name("adamw.m"),
                Dtype::F32,
                slot.shape.clone(),
                f32_bytes(&m),
            ));
            buffers.push((
                name("adamw.v"),
                Dtype::F32,
                slot.shape.clone(),
                f32_bytes(&v),
            ));
        }
        Ok(())
    })
    .map_err(|e| err(path, e))?;
    let metadata = HashMap::from([
        ("iteration".to_string(), iteration.to_string()),
        ("samples".to_string(), samples.to_string()),
        ("run".to_string(), run.to_string()),
        (
            "adamw.steps".to_string(),
            serde_json::Value::Object(steps).to_string(),
        ),
    ]);
    files::write_atomically(path, |f| st_file::write_owned(f, &buffers, &metadata))?;
    Ok(())
}

/// Read and check a checkpoint file. `limit` bounds the bytes read.
pub fn read_checkpoint(path: &Path, limit: u64) -> Result<Checkpoint> {
    let bytes = files::read_regular(path, limit).map_err(|e| err(path, e))?;
    parse_checkpoint(&bytes).map_err(|e| err(path, e))
}

/// Parse checkpoint bytes; the error is the reason, without the file name.
/// The run record is not read here: its owner checks [`Checkpoint::run`].
pub fn parse_checkpoint(bytes: &[u8]) -> std::result::Result<Checkpoint, String> {
    let (tensors, meta) =
        st_file::parse(bytes).map_err(|r| format!("not a safetensors file: {r}"))?;
    let entry = |key: &str| -> std::result::Result<&String, String> {
        meta.get(key).ok_or_else(|| {
            format!("metadata `{key}` is missing: it was not written by `mxswitch train` of this version")
        })
    };
    let whole = |key: &str| -> std::result::Result<u64, String> {
        let v = entry(key)?;
        v.parse()
            .map_err(|_| format!("metadata `{key}` is {:?}, not a whole number", printable(v)))
    };
    let iteration = whole("iteration")?;
    let samples = whole("samples")?;
    let run = entry("run")?.clone();
    let steps_json: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(entry("adamw.steps")?).map_err(|e| {
            format!("metadata `adamw.steps` is not a JSON object of step counts: {e}")
        })?;
    let mut steps = BTreeMap::new();
    for (name, v) in steps_json {
        let n = v.as_u64().ok_or_else(|| {
            format!(
                "metadata `adamw.steps` gives `{}` the step count {v}, not a whole number",
                printable(&name)
            )
        })?;
        steps.insert(name, n);
    }
    if iteration > 0 && steps.is_empty() {
        return Err(format!(
            "it is at iteration {iteration} but holds no AdamW state (metadata `adamw.steps` is empty)"
        ));
    }
    let mut out = BTreeMap::new();
    for t in tensors {
        if t.dtype != Dtype::F32 {
            return Err(format!(
                "tensor `{}` is {:?}; checkpoints hold F32 only",
                printable(&t.name),
                t.dtype
            ));
        }
        let values = t
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.insert(t.name, (t.shape, values));
    }
    Ok(Checkpoint {
        iteration,
        samples,
        run,
        tensors: out,
        steps,
    })
}

impl Checkpoint {
    /// Check that the data position fits a run of `per_step` samples a
    /// step: `samples` is `iteration` x `per_step` (another batch size, or
    /// an edited file, would continue the data somewhere else).
    pub fn check_samples(&self, path: &Path, per_step: u64) -> Result<()> {
        if Some(self.samples) == self.iteration.checked_mul(per_step) {
            return Ok(());
        }
        Err(err(
            path,
            format!(
                "metadata `samples` is {}, but {} iterations of {per_step} samples are {}: it was trained with another number of samples a step",
                self.samples,
                self.iteration,
                self.iteration.saturating_mul(per_step)
            ),
        ))
    }

    /// The parameters (tensors `param.<path>`) by path, moments left out.
    pub fn params(&self) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
        self.tensors
            .iter()
            .filter_map(|(name, t)| Some((name.strip_prefix("param.")?.to_string(), t.clone())))
            .collect()
    }

    /// Put the weights into an allocated `model` (on the parameter's device)
    /// and the moments into a fresh `opt`. Every tensor and step count must
    /// be used; `path` names the file in errors.
    pub fn restore<M: Parameters>(self, path: &Path, model: &mut M, opt: &mut AdamW) -> Result<()> {
        let Checkpoint {
            mut tensors,
            mut steps,
            ..
        } = self;
        try_visit_params(model, |slot| {
            let p = slot
                .param
                .as_mut()
                .ok_or_else(|| err(path, format!("parameter {} is not allocated", slot.path)))?;
            let value = take(
                &mut tensors,
                path,
                &format!("param.{}", slot.path),
                &slot.shape,
            )?;
            p.set(Tensor::from_vec(value, slot.shape.clone(), &p.device())?)?;
            let m = format!("adamw.m.{}", slot.path);
            let v = format!("adamw.v.{}", slot.path);
            match steps.remove(&slot.path) {
                Some(step) => {
                    let m = take(&mut tensors, path, &m, &slot.shape)?;
                    let v = take(&mut tensors, path, &v, &slot.shape)?;
                    opt.set_state(p.id(), step, m, v)
                }
                None if tensors.contains_key(&m) || tensors.contains_key(&v) => Err(err(
                    path,
                    format!(
                        "tensor `{}` has no step count in metadata `adamw.steps`",
                        printable(&m)
                    ),
                )),
                None => Ok(()),
            }
        })?;
        if let Some(name) = tensors.keys().next() {
            return Err(err(
                path,
                format!(
                    "tensor `{}` is not a parameter of this model or its AdamW state ({} unexpected tensor(s))",
                    printable(name),
                    tensors.len()
                ),
            ));
        }
        if let Some(name) = steps.keys().next() {
            return Err(err(
                path,
                format!(
                    "metadata `adamw.steps` names `{}`, which is not a parameter of this model",
                    printable(name)
                ),
            ));
        }
        Ok(())
    }
}

/// Remove the tensor `name` of `shape` from what is left to restore.
fn take(
    tensors: &mut BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    path: &Path,
    name: &str,
    shape: &[usize],
) -> Result<Vec<f32>> {
    let (got, values) = tensors
        .remove(name)
        .ok_or_else(|| err(path, format!("tensor `{}` is missing", printable(name))))?;
    if got != shape {
        return Err(err(
            path,
            format!(
                "tensor `{}` has shape {got:?}, but the model's parameter has {shape:?}",
                printable(name)
            ),
        ));
    }
    Ok(values)
}
