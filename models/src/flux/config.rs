//! Flux run configurations: model shape, synthetic data shape, training
//! settings and the precision schedule, read from RON.
//!
//! The built-in presets live in `models/configs/*.ron`; `flux-schnell`
//! follows `configs["flux-schnell"]` of black-forest-labs/flux (src/flux/util.py).
//!
//! Every value is checked when a config is loaded, so that nothing
//! downstream (the model's shapes, the memory estimate, training) meets a
//! zero, a NaN or sizes whose arithmetic overflows; an error names the field
//! and, for RON text, its `file:line:column`.

use serde::{Deserialize, Serialize};

use mxswitch_runtime::lr_schedule::{Decay, LrSchedule};
use mxswitch_runtime::plan::PrecisionModel;
use mxswitch_runtime::ron_span::RonSource;
use mxswitch_runtime::schedule_config::{syntax_error, ScheduleConfig, ToSchedule};
use mxswitch_runtime::{Error, Result};

use super::memory;
use super::model::Flux;

/// The largest value of any width, length or batch field: far past any real
/// Flux, and small enough that the model's shape arithmetic cannot overflow.
pub const MAX_WIDTH: usize = 1 << 24;
/// The most blocks of either kind: the model's shape holds one struct per block.
pub const MAX_BLOCKS: usize = 10_000;

/// The architecture hyper-parameters of Flux.1 (`FluxParams` upstream).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FluxConfig {
    /// Channels of a patchified latent token: 4 x latent channels.
    pub in_channels: usize,
    /// Width of the pooled text vector (CLIP: 768).
    pub vec_in_dim: usize,
    /// Width of a text token (T5: 4096).
    pub context_in_dim: usize,
    /// Width H of every token inside the blocks.
    pub hidden_size: usize,
    /// MLP width over `hidden_size` (4.0 upstream); the product, truncated,
    /// is [`FluxConfig::mlp_hidden`].
    pub mlp_ratio: f32,
    /// Attention heads; must divide `hidden_size` into an even head dimension.
    pub num_heads: usize,
    /// Double-stream blocks.
    pub depth: usize,
    /// Single-stream blocks.
    pub depth_single_blocks: usize,
    /// RoPE dimensions per position axis; they sum to the head dimension.
    pub axes_dim: Vec<usize>,
    /// RoPE base frequency (10000 upstream).
    pub theta: f32,
    /// Whether the qkv linears have a bias.
    pub qkv_bias: bool,
    /// Flux.1-dev's guidance embedder.
    pub guidance_embed: bool,
}

/// Shape of the synthetic training data.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Latent channels C (16 for Flux.1); `model.in_channels` must be 4 C.
    pub latent_channels: usize,
    /// Latent height in latent pixels; even, for the 2x2 patches.
    pub latent_height: usize,
    /// Latent width in latent pixels; even, for the 2x2 patches.
    pub latent_width: usize,
    /// Text tokens per sample (Lt).
    pub txt_tokens: usize,
    /// Samples per training step (B).
    pub batch: usize,
}

/// Training settings; AdamW constants follow SPEC section 8.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Optimizer steps of the run (at least 1).
    pub iters: u64,
    /// AdamW's constant learning rate (finite, > 0).
    pub lr: f32,
    /// `f32` or `bf16`.
    #[serde(default = "default_activations")]
    pub activations: String,
    /// Iterations of linear learning-rate warm-up [default 0]; fewer than
    /// `iters`.
    #[serde(default)]
    pub warmup_steps: u64,
    /// The learning rate after warm-up: `constant` (the default) or `cosine`
    /// (to 0 at the end of the run).
    #[serde(default = "default_lr_decay")]
    pub lr_decay: String,
}

impl TrainConfig {
    /// The learning rate of each iteration of a run of `iters` iterations
    /// (the config's own, or `--iters`).
    pub fn lr_schedule(&self, iters: u64) -> Result<LrSchedule> {
        let decay = Decay::from_name(&self.lr_decay).ok_or_else(|| {
            Error::Config(format!(
                "train.lr_decay must be \"constant\" or \"cosine\", got {:?}",
                self.lr_decay
            ))
        })?;
        LrSchedule::new(self.lr, self.warmup_steps, decay, iters)
    }
}

