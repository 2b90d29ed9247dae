//! The bytes that training a run config needs, estimated from above before
//! anything is allocated, so that a config too big for the machine is
//! refused with one line instead of being killed mid-allocation.
//!
//! Counted, in checked arithmetic (an overflow names the config fields):
//! - parameters in f32, their gradients in f32, and AdamW's m and v in f32;
//! - warm-up's copy of the parameters: it keeps the values it started from
//!   while its steps write new ones, through every recipe's step after the
//!   first (measured on a GPU: leaving it out underestimated flux-small);
//! - the activations of one batch, from the Flux forward in `model.rs`, per
//!   block and token (H hidden, M MLP width, h heads, D head dimension):
//!   - double block, in the activation dtype: the two layer-norm outputs,
//!     the gated projection and MLP outputs, the GELU input (4H + M), and
//!     attention's rotated q, k and v (3H); in f32: the normalized q and k
//!     (2H) and the norms' reciprocal deviations (2 + 2h); at the recipe's
//!     saved bytes per element: the four linears' inputs (3H + M);
//!   - single block: 5H + M in the activation dtype, 2H + 1 + 2h in f32 and
//!     3H + M at the recipe's saved bytes;
//!   - per block, attention's softmax output, B x h x L x L: the scores are
//!     materialized, one L x L matrix per head; the RoPE tables cast for q
//!     and k (2 x L x D); the modulation vectors (20 x B x H in f32);
//!   - per quantized linear, its weight quantized for backward (none for
//!     `bf16`, which rereads the master weight);
//!   - outside the blocks: the embedders' f32 inputs, the final layer, the
//!     loss, the batch itself and the synthetic data's class patterns;
//!   - per block, what a GPU's pool adds by rounding each buffer up to its
//!     size class: as much again, but at most `BLOCK_ROUNDING`;
//!   - working space of one block's backward: six f32 L x L matrices per
//!     head (softmax's backward holds its incoming gradient, two products
//!     and its result, then the scaled result and the scores' gradient),
//!     four f32 tensors of the widest linear output, and
//!     [`RUNTIME_OVERHEAD`] for the runtime's own tables and buffers.
//!
//! Saved bytes per element take the largest over the schedule's recipes.
//! Against measured peaks the estimate was 1.2 times the pool's peak for
//! flux-small on an H200 (batch 2 to 32, 512 and 1280 tokens), 1.6 to 1.7
//! times for flux-tiny-shaped configs of 264 tokens there, and 1.75 to 2
//! times a counting allocator's peak for those on the CPU, above the
//! process's peak resident size.

use mxswitch_runtime::module::try_count_params;
use mxswitch_runtime::recipe::RecipeKind;
use mxswitch_runtime::schedule_config::ToSchedule;
use mxswitch_runtime::{Error, Result};

use super::config::RunConfig;
use super::model::{Flux, TIME_DIM};

/// Bytes the runtime holds however small the model: lookup tables, caches
/// and per-thread buffers (under 10 MiB measured for flux-tiny).
pub const RUNTIME_OVERHEAD: u64 = 32 << 20;

/// The most a block's buffers grow when a GPU's pool rounds each up to its
/// size class: a power of two below 1 MiB, whole MiB above, for about 64
/// buffers a block keeps.
const BLOCK_ROUNDING: u64 = 64 << 20;

/// Bytes by what holds them; see the module doc for what each counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Every parameter in f32: 4 bytes each.
    pub parameters: u64,
    /// One f32 gradient per parameter: as many bytes as `parameters`.
    pub gradients: u64,
    /// AdamW's first and second moments.
    pub adamw: u64,
    /// Everything one batch's forward keeps for backward, plus working space.
    pub activations: u64,
    /// The parameter values warm-up keeps while its steps write new ones.
    pub warmup_copy: u64,
    /// The sum of the parts.
    pub total: u64,
}

impl MemoryEstimate {
    /// "parameters 44.3 GiB, warm-up's copy 44.3 GiB, gradients 44.3 GiB, AdamW m and v 88.6 GiB, activations 86.8 GiB".
    pub fn breakdown(&self) -> String {
        format!(
            "parameters {}, warm-up's copy {}, gradients {}, AdamW m and v {}, activations {}",
            format_bytes(self.parameters),
            format_bytes(self.warmup_copy),
            format_bytes(self.gradients),
            format_bytes(self.adamw),
            format_bytes(self.activations)
        )
    }
}

/// `1.5 GiB`, `312 B`: binary units, one decimal.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Estimate what training `cfg` needs (the config is validated first, so a
/// hand-built one cannot make the count panic).
pub fn estimate_training_bytes(cfg: &RunConfig) -> Result<MemoryEstimate> {
    cfg.validate()?;
    estimate(cfg).map_err(|o| Error::Config(format!("{}: {}", cfg.origin_name(), o.message())))
}

/// A count that did not fit 64 bits, and the config fields that drive it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Overflow {
    pub fields: &'static [&'static str],
    pub what: &'static str,
}

