//! What each fuzz target does with one input, shared by the cargo-fuzz
//! targets and the property test `tests/fuzz_readers.rs` (which includes this
//! file as a module), so both drive the readers the same way.
//!
//! A reader may reject any input with an error; a panic, an overflow or an
//! absurd allocation is the bug being looked for. Accepted outputs are checked
//! for the invariants callers rely on, so a reader that lets an inconsistent
//! file through also fails.

use std::path::Path;

use mxswitch::models::flux::{Flux, RunConfig};
use mxswitch::runtime::module::{allocate, try_count_params};
use mxswitch::runtime::optim::{AdamW, AdamWConfig};
use mxswitch::runtime::plan::check_schedule;
use mxswitch::runtime::DType;
use mxswitch::st_file;
use mxswitch::train::shards::{Role, ShardSet, ValShards};
use mxswitch::train::{parse_checkpoint, schedule_of, RunFlags, RunRecord};

/// How far one input got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The reader returned an error.
    Rejected,
    /// The reader accepted it; the step after it (plan, restore) refused it.
    Parsed,
    /// Accepted all the way: a plan was built or a model restored.
    Used,
}

/// The micro Flux run the checkpoint target restores into and its seed
/// checkpoint was trained with: small enough that the checkpoint is ~40 KB.
pub const MICRO_CONFIG: &str = include_str!("../corpus/config_loader/seed-micro.ron");

/// The safetensors reader: parse, then check what its callers rely on:
/// every tensor's bytes are exactly its shape times its dtype size, and the
/// tensors come sorted by name, each name once, none of them the metadata key.
pub fn safetensors_reader(data: &[u8]) -> Stage {
    let Ok((tensors, _metadata)) = st_file::parse(data) else {
        return Stage::Rejected;
    };
    for t in &tensors {
        let elements = t
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .unwrap_or_else(|| panic!("tensor {:?}: shape {:?} overflows", t.name, t.shape));
        assert_eq!(
            Some(t.data.len()),
            elements.checked_mul(t.dtype.size()),
            "tensor {:?} of {:?} {:?} holds {} bytes",
            t.name,
            t.dtype,
            t.shape,
            t.data.len()
        );
        assert_ne!(t.name, "__metadata__", "the metadata key read as a tensor");
    }
    for w in tensors.windows(2) {
        assert!(
            w[0].name < w[1].name,
            "tensors {:?} and {:?} out of order or repeated",
            w[0].name,
            w[1].name
        );
    }
    Stage::Parsed
}

/// The config loader: RON text to a validated run config, then what
/// `mxswitch plan` and the start of `mxswitch train` do before any weight
/// exists: the JSON record of the run, the schedule (also with its switch
/// moved), the checked parameter count, the model's shape and its precision
/// plan. The model is built for every accepted config: validation bounds
/// the block counts and widths (`MAX_BLOCKS`, `MAX_WIDTH`), and nothing
/// here allocates a weight.
pub fn config_loader(data: &[u8]) -> Stage {
    let Ok(text) = std::str::from_utf8(data) else {
        return Stage::Rejected;
    };
    let Ok(cfg) = RunConfig::from_ron(text, "fuzz.ron") else {
        return Stage::Rejected;
    };
    check_recorded(&cfg);
    let Ok(schedule) = schedule_of(&cfg, None) else {
        return Stage::Parsed;
    };
    let _ = schedule_of(&cfg, Some(1));
    let mut model = Flux::new(&cfg.model);
    if try_count_params(&mut model).is_err() {
        return Stage::Parsed;
    }
    let plan = model.plan();
    if plan.check_not_empty("Flux").is_err() || check_schedule::<Flux>(&schedule).is_err() {
        return Stage::Parsed;
    }
    Stage::Used
}

