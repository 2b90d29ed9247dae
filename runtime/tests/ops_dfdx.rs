//! Forward values and gradients of the ops dfdx 0.13 also has, against dfdx
//! on seeded random inputs.
//!
//! Each case computes y = op(inputs) and L = sum(y * r) for a fixed random r
//! in both libraries and compares y and dL/d(every input). Both compute in
//! f32 with different summation orders, so the tolerance is
//! |ours - dfdx| <= 1e-5 * max(1, |dfdx|) (the largest difference seen is 2e-7).

mod common;

use common::{assert_close, Rng};
use dfdx::prelude::*;
use mxswitch_runtime as rt;

const TOL: f32 = 1e-5;

fn ours(data: &[f32], shape: &[usize]) -> rt::Param {
    rt::Param::new(rt::Tensor::from_slice(data, shape, &rt::Device::Cpu).unwrap()).unwrap()
}

/// L = sum(y * r) on our side, returning y and the gradients of `inputs`.
fn our_grads(y: rt::Tensor, r: &[f32], inputs: &[&rt::Param]) -> (Vec<f32>, Vec<Vec<f32>>) {
    let rt_r = rt::Tensor::from_slice(r, y.dims(), &rt::Device::Cpu).unwrap();
    let grads = y.mul(&rt_r).unwrap().sum_all().unwrap().backward().unwrap();
    let g = inputs
        .iter()
        .map(|p| grads.get(p.id()).unwrap().to_vec_f32().unwrap())
        .collect();
    (y.to_vec_f32().unwrap(), g)
}

fn compare(
    name: &str,
    ours: (Vec<f32>, Vec<Vec<f32>>),
    theirs_y: Vec<f32>,
    theirs_g: Vec<Vec<f32>>,
) {
    assert_close(&format!("{name} forward"), &ours.0, &theirs_y, TOL);
    for (k, (a, b)) in ours.1.iter().zip(&theirs_g).enumerate() {
        assert_close(&format!("{name} d/dinput{k}"), a, b, TOL);
    }
}

/// One-input ops on an [R, C] tensor: the dfdx expression and ours.
macro_rules! unary_case {
    ($rng:expr, [$r:literal, $c:literal], $name:expr, $lo:expr, $hi:expr, |$x:ident| $theirs:expr, |$o:ident| $ours:expr) => {{
        let dev: Cpu = Default::default();
        let data = $rng.vec($r * $c, $lo, $hi);
        let r = $rng.vec($r * $c, -1.0, 1.0);
        let x = dev.tensor_from_vec(data.clone(), Rank2::<$r, $c>::default());
        let $x = x.leaky_trace();
        let y = $theirs;
        let y_vals = y.as_vec();
        let g = (y * dev.tensor_from_vec(r.clone(), Rank2::<$r, $c>::default()))
            .sum()
            .backward();
        let p = ours(&data, &[$r, $c]);
        let $o: &rt::Tensor = &p;
        compare(
            $name,
            our_grads($ours.unwrap(), &r, &[&p]),
            y_vals,
            vec![g.get(&x).as_vec()],
        );
    }};
    ($rng:expr, $name:expr, $lo:expr, $hi:expr, |$x:ident| $theirs:expr, |$o:ident| $ours:expr) => {
        unary_case!($rng, [3, 4], $name, $lo, $hi, |$x| $theirs, |$o| $ours)
    };
}

#[test]
fn unary_ops_match_dfdx() {
    let mut rng = Rng::new(11);
    unary_case!(rng, "exp", -2.0, 2.0, |x| x.exp(), |o| o.exp());
    unary_case!(rng, "ln", 0.2, 3.0, |x| x.ln(), |o| o.log());
    unary_case!(rng, "sqrt", 0.2, 3.0, |x| x.sqrt(), |o| o.sqrt());
    unary_case!(rng, "square", -2.0, 2.0, |x| x.square(), |o| o.sqr());
    unary_case!(rng, "tanh", -2.0, 2.0, |x| x.tanh(), |o| o.tanh());
    unary_case!(rng, "fast_gelu", -4.0, 4.0, |x| x.fast_gelu(), |o| o
        .gelu_tanh());
    unary_case!(
        rng,
        "silu",
        -4.0,
        4.0,
        |x| {
            let s = x.with_empty_tape().sigmoid();
            x * s
        },
        |o| o.silu()
    );
    unary_case!(rng, "softmax", -3.0, 3.0, |x| x.softmax::<Axis<1>>(), |o| o
        .softmax_last_dim());
    unary_case!(
        rng,
        "normalize",
        -3.0,
        3.0,
        |x| x.normalize::<Axis<1>>(1e-5),
        |o| o.layer_norm(1e-5)
    );
    unary_case!(
        rng,
        "scalar_ops",
        -2.0,
        2.0,
        |x| (x * 3.0 + 0.5) / 4.0 - 1.0,
        |o| o
            .mul_scalar(3.0)
            .and_then(|t| t.add_scalar(0.5))
            .and_then(|t| t.div_scalar(4.0))
            .and_then(|t| t.sub_scalar(1.0))
    );
}

