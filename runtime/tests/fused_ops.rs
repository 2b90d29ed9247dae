//! The fused modulation ops (`ops::modulated_layer_norm`,
//! `ops::gated_residual`) on the CPU, the reference backend:
//!
//! - f32 forward: the bits of the unfused composition they replace
//!   (`x.layer_norm(eps).mul(&scale.add_scalar(1)).add(&shift)` and
//!   `x.add(&gate.mul(&y))`), the same f32 operations in the same order;
//! - BF16 forward: the f32 result on the widened inputs rounded once (bit
//!   for bit), and within the composition's own rounding error of its
//!   BF16 result: u = 2^-8, |fused - composition| <= u (3.1 |t| + 2.1 |out|)
//!   for the norm (t = LN(x) (1 + scale): the composition rounds LN, 1 +
//!   scale, the product and the sum) and <= u (1.1 |gate y| + 2.1 |out|)
//!   for the residual;
//! - backward: the composition's gradients within 1e-5 max|ref| in f32
//!   (sums in f64 where the composition adds in f32), dx and dy of the
//!   residual bit for bit (the same ops); and every input's gradient
//!   against central finite differences (eps 1e-3, loss summed in f64,
//!   |analytic - numeric| <= 2e-3 max(1, |numeric|), as ops_gradcheck.rs).

mod common;

use common::{assert_close, Rng};
use mxswitch_runtime::ops::{gated_residual, modulated_layer_norm};
use mxswitch_runtime::{no_grad, DType, Device, Error, Param, Result, Tensor};

const EPS: f32 = 1e-6;
/// BF16's unit roundoff.
const U: f32 = 1.0 / 256.0;

fn tensor(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape, &Device::Cpu).unwrap()
}

/// Flux's modulation layout: `[B, 1, 3H]` split into shift, scale and gate,
/// strided views of one buffer (packed by the fused ops).
fn modulation(rng: &mut Rng, b: usize, h: usize) -> (Tensor, Tensor, Tensor) {
    let m = tensor(&rng.vec(b * 3 * h, -1.5, 1.5), &[b, 1, 3 * h]);
    let p = m.split(-1, &[h, h, h]).unwrap();
    (p[0].clone(), p[1].clone(), p[2].clone())
}

fn composed_norm(x: &Tensor, shift: &Tensor, scale: &Tensor) -> Result<Tensor> {
    x.layer_norm(EPS)?.mul(&scale.add_scalar(1.0)?)?.add(shift)
}

fn composed_residual(x: &Tensor, gate: &Tensor, y: &Tensor) -> Result<Tensor> {
    x.add(&gate.mul(y)?)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec_f32()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn modulated_norm_f32_is_the_composition_bit_for_bit() {
    let mut rng = Rng::new(1);
    for (b, l, h) in [(1, 9, 64), (3, 7, 40), (2, 5, 3)] {
        let x = tensor(&rng.vec(b * l * h, -3.0, 3.0), &[b, l, h]);
        let (shift, scale, _) = modulation(&mut rng, b, h);
        let fused = modulated_layer_norm(&x, &shift, &scale, EPS).unwrap();
        let composed = composed_norm(&x, &shift, &scale).unwrap();
        assert_eq!(fused.dims(), &[b, l, h]);
        assert_eq!(bits(&fused), bits(&composed), "[{b}, {l}, {h}]");
    }
}

#[test]
fn gated_residual_f32_is_the_composition_bit_for_bit() {
    let mut rng = Rng::new(2);
    for (b, l, h) in [(1, 9, 64), (3, 7, 40), (2, 5, 3)] {
        let x = tensor(&rng.vec(b * l * h, -3.0, 3.0), &[b, l, h]);
        let y = tensor(&rng.vec(b * l * h, -3.0, 3.0), &[b, l, h]);
        let (_, _, gate) = modulation(&mut rng, b, h);
        let fused = gated_residual(&x, &gate, &y).unwrap();
        assert_eq!(
            bits(&fused),
            bits(&composed_residual(&x, &gate, &y).unwrap())
        );
    }
}

/// Checks the BF16 result of `fused` against its f32 result on the widened
/// inputs (rounded once: equal bits) and against the BF16 composition
/// within `bound(i, f32 reference)`.
fn check_bf16(
    what: &str,
    inputs: &[Tensor],
    fused: impl Fn(&[Tensor]) -> Result<Tensor>,
    composed: impl Fn(&[Tensor]) -> Result<Tensor>,
    bound: impl Fn(usize, &[Tensor]) -> f32,
) {
    let bf: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.to_dtype(DType::BF16).unwrap())
        .collect();
    let wide: Vec<Tensor> = bf.iter().map(|t| t.to_dtype(DType::F32).unwrap()).collect();
    let got = fused(&bf).unwrap();
    assert_eq!(got.dtype(), DType::BF16);
    let once = fused(&wide).unwrap().to_dtype(DType::BF16).unwrap();
    assert_eq!(
        got.to_vec_bf16_bits().unwrap(),
        once.to_vec_bf16_bits().unwrap(),
        "{what}: BF16 is not the f32 result rounded once"
    );
    let (got, comp) = (
        got.to_vec_f32().unwrap(),
        composed(&bf).unwrap().to_vec_f32().unwrap(),
    );
    let mut worst = 0f32;
    for (i, (g, c)) in got.iter().zip(&comp).enumerate() {
        let allowed = bound(i, &wide);
        assert!(
            (g - c).abs() <= allowed,
            "{what}: element {i}: fused {g}, composition {c}, allowed {allowed}"
        );
        worst = worst.max((g - c).abs() / allowed.max(f32::MIN_POSITIVE));
    }
    println!("{what}: worst |fused - composition| / bound = {worst:.3}");
}

