//! Every op's backward pass against central finite differences.
//!
//! For an op `f` and a fixed seeded random weighting `r` of its output, the
//! loss is L = sum(f(x) * r). The analytic gradient from `backward()` is
//! compared with the central difference (L(x + eps e_i) - L(x - eps e_i)) / (2 eps)
//! for every element i of every input, with eps = 1e-3, the forward in f32
//! and L summed in f64. Tolerance: |analytic - numeric| <= 2e-3 * max(1, |numeric|); the
//! largest difference seen is about 1e-4, and a 1% error in a formula fails.

mod common;

use common::{assert_close, Rng};
use mxswitch_runtime::ops::{linear, mse_loss, scaled_dot_product_attention};
use mxswitch_runtime::{no_grad, DType, Device, Param, Result, Tensor};

const EPS: f32 = 1e-3;
const TOL: f32 = 2e-3;

/// An input of the function under test: values and shape.
struct Input {
    data: Vec<f32>,
    shape: Vec<usize>,
}

fn input(data: Vec<f32>, shape: &[usize]) -> Input {
    assert_eq!(data.len(), shape.iter().product::<usize>());
    Input {
        data,
        shape: shape.to_vec(),
    }
}

/// Random values in [lo, hi) of the given shape.
fn rand(rng: &mut Rng, shape: &[usize], lo: f32, hi: f32) -> Input {
    input(rng.vec(shape.iter().product(), lo, hi), shape)
}

fn tensor(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape, &Device::Cpu).unwrap()
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

/// Checks every input's gradient of `sum(f(inputs) * r)` against finite differences.
fn gradcheck(name: &str, inputs: Vec<Input>, f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let mut rng = Rng::new(
        name.bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))),
    );
    let params: Vec<Param> = inputs
        .iter()
        .map(|i| Param::new(tensor(&i.data, &i.shape)).unwrap())
        .collect();
    let tracked: Vec<Tensor> = params.iter().map(|p| p.tensor().clone()).collect();
    let y = f(&tracked).unwrap();
    assert!(y.tracks_grad(), "{name}: output does not track gradients");
    let r = rng.vec(y.elem_count(), -1.0, 1.0);
    let loss = y.mul(&tensor(&r, y.dims())).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();

    for (k, (param, inp)) in params.iter().zip(&inputs).enumerate() {
        let analytic = grads
            .get(param.id())
            .unwrap_or_else(|| panic!("{name}: no gradient for input {k}"));
        assert_eq!(
            analytic.dims(),
            &inp.shape[..],
            "{name}: gradient shape of input {k}"
        );
        let analytic = analytic.to_vec_f32().unwrap();
        let mut numeric = vec![0f32; inp.data.len()];
        for (i, num) in numeric.iter_mut().enumerate() {
            let at = |delta: f32| {
                let plain: Vec<Tensor> = inputs
                    .iter()
                    .enumerate()
                    .map(|(j, x)| {
                        let mut data = x.data.clone();
                        if j == k {
                            data[i] += delta;
                        }
                        tensor(&data, &x.shape)
                    })
                    .collect();
                loss_value(&f, &plain, &r)
            };
            *num = ((at(EPS) - at(-EPS)) / (2.0 * f64::from(EPS))) as f32;
        }
        assert_close(&format!("{name} d/dinput{k}"), &analytic, &numeric, TOL);
    }
}

#[test]
fn broadcast_binary_ops() {
    let mut rng = Rng::new(1);
    gradcheck(
        "add",
        vec![
            rand(&mut rng, &[2, 3, 4], -1.0, 1.0),
            rand(&mut rng, &[3, 1], -1.0, 1.0),
        ],
        |x| x[0].add(&x[1]),
    );
    gradcheck(
        "sub",
        vec![
            rand(&mut rng, &[2, 1, 4], -1.0, 1.0),
            rand(&mut rng, &[3, 4], -1.0, 1.0),
        ],
        |x| x[0].sub(&x[1]),
    );
    gradcheck(
        "mul",
        vec![
            rand(&mut rng, &[3, 4], -1.0, 1.0),
            rand(&mut rng, &[4], -1.0, 1.0),
        ],
        |x| x[0].mul(&x[1]),
    );
    gradcheck(
        "div",
        vec![
            rand(&mut rng, &[2, 3], -1.0, 1.0),
            rand(&mut rng, &[2, 1], 0.5, 2.0),
        ],
        |x| x[0].div(&x[1]),
    );
    // The same tensor on both sides: gradients from both uses add up.
    gradcheck("mul_self", vec![rand(&mut rng, &[5], -1.0, 1.0)], |x| {
        x[0].mul(&x[0])
    });
}

