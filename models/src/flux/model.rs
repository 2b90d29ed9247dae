//! Flux.1 (black-forest-labs/flux, src/flux/model.py and modules/layers.py)
//! in the split layout of the production MXFP4 port (SPEC section 8).
//!
//! Every block's big linears are `#[quantize]` fields of the precision plan;
//! modulation, embedders and the final layer stay in high precision. Field
//! names follow the upstream checkpoint keys where the layout allows.
//! Shapes in comments: B batch, L tokens, H hidden, h heads, D head dim.

use mxswitch_macros::{precision, Parameters};
use mxswitch_runtime::linear::QuantLinear;
use mxswitch_runtime::module::{Dense, Scale};
use mxswitch_runtime::ops::{
    gated_residual, modulated_layer_norm, rms_norm_rope, scaled_dot_product_attention, split_fused,
    split_heads,
};
use mxswitch_runtime::{Device, Result, Tensor};

use super::config::FluxConfig;

/// LayerNorm and QK RMSNorm epsilon, as upstream.
const EPS: f32 = 1e-6;
/// Width of the sinusoidal timestep embedding.
pub(crate) const TIME_DIM: usize = 256;

/// in -> H -> SiLU -> H (`MLPEmbedder`).
#[derive(Parameters)]
pub struct MlpEmbedder {
    /// in -> H.
    pub in_layer: Dense,
    /// H -> H.
    pub out_layer: Dense,
}

impl MlpEmbedder {
    fn new(in_dim: usize, hidden: usize) -> Self {
        MlpEmbedder {
            in_layer: Dense::new(in_dim, hidden, true),
            out_layer: Dense::new(hidden, hidden, true),
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.out_layer.forward(&self.in_layer.forward(x)?.silu()?)
    }
}

/// shift, scale and gate, each [B, 1, H].
pub struct ModulationOut {
    /// Added after the scale.
    pub shift: Tensor,
    /// Multiplies as `1 + scale`.
    pub scale: Tensor,
    /// Multiplies a residual branch before it is added.
    pub gate: Tensor,
}

impl ModulationOut {
    /// (1 + scale) * LayerNorm(x) + shift, the LayerNorm without affine
    /// weights: one fused op ([`modulated_layer_norm`]).
    fn modulate_norm(&self, x: &Tensor) -> Result<Tensor> {
        modulated_layer_norm(x, &self.shift, &self.scale, EPS)
    }

    /// x + gate * y, the gated residual add: one fused op ([`gated_residual`]).
    fn gated_add(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        gated_residual(x, &self.gate, y)
    }
}

/// Linear(silu(vec)) split into one or two (shift, scale, gate) triples.
#[derive(Parameters)]
pub struct Modulation {
    /// H -> 3H or 6H, zero-initialized.
    pub lin: Dense,
    /// Two triples (double-stream blocks) or one.
    #[skip]
    pub double: bool,
}

impl Modulation {
    fn new(hidden: usize, double: bool) -> Self {
        let mult = if double { 6 } else { 3 };
        Modulation {
            lin: Dense::new(hidden, mult * hidden, true).zeroed(),
            double,
        }
    }

    /// vec [B, H] -> one or two ModulationOut.
    fn forward(&self, vec: &Tensor) -> Result<Vec<ModulationOut>> {
        let h = self.lin.params.in_features;
        let out = self.lin.forward(&vec.silu()?)?.unsqueeze(1)?; // [B, 1, mult*H]
        let chunks = split_fused(&out, -1, &vec![h; if self.double { 6 } else { 3 }])?;
        Ok(chunks
            .chunks(3)
            .map(|c| ModulationOut {
                shift: c[0].clone(),
                scale: c[1].clone(),
                gate: c[2].clone(),
            })
            .collect())
    }
}

/// RMSNorm of q and k over the head dimension with learnable scales.
#[derive(Parameters)]
pub struct QkNorm {
    /// The scale of q, `[D]`.
    pub query_norm: Scale,
    /// The scale of k, `[D]`.
    pub key_norm: Scale,
}

impl QkNorm {
    fn new(dim: usize) -> Self {
        QkNorm {
            query_norm: Scale::new(dim),
            key_norm: Scale::new(dim),
        }
    }