/// Two-input element-wise ops, with the second operand broadcast over rows
/// (dfdx `[4]` along Axis<0>) or over columns (`[3]` along Axis<1>, ours `[3, 1]`).
macro_rules! binary_case {
    ($rng:expr, $name:expr, $op:tt, $method:ident) => {{
        let dev: Cpu = Default::default();
        for over_rows in [true, false] {
            let a_data = $rng.vec(12, -2.0, 2.0);
            let n = if over_rows { 4 } else { 3 };
            // Away from zero so division is well conditioned.
            let b_data: Vec<f32> = $rng.vec(n, 0.5, 2.0).iter().map(|&v| if $rng.uniform(0.0, 1.0) < 0.5 { -v } else { v }).collect();
            let r = $rng.vec(12, -1.0, 1.0);
            let a = dev.tensor_from_vec(a_data.clone(), Rank2::<3, 4>::default());
            let (y, g_b) = if over_rows {
                let b = dev.tensor_from_vec(b_data.clone(), Rank1::<4>::default());
                let y = a.leaky_trace() $op b.leaky_trace().broadcast::<Rank2<3, 4>, Axis<0>>();
                let y_vals = y.as_vec();
                let g = (y * dev.tensor_from_vec(r.clone(), Rank2::<3, 4>::default())).sum().backward();
                ((y_vals, g.get(&a).as_vec()), g.get(&b).as_vec())
            } else {
                let b = dev.tensor_from_vec(b_data.clone(), Rank1::<3>::default());
                let y = a.leaky_trace() $op b.leaky_trace().broadcast::<Rank2<3, 4>, Axis<1>>();
                let y_vals = y.as_vec();
                let g = (y * dev.tensor_from_vec(r.clone(), Rank2::<3, 4>::default())).sum().backward();
                ((y_vals, g.get(&a).as_vec()), g.get(&b).as_vec())
            };
            let pa = ours(&a_data, &[3, 4]);
            let pb = ours(&b_data, if over_rows { &[4] } else { &[3, 1] });
            let name = format!("{} ({})", $name, if over_rows { "row broadcast" } else { "column broadcast" });
            compare(&name, our_grads(pa.$method(&pb).unwrap(), &r, &[&pa, &pb]), y.0, vec![y.1, g_b]);
        }
    }};
}

#[test]
fn broadcast_binary_ops_match_dfdx() {
    let mut rng = Rng::new(12);
    binary_case!(rng, "add", +, add);
    binary_case!(rng, "sub", -, sub);
    binary_case!(rng, "mul", *, mul);
    binary_case!(rng, "div", /, div);
}

#[test]
fn reductions_match_dfdx() {
    let dev: Cpu = Default::default();
    let mut rng = Rng::new(13);
    let data = rng.distinct(12, -0.6);
    let x = dev.tensor_from_vec(data.clone(), Rank2::<3, 4>::default());
    let p = ours(&data, &[3, 4]);

    let r = rng.vec(3, -1.0, 1.0);
    let y = x.leaky_trace().sum::<Rank1<3>, Axis<1>>();
    let yv = y.as_vec();
    let g = (y * dev.tensor_from_vec(r.clone(), Rank1::<3>::default()))
        .sum()
        .backward();
    compare(
        "sum axis 1",
        our_grads(p.sum(&[1], false).unwrap(), &r, &[&p]),
        yv,
        vec![g.get(&x).as_vec()],
    );

    let r = rng.vec(4, -1.0, 1.0);
    let y = x.leaky_trace().mean::<Rank1<4>, Axis<0>>();
    let yv = y.as_vec();
    let g = (y * dev.tensor_from_vec(r.clone(), Rank1::<4>::default()))
        .sum()
        .backward();
    compare(
        "mean axis 0",
        our_grads(p.mean(&[0], false).unwrap(), &r, &[&p]),
        yv,
        vec![g.get(&x).as_vec()],
    );

    let r = rng.vec(3, -1.0, 1.0);
    let y = x.leaky_trace().max::<Rank1<3>, Axis<1>>();
    let yv = y.as_vec();
    let g = (y * dev.tensor_from_vec(r.clone(), Rank1::<3>::default()))
        .sum()
        .backward();
    compare(
        "max axis 1",
        our_grads(p.max(&[-1], false).unwrap(), &r, &[&p]),
        yv,
        vec![g.get(&x).as_vec()],
    );
}