#[test]
fn bf16_results_are_rounded_once_and_near_the_composition() {
    let mut rng = Rng::new(3);
    let (b, l, h) = (2, 6, 48);
    let x = tensor(&rng.vec(b * l * h, -3.0, 3.0), &[b, l, h]);
    let y = tensor(&rng.vec(b * l * h, -3.0, 3.0), &[b, l, h]);
    let (shift, scale, gate) = modulation(&mut rng, b, h);

    let norm = |t: &[Tensor]| modulated_layer_norm(&t[0], &t[1], &t[2], EPS);
    check_bf16(
        "modulated_layer_norm",
        &[x.clone(), shift.clone(), scale.clone()],
        norm,
        |t| composed_norm(&t[0], &t[1], &t[2]),
        |i, w| {
            let t = w[0]
                .layer_norm(EPS)
                .unwrap()
                .mul(&w[2].add_scalar(1.0).unwrap())
                .unwrap();
            let out = norm(w).unwrap().to_vec_f32().unwrap();
            U * (3.1 * t.to_vec_f32().unwrap()[i].abs() + 2.1 * out[i].abs())
        },
    );
    let res = |t: &[Tensor]| gated_residual(&t[0], &t[1], &t[2]);
    check_bf16(
        "gated_residual",
        &[x, gate, y],
        res,
        |t| composed_residual(&t[0], &t[1], &t[2]),
        |i, w| {
            let gy = w[1].mul(&w[2]).unwrap().to_vec_f32().unwrap();
            let out = res(w).unwrap().to_vec_f32().unwrap();
            U * (1.1 * gy[i].abs() + 2.1 * out[i].abs())
        },
    );
}

/// Gradients of loss = sum(f(inputs) * r) for every input.
fn grads(f: &dyn Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor], r: &[f32]) -> Vec<Vec<f32>> {
    let params: Vec<Param> = inputs
        .iter()
        .map(|t| Param::new(t.clone()).unwrap())
        .collect();
    let tracked: Vec<Tensor> = params.iter().map(|p| p.tensor().clone()).collect();
    let y = f(&tracked).unwrap();
    let g = y
        .mul(&tensor(r, y.dims()).to_dtype(y.dtype()).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    params
        .iter()
        .map(|p| {
            let d = g.get(p.id()).expect("every input gets a gradient");
            assert_eq!(d.shape(), p.shape(), "gradient shape");
            assert_eq!(d.dtype(), p.dtype(), "gradient dtype");
            d.to_vec_f32().unwrap()
        })
        .collect()
}

fn assert_within(what: &str, got: &[f32], want: &[f32], rel: f32) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0f32, f32::max);
    println!(
        "{what}: max |diff| {worst:.3e} (allowed {:.3e})",
        rel * scale
    );
    assert!(
        worst <= rel * scale,
        "{what}: max |diff| {worst:.3e} > {:.3e}",
        rel * scale
    );
}

