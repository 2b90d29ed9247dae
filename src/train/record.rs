//! What a run is, as its checkpoint records it, and how a resumed run's
//! flags are reconciled with it.
//!
//! A checkpoint holds the whole run: the config as given, the `--switch-at`
//! that moved its schedule, the seed, the iteration count and the optimizer
//! settings. Resuming takes all of them from the checkpoint; a flag may
//! repeat a recorded value but never contradict it, and only `--iters` may
//! grow the run.
//!
//! The generic checkpoint stores the record as opaque JSON;
//! [`RunRecord::from_checkpoint`] reads it back and checks it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use mxswitch_models::flux::RunConfig;
use mxswitch_runtime::optim::AdamWConfig;
use mxswitch_runtime::schedule::Schedule;
use mxswitch_runtime::{Error, Result};

use super::checkpoint::Checkpoint;
use super::schedule_of;

/// One run, exactly as its checkpoint stores it (metadata key `run`, JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    /// The config as given, before `--iters` and `--switch-at`.
    pub config: RunConfig,
    /// The first switch as `--switch-at` moved it; `None` keeps the config's.
    pub switch_at: Option<u64>,
    /// Seed of the weights, the data and stochastic rounding.
    pub seed: u64,
    /// The run trains iterations `0..iters`.
    pub iters: u64,
    /// The optimizer settings it was trained with.
    pub adamw: AdamWConfig,
    /// The gradient clipping threshold it was trained with.
    pub clip_norm: f32,
    /// The training shards it reads (`--data`); `None` is the seeded
    /// synthetic data.
    #[serde(default)]
    pub data: Option<DataRecord>,
}

/// The training shards of a run, as its checkpoint records them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataRecord {
    /// The folder as given.
    pub dir: std::path::PathBuf,
    /// The shard set's fingerprint: a resume must read the same shards.
    pub fingerprint: String,
}

/// The flags of `mxswitch train` that decide what the run is.
#[derive(Clone, Debug, Default)]
pub struct RunFlags<'a> {
    /// `--config`.
    pub config: Option<&'a RunConfig>,
    /// `--iters`.
    pub iters: Option<u64>,
    /// `--switch-at`.
    pub switch_at: Option<u64>,
    /// `--seed`.
    pub seed: Option<u64>,
}

impl RunRecord {
    /// The schedule the run trains through.
    pub fn schedule(&self) -> Result<Schedule> {
        schedule_of(&self.config, self.switch_at)
    }

    /// The run a checkpoint records (metadata `run`), checked as a config
    /// file is: a valid config and schedule, and the checkpoint's iteration
    /// within the run. The error is the reason, without the file name.
    pub fn from_checkpoint(ckpt: &Checkpoint) -> std::result::Result<RunRecord, String> {
        let mut run: RunRecord = serde_json::from_str(&ckpt.run)
            .map_err(|e| format!("metadata `run` is not a valid run record: {e}"))?;
        // The recorded config passes the checks a config file passes.
        run.config.origin = "the checkpoint's run config".into();
        run.config
            .validate()
            .and_then(|()| run.schedule().map(drop))
            .map_err(|e| format!("metadata `run`: {e}"))?;
        if ckpt.iteration > run.iters {
            return Err(format!(
                "metadata `iteration` {} is past the run's {} iterations",
                ckpt.iteration, run.iters
            ));
        }
        Ok(run)
    }

    /// A new run from its flags.
    pub fn new(flags: &RunFlags, adamw: AdamWConfig, clip_norm: f32) -> Result<RunRecord> {
        let config = flags.config.ok_or_else(|| {
            Error::InvalidOption("give --config (a preset name or a .ron file), or --resume".into())
        })?;
        let iters = flags.iters.unwrap_or(config.train.iters);
        if iters == 0 {
            return Err(Error::InvalidOption(
                "--iters 0 trains nothing: give at least 1".into(),
            ));
        }
        let record = RunRecord {
            config: config.clone(),
            switch_at: flags.switch_at,
            seed: flags.seed.unwrap_or(0),
            iters,
            adamw,
            clip_norm,
            data: None,
        };
        record.schedule()?;
        Ok(record)
    }