    /// q and k normalized in f32, cast back to their dtype (v's: all three
    /// come from one projection) so that attention sees one dtype, and
    /// rotated by `pe` (the tables of their positions): one fused op each
    /// ([`rms_norm_rope`]).
    fn forward(&self, q: &Tensor, k: &Tensor, pe: &Rope) -> Result<(Tensor, Tensor)> {
        let qs = self.query_norm.get()?;
        let ks = self.key_norm.get()?;
        let q = rms_norm_rope(q, qs, &pe.cos, &pe.sin, EPS)?;
        let k = rms_norm_rope(k, ks, &pe.cos, &pe.sin, EPS)?;
        Ok((q, k))
    }
}

/// RoPE tables of the joint (text then image) sequence, [L, D/2] each.
pub struct Rope {
    /// cos of each position's angles.
    pub cos: Tensor,
    /// sin of each position's angles.
    pub sin: Tensor,
}

impl Rope {
    /// The tables of positions `start..start + len` (views).
    fn positions(&self, start: usize, len: usize) -> Result<Rope> {
        Ok(Rope {
            cos: self.cos.narrow(0, start, len)?,
            sin: self.sin.narrow(0, start, len)?,
        })
    }
}

/// Attention of rotated q and k, and heads merged back: [B, L, H].
fn attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let x = scaled_dot_product_attention(q, k, v)?; // [B, h, L, D]
    let (b, h, l, d) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
    x.permute(&[0, 2, 1, 3])?.reshape([b, l, h * d])
}

/// A double-stream block: image and text streams with their own weights,
/// joined only in attention. Eight quantized linears.
#[precision(layer)]
pub struct DoubleBlock {
    /// Attention heads (h).
    #[skip]
    pub heads: usize,
    /// The image stream's two modulation triples.
    pub img_mod: Modulation,
    /// The image stream's QK norm.
    pub img_norm: QkNorm,
    /// Image q, k, v: H -> 3H.
    #[quantize]
    pub img_qkv: QuantLinear,
    /// Image attention output: H -> H.
    #[quantize]
    pub img_proj: QuantLinear,
    /// Image MLP in: H -> mlp_ratio H.
    #[quantize]
    pub img_mlp_fc1: QuantLinear,
    /// Image MLP out: mlp_ratio H -> H.
    #[quantize]
    pub img_mlp_fc2: QuantLinear,
    /// The text stream's two modulation triples.
    pub txt_mod: Modulation,
    /// The text stream's QK norm.
    pub txt_norm: QkNorm,
    /// Text q, k, v: H -> 3H.
    #[quantize]
    pub txt_qkv: QuantLinear,
    /// Text attention output: H -> H.
    #[quantize]
    pub txt_proj: QuantLinear,
    /// Text MLP in: H -> mlp_ratio H.
    #[quantize]
    pub txt_mlp_fc1: QuantLinear,
    /// Text MLP out: mlp_ratio H -> H.
    #[quantize]
    pub txt_mlp_fc2: QuantLinear,
}

impl DoubleBlock {
    /// The block's shape for `cfg`, without weights.
    pub fn new(cfg: &FluxConfig) -> Self {
        let (h, m) = (cfg.hidden_size, cfg.mlp_hidden());
        DoubleBlock {
            heads: cfg.num_heads,
            img_mod: Modulation::new(h, true),
            img_norm: QkNorm::new(cfg.head_dim()),
            img_qkv: QuantLinear::new(h, 3 * h, cfg.qkv_bias),
            img_proj: QuantLinear::new(h, h, true),
            img_mlp_fc1: QuantLinear::new(h, m, true),
            img_mlp_fc2: QuantLinear::new(m, h, true),
            txt_mod: Modulation::new(h, true),
            txt_norm: QkNorm::new(cfg.head_dim()),
            txt_qkv: QuantLinear::new(h, 3 * h, cfg.qkv_bias),
            txt_proj: QuantLinear::new(h, h, true),
            txt_mlp_fc1: QuantLinear::new(h, m, true),
            txt_mlp_fc2: QuantLinear::new(m, h, true),
        }
    }

    /// The quantized linears, for counting what they save for backward.
    pub fn quantized(&self) -> [&QuantLinear; 8] {
        [
            &self.img_qkv,
            &self.img_proj,
            &self.img_mlp_fc1,
            &self.img_mlp_fc2,
            &self.txt_qkv,
            &self.txt_proj,
            &self.txt_mlp_fc1,
            &self.txt_mlp_fc2,
        ]
    }