#[test]
fn scalar_ops() {
    let mut rng = Rng::new(2);
    gradcheck("affine", vec![rand(&mut rng, &[6], -1.0, 1.0)], |x| {
        x[0].affine(-1.5, 0.25)
    });
    gradcheck("scalars", vec![rand(&mut rng, &[2, 3], -1.0, 1.0)], |x| {
        x[0].add_scalar(1.0)?
            .mul_scalar(3.0)?
            .sub_scalar(0.5)?
            .div_scalar(4.0)?
            .neg()
    });
}

#[test]
fn reductions() {
    let mut rng = Rng::new(3);
    gradcheck(
        "sum_axes",
        vec![rand(&mut rng, &[2, 3, 4], -1.0, 1.0)],
        |x| x[0].sum(&[0, 2], false),
    );
    gradcheck(
        "sum_keepdim",
        vec![rand(&mut rng, &[2, 3, 4], -1.0, 1.0)],
        |x| x[0].sum(&[-1], true),
    );
    gradcheck("mean", vec![rand(&mut rng, &[3, 5], -1.0, 1.0)], |x| {
        x[0].mean(&[1], true)
    });
    gradcheck(
        "sum_all_mean_all",
        vec![rand(&mut rng, &[3, 2], -1.0, 1.0)],
        |x| x[0].sum_all()?.add(&x[0].mean_all()?.mul_scalar(3.0)?),
    );
    gradcheck(
        "max_last",
        vec![input(rng.distinct(12, -0.5), &[3, 4])],
        |x| x[0].max(&[-1], false),
    );
    gradcheck(
        "max_axes",
        vec![input(rng.distinct(24, -1.0), &[2, 3, 4])],
        |x| x[0].max(&[0, 2], true),
    );
}

#[test]
fn views_and_joins() {
    let mut rng = Rng::new(4);
    gradcheck("reshape", vec![rand(&mut rng, &[2, 6], -1.0, 1.0)], |x| {
        x[0].reshape([3, 4])?.exp()
    });
    gradcheck(
        "permute",
        vec![rand(&mut rng, &[2, 3, 4], -1.0, 1.0)],
        |x| x[0].permute(&[2, 0, 1])?.sqr(),
    );
    gradcheck(
        "transpose_contiguous",
        vec![rand(&mut rng, &[3, 4], -1.0, 1.0)],
        |x| x[0].t()?.contiguous()?.reshape([2, 6]),
    );
    gradcheck("narrow", vec![rand(&mut rng, &[3, 5], -1.0, 1.0)], |x| {
        x[0].narrow(1, 1, 3)?.sqr()
    });
    gradcheck(
        "cat",
        vec![
            rand(&mut rng, &[2, 1, 3], -1.0, 1.0),
            rand(&mut rng, &[2, 2, 3], -1.0, 1.0),
            rand(&mut rng, &[2, 3, 3], -1.0, 1.0),
        ],
        |x| Tensor::cat(&[&x[0], &x[1].sqr()?, &x[2]], 1),
    );
    gradcheck("split", vec![rand(&mut rng, &[4, 5], -1.0, 1.0)], |x| {
        let parts = x[0].split(-1, &[2, 3])?;
        Tensor::cat(&[&parts[1].exp()?, &parts[0].mul_scalar(2.0)?], 1)
    });
    gradcheck(
        "broadcast_as",
        vec![rand(&mut rng, &[3, 1], -1.0, 1.0)],
        |x| x[0].broadcast_as([2, 3, 4])?.sqr(),
    );
    gradcheck(
        "unsqueeze_squeeze",
        vec![rand(&mut rng, &[3, 2], -1.0, 1.0)],
        |x| x[0].unsqueeze(1)?.mul_scalar(2.0)?.squeeze(1),
    );
}

