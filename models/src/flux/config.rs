//! Flux run configurations: model shape, synthetic data shape, training
//! settings and the precision schedule, read from RON.
//!
//! The built-in presets live in `models/configs/*.ron`; `flux-schnell`
//! follows `configs["flux-schnell"]` of black-forest-labs/flux (src/flux/util.py).

use serde::{Deserialize, Serialize};

use mxswitch_runtime::schedule_config::ScheduleConfig;
use mxswitch_runtime::{Error, Result};

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
    pub hidden_size: usize,
    pub mlp_ratio: f32,
    pub num_heads: usize,
    /// Double-stream blocks.
    pub depth: usize,
    /// Single-stream blocks.
    pub depth_single_blocks: usize,
    /// RoPE dimensions per position axis; they sum to the head dimension.
    pub axes_dim: Vec<usize>,
    pub theta: f32,
    pub qkv_bias: bool,
    /// Flux.1-dev's guidance embedder.
    pub guidance_embed: bool,
}

/// Shape of the synthetic training data.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    pub latent_channels: usize,
    pub latent_height: usize,
    pub latent_width: usize,
    pub txt_tokens: usize,
    pub batch: usize,
}

/// Training settings; AdamW constants follow SPEC section 8.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    pub iters: u64,
    pub lr: f32,
    /// `f32` or `bf16`.
    #[serde(default = "default_activations")]
    pub activations: String,
}

fn default_activations() -> String {
    "f32".into()
}

/// A whole run: `(model: (..), data: (..), train: (..), schedule: (..))`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: FluxConfig,
    pub data: DataConfig,
    pub train: TrainConfig,
    pub schedule: ScheduleConfig,
}

/// The built-in presets by name.
pub const PRESETS: [(&str, &str); 3] = [
    ("flux-tiny", include_str!("../../configs/flux-tiny.ron")),
    ("flux-small", include_str!("../../configs/flux-small.ron")),
    (
        "flux-schnell",
        include_str!("../../configs/flux-schnell.ron"),
    ),
];

impl RunConfig {
    /// Parse RON text; `origin` names the file in errors.
    pub fn from_ron(text: &str, origin: &str) -> Result<RunConfig> {
        // `implicit_some` lets optional keys be written `sr: true`, as in schedule files.
        let options = ron::Options::default()
            .with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
        let cfg: RunConfig = options.from_str(text).map_err(|e| {
            Error::InvalidOption(format!(
                "{origin}:{}:{}: {}",
                e.position.line, e.position.col, e.code
            ))
        })?;
        cfg.validate(origin)?;
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

    /// Cross-field rules serde cannot express.
    fn validate(&self, origin: &str) -> Result<()> {
        let m = &self.model;
        let d = &self.data;
        let bad = |msg: String| Err(Error::InvalidOption(format!("{origin}: {msg}")));
        if m.num_heads == 0 || m.hidden_size % m.num_heads != 0 {
            return bad(format!(
                "hidden_size {} must be a multiple of num_heads {}",
                m.hidden_size, m.num_heads
            ));
        }
        let head_dim = m.hidden_size / m.num_heads;
        if m.axes_dim.iter().sum::<usize>() != head_dim || m.axes_dim.iter().any(|a| a % 2 != 0) {
            return bad(format!(
                "axes_dim {:?} must be even and sum to the head dimension {head_dim}",
                m.axes_dim
            ));
        }
        if m.axes_dim.len() != 3 {
            return bad(format!(
                "axes_dim must have 3 entries (time, row, column), got {}",
                m.axes_dim.len()
            ));
        }
        if d.latent_height % 2 != 0
            || d.latent_width % 2 != 0
            || d.latent_height == 0
            || d.latent_width == 0
        {
            return bad(format!(
                "latents {}x{} must have even, non-zero sides for the 2x2 patchify",
                d.latent_height, d.latent_width
            ));
        }
        if 4 * d.latent_channels != m.in_channels {
            return bad(format!(
                "in_channels {} must be 4 x latent_channels {}",
                m.in_channels, d.latent_channels
            ));
        }
        if d.batch == 0 || d.txt_tokens == 0 {
            return bad("batch and txt_tokens must be at least 1".into());
        }
        if !(self.train.lr > 0.0 && self.train.lr.is_finite()) {
            return bad(format!(
                "lr must be a positive number, got {}",
                self.train.lr
            ));
        }
        if !matches!(self.train.activations.as_str(), "f32" | "bf16") {
            return bad(format!(
                "activations must be \"f32\" or \"bf16\", got {:?}",
                self.train.activations
            ));
        }
        Ok(())
    }
}

impl FluxConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    pub fn mlp_hidden(&self) -> usize {
        (self.hidden_size as f32 * self.mlp_ratio) as usize
    }
}