    /// The run a checkpoint at iteration `at` continues as: the recorded one,
    /// with `--iters` grown if given. `adamw` and `clip_norm` are this
    /// build's settings, which must be the recorded ones.
    pub fn resumed(
        &self,
        at: u64,
        flags: &RunFlags,
        adamw: AdamWConfig,
        clip_norm: f32,
    ) -> Result<RunRecord> {
        let contradiction = |flag: &str, given: String, recorded: String, fix: &str| {
            Error::InvalidOption(format!(
                "{flag} {given} contradicts the checkpoint, whose run has {recorded}; {fix}"
            ))
        };
        if let Some(cfg) = flags.config {
            let mut given = cfg.clone();
            given.train.iters = self.config.train.iters;
            if let Some((path, a, b)) = first_difference(&to_json(&given)?, &to_json(&self.config)?)
            {
                return Err(contradiction(
                    "--config",
                    format!("sets {path} to {a}"),
                    format!("{path} = {b}"),
                    "resume with the same config, or leave --config out",
                ));
            }
        }
        if let Some(seed) = flags.seed.filter(|&s| s != self.seed) {
            return Err(contradiction(
                "--seed",
                seed.to_string(),
                format!("seed {}", self.seed),
                "leave --seed out to continue the same data",
            ));
        }
        if let Some(at) = flags.switch_at {
            let recorded = self.schedule()?.phases().get(1).map(|p| p.start);
            if recorded != Some(at) {
                let recorded =
                    recorded.map_or("no switch".into(), |s| format!("its switch at {s}"));
                return Err(contradiction(
                    "--switch-at",
                    at.to_string(),
                    recorded,
                    "leave --switch-at out to keep the recorded schedule",
                ));
            }
        }
        if adamw != self.adamw || clip_norm != self.clip_norm {
            return Err(Error::Training(format!(
                "the checkpoint was trained with AdamW {:?} and clipping at {}, but this build uses {adamw:?} and {clip_norm}; resume it with the build that wrote it",
                self.adamw, self.clip_norm
            )));
        }
        let iters = flags.iters.unwrap_or(self.iters);
        if iters <= at {
            let asked = match flags.iters {
                Some(n) => format!("--iters {n} is not past"),
                None => format!("the run's {} iterations end at", self.iters),
            };
            return Err(Error::InvalidOption(format!(
                "{asked} the checkpoint's iteration {at}: give --iters greater than {at} to train further"
            )));
        }
        Ok(RunRecord {
            iters,
            ..self.clone()
        })
    }
}

fn to_json(cfg: &RunConfig) -> Result<Value> {
    serde_json::to_value(cfg).map_err(|e| Error::InvalidOption(format!("run config: {e}")))
}