fn default_lr_decay() -> String {
    Decay::Constant.name().into()
}

fn default_activations() -> String {
    "f32".into()
}

/// A whole run: `(model: (..), data: (..), train: (..), schedule: (..))`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The architecture.
    pub model: FluxConfig,
    /// The synthetic data's shape.
    pub data: DataConfig,
    /// Steps, learning rate and activation dtype.
    pub train: TrainConfig,
    /// The precision schedule (SPEC section 5); it may name only the recipes
    /// of Flux's `#[precision]` attribute.
    pub schedule: ScheduleConfig,
    /// Where the config came from (a preset name or file path), for messages;
    /// empty for one built another way.
    #[serde(skip)]
    pub origin: String,
}

/// The built-in presets by name.
pub const PRESETS: [(&str, &str); 5] = [
    ("flux-tiny", include_str!("../../configs/flux-tiny.ron")),
    ("flux-small", include_str!("../../configs/flux-small.ron")),
    (
        "flux-schnell",
        include_str!("../../configs/flux-schnell.ron"),
    ),
    ("flux-wide", include_str!("../../configs/flux-wide.ron")),
    ("flux-1024", include_str!("../../configs/flux-1024.ron")),
];

impl RunConfig {
    /// Parse RON text; `origin` names the file in errors.
    pub fn from_ron(text: &str, origin: &str) -> Result<RunConfig> {
        let src = RonSource::named(origin, text);
        // `implicit_some` lets optional keys be written `sr: true`, as in schedule files.
        let options = ron::Options::default()
            .with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
        let mut cfg: RunConfig = options.from_str(text).map_err(|e| syntax_error(&src, &e))?;
        cfg.origin = origin.to_string();
        cfg.check(Some(&src))?;
        Ok(cfg)
    }

    /// A preset name (`flux-tiny`, ...) or a path to a RON file.
    pub fn load(name_or_path: &str) -> Result<RunConfig> {
        if let Some((name, text)) = PRESETS.iter().find(|(n, _)| *n == name_or_path) {
            return RunConfig::from_ron(text, name);
        }
        if !name_or_path.ends_with(".ron") {
            let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            return Err(Error::InvalidOption(format!(
                "unknown config `{name_or_path}`: give a built-in name ({}) or a .ron file",
                names.join(", ")
            )));
        }
        let text = std::fs::read_to_string(name_or_path)
            .map_err(|e| Error::Io(format!("cannot read config {name_or_path}: {e}")))?;
        RunConfig::from_ron(&text, name_or_path)
    }

    /// Check every value of a config that did not come from RON text (one
    /// recorded in a checkpoint, or built in code); errors name the field.
    pub fn validate(&self) -> Result<()> {
        self.check(None)
    }

    /// How messages name this config: its origin, or "run config".
    pub fn origin_name(&self) -> &str {
        if self.origin.is_empty() {
            "run config"
        } else {
            &self.origin
        }
    }