#[test]
fn unary_ops() {
    let mut rng = Rng::new(5);
    // (name, input range, op)
    type UnaryCase = (&'static str, f32, f32, fn(&Tensor) -> Result<Tensor>);
    let ops: [UnaryCase; 8] = [
        ("exp", -1.0, 1.0, Tensor::exp),
        ("log", 0.5, 2.0, Tensor::log),
        ("sqrt", 0.5, 2.0, Tensor::sqrt),
        ("rsqrt", 0.5, 2.0, Tensor::rsqrt),
        ("sqr", -1.0, 1.0, Tensor::sqr),
        ("tanh", -2.0, 2.0, Tensor::tanh),
        ("silu", -3.0, 3.0, Tensor::silu),
        ("gelu_tanh", -3.0, 3.0, Tensor::gelu_tanh),
    ];
    for (name, lo, hi, op) in ops {
        gradcheck(name, vec![rand(&mut rng, &[3, 4], lo, hi)], |x| op(&x[0]));
    }
}

#[test]
fn network_ops() {
    let mut rng = Rng::new(6);
    gradcheck("softmax", vec![rand(&mut rng, &[3, 5], -2.0, 2.0)], |x| {
        x[0].softmax_last_dim()
    });
    gradcheck(
        "layer_norm",
        vec![rand(&mut rng, &[3, 8], -2.0, 2.0)],
        |x| x[0].layer_norm(1e-5),
    );
    gradcheck(
        "rms_norm",
        vec![
            rand(&mut rng, &[2, 3, 8], -2.0, 2.0),
            rand(&mut rng, &[8], 0.5, 1.5),
        ],
        |x| x[0].rms_norm(&x[1], 1e-6),
    );
    let angles = rng.vec(3 * 4, -3.0, 3.0);
    let cos = tensor(&angles.iter().map(|a| a.cos()).collect::<Vec<_>>(), &[3, 4]);
    let sin = tensor(&angles.iter().map(|a| a.sin()).collect::<Vec<_>>(), &[3, 4]);
    gradcheck(
        "rope_interleaved",
        vec![rand(&mut rng, &[2, 2, 3, 8], -1.0, 1.0)],
        |x| x[0].rope_interleaved(&cos, &sin),
    );
    gradcheck(
        "attention",
        vec![
            rand(&mut rng, &[1, 2, 3, 4], -1.0, 1.0),
            rand(&mut rng, &[1, 2, 5, 4], -1.0, 1.0),
            rand(&mut rng, &[1, 2, 5, 3], -1.0, 1.0),
        ],
        |x| scaled_dot_product_attention(&x[0], &x[1], &x[2]),
    );
    gradcheck(
        "mse_loss",
        vec![
            rand(&mut rng, &[3, 4], -1.0, 1.0),
            rand(&mut rng, &[3, 4], -1.0, 1.0),
        ],
        |x| mse_loss(&x[0], &x[1]),
    );
}

#[test]
fn matmul_and_linear() {
    let mut rng = Rng::new(7);
    gradcheck(
        "matmul",
        vec![
            rand(&mut rng, &[3, 4], -1.0, 1.0),
            rand(&mut rng, &[4, 5], -1.0, 1.0),
        ],
        |x| x[0].matmul(&x[1]),
    );
    gradcheck(
        "matmul_batch_broadcast",
        vec![
            rand(&mut rng, &[2, 1, 3, 4], -1.0, 1.0),
            rand(&mut rng, &[1, 2, 4, 2], -1.0, 1.0),
        ],
        |x| x[0].matmul(&x[1]),
    );
    gradcheck(
        "matmul_transposed_views",
        vec![
            rand(&mut rng, &[4, 3], -1.0, 1.0),
            rand(&mut rng, &[5, 4], -1.0, 1.0),
        ],
        |x| x[0].t()?.matmul(&x[1].t()?),
    );
    gradcheck(
        "linear_bias",
        vec![
            rand(&mut rng, &[2, 3, 4], -1.0, 1.0),
            rand(&mut rng, &[5, 4], -1.0, 1.0),
            rand(&mut rng, &[5], -1.0, 1.0),
        ],
        |x| linear(&x[0], &x[1], Some(&x[2])),
    );
    gradcheck(
        "linear_no_bias",
        vec![
            rand(&mut rng, &[3, 4], -1.0, 1.0),
            rand(&mut rng, &[2, 4], -1.0, 1.0),
        ],
        |x| linear(&x[0], &x[1], None),
    );
}

/// A small block in the shape of Flux's: norm, linear, gelu, residual.
#[test]
fn composed_block() {
    let mut rng = Rng::new(8);
    gradcheck(
        "block",
        vec![
            rand(&mut rng, &[2, 3, 4], -1.0, 1.0),
            rand(&mut rng, &[6, 4], -0.5, 0.5),
            rand(&mut rng, &[4, 6], -0.5, 0.5),
        ],
        |x| {
            let h = linear(&x[0].layer_norm(1e-6)?, &x[1], None)?.gelu_tanh()?;
            x[0].add(&linear(&h, &x[2], None)?)
        },
    );
}

/// The f32 <-> bf16 cast passes gradients straight through, cast back:
/// d/dx sum(f32(bf16(x)) * r) = f32(bf16(r)). Finite differences cannot see
/// through bf16 rounding, so this one is checked in closed form.
#[test]
fn bf16_cast_is_straight_through() {
    let mut rng = Rng::new(9);
    let x = Param::new(tensor(&rng.vec(10, -1.0, 1.0), &[10])).unwrap();
    let r = rng.vec(10, -1.0, 1.0);
    let y = x
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let grads = y
        .mul(&tensor(&r, &[10]))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let got = grads.get(x.id()).unwrap().to_vec_f32().unwrap();
    let want: Vec<f32> = r
        .iter()
        .map(|&v| mxswitch_runtime::formats::bf16::round(v))
        .collect();
    assert_eq!(got, want);
}
