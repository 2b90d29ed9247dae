//! Training checkpoints in safetensors: every parameter (`param.<path>`),
//! the AdamW moments (`adamw.m.<path>`, `adamw.v.<path>`) and, in the
//! metadata, the next iteration, the seed and each parameter's step count.
//! No recipe is stored: the recipe in force is a pure function of the
//! iteration, so a run resumed past a switch is switched.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use mxswitch_runtime::module::{allocated, try_visit_params, Parameters};
use mxswitch_runtime::optim::AdamW;
use mxswitch_runtime::{Error, Result, Tensor};

/// What a checkpoint says besides the tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The next iteration to run.
    pub iteration: u64,
    pub seed: u64,
}

fn err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Io(format!("checkpoint {}: {what}", path.display()))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Write the model and optimizer state.
pub fn save_checkpoint<M: Parameters>(
    path: &Path,
    model: &mut M,
    opt: &AdamW,
    iteration: u64,
    seed: u64,
) -> Result<()> {
    let mut buffers: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut steps = serde_json::Map::new();
    try_visit_params(model, |slot| {
        let p = allocated(&slot)?;
        let name = |kind: &str| format!("{kind}.{}", slot.path);
        buffers.push((
            name("param"),
            slot.shape.clone(),
            f32_bytes(&p.to_vec_f32()?),
        ));
        if let Some((step, m, v)) = opt.state(p.id())? {
            steps.insert(slot.path.clone(), step.into());
            buffers.push((name("adamw.m"), slot.shape.clone(), f32_bytes(&m)));
            buffers.push((name("adamw.v"), slot.shape.clone(), f32_bytes(&v)));
        }
        Ok(())
    })
    .map_err(|e| err(path, e))?;
    let mut views = HashMap::new();
    for (name, shape, bytes) in &buffers {
        let view = TensorView::new(Dtype::F32, shape.clone(), bytes).map_err(|e| err(path, e))?;
        views.insert(name.clone(), view);
    }
    let metadata = HashMap::from([
        ("iteration".to_string(), iteration.to_string()),
        ("seed".to_string(), seed.to_string()),
        (
            "adamw.steps".to_string(),
            serde_json::Value::Object(steps).to_string(),
        ),
    ]);
    // Write beside the target and rename, so a failure leaves no half file.
    let tmp = path.with_extension("safetensors.tmp");
    safetensors::serialize_to_file(&views, &Some(metadata), &tmp).map_err(|e| err(path, e))?;
    std::fs::rename(&tmp, path).map_err(|e| err(path, e))
}

/// Read a checkpoint into an allocated model and a fresh optimizer.
pub fn load_checkpoint<M: Parameters>(
    path: &Path,
    model: &mut M,
    opt: &mut AdamW,
) -> Result<Checkpoint> {
    let bytes = std::fs::read(path).map_err(|e| err(path, e))?;
    let (_, meta) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| err(path, format!("not a safetensors file: {e}")))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| err(path, format!("not a safetensors file: {e}")))?;
    let meta = meta.metadata().clone().unwrap_or_default();
    let number = |key: &str| -> Result<u64> {
        meta.get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| err(path, format!("metadata `{key}` is missing")))
    };
    let ckpt = Checkpoint {
        iteration: number("iteration")?,
        seed: number("seed")?,
    };
    let steps: serde_json::Map<String, serde_json::Value> = meta
        .get("adamw.steps")
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| err(path, "metadata `adamw.steps` is missing"))?;
    let read = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        let t = st
            .tensor(name)
            .map_err(|_| err(path, format!("tensor `{name}` is missing")))?;
        if t.dtype() != Dtype::F32 || t.shape() != shape {
            return Err(err(
                path,
                format!(
                    "tensor `{name}` is {:?} {:?}, expected F32 {shape:?}",
                    t.dtype(),
                    t.shape()
                ),
            ));
        }
        Ok(t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    };
    try_visit_params(model, |slot| {
        let p = slot
            .param
            .as_mut()
            .ok_or_else(|| err(path, format!("parameter {} is not allocated", slot.path)))?;
        // The value goes where the parameter lives (the CPU or a GPU).
        let value = read(&format!("param.{}", slot.path), &slot.shape)?;
        p.set(Tensor::from_vec(value, slot.shape.clone(), &p.device())?)?;
        if let Some(step) = steps.get(&slot.path).and_then(|s| s.as_u64()) {
            let m = read(&format!("adamw.m.{}", slot.path), &slot.shape)?;
            let v = read(&format!("adamw.v.{}", slot.path), &slot.shape)?;
            opt.set_state(p.id(), step, m, v)?;
        }
        Ok(())
    })?;
    Ok(ckpt)
}