#[test]
fn backward_matches_the_composition() {
    let mut rng = Rng::new(4);
    let (b, l, h) = (3, 7, 40);
    let x = tensor(&rng.vec(b * l * h, -3.0, 3.0), &[b, l, h]);
    let y = tensor(&rng.vec(b * l * h, -3.0, 3.0), &[b, l, h]);
    let (shift, scale, gate) = modulation(&mut rng, b, h);
    let r = rng.vec(b * l * h, -1.0, 1.0);

    let norm_in = [x.clone(), shift, scale];
    let fused = grads(
        &|t| modulated_layer_norm(&t[0], &t[1], &t[2], EPS),
        &norm_in,
        &r,
    );
    let composed = grads(&|t| composed_norm(&t[0], &t[1], &t[2]), &norm_in, &r);
    for (k, name) in ["dx", "dshift", "dscale"].iter().enumerate() {
        assert_within(
            &format!("modulated_layer_norm {name}"),
            &fused[k],
            &composed[k],
            1e-5,
        );
    }

    let res_in = [x, gate, y];
    for dtype in [DType::F32, DType::BF16] {
        let inputs: Vec<Tensor> = res_in.iter().map(|t| t.to_dtype(dtype).unwrap()).collect();
        let fused = grads(&|t| gated_residual(&t[0], &t[1], &t[2]), &inputs, &r);
        let composed = grads(&|t| composed_residual(&t[0], &t[1], &t[2]), &inputs, &r);
        assert_eq!(fused[0], composed[0], "gated_residual dx {dtype}");
        assert_eq!(fused[2], composed[2], "gated_residual dy {dtype}");
        let rel = if dtype == DType::BF16 { 2.0 * U } else { 1e-5 };
        assert_within(
            &format!("gated_residual dgate {dtype}"),
            &fused[1],
            &composed[1],
            rel,
        );
    }
}

/// L = sum(f(x) * r) in f64, without recording.
fn loss_value(f: &dyn Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor], r: &[f32]) -> f64 {
    no_grad(|| {
        let y = f(inputs).unwrap().to_vec_f32().unwrap();
        y.iter()
            .zip(r)
            .map(|(&y, &r)| f64::from(y) * f64::from(r))
            .sum()
    })
}

/// Every input's analytic gradient against central differences.
fn gradcheck(name: &str, inputs: &[Tensor], f: &dyn Fn(&[Tensor]) -> Result<Tensor>) {
    let mut rng = Rng::new(name.len() as u64);
    let out = no_grad(|| f(inputs)).unwrap();
    let r = rng.vec(out.elem_count(), -1.0, 1.0);
    let analytic = grads(f, inputs, &r);
    for (k, inp) in inputs.iter().enumerate() {
        let data = inp.to_vec_f32().unwrap();
        let numeric: Vec<f32> = (0..data.len())
            .map(|i| {
                let at = |delta: f32| {
                    let mut d = data.clone();
                    d[i] += delta;
                    let mut moved = inputs.to_vec();
                    moved[k] = tensor(&d, inp.dims());
                    loss_value(f, &moved, &r)
                };
                ((at(1e-3) - at(-1e-3)) / 2e-3) as f32
            })
            .collect();
        assert_close(&format!("{name} input {k}"), &analytic[k], &numeric, 2e-3);
    }
}

#[test]
fn gradients_match_finite_differences() {
    let mut rng = Rng::new(5);
    let (b, l, h) = (2, 3, 8);
    let x = tensor(&rng.vec(b * l * h, -2.0, 2.0), &[b, l, h]);
    let y = tensor(&rng.vec(b * l * h, -2.0, 2.0), &[b, l, h]);
    let (shift, scale, gate) = modulation(&mut rng, b, h);
    gradcheck("modulated_layer_norm", &[x.clone(), shift, scale], &|t| {
        modulated_layer_norm(&t[0], &t[1], &t[2], EPS)
    });
    gradcheck("gated_residual", &[x, gate, y], &|t| {
        gated_residual(&t[0], &t[1], &t[2])
    });
}