impl Overflow {
    /// "model.hidden_size is too large with ...: the parameter count overflows 64 bits; ...".
    pub fn message(&self) -> String {
        let (first, rest) = self.fields.split_first().unwrap_or((&"the config", &[]));
        format!(
            "{first} is too large together with {}: {} overflows 64 bits; use smaller sizes",
            rest.join(", "),
            self.what
        )
    }
}

const PARAMETER_FIELDS: &[&str] = &[
    "model.hidden_size",
    "model.mlp_ratio",
    "model.depth",
    "model.depth_single_blocks",
    "model.context_in_dim",
    "model.vec_in_dim",
];

const BATCH_FIELDS: &[&str] = &[
    "data.batch",
    "data.latent_height",
    "data.latent_width",
    "data.txt_tokens",
    "model.hidden_size",
    "model.num_heads",
];

/// A u64 count that becomes `None` at the first overflow.
#[derive(Clone, Copy, Debug)]
struct Count(Option<u64>);

fn n(v: usize) -> Count {
    Count(u64::try_from(v).ok())
}

impl std::ops::Add for Count {
    type Output = Count;
    fn add(self, o: Count) -> Count {
        Count(self.0.zip(o.0).and_then(|(a, b)| a.checked_add(b)))
    }
}

impl std::ops::Mul for Count {
    type Output = Count;
    fn mul(self, o: Count) -> Count {
        Count(self.0.zip(o.0).and_then(|(a, b)| a.checked_mul(b)))
    }
}

impl std::ops::Mul<u64> for Count {
    type Output = Count;
    fn mul(self, k: u64) -> Count {
        self * Count(Some(k))
    }
}

impl std::ops::Add<u64> for Count {
    type Output = Count;
    fn add(self, k: u64) -> Count {
        self + Count(Some(k))
    }
}

impl Count {
    /// Elements at `per32` thirty-seconds of a byte each, in whole bytes.
    fn min(self, k: u64) -> Count {
        Count(self.0.map(|x| x.min(k)))
    }

    fn at_32ths(self, per32: u64) -> Count {
        Count((self * per32).0.map(|x| x.div_ceil(32)))
    }

    fn or(
        self,
        fields: &'static [&'static str],
        what: &'static str,
    ) -> std::result::Result<u64, Overflow> {
        self.0.ok_or(Overflow { fields, what })
    }
}