    /// Every field in range, the cross-field rules, the schedule, and sizes
    /// whose counts fit 64 bits; errors point into `src` when given.
    fn check(&self, src: Option<&RonSource>) -> Result<()> {
        let fail = |path: &str, msg: String| {
            let place = match src {
                Some(src) => src.place(path),
                None => self.origin_name().to_string(),
            };
            Err(Error::Config(format!("{place}: {path} {msg}")))
        };
        let width = |path: &str, v: usize| {
            if (1..=MAX_WIDTH).contains(&v) {
                Ok(())
            } else {
                fail(path, format!("must be between 1 and {MAX_WIDTH}, got {v}"))
            }
        };
        let positive = |path: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                fail(path, format!("must be a finite number > 0, got {v}"))
            }
        };
        let (m, d, t) = (&self.model, &self.data, &self.train);

        width("model.in_channels", m.in_channels)?;
        width("model.vec_in_dim", m.vec_in_dim)?;
        width("model.context_in_dim", m.context_in_dim)?;
        width("model.hidden_size", m.hidden_size)?;
        positive("model.mlp_ratio", m.mlp_ratio)?;
        let mlp = m.mlp_hidden();
        if !(1..=MAX_WIDTH).contains(&mlp) {
            return fail(
                "model.mlp_ratio",
                format!(
                    "{} makes the MLP width hidden_size x mlp_ratio = {}; it must be between 1 and {MAX_WIDTH}",
                    m.mlp_ratio,
                    m.hidden_size as f32 * m.mlp_ratio
                ),
            );
        }
        if m.num_heads == 0 || m.hidden_size % m.num_heads != 0 {
            return fail(
                "model.num_heads",
                format!(
                    "must be at least 1 and divide hidden_size {}, got {}",
                    m.hidden_size, m.num_heads
                ),
            );
        }
        let head_dim = m.head_dim();
        if head_dim % 2 != 0 {
            return fail(
                "model.num_heads",
                format!(
                    "{} makes the head dimension hidden_size / num_heads = {head_dim} odd; RoPE needs it even",
                    m.num_heads
                ),
            );
        }
        for (path, v) in [
            ("model.depth", m.depth),
            ("model.depth_single_blocks", m.depth_single_blocks),
        ] {
            if v > MAX_BLOCKS {
                return fail(path, format!("must be at most {MAX_BLOCKS}, got {v}"));
            }
        }
        if m.depth == 0 && m.depth_single_blocks == 0 {
            return fail(
                "model.depth",
                "and model.depth_single_blocks are both 0: the model would have no quantized linear; give at least one block".into(),
            );
        }
        if m.axes_dim.len() != 3 {
            return fail(
                "model.axes_dim",
                format!(
                    "must have 3 entries (time, row, column), got {}",
                    m.axes_dim.len()
                ),
            );
        }
        for (i, &a) in m.axes_dim.iter().enumerate() {
            if a % 2 != 0 {
                return fail(
                    &format!("model.axes_dim[{i}]"),
                    format!("must be even (RoPE rotates pairs), got {a}"),
                );
            }
        }
        let axes_sum = m.axes_dim.iter().try_fold(0usize, |s, &a| s.checked_add(a));
        if axes_sum != Some(head_dim) {
            return fail(
                "model.axes_dim",
                format!(
                    "{:?} must sum to the head dimension hidden_size / num_heads = {head_dim}",
                    m.axes_dim
                ),
            );
        }
        positive("model.theta", m.theta)?;

        width("data.latent_channels", d.latent_channels)?;
        if d.latent_channels.checked_mul(4) != Some(m.in_channels) {
            return fail(
                "model.in_channels",
                format!(
                    "must be 4 x data.latent_channels = 4 x {} for the 2x2 patchify, got {}",
                    d.latent_channels, m.in_channels
                ),
            );
        }
        for (path, v) in [
            ("data.latent_height", d.latent_height),
            ("data.latent_width", d.latent_width),
        ] {
            if v % 2 != 0 || !(2..=MAX_WIDTH).contains(&v) {
                return fail(
                    path,
                    format!("must be even (2x2 patches) and between 2 and {MAX_WIDTH}, got {v}"),
                );
            }
        }
        width("data.txt_tokens", d.txt_tokens)?;
        width("data.batch", d.batch)?;

        if t.iters == 0 {
            return fail("train.iters", "must be at least 1, got 0".into());
        }
        positive("train.lr", t.lr)?;
        if t.warmup_steps >= t.iters {
            return fail(
                "train.warmup_steps",
                format!(
                    "must be fewer than train.iters {}, got {}",
                    t.iters, t.warmup_steps
                ),
            );
        }
        if Decay::from_name(&t.lr_decay).is_none() {
            return fail(
                "train.lr_decay",
                format!("must be \"constant\" or \"cosine\", got {:?}", t.lr_decay),
            );
        }
        if !matches!(t.activations.as_str(), "f32" | "bf16") {
            return fail(
                "train.activations",
                format!("must be \"f32\" or \"bf16\", got {:?}", t.activations),
            );
        }

        let schedule = match src {
            Some(src) => self.schedule.to_schedule_in(src, "schedule")?,
            None => self.schedule.to_schedule()?,
        };
        let runs = Flux::RECIPES;
        // The base recipe and the recipes its per-GEMM overrides name.
        let refused = schedule.phases().iter().enumerate().find_map(|(i, p)| {
            let kinds = p.recipe.kinds();
            kinds
                .into_iter()
                .find(|k| !runs.contains(k))
                .map(|k| (i, k))
        });
        if let Some((i, kind)) = refused {
            let names: Vec<&str> = runs.iter().map(|k| k.name()).collect();
            return fail(
                &format!("schedule.phases[{i}].recipe"),
                format!(
                    "`{kind}` is not allowed for Flux, whose #[precision] attribute names only {}; use one of those",
                    names.join(", ")
                ),
            );
        }

        match memory::estimate(self) {
            Ok(_) => Ok(()),
            Err(overflow) => {
                let first = overflow.fields.first().copied().unwrap_or("model");
                let place = match src {
                    Some(src) => src.place(first),
                    None => self.origin_name().to_string(),
                };
                Err(Error::Config(format!("{place}: {}", overflow.message())))
            }
        }
    }
}

