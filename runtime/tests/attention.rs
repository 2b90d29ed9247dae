//! Fused attention against the unfused composition (matmul, softmax,
//! matmul) on the CPU: outputs and all three gradients, f32 and BF16, shapes
//! that do not divide the tiles; and its memory: what the tape keeps grows
//! linearly with the sequence. Finite differences are in ops_gradcheck.rs.

mod common;

use common::Rng;
use mxswitch_runtime::ops::{attention_unfused, scaled_dot_product_attention};
use mxswitch_runtime::{DType, Device, Param, Result, Tensor};

/// The largest |a - b| / max(1, |b|) over two equal-length vectors.
fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

type Attn = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;

/// o, dq, dk, dv of `f` for the loss sum(o * r).
fn run(
    f: Attn,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: [[usize; 4]; 3],
    r: &[f32],
    dtype: DType,
) -> Vec<Vec<f32>> {
    let p = |x: &[f32], d: [usize; 4]| {
        let t = Tensor::from_slice(x, d, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        Param::new(t).unwrap()
    };
    let (qp, kp, vp) = (p(q, dims[0]), p(k, dims[1]), p(v, dims[2]));
    let o = f(&qp, &kp, &vp).unwrap();
    let rt = Tensor::from_slice(r, o.dims(), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let grads = o
        .mul(&rt)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = |p: &Param| grads.get(p.id()).unwrap().to_vec_f32().unwrap();
    vec![o.to_vec_f32().unwrap(), g(&qp), g(&kp), g(&vp)]
}

#[test]
fn fused_matches_unfused_in_f32_and_bf16() {
    let mut rng = Rng::new(11);
    // (batch, heads, L, S, D, Dv): single tiles, ragged tiles, S != L.
    for (b, h, l, s, d, dv) in [
        (1, 1, 5, 5, 8, 8),
        (2, 3, 70, 130, 16, 8),
        (1, 2, 200, 64, 32, 32),
    ] {
        let dims = [[b, h, l, d], [b, h, s, d], [b, h, s, dv]];
        let n = |d: [usize; 4]| d.iter().product::<usize>();
        let q = rng.vec(n(dims[0]), -2.0, 2.0);
        let k = rng.vec(n(dims[1]), -2.0, 2.0);
        let v = rng.vec(n(dims[2]), -1.0, 1.0);
        let r = rng.vec(b * h * l * dv, -1.0, 1.0);
        for (dtype, bound) in [(DType::F32, 2e-5), (DType::BF16, 2e-2)] {
            let fused = run(scaled_dot_product_attention, &q, &k, &v, dims, &r, dtype);
            let plain = run(attention_unfused, &q, &k, &v, dims, &r, dtype);
            for (name, (a, e)) in ["o", "dq", "dk", "dv"].iter().zip(fused.iter().zip(&plain)) {
                let err = max_rel(a, e);
                println!("{dtype} b{b} h{h} L{l} S{s} D{d} Dv{dv} {name}: max rel diff {err:.2e} (bound {bound:.0e})");
                assert!(err <= bound, "{dtype} L{l} S{s} {name}: {err} > {bound}");
            }
        }
    }
}

#[test]
fn what_the_tape_keeps_grows_linearly_with_the_sequence() {
    let kept = |l: usize, f: Attn| {
        let x = Param::new(Tensor::ones([1, 2, l, 16], DType::F32, &Device::Cpu).unwrap()).unwrap();
        let o = f(&x, &x, &x).unwrap();
        o.sum_all().unwrap().saved_bytes().total()
    };
    let (fused_1k, fused_4k) = (
        kept(1024, scaled_dot_product_attention),
        kept(4096, scaled_dot_product_attention),
    );
    println!("fused: {fused_1k} bytes at L=1024, {fused_4k} at L=4096");
    assert!(fused_4k <= 4 * fused_1k + 64, "linear in L");
    // 2 heads x 4096^2 f32 scores: what the unfused path keeps for softmax alone.
    let scores = 2 * 4096 * 4096 * 4;
    assert!(
        fused_4k < scores / 50,
        "{fused_4k} bytes, scores alone are {scores}"
    );
    let plain_1k = kept(1024, attention_unfused);
    assert!(
        plain_1k > 2 * 1024 * 1024 * 4,
        "the unfused path keeps its scores: {plain_1k}"
    );
}

#[test]
fn bad_shapes_are_one_error_naming_all_three() {
    let t = |d: &[usize]| Tensor::zeros(d, DType::F32, &Device::Cpu).unwrap();
    let e =
        scaled_dot_product_attention(&t(&[1, 4, 8]), &t(&[1, 5, 7]), &t(&[1, 5, 8])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "shape error: attention: q [1, 4, 8], k [1, 5, 7], v [1, 5, 8] do not fit; expected [.., L, D], [.., S, D], [.., S, Dv] with equal leading dims"
    );
}