#[test]
fn matmul_matches_dfdx() {
    let dev: Cpu = Default::default();
    let mut rng = Rng::new(14);
    let (a_data, b_data) = (rng.vec(5 * 7, -1.0, 1.0), rng.vec(7 * 6, -1.0, 1.0));
    let r = rng.vec(5 * 6, -1.0, 1.0);
    let a = dev.tensor_from_vec(a_data.clone(), Rank2::<5, 7>::default());
    let b = dev.tensor_from_vec(b_data.clone(), Rank2::<7, 6>::default());
    let y = a.leaky_trace().matmul(b.leaky_trace());
    let yv = y.as_vec();
    let g = (y * dev.tensor_from_vec(r.clone(), Rank2::<5, 6>::default()))
        .sum()
        .backward();
    let (pa, pb) = (ours(&a_data, &[5, 7]), ours(&b_data, &[7, 6]));
    compare(
        "matmul",
        our_grads(pa.matmul(&pb).unwrap(), &r, &[&pa, &pb]),
        yv,
        vec![g.get(&a).as_vec(), g.get(&b).as_vec()],
    );

    let (a_data, b_data) = (rng.vec(2 * 3 * 4, -1.0, 1.0), rng.vec(2 * 4 * 5, -1.0, 1.0));
    let r = rng.vec(2 * 3 * 5, -1.0, 1.0);
    let a = dev.tensor_from_vec(a_data.clone(), Rank3::<2, 3, 4>::default());
    let b = dev.tensor_from_vec(b_data.clone(), Rank3::<2, 4, 5>::default());
    let y = a.leaky_trace().matmul(b.leaky_trace());
    let yv = y.as_vec();
    let g = (y * dev.tensor_from_vec(r.clone(), Rank3::<2, 3, 5>::default()))
        .sum()
        .backward();
    let (pa, pb) = (ours(&a_data, &[2, 3, 4]), ours(&b_data, &[2, 4, 5]));
    compare(
        "batched matmul",
        our_grads(pa.matmul(&pb).unwrap(), &r, &[&pa, &pb]),
        yv,
        vec![g.get(&a).as_vec(), g.get(&b).as_vec()],
    );
}

#[test]
fn mse_loss_matches_dfdx() {
    let dev: Cpu = Default::default();
    let mut rng = Rng::new(15);
    let (p_data, t_data) = (rng.vec(24, -2.0, 2.0), rng.vec(24, -2.0, 2.0));
    let pred = dev.tensor_from_vec(p_data.clone(), Rank2::<4, 6>::default());
    let targ = dev.tensor_from_vec(t_data.clone(), Rank2::<4, 6>::default());
    let loss = mse_loss(pred.leaky_trace(), targ);
    let lv = loss.as_vec();
    let g = loss.backward();
    let pp = ours(&p_data, &[4, 6]);
    let target = rt::Tensor::from_slice(&t_data, [4, 6], &rt::Device::Cpu).unwrap();
    let our = rt::ops::mse_loss(&pp, &target).unwrap();
    compare(
        "mse_loss",
        our_grads(our, &[1.0], &[&pp]),
        lv,
        vec![g.get(&pred).as_vec()],
    );
}