impl FluxConfig {
    /// Head dimension D = `hidden_size / num_heads` (integer division; a
    /// loaded config has it exact and even).
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// MLP width: `hidden_size * mlp_ratio` in f32, truncated to an integer.
    pub fn mlp_hidden(&self) -> usize {
        (self.hidden_size as f32 * self.mlp_ratio) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// flux-tiny's text with the value of `key` (the first after `section`) set to `new`.
    fn tiny_with(section: &str, key: &str, new: &str) -> String {
        let text = PRESETS[0].1;
        let at = text.find(section).expect("section") + section.len();
        let start = at + text[at..].find(&format!("{key}:")).expect("key") + key.len() + 1;
        let end = start + text[start..].find(",\n").expect("end of line");
        format!("{} {new}{}", &text[..start], &text[end..])
    }

    fn error_of(text: &str) -> String {
        RunConfig::from_ron(text, "bad.ron")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn the_presets_load() {
        for (name, _) in PRESETS {
            let cfg = RunConfig::load(name).unwrap();
            assert_eq!(cfg.origin, name);
            cfg.validate().unwrap();
        }
    }

    /// Each bad value is reported at its own line and column, with the field.
    #[test]
    fn bad_values_name_file_line_column_and_field() {
        let cases = [
            ("model:", "mlp_ratio", "NaN", "bad.ron:8:9: model.mlp_ratio must be a finite number > 0, got NaN"),
            ("model:", "mlp_ratio", "-4.0", "bad.ron:8:9: model.mlp_ratio must be a finite number > 0, got -4"),
            ("model:", "mlp_ratio", "0.001", "bad.ron:8:9: model.mlp_ratio 0.001 makes the MLP width hidden_size x mlp_ratio = 0.064"),
            ("model:", "hidden_size", "0", "bad.ron:7:9: model.hidden_size must be between 1 and 16777216, got 0"),
            ("model:", "hidden_size", "4611686018427387904", "bad.ron:7:9: model.hidden_size must be between 1 and 16777216, got 4611686018427387904"),
            ("model:", "num_heads", "3", "bad.ron:9:9: model.num_heads must be at least 1 and divide hidden_size 64, got 3"),
            ("model:", "num_heads", "64", "bad.ron:9:9: model.num_heads 64 makes the head dimension hidden_size / num_heads = 1 odd"),
            ("model:", "depth", "10001", "bad.ron:10:9: model.depth must be at most 10000, got 10001"),
            ("model:", "axes_dim", "[4, 6]", "bad.ron:12:9: model.axes_dim must have 3 entries"),
            ("model:", "axes_dim", "[4, 5, 7]", "bad.ron:12:23: model.axes_dim[1] must be even"),
            ("model:", "axes_dim", "[4, 6, 8]", "bad.ron:12:9: model.axes_dim [4, 6, 8] must sum to the head dimension"),
            ("model:", "theta", "0", "bad.ron:13:9: model.theta must be a finite number > 0, got 0"),
            ("model:", "theta", "inf", "bad.ron:13:9: model.theta must be a finite number > 0, got inf"),
            ("model:", "in_channels", "60", "bad.ron:4:9: model.in_channels must be 4 x data.latent_channels = 4 x 16"),
            ("data:", "latent_height", "7", "bad.ron:19:9: data.latent_height must be even"),
            ("data:", "latent_width", "0", "bad.ron:20:9: data.latent_width must be even"),
            ("data:", "batch", "0", "bad.ron:22:9: data.batch must be between 1 and 16777216, got 0"),
            ("train:", "iters", "0", "bad.ron:25:9: train.iters must be at least 1, got 0"),
            ("train:", "lr", "-1e-3", "bad.ron:26:9: train.lr must be a finite number > 0"),
            ("train:", "activations", "\"f16\"", "bad.ron:27:9: train.activations must be \"f32\" or \"bf16\""),
        ];
        for (section, key, value, want) in cases {
            let e = error_of(&tiny_with(section, key, value));
            assert!(e.starts_with(want), "{key}: {value}: {e}");
        }
    }

    #[test]
    fn cross_field_and_schedule_errors_point_at_a_field() {
        let text = tiny_with("model:", "depth", "0")
            .replace("depth_single_blocks: 2", "depth_single_blocks: 0");
        assert!(error_of(&text)
            .starts_with("bad.ron:10:9: model.depth and model.depth_single_blocks are both 0"));
        let text = PRESETS[0].1.replace(
            "(start: 40, recipe: \"fp8\")",
            "(start: 40, recipe: \"bf16\")",
        );
        assert_eq!(
            error_of(&text),
            "bad.ron:30:59: schedule.phases[1].recipe `bf16` is not allowed for Flux, whose #[precision] attribute names only mxfp4, fp8, nvfp4, fp8_rowwise, fp8_block; use one of those"
        );
        let text = PRESETS[0].1.replace("start: 40", "start: 0");
        assert!(error_of(&text)
            .starts_with("bad.ron:30:48: schedule.phases[1].start: schedule phases out of order"));
        let e = error_of("(model: (hidden_size: 64,\n bogus: 1))");
        assert!(e.starts_with("bad.ron:2:"), "{e}");
    }

    /// The learning-rate keys default to a constant rate without warm-up,
    /// and a bad one is an error at its field.
    #[test]
    fn learning_rate_schedules_are_checked_at_their_fields() {
        let cfg = RunConfig::load("flux-tiny").unwrap();
        assert_eq!(
            (cfg.train.warmup_steps, cfg.train.lr_decay.as_str()),
            (0, "constant")
        );
        let with = |extra: &str| {
            PRESETS[0].1.replace(
                "activations: \"f32\",",
                &format!("activations: \"f32\", {extra}"),
            )
        };
        let ok = RunConfig::from_ron(&with("warmup_steps: 10, lr_decay: \"cosine\","), "ok.ron")
            .unwrap();
        let s = ok.train.lr_schedule(80).unwrap();
        assert!(s.at(0) < s.at(9) && s.at(9) == ok.train.lr && s.at(79) < s.at(10));
        let e = error_of(&with("warmup_steps: 80,"));
        assert!(
            e.contains("train.warmup_steps must be fewer than train.iters 80, got 80"),
            "{e}"
        );
        let e = error_of(&with("lr_decay: \"linear\","));
        assert!(
            e.contains("train.lr_decay must be \"constant\" or \"cosine\", got \"linear\""),
            "{e}"
        );
        // --iters shorter than the warm-up is refused when the run is built.
        assert!(ok.train.lr_schedule(10).is_err());
    }

    /// A config built in code is checked the same way, without a position.
    #[test]
    fn validate_checks_a_config_built_in_code() {
        let mut cfg = RunConfig::load("flux-tiny").unwrap();
        cfg.model.mlp_ratio = f32::NAN;
        assert_eq!(
            cfg.validate().unwrap_err().to_string(),
            "flux-tiny: model.mlp_ratio must be a finite number > 0, got NaN"
        );
        cfg.origin.clear();
        cfg.model.mlp_ratio = 4.0;
        cfg.data.batch = 1 << 24;
        cfg.data.latent_height = 1 << 24;
        cfg.data.latent_width = 1 << 24;
        let e = cfg.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("run config: data.batch is too large together with"),
            "{e}"
        );
    }
}