#[test]
fn the_norm_keeps_x_and_two_statistics_per_row() {
    let mut rng = Rng::new(6);
    let (b, l, h) = (2, 5, 16);
    let x = Param::new(tensor(&rng.vec(b * l * h, -2.0, 2.0), &[b, l, h])).unwrap();
    let (shift, scale, _) = modulation(&mut rng, b, h);
    let out = modulated_layer_norm(&x, &shift, &scale, EPS).unwrap();
    let saved = out.saved_bytes();
    // x and scale in f32, then the f32 mean and rstd of each of the b * l rows.
    let want = 4 * (b * l * h + b * h + 2 * b * l);
    assert_eq!(saved.get("modulated_layer_norm"), want);
}

#[test]
fn shapes_and_dtypes_are_checked() {
    let x = Tensor::zeros([2, 3, 8], DType::F32, &Device::Cpu).unwrap();
    let v = Tensor::zeros([2, 1, 8], DType::F32, &Device::Cpu).unwrap();
    let wrong = Tensor::zeros([1, 1, 8], DType::F32, &Device::Cpu).unwrap();
    let e = modulated_layer_norm(&x, &v, &wrong, EPS).unwrap_err();
    assert!(
        matches!(&e, Error::Shape(m) if m.contains("scale [1, 1, 8]") && m.contains("[2, 1, 8]")),
        "{e}"
    );
    let e = gated_residual(&x, &v, &v).unwrap_err();
    assert!(
        matches!(&e, Error::Shape(m) if m.contains("y [2, 1, 8]")),
        "{e}"
    );
    let bf = v.to_dtype(DType::BF16).unwrap();
    let e = gated_residual(&x, &bf, &x).unwrap_err();
    assert!(matches!(e, Error::DType(_)), "{e}");
    let codes = Tensor::zeros([2, 1, 8], DType::U8, &Device::Cpu).unwrap();
    let e = modulated_layer_norm(&x, &codes, &v, EPS).unwrap_err();
    assert!(matches!(e, Error::DType(_)), "{e}");
}

/// Flux's former `split_heads`: reshape, permute and split, each recorded.
fn composed_heads(qkv: &Tensor, heads: usize) -> Result<Vec<Tensor>> {
    let (b, l, h3) = (qkv.dims()[0], qkv.dims()[1], qkv.dims()[2]);
    let x = qkv
        .reshape([b, l, 3, heads, h3 / 3 / heads])?
        .permute(&[2, 0, 3, 1, 4])?;
    x.split(0, &[1, 1, 1])?
        .into_iter()
        .map(|t| t.squeeze(0))
        .collect()
}

/// The pieces of `split` and their gradients (of sum(piece * r_k) over the
/// pieces in `used`), as (values, gradient of the input).
fn pieces_and_grad(
    x: &Tensor,
    used: &[usize],
    split: &dyn Fn(&Tensor) -> Result<Vec<Tensor>>,
) -> (Vec<Vec<u32>>, Vec<u32>) {
    let p = Param::new(x.clone()).unwrap();
    let pieces = split(p.tensor()).unwrap();
    let mut rng = Rng::new(8);
    let mut loss: Option<Tensor> = None;
    for &k in used {
        let r = tensor(
            &rng.vec(pieces[k].elem_count(), -1.0, 1.0),
            pieces[k].dims(),
        );
        let term = pieces[k].mul(&r).unwrap().sum_all().unwrap();
        loss = Some(match loss {
            Some(l) => l.add(&term).unwrap(),
            None => term,
        });
    }
    let g = loss.unwrap().backward().unwrap();
    (
        pieces.iter().map(bits).collect(),
        bits(g.get(p.id()).unwrap()),
    )
}

