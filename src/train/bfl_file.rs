//! Flux weights in Black Forest Labs' safetensors naming, in and out:
//! `train --init-from FILE` and `mxswitch export`. The names and the split
//! of the fused linears are [`mxswitch_models::flux::bfl`]'s; this file reads
//! and writes the files, F32 or BF16 (widened exactly), every failure one
//! line that names the file.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::Dtype;

use mxswitch_models::flux::bfl::{Layout, Tensors};
use mxswitch_models::flux::{Flux, FluxConfig};
use mxswitch_runtime::formats::bf16;
use mxswitch_runtime::module::try_visit_params;
use mxswitch_runtime::{Error, Result, Tensor};

use super::checkpoint::read_checkpoint;
use super::record::RunRecord;
use crate::files;
use crate::st_file::{self, printable, OwnedTensor};

/// An error about the Flux weights file at `path`.
fn err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Io(format!("flux weights {}: {what}", path.display()))
}

/// The BFL layout of a Flux model of `cfg`.
fn layout(cfg: &FluxConfig) -> Result<Layout> {
    let mut model = Flux::new(cfg);
    let mut params = Vec::new();
    try_visit_params(&mut model, |slot| {
        params.push((slot.path.clone(), slot.shape.clone()));
        Ok(())
    })?;
    Layout::new(&params, cfg.hidden_size).map_err(Error::InvalidOption)
}

/// The element type an export writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportDType {
    /// The f32 master weights, bit for bit.
    F32,
    /// Rounded to nearest even BF16 (what Flux checkpoints usually hold).
    BF16,
}

/// Reads BFL-named F32 or BF16 tensors from `path` as f32 values.
fn read_bfl(path: &Path) -> Result<Tensors> {
    let bytes = files::read_regular(path, u64::MAX).map_err(|e| err(path, e))?;
    let (tensors, _) =
        st_file::parse(&bytes).map_err(|r| err(path, format!("not a safetensors file: {r}")))?;
    let mut out = Tensors::new();
    for t in tensors {
        let values: Vec<f32> = match t.dtype {
            Dtype::F32 => t
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => t
                .data
                .chunks_exact(2)
                .map(|b| bf16::to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            other => {
                return Err(err(
                    path,
                    format!(
                        "tensor `{}` is {other:?}; Flux weights are read as F32 or BF16",
                        printable(&t.name)
                    ),
                ))
            }
        };
        out.insert(t.name, (t.shape, values));
    }
    Ok(out)
}

/// BFL-named weights read from a file and checked against a model's
/// layout, before anything is allocated or written.
#[derive(Debug)]
pub struct FluxWeights {
    path: std::path::PathBuf,
    tensors: Tensors,
}

impl FluxWeights {
    /// Reads `path` and checks that its tensors are exactly those of a Flux
    /// model of `cfg`.
    pub fn read(path: &Path, cfg: &FluxConfig) -> Result<FluxWeights> {
        let tensors = layout(cfg)?
            .from_bfl(&read_bfl(path)?)
            .map_err(|e| err(path, e))?;
        Ok(FluxWeights {
            path: path.to_path_buf(),
            tensors,
        })
    }

    /// Sets every parameter of an allocated `model` (on its device).
    pub fn put_into(mut self, model: &mut Flux) -> Result<()> {
        let path = self.path;
        try_visit_params(model, |slot| {
            let p = slot
                .param
                .as_mut()
                .ok_or_else(|| err(&path, format!("parameter {} is not allocated", slot.path)))?;
            let (shape, values) = self
                .tensors
                .remove(&slot.path)
                .ok_or_else(|| err(&path, format!("no tensor for parameter {}", slot.path)))?;
            p.set(Tensor::from_vec(values, shape, &p.device())?)
        })
    }
}

/// Writes the weights of the training checkpoint `checkpoint` to `output`
/// in BFL naming, as `dtype`; the file appears whole or not at all.
pub fn export(checkpoint: &Path, output: &Path, dtype: ExportDType) -> Result<()> {
    if files::same_file(checkpoint, output) {
        return Err(Error::InvalidOption(format!(
            "--output {} is the checkpoint itself; choose another path",
            output.display()
        )));
    }
    files::output_target(output)?;
    let ckpt = read_checkpoint(checkpoint, u64::MAX)?;
    let run =
        RunRecord::from_checkpoint(&ckpt).map_err(|e| super::checkpoint::err(checkpoint, e))?;
    let bfl = layout(&run.config.model)?
        .to_bfl(&ckpt.params())
        .map_err(|e| super::checkpoint::err(checkpoint, e))?;
    let st_dtype = match dtype {
        ExportDType::F32 => Dtype::F32,
        ExportDType::BF16 => Dtype::BF16,
    };
    let tensors: Vec<OwnedTensor> = bfl
        .into_iter()
        .map(|(name, (shape, v))| {
            let data = match dtype {
                ExportDType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ExportDType::BF16 => v
                    .iter()
                    .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                    .collect(),
            };
            (name, st_dtype, shape, data)
        })
        .collect();
    // What torch's safetensors writer records; loaders may look for it.
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    files::write_atomically(output, |f| st_file::write_owned(f, &tensors, &metadata))?;
    Ok(())
}