    /// img [B, Li, H], txt [B, Lt, H], vec [B, H] -> new (img, txt).
    pub fn forward(
        &self,
        img: &Tensor,
        txt: &Tensor,
        vec: &Tensor,
        pe: &Rope,
    ) -> Result<(Tensor, Tensor)> {
        let img_mod = self.img_mod.forward(vec)?;
        let txt_mod = self.txt_mod.forward(vec)?;
        let (img1, img2) = (&img_mod[0], &img_mod[1]);
        let (txt1, txt2) = (&txt_mod[0], &txt_mod[1]);

        let img_in = img1.modulate_norm(img)?;
        let (iq, ik, iv) = split_heads(&self.img_qkv.forward(&img_in)?, self.heads)?;
        // Text first in the joint sequence: the text tokens take the first
        // positions of the tables.
        let lt = txt.dims()[1];
        let (iq, ik) = self
            .img_norm
            .forward(&iq, &ik, &pe.positions(lt, img.dims()[1])?)?;
        let txt_in = txt1.modulate_norm(txt)?;
        let (tq, tk, tv) = split_heads(&self.txt_qkv.forward(&txt_in)?, self.heads)?;
        let (tq, tk) = self.txt_norm.forward(&tq, &tk, &pe.positions(0, lt)?)?;

        let q = Tensor::cat(&[&tq, &iq], 2)?;
        let k = Tensor::cat(&[&tk, &ik], 2)?;
        let v = Tensor::cat(&[&tv, &iv], 2)?;
        let attn = attention(&q, &k, &v)?;
        let parts = split_fused(&attn, 1, &[lt, img.dims()[1]])?;
        let (txt_attn, img_attn) = (&parts[0], &parts[1]);

        let img = img1.gated_add(img, &self.img_proj.forward(img_attn)?)?;
        let img_mlp = self
            .img_mlp_fc1
            .forward(&img2.modulate_norm(&img)?)?
            .gelu_tanh()?;
        let img = img2.gated_add(&img, &self.img_mlp_fc2.forward(&img_mlp)?)?;

        let txt = txt1.gated_add(txt, &self.txt_proj.forward(txt_attn)?)?;
        let txt_mlp = self
            .txt_mlp_fc1
            .forward(&txt2.modulate_norm(&txt)?)?
            .gelu_tanh()?;
        let txt = txt2.gated_add(&txt, &self.txt_mlp_fc2.forward(&txt_mlp)?)?;
        Ok((img, txt))
    }
}

/// A single-stream block over the joint sequence, split into four
/// quantized linears: out = fc2(gelu(fc1 h)) + proj(attn), proj without bias.
#[precision(layer)]
pub struct SingleBlock {
    /// Attention heads (h).
    #[skip]
    pub heads: usize,
    /// One modulation triple.
    pub modulation: Modulation,
    /// QK norm.
    pub norm: QkNorm,
    /// q, k, v: H -> 3H.
    #[quantize]
    pub qkv: QuantLinear,
    /// Attention output: H -> H, without bias.
    #[quantize]
    pub proj: QuantLinear,
    /// MLP in: H -> mlp_ratio H.
    #[quantize]
    pub mlp_fc1: QuantLinear,
    /// MLP out: mlp_ratio H -> H.
    #[quantize]
    pub mlp_fc2: QuantLinear,
}

impl SingleBlock {
    /// The block's shape for `cfg`, without weights.
    pub fn new(cfg: &FluxConfig) -> Self {
        let (h, m) = (cfg.hidden_size, cfg.mlp_hidden());
        SingleBlock {
            heads: cfg.num_heads,
            modulation: Modulation::new(h, false),
            norm: QkNorm::new(cfg.head_dim()),
            qkv: QuantLinear::new(h, 3 * h, cfg.qkv_bias),
            proj: QuantLinear::new(h, h, false),
            mlp_fc1: QuantLinear::new(h, m, true),
            mlp_fc2: QuantLinear::new(m, h, true),
        }
    }

    /// The quantized linears, for counting what they save for backward.
    pub fn quantized(&self) -> [&QuantLinear; 4] {
        [&self.qkv, &self.proj, &self.mlp_fc1, &self.mlp_fc2]
    }