/// The first key path at which two JSON values differ, with both values.
fn first_difference(a: &Value, b: &Value) -> Option<(String, Value, Value)> {
    fn walk(a: &Value, b: &Value, path: String) -> Option<(String, Value, Value)> {
        let join = |key: &str| {
            if path.is_empty() {
                key.to_string()
            } else {
                format!("{path}.{key}")
            }
        };
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k)));
                keys.into_iter().find_map(|k| {
                    let (va, vb) = (
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                    );
                    walk(va, vb, join(k))
                })
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
                .iter()
                .zip(y)
                .enumerate()
                .find_map(|(i, (va, vb))| walk(va, vb, format!("{path}[{i}]"))),
            _ if a == b => None,
            _ => Some((path, a.clone(), b.clone())),
        }
    }
    walk(a, b, String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> RunConfig {
        RunConfig::load("flux-tiny").unwrap()
    }

    fn record() -> RunRecord {
        let cfg = tiny();
        let flags = RunFlags {
            config: Some(&cfg),
            iters: Some(20),
            switch_at: Some(10),
            seed: None,
        };
        RunRecord::new(&flags, AdamWConfig::default(), 1.0).unwrap()
    }

    fn resume(flags: RunFlags) -> Result<RunRecord> {
        record().resumed(20, &flags, AdamWConfig::default(), 1.0)
    }

    #[test]
    fn a_resumed_run_keeps_the_recorded_schedule_and_seed() {
        let r = resume(RunFlags {
            iters: Some(30),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((r.iters, r.seed, r.switch_at), (30, 0, Some(10)));
        assert_eq!(r.schedule().unwrap().phases()[1].start, 10);
        // Repeating recorded values is fine.
        let cfg = tiny();
        resume(RunFlags {
            config: Some(&cfg),
            iters: Some(21),
            switch_at: Some(10),
            seed: Some(0),
        })
        .unwrap();
    }

    #[test]
    fn contradicting_flags_name_both_values() {
        let msg = |flags| resume(flags).unwrap_err().to_string();
        let e = msg(RunFlags {
            iters: Some(10),
            ..Default::default()
        });
        assert!(
            e.contains("--iters 10") && e.contains("iteration 20"),
            "{e}"
        );
        let e = msg(RunFlags::default());
        assert!(
            e.contains("20 iterations end at") && e.contains("iteration 20"),
            "{e}"
        );
        let e = msg(RunFlags {
            iters: Some(30),
            seed: Some(5),
            ..Default::default()
        });
        assert!(e.contains("--seed 5") && e.contains("seed 0"), "{e}");
        let e = msg(RunFlags {
            iters: Some(30),
            switch_at: Some(40),
            ..Default::default()
        });
        assert!(
            e.contains("--switch-at 40") && e.contains("switch at 10"),
            "{e}"
        );
        let mut shallow = tiny();
        shallow.model.depth = 1;
        let e = msg(RunFlags {
            config: Some(&shallow),
            iters: Some(30),
            ..Default::default()
        });
        assert!(
            e.contains("model.depth to 1") && e.contains("model.depth = 2"),
            "{e}"
        );
        let e = record()
            .resumed(
                20,
                &RunFlags {
                    iters: Some(30),
                    ..Default::default()
                },
                AdamWConfig {
                    lr: 0.5,
                    ..AdamWConfig::default()
                },
                1.0,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("build that wrote it"), "{e}");
    }

    #[test]
    fn zero_iterations_is_an_error() {
        let cfg = tiny();
        let e = RunRecord::new(
            &RunFlags {
                config: Some(&cfg),
                iters: Some(0),
                ..Default::default()
            },
            AdamWConfig::default(),
            1.0,
        )
        .unwrap_err();
        assert!(e.to_string().contains("--iters 0"), "{e}");
    }

    /// A checkpoint without tensors whose metadata holds `run` (JSON text)
    /// at `iteration`.
    fn checkpoint(run: &str, iteration: u64) -> Checkpoint {
        let meta = std::collections::HashMap::from([
            ("iteration".to_string(), iteration.to_string()),
            ("samples".to_string(), (iteration * 4).to_string()),
            ("run".to_string(), run.to_string()),
            ("adamw.steps".to_string(), r#"{"w": 1}"#.to_string()),
        ]);
        let mut bytes = Vec::new();
        crate::st_file::write(&mut bytes, &[], &meta).unwrap();
        super::super::parse_checkpoint(&bytes).unwrap()
    }

    #[test]
    fn a_checkpoint_record_is_checked_as_a_config_file_is() {
        let json = serde_json::to_string(&record()).unwrap();
        let got = RunRecord::from_checkpoint(&checkpoint(&json, 20)).unwrap();
        assert_eq!(got.config.origin, "the checkpoint's run config");
        assert_eq!((got.iters, got.switch_at), (20, Some(10)));

        let e = RunRecord::from_checkpoint(&checkpoint(&json, 21)).unwrap_err();
        assert_eq!(e, "metadata `iteration` 21 is past the run's 20 iterations");
        let e = RunRecord::from_checkpoint(&checkpoint("{}", 1)).unwrap_err();
        assert!(
            e.starts_with("metadata `run` is not a valid run record: "),
            "{e}"
        );
        let mut bad: Value = serde_json::from_str(&json).unwrap();
        bad["config"]["model"]["mlp_ratio"] = 0.0.into();
        let e = RunRecord::from_checkpoint(&checkpoint(&bad.to_string(), 1)).unwrap_err();
        assert!(
            e.starts_with("metadata `run`: ") && e.contains("mlp_ratio"),
            "{e}"
        );
        let mut bad: Value = serde_json::from_str(&json).unwrap();
        bad["switch_at"] = 0.into();
        let e = RunRecord::from_checkpoint(&checkpoint(&bad.to_string(), 1)).unwrap_err();
        assert!(e.starts_with("metadata `run`: "), "{e}");
    }

    #[test]
    fn differences_are_found_by_path() {
        let a = serde_json::json!({"m": {"x": [1, 2], "y": 3}});
        let b = serde_json::json!({"m": {"x": [1, 5], "y": 3}});
        let (path, x, y) = first_difference(&a, &b).unwrap();
        assert_eq!((path.as_str(), x, y), ("m.x[1]", 2.into(), 5.into()));
        assert!(first_difference(&a, &a).is_none());
    }
}
