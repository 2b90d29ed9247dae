//! Seeded synthetic data for rectified-flow training, and the 2x2 patchify.
//!
//! There are a few "classes", each a fixed smooth latent pattern with its own
//! text tokens and pooled vector. A sample is its class pattern plus a little
//! noise, so the velocity the model must predict depends on the text: the
//! loss can fall well below its starting value of about 1 + |x0|^2.

use mxswitch_runtime::formats::bf16;
use mxswitch_runtime::module::SplitMix64;
use mxswitch_runtime::{DType, Device, Error, Result, Tensor};

use super::config::{DataConfig, FluxConfig};

/// Number of distinct classes in the synthetic data.
const CLASSES: usize = 8;
/// Spread of the class patterns' channel levels: large enough that learning
/// the class-dependent part of the velocity clearly lowers the loss.
const PATTERN_SCALE: f32 = 1.5;
/// Standard deviation of the per-sample deviation from the class pattern.
const SAMPLE_NOISE: f32 = 0.05;

/// One training batch.
#[derive(Debug)]
pub struct Batch {
    /// Noisy latents x_t, patchified: [B, Li, 4C].
    pub img: Tensor,
    /// Text tokens [B, Lt, context].
    pub txt: Tensor,
    /// Pooled text vectors [B, vec].
    pub y: Tensor,
    /// t ~ U(0, 1), `[B]`.
    pub timesteps: Vec<f32>,
    /// Velocity target noise - x0, patchified: [B, Li, 4C], f32.
    pub target: Tensor,
    /// Latent size in patches.
    pub patches_hw: (usize, usize),
}

impl Batch {
    /// The same batch on another device.
    pub fn to_device(self, device: &Device) -> Result<Batch> {
        if *device == Device::Cpu {
            return Ok(self);
        }
        Ok(Batch {
            img: self.img.to_device(device)?,
            txt: self.txt.to_device(device)?,
            y: self.y.to_device(device)?,
            target: self.target.to_device(device)?,
            ..self
        })
    }
}

/// The generator: class patterns fixed by the seed, batches by (seed, step).
pub struct SyntheticData {
    data: DataConfig,
    context: usize,
    vec_dim: usize,
    seed: u64,
    /// [C*H*W] per class.
    patterns: Vec<Vec<f32>>,
    /// [Lt*context] per class.
    texts: Vec<Vec<f32>>,
    /// The same texts as BF16 bits: a BF16 batch copies them instead of
    /// converting its largest tensor every step (a flux-wide batch's text
    /// is 16.8 M values, which took longer to build than a GPU step).
    texts_bf16: Vec<Vec<u16>>,
    /// [vec] per class.
    vectors: Vec<Vec<f32>>,
}