    /// x [B, L, H], vec [B, H] -> x.
    pub fn forward(&self, x: &Tensor, vec: &Tensor, pe: &Rope) -> Result<Tensor> {
        let m = &self.modulation.forward(vec)?[0];
        let h = m.modulate_norm(x)?;
        let (q, k, v) = split_heads(&self.qkv.forward(&h)?, self.heads)?;
        let (q, k) = self.norm.forward(&q, &k, pe)?;
        let attn = attention(&q, &k, &v)?;
        let mlp = self.mlp_fc1.forward(&h)?.gelu_tanh()?;
        let out = self
            .proj
            .forward(&attn)?
            .add(&self.mlp_fc2.forward(&mlp)?)?;
        m.gated_add(x, &out)
    }
}

/// Final adaLN modulation and projection back to patch channels.
#[derive(Parameters)]
pub struct LastLayer {
    /// H -> 2H (shift and scale), zero-initialized.
    pub ada_ln_modulation: Dense,
    /// H -> patch channels, zero-initialized.
    pub linear: Dense,
}

impl LastLayer {
    fn forward(&self, x: &Tensor, vec: &Tensor) -> Result<Tensor> {
        let h = self.linear.params.in_features;
        let m = self.ada_ln_modulation.forward(&vec.silu()?)?.unsqueeze(1)?;
        let parts = split_fused(&m, -1, &[h, h])?;
        let (shift, scale) = (&parts[0], &parts[1]);
        self.linear
            .forward(&modulated_layer_norm(x, shift, scale, EPS)?)
    }
}

/// Flux.1: double-stream blocks, then single-stream blocks over the joint
/// sequence. The schedule here is the production one; a RON config or the
/// command line moves the switch (`apply_with`), and may also schedule the
/// recipes of `allow` (NVFP4, FP8 rowwise and 128-block), as base recipes or
/// per-GEMM overrides.
#[precision(mxfp4, switch_to = fp8, at = 12000, allow = [nvfp4, fp8_rowwise, fp8_block])]
pub struct Flux {
    /// The shape it was built from.
    #[skip]
    pub config: FluxConfig,
    /// Patch channels -> H.
    pub img_in: Dense,
    /// Timestep embedding -> H.
    pub time_in: MlpEmbedder,
    /// Pooled text vector -> H.
    pub vector_in: MlpEmbedder,
    /// Guidance embedding -> H, for guidance-distilled models.
    pub guidance_in: Option<MlpEmbedder>,
    /// Text tokens -> H.
    pub txt_in: Dense,
    /// The double-stream blocks, plan layers 0..depth.
    #[layers]
    pub double_blocks: Vec<DoubleBlock>,
    /// The single-stream blocks, the plan layers after them.
    #[layers]
    pub single_blocks: Vec<SingleBlock>,
    /// Final modulation and projection.
    pub final_layer: LastLayer,
}

/// Inputs of one forward pass.
pub struct FluxInput<'a> {
    /// Patchified noisy latents [B, Li, in_channels].
    pub img: &'a Tensor,
    /// Text tokens [B, Lt, context_in_dim].
    pub txt: &'a Tensor,
    /// Timesteps in [0, 1], `[B]`.
    pub timesteps: &'a [f32],
    /// Pooled text vector [B, vec_in_dim].
    pub y: &'a Tensor,
    /// Guidance strengths `[B]`, for `guidance_embed` models.
    pub guidance: Option<&'a [f32]>,
    /// Latent height and width in patches (for the RoPE positions).
    pub patches_hw: (usize, usize),
}

impl Flux {
    /// The model's shape: every layer, no weights.
    pub fn new(cfg: &FluxConfig) -> Self {
        let h = cfg.hidden_size;
        Flux {
            config: cfg.clone(),
            img_in: Dense::new(cfg.in_channels, h, true),
            time_in: MlpEmbedder::new(TIME_DIM, h),
            vector_in: MlpEmbedder::new(cfg.vec_in_dim, h),
            guidance_in: cfg.guidance_embed.then(|| MlpEmbedder::new(TIME_DIM, h)),
            txt_in: Dense::new(cfg.context_in_dim, h, true),
            double_blocks: (0..cfg.depth).map(|_| DoubleBlock::new(cfg)).collect(),
            single_blocks: (0..cfg.depth_single_blocks)
                .map(|_| SingleBlock::new(cfg))
                .collect(),
            final_layer: LastLayer {
                ada_ln_modulation: Dense::new(h, 2 * h, true).zeroed(),
                linear: Dense::new(h, cfg.in_channels, true).zeroed(),
            },
        }
    }