/// Inputs above the kernels' parallel threshold (32k elements), so the
/// multi-threaded paths run: element-wise maps, broadcast rows, column and
/// row reductions, softmax and norm rows, a threaded GEMM and a batch of
/// small GEMMs split across threads.
#[test]
fn large_inputs_match_dfdx() {
    let mut rng = Rng::new(16);
    unary_case!(rng, [256, 300], "large exp", -2.0, 2.0, |x| x.exp(), |o| o
        .exp());
    unary_case!(
        rng,
        [256, 300],
        "large softmax",
        -3.0,
        3.0,
        |x| x.softmax::<Axis<1>>(),
        |o| o.softmax_last_dim()
    );
    unary_case!(
        rng,
        [256, 300],
        "large normalize",
        -3.0,
        3.0,
        |x| x.normalize::<Axis<1>>(1e-5),
        |o| o.layer_norm(1e-5)
    );
    unary_case!(
        rng,
        [256, 300],
        "large gelu",
        -3.0,
        3.0,
        |x| x.fast_gelu(),
        |o| o.gelu_tanh()
    );

    let dev: Cpu = Default::default();
    let data = rng.vec(256 * 300, -1.0, 1.0);
    let x = dev.tensor_from_vec(data.clone(), Rank2::<256, 300>::default());
    let p = ours(&data, &[256, 300]);
    let b_data = rng.vec(300, -1.0, 1.0);
    let b = dev.tensor_from_vec(b_data.clone(), Rank1::<300>::default());
    let pb = ours(&b_data, &[300]);
    let r = rng.vec(256 * 300, -1.0, 1.0);
    let y = x.leaky_trace() * b.leaky_trace().broadcast::<Rank2<256, 300>, Axis<0>>();
    let yv = y.as_vec();
    let g = (y * dev.tensor_from_vec(r.clone(), Rank2::<256, 300>::default()))
        .sum()
        .backward();
    compare(
        "large broadcast mul",
        our_grads(p.mul(&pb).unwrap(), &r, &[&p, &pb]),
        yv,
        vec![g.get(&x).as_vec(), g.get(&b).as_vec()],
    );

    let r = rng.vec(300, -1.0, 1.0);
    let y = x.leaky_trace().sum::<Rank1<300>, Axis<0>>();
    let yv = y.as_vec();
    let g = (y * dev.tensor_from_vec(r.clone(), Rank1::<300>::default()))
        .sum()
        .backward();
    compare(
        "large column sum",
        our_grads(p.sum(&[0], false).unwrap(), &r, &[&p]),
        yv,
        vec![g.get(&x).as_vec()],
    );

    let r = rng.vec(256, -1.0, 1.0);
    let y = x.leaky_trace().max::<Rank1<256>, Axis<1>>();
    let yv = y.as_vec();
    let g = (y * dev.tensor_from_vec(r.clone(), Rank1::<256>::default()))
        .sum()
        .backward();
    compare(
        "large row max",
        our_grads(p.max(&[1], false).unwrap(), &r, &[&p]),
        yv,
        vec![g.get(&x).as_vec()],
    );

    let y = x.leaky_trace().square().mean();
    let yv = y.as_vec();
    let g = y.backward();
    compare(
        "large mean_all",
        our_grads(p.sqr().unwrap().mean_all().unwrap(), &[1.0], &[&p]),
        yv,
        vec![g.get(&x).as_vec()],
    );

    let (a_data, b_data) = (rng.vec(128 * 96, -1.0, 1.0), rng.vec(96 * 80, -1.0, 1.0));
    let r = rng.vec(128 * 80, -1.0, 1.0);
    let a = dev.tensor_from_vec(a_data.clone(), Rank2::<128, 96>::default());
    let b = dev.tensor_from_vec(b_data.clone(), Rank2::<96, 80>::default());
    let y = a.leaky_trace().matmul(b.leaky_trace());
    let yv = y.as_vec();
    let g = (y * dev.tensor_from_vec(r.clone(), Rank2::<128, 80>::default()))
        .sum()
        .backward();
    let (pa, pb) = (ours(&a_data, &[128, 96]), ours(&b_data, &[96, 80]));
    compare(
        "large matmul",
        our_grads(pa.matmul(&pb).unwrap(), &r, &[&pa, &pb]),
        yv,
        vec![g.get(&a).as_vec(), g.get(&b).as_vec()],
    );

    let (a_data, b_data) = (
        rng.vec(8 * 16 * 12, -1.0, 1.0),
        rng.vec(8 * 12 * 10, -1.0, 1.0),
    );
    let r = rng.vec(8 * 16 * 10, -1.0, 1.0);
    let a = dev.tensor_from_vec(a_data.clone(), Rank3::<8, 16, 12>::default());
    let b = dev.tensor_from_vec(b_data.clone(), Rank3::<8, 12, 10>::default());
    let y = a.leaky_trace().matmul(b.leaky_trace());
    let yv = y.as_vec();
    let g = (y * dev.tensor_from_vec(r.clone(), Rank3::<8, 16, 10>::default()))
        .sum()
        .backward();
    let (pa, pb) = (ours(&a_data, &[8, 16, 12]), ours(&b_data, &[8, 12, 10]));
    compare(
        "batch of small matmuls",
        our_grads(pa.matmul(&pb).unwrap(), &r, &[&pa, &pb]),
        yv,
        vec![g.get(&a).as_vec(), g.get(&b).as_vec()],
    );
}