impl SyntheticData {
    /// The generator of `data`-shaped batches for `model` (its text and
    /// vector widths); the class patterns, texts and vectors are drawn from
    /// `seed` here, once.
    pub fn new(model: &FluxConfig, data: &DataConfig, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed ^ 0xDA7A);
        let (c, h, w) = (data.latent_channels, data.latent_height, data.latent_width);
        let patterns = (0..CLASSES)
            .map(|_| {
                // Per channel: a level plus one slow plane wave. Mostly the
                // class decides the levels, which the model can pick up from
                // the text conditioning quickly; the waves need the positions.
                let mut p = Vec::with_capacity(c * h * w);
                for _ in 0..c {
                    let level = rng.normal() * PATTERN_SCALE;
                    let (fy, fx, phase) = (
                        rng.next_f64() as f32,
                        rng.next_f64() as f32,
                        rng.next_f64() as f32 * std::f32::consts::TAU,
                    );
                    for y in 0..h {
                        for x in 0..w {
                            let arg = std::f32::consts::TAU
                                * (fy * y as f32 / h as f32 + fx * x as f32 / w as f32)
                                + phase;
                            p.push(level + 0.5 * arg.sin());
                        }
                    }
                }
                p
            })
            .collect();
        let texts: Vec<Vec<f32>> = (0..CLASSES)
            .map(|_| {
                (0..data.txt_tokens * model.context_in_dim)
                    .map(|_| rng.normal())
                    .collect()
            })
            .collect();
        let vectors = (0..CLASSES)
            .map(|_| (0..model.vec_in_dim).map(|_| rng.normal()).collect())
            .collect();
        let texts_bf16 = texts
            .iter()
            .map(|t| t.iter().map(|&x| bf16::from_f32(x)).collect())
            .collect();
        SyntheticData {
            data: data.clone(),
            context: model.context_in_dim,
            vec_dim: model.vec_in_dim,
            seed,
            patterns,
            texts,
            texts_bf16,
            vectors,
        }
    }

    /// The batch of training step `step`, in activation dtype `act` (the
    /// target stays f32: the loss is computed in f32).
    pub fn batch(&self, step: u64, act: DType) -> Result<Batch> {
        self.batch_part(step, act, 0..self.data.batch)
    }

    /// The samples `part` of step `step`'s batch, as [`SyntheticData::batch`]
    /// would hold them: a data-parallel rank's share of the global batch.
    /// The samples before `part` are drawn and dropped, so that every
    /// sample is the same whichever rank builds it.
    pub fn batch_part(&self, step: u64, act: DType, part: std::ops::Range<usize>) -> Result<Batch> {
        let d = &self.data;
        let n = d.latent_channels * d.latent_height * d.latent_width;
        let mut rng = SplitMix64::new(
            self.seed
                .wrapping_mul(0x9E37_79B9)
                .wrapping_add(step)
                .wrapping_mul(0xD134_2543_DE82_EF95),
        );
        let mut out = BatchBuilder::new(d, self.context, self.vec_dim, act, part.len());
        let (mut x0, mut noise) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..part.end.min(d.batch) {
            let class = (rng.next_u64() % CLASSES as u64) as usize;
            let t = rng.next_f64() as f32;
            // Drawn interleaved, one deviation then one noise value per element.
            x0.clear();
            noise.clear();
            for &p in &self.patterns[class] {
                x0.push(p + SAMPLE_NOISE * rng.normal());
                noise.push(rng.normal());
            }
            if i < part.start {
                continue;
            }
            let txt = match act {
                DType::BF16 => TextTokens::Bf16(&self.texts_bf16[class]),
                _ => TextTokens::F32(&self.texts[class]),
            };
            out.push(&x0, &noise, t, txt, &self.vectors[class])?;
        }
        out.finish()
    }

    /// Number of classes: a class is a latent pattern, a text and a vector.
    pub fn classes(&self) -> usize {
        CLASSES
    }

    /// A clean latent x0 of `class` ([C, H, W] row-major): the class pattern
    /// plus a little Gaussian noise drawn from `rng`, as a batch draws it.
    pub fn class_latent(&self, class: usize, rng: &mut SplitMix64) -> Vec<f32> {
        self.patterns[class]
            .iter()
            .map(|&p| p + SAMPLE_NOISE * rng.normal())
            .collect()
    }

    /// The text tokens of `class`, [Lt, context] row-major.
    pub fn class_text(&self, class: usize) -> &[f32] {
        &self.texts[class]
    }

    /// The pooled vector of `class`, `[vec]`.
    pub fn class_vector(&self, class: usize) -> &[f32] {
        &self.vectors[class]
    }
}