    /// Predicted velocity [B, Li, in_channels].
    pub fn forward(&self, inp: &FluxInput) -> Result<Tensor> {
        let act = inp.img.dtype();
        let device = inp.img.device();
        let mut img = self.img_in.forward(inp.img)?;
        let t_emb = Tensor::from_vec(
            timestep_embedding(inp.timesteps, TIME_DIM),
            [inp.timesteps.len(), TIME_DIM],
            &device,
        )?;
        let mut vec = self.time_in.forward(&t_emb.to_dtype(act)?)?;
        if let Some(g_in) = &self.guidance_in {
            // As upstream: a guidance-distilled model needs its guidance strength.
            let g = inp.guidance.ok_or_else(|| {
                mxswitch_runtime::Error::InvalidOption(
                    "this Flux has a guidance embedder (guidance_embed): pass guidance strengths"
                        .into(),
                )
            })?;
            let g_emb = Tensor::from_vec(
                timestep_embedding(g, TIME_DIM),
                [g.len(), TIME_DIM],
                &device,
            )?;
            vec = vec.add(&g_in.forward(&g_emb.to_dtype(act)?)?)?;
        }
        vec = vec.add(&self.vector_in.forward(inp.y)?)?;
        let mut txt = self.txt_in.forward(inp.txt)?;
        let pe = self.rope(inp.txt.dims()[1], inp.patches_hw, &device)?;
        for block in &self.double_blocks {
            (img, txt) = block.forward(&img, &txt, &vec, &pe)?;
        }
        let lt = txt.dims()[1];
        let mut x = Tensor::cat(&[&txt, &img], 1)?;
        for block in &self.single_blocks {
            x = block.forward(&x, &vec, &pe)?;
        }
        let img = x.narrow(1, lt, x.dims()[1] - lt)?;
        self.final_layer.forward(&img, &vec)
    }

    /// RoPE tables: text tokens at position (0, 0, 0), image patch (r, c) at
    /// (0, r, c); each axis a of width d_a rotates pair j by pos * theta^(-2j/d_a).
    pub fn rope(
        &self,
        txt_tokens: usize,
        (ph, pw): (usize, usize),
        device: &Device,
    ) -> Result<Rope> {
        let cfg = &self.config;
        let half = cfg.head_dim() / 2;
        let l = txt_tokens + ph * pw;
        let (mut cos, mut sin) = (Vec::with_capacity(l * half), Vec::with_capacity(l * half));
        for tok in 0..l {
            let pos = if tok < txt_tokens {
                [0.0f64; 3]
            } else {
                let p = tok - txt_tokens;
                [0.0, (p / pw) as f64, (p % pw) as f64]
            };
            for (axis, &d) in cfg.axes_dim.iter().enumerate() {
                for j in 0..d / 2 {
                    let omega = 1.0 / (cfg.theta as f64).powf(2.0 * j as f64 / d as f64);
                    let angle = pos[axis] * omega;
                    cos.push(angle.cos() as f32);
                    sin.push(angle.sin() as f32);
                }
            }
        }
        Ok(Rope {
            cos: Tensor::from_vec(cos, [l, half], device)?,
            sin: Tensor::from_vec(sin, [l, half], device)?,
        })
    }
}

/// Sinusoidal embedding of t * 1000, cos first (upstream `timestep_embedding`).
pub fn timestep_embedding(t: &[f32], dim: usize) -> Vec<f32> {
    let half = dim / 2;
    let mut out = Vec::with_capacity(t.len() * dim);
    for &ti in t {
        let args: Vec<f64> = (0..half)
            .map(|i| (ti as f64 * 1000.0) * (-(10000f64.ln()) * i as f64 / half as f64).exp())
            .collect();
        out.extend(args.iter().map(|a| a.cos() as f32));
        out.extend(args.iter().map(|a| a.sin() as f32));
    }
    out
}