/// A checkpoint records the run config as JSON and checks it again on
/// `--resume`: an accepted config must come back equal and still valid, or
/// a run could write a checkpoint it cannot resume from.
fn check_recorded(cfg: &RunConfig) {
    let json = serde_json::to_string(cfg).expect("a run config serializes");
    let mut back: RunConfig = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("a run config does not read back from {json}: {e}"));
    back.origin.clone_from(&cfg.origin);
    assert_eq!(&back, cfg, "a run config changes through {json}");
    if let Err(e) = back.validate() {
        panic!("a config accepted from RON fails validate() after {json}: {e}");
    }
}

/// The checkpoint loader: parse, read and check the recorded run as
/// `--resume` does (a run it accepts must have a valid config, since the
/// model is built from it), and restore into an allocated micro model with a fresh
/// optimizer.
pub struct CheckpointTarget {
    model: Flux,
}

impl CheckpointTarget {
    pub fn new() -> CheckpointTarget {
        let cfg = RunConfig::from_ron(MICRO_CONFIG, "seed-micro.ron").expect("the micro config");
        let mut model = Flux::new(&cfg.model);
        allocate(&mut model, 0).expect("allocating the micro model");
        CheckpointTarget { model }
    }

    pub fn load(&mut self, data: &[u8]) -> Stage {
        let Ok(ckpt) = parse_checkpoint(data) else {
            return Stage::Rejected;
        };
        let Ok(run) = RunRecord::from_checkpoint(&ckpt) else {
            return Stage::Rejected;
        };
        // What `--resume --iters <one more>` checks before it builds the
        // model from the recorded config: by then the config must be valid.
        let flags = RunFlags {
            iters: Some(ckpt.iteration.saturating_add(1)),
            ..RunFlags::default()
        };
        if let Ok(resumed) = run.resumed(ckpt.iteration, &flags, run.adamw, run.clip_norm) {
            if let Err(e) = resumed.config.validate() {
                panic!("a checkpoint that resumes records an invalid config: {e}");
            }
        }
        let _ = run.schedule();
        let mut opt = AdamW::new(AdamWConfig::default()).expect("default AdamW settings");
        match ckpt.restore(Path::new("fuzz.safetensors"), &mut self.model, &mut opt) {
            Ok(()) => Stage::Used,
            Err(_) => Stage::Parsed,
        }
    }
}

impl Default for CheckpointTarget {
    fn default() -> Self {
        CheckpointTarget::new()
    }
}

/// The shard reader of `train --data` / `--val-data`: the input is the one
/// shard of a folder, opened as a validation set for the micro config (the
/// header checks), then read whole in batches of 2 (every sample's rows,
/// dtype conversion and the non-finite check). The folder is this target's
/// own, reused across inputs.
pub struct ShardTarget {
    dir: tempfile::TempDir,
    cfg: RunConfig,
}

impl ShardTarget {
    pub fn new() -> ShardTarget {
        ShardTarget {
            dir: tempfile::tempdir().expect("a temporary folder"),
            cfg: RunConfig::from_ron(MICRO_CONFIG, "seed-micro.ron").expect("the micro config"),
        }
    }

    pub fn load(&mut self, data: &[u8]) -> Stage {
        let file = self.dir.path().join("shard.safetensors");
        std::fs::write(&file, data).expect("writing the shard under test");
        let (model, shape) = (&self.cfg.model, &self.cfg.data);
        let Ok(set) = ShardSet::open(self.dir.path(), model, shape, Role::Val) else {
            return Stage::Rejected;
        };
        let samples = set.len();
        let val = ValShards::new(set).expect("a set opened as validation data");
        let mut read = 0;
        for batch in val.batches(2, DType::F32) {
            match batch {
                Ok(b) => read += b.timesteps.len() as u64,
                Err(_) => return Stage::Parsed,
            }
        }
        assert_eq!(read, samples, "the batches hold every sample once");
        Stage::Used
    }
}

impl Default for ShardTarget {
    fn default() -> Self {
        ShardTarget::new()
    }
}
