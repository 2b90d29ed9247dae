//! Seeded synthetic data for rectified-flow training, and the 2x2 patchify.
//!
//! There are a few "classes", each a fixed smooth latent pattern with its own
//! text tokens and pooled vector. A sample is its class pattern plus a little
//! noise, so the velocity the model must predict depends on the text: the
//! loss can fall well below its starting value of about 1 + |x0|^2.

use mxswitch_runtime::formats::bf16;
use mxswitch_runtime::module::SplitMix64;
use mxswitch_runtime::{DType, Device, Result, Tensor};

use super::config::{DataConfig, FluxConfig};

/// Number of distinct classes in the synthetic data.
const CLASSES: usize = 8;
/// Spread of the class patterns' channel levels: large enough that learning
/// the class-dependent part of the velocity clearly lowers the loss.
const PATTERN_SCALE: f32 = 1.5;
/// Standard deviation of the per-sample deviation from the class pattern.
const SAMPLE_NOISE: f32 = 0.05;

/// One training batch.
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
        let d = &self.data;
        let (c, h, w) = (d.latent_channels, d.latent_height, d.latent_width);
        let mut rng = SplitMix64::new(
            self.seed
                .wrapping_mul(0x9E37_79B9)
                .wrapping_add(step)
                .wrapping_mul(0xD134_2543_DE82_EF95),
        );
        let bf16_txt = act == DType::BF16;
        let (mut xt, mut target, mut txt, mut txt_bits, mut y, mut ts) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        for _ in 0..d.batch {
            let class = (rng.next_u64() % CLASSES as u64) as usize;
            let t = rng.next_f64() as f32;
            let mut x_t = Vec::with_capacity(c * h * w);
            let mut v = Vec::with_capacity(c * h * w);
            for &p in &self.patterns[class] {
                let x0 = p + SAMPLE_NOISE * rng.normal();
                let noise = rng.normal();
                x_t.push((1.0 - t) * x0 + t * noise);
                v.push(noise - x0);
            }
            xt.extend(patchify(&x_t, c, h, w));
            target.extend(patchify(&v, c, h, w));
            match bf16_txt {
                true => txt_bits.extend_from_slice(&self.texts_bf16[class]),
                false => txt.extend_from_slice(&self.texts[class]),
            }
            y.extend_from_slice(&self.vectors[class]);
            ts.push(t);
        }
        let (b, li) = (d.batch, (h / 2) * (w / 2));
        let dev = Device::Cpu;
        Ok(Batch {
            img: Tensor::from_vec(xt, [b, li, 4 * c], &dev)?.to_dtype(act)?,
            txt: match bf16_txt {
                true => Tensor::from_bf16_bits(txt_bits, [b, d.txt_tokens, self.context], &dev)?,
                false => {
                    Tensor::from_vec(txt, [b, d.txt_tokens, self.context], &dev)?.to_dtype(act)?
                }
            },
            y: Tensor::from_vec(y, [b, self.vec_dim], &dev)?.to_dtype(act)?,
            timesteps: ts,
            target: Tensor::from_vec(target, [b, li, 4 * c], &dev)?,
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
