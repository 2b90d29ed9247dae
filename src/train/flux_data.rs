//! Where a Flux run's batches come from, and its evaluation.
//!
//! A run trains on the seeded synthetic data, or on precomputed shards
//! (`--data`, [`super::shards`]). Either way the batch of an iteration is
//! a pure function of the seed and the iteration, so a resumed run reads on
//! exactly where it stopped; the checkpoint's `samples` is that position.
//! Shards are read ahead on a helper thread on every device (their cost is
//! the disk); synthetic batches only for a GPU (on the CPU their cost is
//! compute, which the step's cores do better).

use std::ops::Range;
use std::path::Path;

use mxswitch_models::flux::{Batch, Flux, RunConfig, SyntheticData};
use mxswitch_runtime::{DType, Device, Error, Result};

use super::record::{DataRecord, RunRecord};
use super::shards::{Role, ShardSet, TrainShards, ValShards};

/// Where a run's training samples come from.
pub enum Source {
    /// Seeded synthetic batches.
    Synthetic(SyntheticData),
    /// Batches from `--data` shards.
    Shards(TrainShards),
}

/// The training batches of a run, or of one rank of a data-parallel run:
/// the rank's slice `part` of each global batch (SPEC section 9).
pub struct TrainData {
    pub source: Source,
    pub part: Range<usize>,
}

impl TrainData {
    /// The run's data for `rank` of `world` ranks: the shards its record
    /// names, or synthetic data. The config's batch is the global batch;
    /// rank r takes samples r B/W .. (r+1) B/W of it.
    pub fn of(run: &RunRecord, rank: usize, world: usize) -> Result<TrainData> {
        let cfg = &run.config;
        let b = cfg.data.batch;
        if b % world != 0 {
            return Err(Error::InvalidOption(format!(
                "data.batch {b} is the global batch, split evenly over {world} ranks: make it a multiple of {world}"
            )));
        }
        let source = match &run.data {
            None => Source::Synthetic(SyntheticData::new(&cfg.model, &cfg.data, run.seed)),
            Some(rec) => {
                let set = open_recorded(rec, cfg)?;
                Source::Shards(TrainShards::new(set, run.seed, b)?)
            }
        };
        let per = b / world;
        Ok(TrainData {
            source,
            part: rank * per..(rank + 1) * per,
        })
    }

    /// This rank's part of the batch of iteration `iter`.
    pub fn batch(&self, iter: u64, act: DType) -> Result<Batch> {
        let part = self.part.clone();
        match &self.source {
            Source::Synthetic(d) => d.batch_part(iter, act, part),
            Source::Shards(d) => d.batch_part(iter, act, part),
        }
    }

    /// Whether batches are built ahead on a helper thread.
    fn read_ahead(&self, device: Device) -> bool {
        matches!(self.source, Source::Shards(_)) || device != Device::Cpu
    }
}

/// The record of the shards in `dir` for a new run of `cfg`.
pub fn record_shards(dir: &Path, cfg: &RunConfig) -> Result<DataRecord> {
    let set = ShardSet::open(dir, &cfg.model, &cfg.data, Role::Train)?;
    Ok(DataRecord {
        dir: dir.to_path_buf(),
        fingerprint: set.fingerprint(),
    })
}

/// The shards a record names, refused when they are not the ones it
/// recorded.
fn open_recorded(rec: &DataRecord, cfg: &RunConfig) -> Result<ShardSet> {
    let set = ShardSet::open(&rec.dir, &cfg.model, &cfg.data, Role::Train)?;
    if set.fingerprint() != rec.fingerprint {
        return Err(Error::InvalidOption(format!(
            "--data {}: these shards are not the ones the run trained on (fingerprint {}, recorded {}); resume with the run's data",
            rec.dir.display(),
            set.fingerprint(),
            rec.fingerprint
        )));
    }
    Ok(set)
}

/// The data a resumed run reads: the recorded shards, from `--data` if it
/// was given again (the folder may have moved; the shards must be the same).
pub fn resumed_data(run: &RunRecord, flag: Option<&Path>) -> Result<Option<DataRecord>> {
    match (&run.data, flag) {
        (None, None) => Ok(None),
        (None, Some(dir)) => Err(Error::InvalidOption(format!(
            "--data {} contradicts the checkpoint, whose run trained on synthetic data; leave --data out",
            dir.display()
        ))),
        (Some(rec), None) => Ok(Some(rec.clone())),
        (Some(rec), Some(dir)) => {
            let moved = DataRecord {
                dir: dir.to_path_buf(),
                fingerprint: rec.fingerprint.clone(),
            };
            open_recorded(&moved, &run.config)?;
            Ok(Some(moved))
        }
    }
}

/// Runs `body` with a source of the host batches of `iters`, in order,
/// built ahead on a helper thread where [`TrainData`] says so.
pub fn with_batches<R>(
    data: &TrainData,
    act: DType,
    device: Device,
    iters: std::ops::Range<u64>,
    body: impl FnOnce(&mut dyn FnMut() -> Result<Batch>) -> Result<R>,
) -> Result<R> {
    if !data.read_ahead(device) {
        let mut it = iters;
        return body(&mut || {
            let iter = it
                .next()
                .ok_or_else(|| Error::Backend("no batch left to train on".into()))?;
            data.batch(iter, act)
        });
    }
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        s.spawn(move || {
            for iter in iters {
                // A closed channel means training stopped early.
                if tx.send(data.batch(iter, act)).is_err() {
                    break;
                }
            }
        });
        body(&mut || {
            rx.recv()
                .map_err(|_| Error::Backend("the data thread stopped".into()))?
        })
    })
}

/// The validation set of `--val-data`, checked against the run's config.
pub fn open_val(dir: &Path, cfg: &RunConfig) -> Result<ValShards> {
    let set = ShardSet::open(dir, &cfg.model, &cfg.data, Role::Val)?;
    ValShards::new(set)
}

/// The eval loss: the mean over the validation set of each sample's MSE,
/// in batches of the run's size. Every sample has the same number of
/// elements, so the batch means weighted by their sizes give it exactly.
pub fn eval_loss(
    model: &mut Flux,
    val: &ValShards,
    batch: usize,
    act: DType,
    device: &Device,
) -> Result<f32> {
    let (mut sum, mut n) = (0.0f64, 0u64);
    for b in val.batches(batch, act) {
        let b = b?;
        let k = b.timesteps.len() as u64;
        let loss = super::flux_loss(model, b, device)?.to_scalar_f32()?;
        sum += loss as f64 * k as f64;
        n += k;
    }
    if n == 0 {
        return Err(Error::InvalidOption(
            "--val-data holds no samples to evaluate".into(),
        ));
    }
    Ok((sum / n as f64) as f32)
}