/// The estimate of a config whose fields are already in range.
pub(crate) fn estimate(cfg: &RunConfig) -> std::result::Result<MemoryEstimate, Overflow> {
    let mut model = Flux::new(&cfg.model);
    let params = try_count_params(&mut model).map_err(|_| Overflow {
        fields: PARAMETER_FIELDS,
        what: "the parameter count",
    })?;
    let p = Count(Some(params));
    let parameters = (p * 4).or(PARAMETER_FIELDS, "the byte count of the parameters")?;
    let adamw = (p * 8).or(PARAMETER_FIELDS, "the byte count of the AdamW state")?;

    // Saved bytes per element of x and of W, in 32ths, the most over the schedule.
    let (mut x32, mut w32) = (0u64, 0u64);
    match cfg.schedule.to_schedule() {
        Ok(schedule) => {
            for phase in schedule.phases() {
                let per32 = (phase.recipe.saved_bytes_per_element() * 32.0).ceil() as u64;
                x32 = x32.max(per32);
                if phase.recipe.kind != RecipeKind::Bf16 {
                    w32 = w32.max(per32);
                }
            }
        }
        // Unreachable for a validated config; count the most any recipe saves.
        Err(_) => (x32, w32) = (64, 64),
    }
    let weights = |linears: &[&mxswitch_runtime::linear::QuantLinear]| {
        linears.iter().fold(n(0), |acc, l| {
            acc + n(l.params.in_features) * n(l.params.out_features)
        })
    };
    let double_w = model
        .double_blocks
        .first()
        .map_or(n(0), |b| weights(&b.quantized()));
    let single_w = model
        .single_blocks
        .first()
        .map_or(n(0), |b| weights(&b.quantized()));

    let (m, d) = (&cfg.model, &cfg.data);
    let a = if cfg.train.activations == "bf16" {
        2
    } else {
        4
    };
    let (b, lt) = (n(d.batch), n(d.txt_tokens));
    let li = n(d.latent_height / 2) * n(d.latent_width / 2);
    let l = li + lt;
    let (tokens, img_tokens, txt_tokens) = (b * l, b * li, b * lt);
    let (h, mlp, heads, head_dim) = (
        n(m.hidden_size),
        n(m.mlp_hidden()),
        n(m.num_heads),
        n(m.head_dim()),
    );
    let (c4, ctx, vec) = (n(m.in_channels), n(m.context_in_dim), n(m.vec_in_dim));
    let scores = b * heads * l * l;
    let rope = l * head_dim * 2;
    let modulation = b * h * 20 * 4;

    let block = |act: Count, f32s: Count, quantized: Count, w: Count| {
        (tokens * act + scores + rope) * a
            + tokens * f32s * 4
            + (tokens * quantized).at_32ths(x32)
            + w.at_32ths(w32)
            + modulation
    };
    let double = block(h * 7 + mlp, h * 2 + heads * 2 + 2, h * 3 + mlp, double_w);
    let single = block(h * 5 + mlp, h * 2 + heads * 2 + 1, h * 3 + mlp, single_w);
    // A GPU's pool rounds every buffer up to its size class.
    let rounded = |bytes: Count| bytes + bytes.min(BLOCK_ROUNDING);
    let blocks = n(m.depth) * rounded(double) + n(m.depth_single_blocks) * rounded(single);

    let embedders =
        (img_tokens * c4 + txt_tokens * ctx) * 4 + b * (n(TIME_DIM) * 4 + vec * 2 + h * 8) * 4;
    let final_layer = img_tokens * h * (a + 4) + img_tokens * c4 * (a + 4 * 3);
    let batch = (img_tokens * c4 * 2 + txt_tokens * ctx + b * vec) * 4;
    let classes = 8;
    let generator =
        (n(d.latent_channels) * n(d.latent_height) * n(d.latent_width) + lt * ctx + vec)
            * (classes * 4);
    let tables = l * head_dim * 4;
    let wide = if m.mlp_hidden() > 3 * m.hidden_size {
        mlp
    } else {
        h * 3
    };
    let working = scores * (6 * 4) + tokens * wide * (4 * 4) + RUNTIME_OVERHEAD;
    let activations = (blocks + embedders + final_layer + batch + generator + tables + working)
        .or(BATCH_FIELDS, "the byte count of one batch's activations")?;

    let total = (Count(Some(parameters)) * 3 + Count(Some(adamw)) + Count(Some(activations)))
        .or(BATCH_FIELDS, "the total byte count")?;
    Ok(MemoryEstimate {
        parameters,
        gradients: parameters,
        adamw,
        activations,
        warmup_copy: parameters,
        total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_in_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(44_300_000_000), "41.3 GiB");
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
    }

    /// flux-schnell: 12B parameters at 4 bytes each, twice for AdamW; its
    /// 57 blocks of 24 heads over 4352 tokens keep 24 x 4352^2 BF16 scores each.
    #[test]
    fn flux_schnell_counts_parameters_optimizer_and_attention() {
        let cfg = RunConfig::load("flux-schnell").unwrap();
        let e = estimate_training_bytes(&cfg).unwrap();
        let mut model = Flux::new(&cfg.model);
        let params = try_count_params(&mut model).unwrap();
        assert!(
            (11_000_000_000..13_000_000_000).contains(&params),
            "{params}"
        );
        assert_eq!(
            (e.parameters, e.gradients, e.adamw),
            (4 * params, 4 * params, 8 * params)
        );
        let scores = 57 * 24 * 4352u64 * 4352 * 2;
        assert!(e.activations > scores, "{e:?}");
        assert!(e.activations < 3 * scores, "{e:?}");
        assert_eq!(e.warmup_copy, e.parameters);
        assert_eq!(e.total, e.parameters * 3 + e.adamw + e.activations);
        assert!(
            e.breakdown().starts_with("parameters 44.3 GiB, warm-up's copy 44.3 GiB, gradients 44.3 GiB, AdamW m and v 88.6 GiB, activations "),
            "{}",
            e.breakdown()
        );
    }

    /// Activations grow with the batch, the rest does not.
    #[test]
    fn activations_grow_with_the_batch() {
        let mut cfg = RunConfig::load("flux-small").unwrap();
        cfg.data.batch = 1;
        let one = estimate_training_bytes(&cfg).unwrap();
        cfg.data.batch = 8;
        let eight = estimate_training_bytes(&cfg).unwrap();
        assert_eq!(
            (one.parameters, one.warmup_copy, one.gradients, one.adamw),
            (
                eight.parameters,
                eight.warmup_copy,
                eight.gradients,
                eight.adamw
            )
        );
        assert!(eight.activations > 4 * one.activations, "{one:?} {eight:?}");
        assert_eq!(eight.total - one.total, eight.activations - one.activations);
    }

    /// Sizes that are each in range but overflow together name the fields.
    #[test]
    fn overflow_is_an_error_naming_fields() {
        let mut cfg = RunConfig::load("flux-tiny").unwrap();
        cfg.data.batch = 1 << 24;
        cfg.data.latent_height = 1 << 24;
        cfg.data.latent_width = 1 << 24;
        let e = estimate_training_bytes(&cfg).unwrap_err().to_string();
        assert_eq!(
            e,
            "flux-tiny: data.batch is too large together with data.latent_height, data.latent_width, \
             data.txt_tokens, model.hidden_size, model.num_heads: the byte count of one batch's \
             activations overflows 64 bits; use smaller sizes"
        );
    }
}