/// One sample's text tokens, as f32 values or as BF16 bits already rounded
/// (a BF16 batch copies those instead of converting).
#[derive(Clone, Copy, Debug)]
pub enum TextTokens<'a> {
    /// f32 values, converted to the batch's dtype.
    F32(&'a [f32]),
    /// BF16 bits; widened exactly for an f32 batch.
    Bf16(&'a [u16]),
}

/// Rectified flow for one sample: from the clean latent `x0` and the
/// `noise` (both [C, H, W]) at time `t`, the noisy input
/// x_t = (1 - t) x0 + t noise and the velocity target noise - x0.
pub fn rectified_flow(x0: &[f32], noise: &[f32], t: f32) -> (Vec<f32>, Vec<f32>) {
    let xt = x0
        .iter()
        .zip(noise)
        .map(|(&x0, &n)| (1.0 - t) * x0 + t * n)
        .collect();
    let v = x0.iter().zip(noise).map(|(&x0, &n)| n - x0).collect();
    (xt, v)
}

/// Builds a [`Batch`] one sample at a time: every data source (the
/// synthetic generator, precomputed shards) makes its batches here, so the
/// rectified-flow construction, the patchify and the dtypes are the same.
pub struct BatchBuilder {
    c: usize,
    h: usize,
    w: usize,
    txt_tokens: usize,
    context: usize,
    vec_dim: usize,
    act: DType,
    xt: Vec<f32>,
    target: Vec<f32>,
    txt: Vec<f32>,
    txt_bits: Vec<u16>,
    y: Vec<f32>,
    timesteps: Vec<f32>,
}

impl BatchBuilder {
    /// An empty batch of `data`'s latent and text shape, `context`-wide
    /// tokens and `vec_dim`-wide pooled vectors, in activation dtype `act`,
    /// with room for `capacity` samples.
    pub fn new(
        data: &DataConfig,
        context: usize,
        vec_dim: usize,
        act: DType,
        capacity: usize,
    ) -> BatchBuilder {
        let (c, h, w) = (data.latent_channels, data.latent_height, data.latent_width);
        let latent = capacity.saturating_mul(c * h * w);
        let text = capacity.saturating_mul(data.txt_tokens * context);
        let bf16_txt = act == DType::BF16;
        BatchBuilder {
            c,
            h,
            w,
            txt_tokens: data.txt_tokens,
            context,
            vec_dim,
            act,
            xt: Vec::with_capacity(latent),
            target: Vec::with_capacity(latent),
            txt: Vec::with_capacity(if bf16_txt { 0 } else { text }),
            txt_bits: Vec::with_capacity(if bf16_txt { text } else { 0 }),
            y: Vec::with_capacity(capacity.saturating_mul(vec_dim)),
            timesteps: Vec::with_capacity(capacity),
        }
    }

    /// Samples added so far.
    pub fn len(&self) -> usize {
        self.timesteps.len()
    }

    /// True before the first sample.
    pub fn is_empty(&self) -> bool {
        self.timesteps.is_empty()
    }

    /// Add one sample: its clean latent `x0` and `noise` ([C, H, W]), its
    /// time `t`, its text tokens (`[Lt, context]`) and pooled vector (`[vec]`).
    /// The inputs go through [`rectified_flow`] and [`patchify`].
    pub fn push(
        &mut self,
        x0: &[f32],
        noise: &[f32],
        t: f32,
        txt: TextTokens<'_>,
        y: &[f32],
    ) -> Result<()> {
        let (c, h, w) = (self.c, self.h, self.w);
        let text_len = match txt {
            TextTokens::F32(v) => v.len(),
            TextTokens::Bf16(v) => v.len(),
        };
        for (what, got, want) in [
            ("latent", x0.len(), c * h * w),
            ("noise", noise.len(), c * h * w),
            ("text", text_len, self.txt_tokens * self.context),
            ("pooled vector", y.len(), self.vec_dim),
        ] {
            if got != want {
                return Err(Error::Shape(format!(
                    "a batch sample's {what} has {got} values, not {want}"
                )));
            }
        }
        let (xt, v) = rectified_flow(x0, noise, t);
        self.xt.extend(patchify(&xt, c, h, w));
        self.target.extend(patchify(&v, c, h, w));
        match (txt, self.act == DType::BF16) {
            (TextTokens::Bf16(bits), true) => self.txt_bits.extend_from_slice(bits),
            (TextTokens::F32(v), true) => {
                self.txt_bits.extend(v.iter().map(|&x| bf16::from_f32(x)))
            }
            (TextTokens::F32(v), false) => self.txt.extend_from_slice(v),
            (TextTokens::Bf16(bits), false) => {
                self.txt.extend(bits.iter().map(|&b| bf16::to_f32(b)))
            }
        }
        self.y.extend_from_slice(y);
        self.timesteps.push(t);
        Ok(())
    }

    /// The batch of the samples added, in order.
    pub fn finish(self) -> Result<Batch> {
        let (c, h, w, act) = (self.c, self.h, self.w, self.act);
        let (b, li) = (self.timesteps.len(), (h / 2) * (w / 2));
        let dev = Device::Cpu;
        let text_shape = [b, self.txt_tokens, self.context];
        Ok(Batch {
            img: Tensor::from_vec(self.xt, [b, li, 4 * c], &dev)?.to_dtype(act)?,
            txt: match act == DType::BF16 {
                true => Tensor::from_bf16_bits(self.txt_bits, text_shape, &dev)?,
                false => Tensor::from_vec(self.txt, text_shape, &dev)?.to_dtype(act)?,
            },
            y: Tensor::from_vec(self.y, [b, self.vec_dim], &dev)?.to_dtype(act)?,
            timesteps: self.timesteps,
            target: Tensor::from_vec(self.target, [b, li, 4 * c], &dev)?,
            patches_hw: (h / 2, w / 2),
        })
    }
}

/// [C, H, W] -> [(H/2)(W/2), 4C], channels ordered (c, ph, pw) as in
/// Flux's `rearrange(x, "c (h ph) (w pw) -> (h w) (c ph pw)", ph=2, pw=2)`.
pub fn patchify(x: &[f32], c: usize, h: usize, w: usize) -> Vec<f32> {
    let (hp, wp) = (h / 2, w / 2);
    let mut out = Vec::with_capacity(x.len());
    for i in 0..hp {
        for j in 0..wp {
            for ch in 0..c {
                for ph in 0..2 {
                    for pw in 0..2 {
                        out.push(x[ch * h * w + (2 * i + ph) * w + 2 * j + pw]);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BF16 batch is the f32 batch rounded to BF16, the text included
    /// (which comes from the precomputed BF16 copies).
    #[test]
    fn a_bf16_batch_is_the_f32_batch_rounded() {
        let cfg = crate::flux::RunConfig::load("flux-tiny").unwrap();
        let data = SyntheticData::new(&cfg.model, &cfg.data, 3);
        let (a, b) = (
            data.batch(5, DType::F32).unwrap(),
            data.batch(5, DType::BF16).unwrap(),
        );
        for (x, y) in [(&a.txt, &b.txt), (&a.img, &b.img), (&a.y, &b.y)] {
            assert_eq!(y.dtype(), DType::BF16);
            assert_eq!(
                x.to_dtype(DType::BF16).unwrap().to_vec_bf16_bits().unwrap(),
                y.to_vec_bf16_bits().unwrap()
            );
        }
        assert_eq!(
            a.target.to_vec_f32().unwrap(),
            b.target.to_vec_f32().unwrap()
        );
    }

    /// The synthetic batches are pinned bit for bit (an FNV-1a hash of every
    /// value): they are the data of every run and test of `mxswitch train`,
    /// and the batch builder they share with the shard reader must not move
    /// them. The hashes are those of the generator before the builder.
    #[test]
    fn synthetic_batches_are_pinned() {
        let cfg = crate::flux::RunConfig::load("flux-tiny").unwrap();
        let data = SyntheticData::new(&cfg.model, &cfg.data, 3);
        for (act, want) in [
            (DType::F32, 0x1b12_6e67_7460_4e55u64),
            (DType::BF16, 0x6029_81bc_ceb8_2365),
        ] {
            let b = data.batch(5, act).unwrap();
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            let mut eat = |bits: u32| {
                for byte in bits.to_le_bytes() {
                    h ^= byte as u64;
                    h = h.wrapping_mul(0x0100_0000_01b3);
                }
            };
            for t in [&b.img, &b.txt, &b.y, &b.target] {
                match t.dtype() {
                    DType::BF16 => t
                        .to_vec_bf16_bits()
                        .unwrap()
                        .iter()
                        .for_each(|&x| eat(x as u32)),
                    _ => t
                        .to_vec_f32()
                        .unwrap()
                        .iter()
                        .for_each(|&x| eat(x.to_bits())),
                }
            }
            b.timesteps.iter().for_each(|&x| eat(x.to_bits()));
            assert_eq!(h, want, "{act:?}");
        }
    }

    #[test]
    fn the_builder_checks_sample_sizes() {
        let cfg = crate::flux::RunConfig::load("flux-tiny").unwrap();
        let mut b = BatchBuilder::new(&cfg.data, 64, 32, DType::F32, 1);
        let (x, txt, y) = (vec![0.0; 1024], vec![0.0; 512], vec![0.0; 32]);
        let e = b
            .push(&x, &x[..1000], 0.5, TextTokens::F32(&txt), &y)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "shape error: a batch sample's noise has 1000 values, not 1024"
        );
        assert!(b.is_empty());
        b.push(&x, &x, 0.5, TextTokens::F32(&txt), &y).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b.finish().unwrap().img.dims(), [1, 16, 64]);
    }

    #[test]
    fn patchify_orders_channels_c_ph_pw() {
        // C=1, 2x4: values are their own row-major index.
        let x: Vec<f32> = (0..8).map(|v| v as f32).collect();
        assert_eq!(
            patchify(&x, 1, 2, 4),
            vec![0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]
        );
    }
}