#[test]
fn split_fused_and_split_heads_are_the_compositions_exactly() {
    use mxswitch_runtime::ops::{split_fused, split_heads};
    let mut rng = Rng::new(7);
    let m = tensor(&rng.vec(2 * 6 * 8, -2.0, 2.0), &[2, 1, 6 * 8]);
    let sizes = [8; 6];
    for used in [&[0, 1, 2, 3, 4, 5][..], &[1, 4]] {
        let fused = pieces_and_grad(&m, used, &|t| split_fused(t, -1, &sizes));
        let composed = pieces_and_grad(&m, used, &|t| t.split(-1, &sizes));
        assert_eq!(fused, composed, "split_fused, pieces {used:?} used");
    }
    let qkv = tensor(&rng.vec(2 * 5 * 3 * 16, -2.0, 2.0), &[2, 5, 48]);
    for used in [&[0, 1, 2][..], &[2]] {
        let fused = pieces_and_grad(&qkv, used, &|t| {
            let (q, k, v) = split_heads(t, 4)?;
            Ok(vec![q, k, v])
        });
        let composed = pieces_and_grad(&qkv, used, &|t| composed_heads(t, 4));
        assert_eq!(fused, composed, "split_heads, parts {used:?} used");
    }
    let (q, _, _) = split_heads(&qkv, 4).unwrap();
    assert_eq!(q.dims(), &[2, 4, 5, 4]);
    assert!(split_heads(&qkv, 5).is_err(), "48 is not 3 * 5 * D");
}

/// Flux's former QK norm and RoPE: cast to f32, RMSNorm with the weight,
/// cast back, rotate with the tables cast to x's dtype.
fn composed_qk(x: &Tensor, w: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let z = x
        .to_dtype(DType::F32)?
        .rms_norm(w, EPS)?
        .to_dtype(x.dtype())?;
    z.rope_interleaved(&cos.to_dtype(x.dtype())?, &sin.to_dtype(x.dtype())?)
}

/// q of a `[2, 9, 3 * 4 * 16]` projection (a strided view), a weight
/// near 1 and RoPE tables of 9 positions.
fn qk_inputs(rng: &mut Rng) -> (Tensor, Tensor, Tensor, Tensor) {
    use mxswitch_runtime::ops::split_heads;
    let qkv = tensor(&rng.vec(2 * 9 * 192, -2.0, 2.0), &[2, 9, 192]);
    let (q, _, _) = split_heads(&qkv, 4).unwrap();
    let w = tensor(&rng.vec(16, 0.5, 1.5), &[16]);
    let angles: Vec<f32> = rng.vec(9 * 8, -3.0, 3.0);
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    (q, w, tensor(&cos, &[9, 8]), tensor(&sin, &[9, 8]))
}

#[test]
fn rms_norm_rope_is_the_composition() {
    use mxswitch_runtime::ops::rms_norm_rope;
    let mut rng = Rng::new(9);
    let (q, w, cos, sin) = qk_inputs(&mut rng);
    let r = rng.vec(q.elem_count(), -1.0, 1.0);
    for dtype in [DType::F32, DType::BF16] {
        let x = q.to_dtype(dtype).unwrap();
        let fused = rms_norm_rope(&x, &w, &cos, &sin, EPS).unwrap();
        let composed = composed_qk(&x, &w, &cos, &sin).unwrap();
        assert_eq!(fused.dtype(), dtype);
        assert_eq!(bits(&fused), bits(&composed), "forward {dtype}");
        let inputs = [x, w.clone()];
        let f = grads(
            &|t| rms_norm_rope(&t[0], &t[1], &cos, &sin, EPS),
            &inputs,
            &r,
        );
        let c = grads(&|t| composed_qk(&t[0], &t[1], &cos, &sin), &inputs, &r);
        // dx: the mean of dy y is an f64 sum here, an f32 one there, so a
        // BF16 dx may round the other way.
        let rel = if dtype == DType::BF16 { U } else { 1e-5 };
        assert_within(&format!("rms_norm_rope dx {dtype}"), &f[0], &c[0], rel);
        assert_within(
            &format!("rms_norm_rope dweight {dtype}"),
            &f[1],
            &c[1],
            1e-5,
        );
    }
    gradcheck("rms_norm_rope", &[q, w], &|t| {
        rms_norm_rope(&t[0], &t[1], &cos, &sin, EPS)
    });
}
