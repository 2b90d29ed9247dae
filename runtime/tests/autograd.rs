//! The tape: closed-form gradients, parameters, no-grad mode, custom ops and
//! their saved-bytes accounting, views, devices and error cases.

mod common;

use common::Rng;
use mxswitch_runtime::ops::{apply_custom, linear, CustomOp};
use mxswitch_runtime::{no_grad, DType, Device, Error, Param, Result, Tensor};

fn t(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape, &Device::Cpu).unwrap()
}

fn param(data: &[f32], shape: &[usize]) -> Param {
    Param::new(t(data, shape)).unwrap()
}

fn grad(grads: &mxswitch_runtime::Gradients, p: &Param) -> Vec<f32> {
    grads
        .get(p.id())
        .expect("parameter has a gradient")
        .to_vec_f32()
        .unwrap()
}

#[test]
fn closed_form_polynomial() {
    // y = x^2 + 5x + exp(x); dy/dx = 2x + 5 + exp(x)
    let x = param(&[3.0, -1.0], &[2]);
    let y = x
        .sqr()
        .unwrap()
        .add(&x.mul_scalar(5.0).unwrap())
        .unwrap()
        .add(&x.exp().unwrap())
        .unwrap();
    let g = grad(&y.sum_all().unwrap().backward().unwrap(), &x);
    let dydx = |x: f32| 2.0 * x + 5.0 + x.exp();
    assert_eq!(g, vec![dydx(3.0), dydx(-1.0)]);
}

#[test]
fn closed_form_linear() {
    // L = sum(x W^T + b); dL/dW[n, k] = sum_m x[m, k], dL/db = M, dL/dx[m, k] = sum_n W[n, k]
    let x = param(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let w = param(&[1.0, 0.0, -1.0, 2.0, 1.0, 0.5], &[2, 3]);
    let b = param(&[0.5, -0.5], &[2]);
    let y = linear(&x, &w, Some(&b)).unwrap();
    assert_eq!(
        y.to_vec_f32().unwrap(),
        vec![
            1.0 - 3.0 + 0.5,
            2.0 + 2.0 + 1.5 - 0.5,
            4.0 - 6.0 + 0.5,
            8.0 + 5.0 + 3.0 - 0.5
        ]
    );
    let grads = y.sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&grads, &w), vec![5.0, 7.0, 9.0, 5.0, 7.0, 9.0]);
    assert_eq!(grad(&grads, &b), vec![2.0, 2.0]);
    assert_eq!(grad(&grads, &x), vec![3.0, 1.0, -0.5, 3.0, 1.0, -0.5]);
    // dW comes out packed: the matmul backward lays it out like W.
    assert!(grads.get(w.id()).unwrap().is_contiguous());
}

#[test]
fn param_used_twice_accumulates_and_unused_param_has_no_gradient() {
    let a = param(&[2.0], &[1]);
    let unused = param(&[1.0], &[1]);
    let y = a.mul(&a).unwrap().add(&a).unwrap(); // dy/da = 2a + 1
    let grads = y.sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&grads, &a), vec![5.0]);
    assert!(grads.get(unused.id()).is_none());
    assert_eq!(grads.len(), 1);
}

#[test]
fn param_set_keeps_id_and_checks_shape() {
    let mut p = param(&[1.0, 2.0], &[2]);
    let id = p.id();
    p.set(t(&[3.0, 4.0], &[2])).unwrap();
    assert_eq!(p.id(), id);
    assert_eq!(p.to_vec_f32().unwrap(), vec![3.0, 4.0]);
    assert!(matches!(p.set(t(&[1.0], &[1])), Err(Error::Shape(_))));
    // Gradients of the new value are still keyed by the same id.
    let grads = p
        .mul_scalar(3.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grads.get(id).unwrap().to_vec_f32().unwrap(), vec![3.0, 3.0]);
}

#[test]
fn no_grad_records_nothing() {
    let x = param(&[1.0, 2.0], &[2]);
    let y = no_grad(|| x.exp().unwrap());
    assert!(!y.tracks_grad());
    assert!(matches!(
        y.sum_all().unwrap().backward(),
        Err(Error::Autograd(_))
    ));
    // The mode is restored afterwards.
    assert!(x.exp().unwrap().tracks_grad());
    assert!(
        !t(&[1.0], &[1]).exp().unwrap().tracks_grad(),
        "no parameter, no tape"
    );
}

#[test]
fn detach_stops_gradients() {
    let x = param(&[2.0], &[1]);
    // y = x * detach(x): dy/dx = detach(x) = 2
    let y = x.mul(&x.detach()).unwrap();
    assert_eq!(
        grad(&y.sum_all().unwrap().backward().unwrap(), &x),
        vec![2.0]
    );
}

#[test]
fn backward_needs_a_scalar_or_a_matching_gradient() {
    let x = param(&[1.0, 2.0], &[2]);
    let y = x.mul_scalar(2.0).unwrap();
    assert!(matches!(y.backward(), Err(Error::Autograd(_))));
    let grads = y.backward_with(&t(&[1.0, 10.0], &[2])).unwrap();
    assert_eq!(grad(&grads, &x), vec![2.0, 20.0]);
    assert!(matches!(
        y.backward_with(&t(&[1.0], &[1])),
        Err(Error::Shape(_))
    ));
}

#[test]
fn deep_tape_does_not_overflow_the_stack() {
    // 100k recorded ops: backward and drop both walk the tape without recursion.
    let x = param(&[1.0], &[1]);
    let mut y = x.tensor().clone();
    for _ in 0..100_000 {
        y = y.add_scalar(1e-5).unwrap();
    }
    let grads = y.sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&grads, &x), vec![1.0]);
    drop(y);
}

#[test]
fn views_share_the_buffer() {
    let x = t(&(0..24).map(|v| v as f32).collect::<Vec<_>>(), &[2, 3, 4]);
    let r = x.reshape([6, 4]).unwrap();
    assert!(r.same_storage(&x));
    let p = x.permute(&[2, 0, 1]).unwrap();
    assert!(p.same_storage(&x) && !p.is_contiguous());
    let n = x.narrow(2, 1, 2).unwrap();
    assert!(n.same_storage(&x));
    assert_eq!(n.to_vec_f32().unwrap()[..4], [1.0, 2.0, 5.0, 6.0]);
    let b = t(&[1.0, 2.0], &[2, 1]).broadcast_as([3, 2, 4]).unwrap();
    assert_eq!(b.layout().strides(), &[0, 1, 0]);
    // A reshape of a strided view must copy, and gets the right order.
    let tr = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).t().unwrap();
    let flat = tr.reshape([6]).unwrap();
    assert!(!flat.same_storage(&tr));
    assert_eq!(
        flat.to_vec_f32().unwrap(),
        vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
}

#[test]
fn shape_errors_are_errors_not_panics() {
    let a = t(&[1.0; 6], &[2, 3]);
    let b = t(&[1.0; 4], &[4]);
    assert!(matches!(a.add(&b), Err(Error::Shape(_))));
    assert!(matches!(a.matmul(&a), Err(Error::Shape(_))));
    assert!(matches!(a.reshape([4]), Err(Error::Shape(_))));
    assert!(matches!(
        a.sum(&[2], false),
        Err(Error::AxisOutOfRange { axis: 2, rank: 2 })
    ));
    assert!(matches!(a.narrow(1, 2, 2), Err(Error::Shape(_))));
    assert!(matches!(a.permute(&[0, 0]), Err(Error::Shape(_))));
    assert!(matches!(Tensor::cat(&[&a, &b], 0), Err(Error::Shape(_))));
    assert!(matches!(a.split(1, &[1, 1]), Err(Error::Shape(_))));
    assert!(matches!(
        Tensor::from_vec(vec![1.0; 5], [2, 3], &Device::Cpu),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        linear(&a, &t(&[1.0; 4], &[2, 2]), None),
        Err(Error::Shape(_))
    ));
    let msg = a.add(&b).unwrap_err().to_string();
    assert!(
        msg.contains("[2, 3]") && msg.contains("[4]"),
        "message names the shapes: {msg}"
    );
}

#[test]
fn dtype_rules() {
    let f = t(&[1.0, 2.5], &[2]);
    let h = f.to_dtype(DType::BF16).unwrap();
    assert!(
        matches!(f.add(&h), Err(Error::DType(_))),
        "no silent promotion"
    );
    let codes = Tensor::from_bytes(vec![1, 2], [2], &Device::Cpu).unwrap();
    assert!(matches!(codes.exp(), Err(Error::DType(_))));
    assert!(matches!(codes.to_dtype(DType::F32), Err(Error::DType(_))));
    assert_eq!(
        codes.reshape([2, 1]).unwrap().to_vec_u8().unwrap(),
        vec![1, 2]
    );
    assert!(matches!(Param::new(codes), Err(Error::DType(_))));
}

#[test]
fn other_devices_fail_clearly() {
    // No AMD GPU on a test machine: without the `rocm` feature there is no
    // backend; with it, the missing libraries or the missing device are one
    // line that says ROCm.
    let rocm = Device::Rocm(1);
    let err = Tensor::zeros([2], DType::F32, &rocm).unwrap_err();
    let msg = err.to_string();
    if cfg!(feature = "rocm") {
        assert!(matches!(err, Error::Backend(_)), "{err:?}");
        assert!(msg.contains("ROCm") && !msg.contains('\n'), "{msg}");
    } else {
        assert!(matches!(err, Error::DeviceUnavailable { .. }));
        assert!(
            msg.contains("rocm:1") && msg.contains("no backend"),
            "{msg}"
        );
    }
    assert!(t(&[1.0], &[1]).to_device(&rocm).is_err());
    // A CUDA device without a GPU (or built without the `cuda` feature) is
    // one line of error too, never a panic.
    let cuda = Device::Cuda(0);
    if cuda.is_available() {
        eprintln!("skipped the CUDA half: this machine has a GPU");
        return;
    }
    let msg = Tensor::zeros([2], DType::F32, &cuda)
        .unwrap_err()
        .to_string();
    assert!(
        msg.to_lowercase().contains("cuda") && !msg.contains('\n'),
        "{msg}"
    );
    assert!(t(&[1.0], &[1]).to_device(&cuda).is_err());
}

/// The backward of silu and gelu_tanh is one pass, g times the slope at x
/// computed in f32, rounded once: under BF16 activations each input
/// gradient equals the f32 gradient on the same (widened) values, rounded
/// to BF16 (a slope tensor and a product would round twice).
#[test]
fn bf16_activation_backward_rounds_once() {
    use mxswitch_runtime::formats::bf16;
    let mut rng = Rng::new(22);
    let round = |v: Vec<f32>| v.iter().map(|&x| bf16::round(x)).collect::<Vec<_>>();
    let (x, r) = (
        round(rng.vec(512, -4.0, 4.0)),
        round(rng.vec(512, -3.0, 3.0)),
    );
    type Act = fn(&Tensor) -> Result<Tensor>;
    for (name, act) in [
        ("silu", Tensor::silu as Act),
        ("gelu_tanh", Tensor::gelu_tanh),
    ] {
        let input_grad = |dtype: DType| {
            let p = param(&x, &[8, 64]);
            let rt = t(&r, &[8, 64]).to_dtype(dtype).unwrap();
            let y = act(&p.to_dtype(dtype).unwrap()).unwrap();
            grad(
                &y.mul(&rt).unwrap().sum_all().unwrap().backward().unwrap(),
                &p,
            )
        };
        let want: Vec<f32> = input_grad(DType::F32)
            .into_iter()
            .map(bf16::round)
            .collect();
        let got = input_grad(DType::BF16);
        let differ = (0..want.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "{name}: {differ} of {} gradients differ",
            want.len()
        );
    }
}

/// Values are rounded to bf16 and ops on bf16 compute in f32 and round the
/// result once: each result equals the f32 op on the widened inputs, rounded.
#[test]
fn bf16_ops_round_the_f32_result() {
    use mxswitch_runtime::formats::bf16;
    let mut rng = Rng::new(21);
    let (a, b) = (rng.vec(24, -2.0, 2.0), rng.vec(24, -2.0, 2.0));
    let widen = |v: &[f32]| v.iter().map(|&x| bf16::round(x)).collect::<Vec<_>>();
    let (a32, b32) = (t(&widen(&a), &[4, 6]), t(&widen(&b), &[4, 6]));
    let (a16, b16) = (
        a32.to_dtype(DType::BF16).unwrap(),
        b32.to_dtype(DType::BF16).unwrap(),
    );
    let cases: Vec<(&str, Tensor, Tensor)> = vec![
        ("mul", a32.mul(&b32).unwrap(), a16.mul(&b16).unwrap()),
        ("gelu", a32.gelu_tanh().unwrap(), a16.gelu_tanh().unwrap()),
        (
            "softmax",
            a32.softmax_last_dim().unwrap(),
            a16.softmax_last_dim().unwrap(),
        ),
        (
            "matmul",
            a32.matmul(&b32.t().unwrap()).unwrap(),
            a16.matmul(&b16.t().unwrap()).unwrap(),
        ),
        (
            "sum",
            a32.sum(&[0], false).unwrap(),
            a16.sum(&[0], false).unwrap(),
        ),
    ];
    for (name, want, got) in cases {
        assert_eq!(got.dtype(), DType::BF16, "{name}");
        let want: Vec<u16> = want
            .to_vec_f32()
            .unwrap()
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        assert_eq!(got.to_vec_bf16_bits().unwrap(), want, "{name}");
    }
    // RNE: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and goes to the even 1.
    let tie = t(&[1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0], &[2])
        .to_dtype(DType::BF16)
        .unwrap();
    assert_eq!(tie.to_vec_f32().unwrap(), vec![1.0, 1.0 + 4.0 / 256.0]);
}

/// A linear that saves its inputs as bf16 bytes, like a quantized recipe
/// saving FP4 codes: y = x W^T + b, dx = g W, dW = g^T x, db = sum_rows(g).
struct Bf16SavingLinear {
    layer: String,
}

struct SavedLinear {
    x_bf16: Tensor,
    w_bf16: Tensor,
    has_bias: bool,
}

impl CustomOp for Bf16SavingLinear {
    type Saved = Option<SavedLinear>;

    fn name(&self) -> &str {
        "bf16_saving_linear"
    }

    fn label(&self) -> String {
        self.layer.clone()
    }

    fn forward(
        &self,
        inputs: &[Tensor],
        needs_backward: bool,
    ) -> Result<(Vec<Tensor>, Self::Saved)> {
        let (x, w, b) = (&inputs[0], &inputs[1], inputs.get(2));
        let y = linear(x, w, b)?;
        let saved = needs_backward
            .then(|| -> Result<SavedLinear> {
                Ok(SavedLinear {
                    x_bf16: x.to_dtype(DType::BF16)?,
                    w_bf16: w.to_dtype(DType::BF16)?,
                    has_bias: b.is_some(),
                })
            })
            .transpose()?;
        Ok((vec![y], saved))
    }

    fn saved_bytes(&self, saved: &Self::Saved) -> usize {
        saved
            .as_ref()
            .map_or(0, |s| 2 * (s.x_bf16.elem_count() + s.w_bf16.elem_count()))
    }

    fn backward(
        &self,
        saved: &Self::Saved,
        grads: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let s = saved.as_ref().expect("recorded ops keep their saved value");
        let g = grads[0].as_ref().expect("single output");
        let (x, w) = (
            s.x_bf16.to_dtype(DType::F32)?,
            s.w_bf16.to_dtype(DType::F32)?,
        );
        let mut out = vec![Some(g.matmul(&w)?), Some(g.t()?.matmul(&x)?)];
        if s.has_bias {
            out.push(Some(g.sum(&[0], false)?));
        }
        Ok(out)
    }
}

#[test]
fn custom_op_with_three_inputs_and_saved_bytes() {
    let mut rng = Rng::new(22);
    let exact = |n: usize, rng: &mut Rng| -> Vec<f32> {
        rng.vec(n, -1.0, 1.0)
            .iter()
            .map(|&v| mxswitch_runtime::formats::bf16::round(v))
            .collect()
    };
    let (xv, wv, bv) = (
        exact(4 * 3, &mut rng),
        exact(5 * 3, &mut rng),
        exact(5, &mut rng),
    );
    let (x, w, b) = (param(&xv, &[4, 3]), param(&wv, &[5, 3]), param(&bv, &[5]));
    let op = |layer: &str| Bf16SavingLinear {
        layer: layer.into(),
    };

    let y1 = apply_custom(op("blocks.0.qkv"), &[&x, &w, &b])
        .unwrap()
        .remove(0);
    // Shape errors inside a custom forward come back as errors.
    assert!(matches!(
        apply_custom(op("bad"), &[&x, &b, &b]),
        Err(Error::Shape(_))
    ));

    let w2 = param(&exact(2 * 5, &mut rng), &[2, 5]);
    let y2 = apply_custom(op("blocks.1.proj"), &[&y1.gelu_tanh().unwrap(), &w2])
        .unwrap()
        .remove(0);
    let loss = y2.sum_all().unwrap();

    // Per-label saved bytes: 2 bytes per element of x and W of each layer.
    let saved = loss.saved_bytes();
    assert_eq!(saved.get("blocks.0.qkv"), 2 * (4 * 3 + 5 * 3));
    assert_eq!(saved.get("blocks.1.proj"), 2 * (4 * 5 + 2 * 5));
    assert!(
        saved.get("gelu_tanh") > 0,
        "built-in ops report what they keep too"
    );
    assert_eq!(saved.total(), saved.iter().map(|(_, b)| b).sum::<usize>());

    // Same gradients as the built-in ops. x, W and b are bf16-exact, so
    // saving them in bf16 loses nothing; the second layer saves gelu(y1) in
    // bf16, so its dW is right to bf16 precision (2^-8 relative).
    let grads = loss.backward().unwrap();
    let builtin = linear(
        &linear(&x, &w, Some(&b)).unwrap().gelu_tanh().unwrap(),
        &w2,
        None,
    )
    .unwrap();
    let reference = builtin.sum_all().unwrap().backward().unwrap();
    for (p, tol) in [(&x, 1e-5), (&w, 1e-5), (&b, 1e-5), (&w2, 1e-2)] {
        let (got, want) = (grad(&grads, p), grad(&reference, p));
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
            .fold(0f32, f32::max);
        assert!(
            diff < tol,
            "custom vs built-in gradient differs by {diff} (tolerance {tol})"
        );
    }

    // Under no_grad nothing is recorded or saved.
    let y = no_grad(|| apply_custom(op("eval"), &[&x, &w, &b]).unwrap().remove(0));
    assert!(!y.tracks_grad());
    assert_eq!(y.saved_bytes().total(), 0);
}

/// An op whose backward returns a wrongly shaped gradient is reported, not
/// silently accepted.
struct BadBackward;

impl CustomOp for BadBackward {
    type Saved = ();
    fn name(&self) -> &str {
        "bad_backward"
    }
    fn forward(&self, inputs: &[Tensor], _: bool) -> Result<(Vec<Tensor>, ())> {
        Ok((vec![inputs[0].clone(), inputs[0].sum_all()?], ()))
    }
    fn saved_bytes(&self, _: &()) -> usize {
        0
    }
    fn backward(&self, _: &(), grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        // The first output is unused by the loss below, so it gets no gradient.
        assert!(grads[0].is_none() && grads[1].is_some());
        Ok(vec![Some(Tensor::zeros([7], DType::F32, &Device::Cpu)?)])
    }
}

#[test]
fn custom_op_gradient_shapes_are_checked() {
    let x = param(&[1.0, 2.0], &[2]);
    let outs = apply_custom(BadBackward, &[&x]).unwrap();
    assert_eq!(outs.len(), 2);
    let err = outs[1].backward().unwrap_err();
    assert!(matches!(err, Error::Autograd(_)), "{err}");
    assert!(err.to_string().contains("bad_backward"));
}

#[test]
fn rope_tables_must_be_constants() {
    let x = param(&[1.0, 0.0, 0.0, 1.0], &[2, 2]);
    let cos = param(&[1.0, 1.0], &[2, 1]);
    let sin = t(&[0.0, 0.0], &[2, 1]);
    assert!(matches!(
        x.rope_interleaved(&cos, &sin),
        Err(Error::Autograd(_))
    ));
    // A quarter turn maps (1, 0) to (0, 1).
    let y = x
        .rope_interleaved(&t(&[0.0, 1.0], &[2, 1]), &t(&[1.0, 0.0], &[2, 1]))
        .unwrap();
    assert_eq!(y.to_vec_f32().unwrap(), vec![0.0, 1.0, 0.0, 1.0]);
}

/// Copies and casts above the parallel threshold (32k elements) give the
/// same elements as index arithmetic and per-element rounding.
#[test]
fn large_strided_copies_and_casts() {
    use mxswitch_runtime::formats::bf16;
    let (r, c) = (256, 300);
    let data: Vec<f32> = Rng::new(23).vec(r * c, -3.0, 3.0);
    let x = t(&data, &[r, c]);
    let xt = x.t().unwrap().contiguous().unwrap().to_vec_f32().unwrap();
    assert!(
        (0..c).all(|j| (0..r).all(|i| xt[j * r + i] == data[i * c + j])),
        "transpose copy"
    );
    let n = x
        .narrow(1, 7, 250)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert!(
        (0..r).all(|i| n[i * 250..(i + 1) * 250] == data[i * c + 7..i * c + 257]),
        "narrow copy"
    );
    let bits = x.to_dtype(DType::BF16).unwrap().to_vec_bf16_bits().unwrap();
    assert!(
        bits.iter()
            .zip(&data)
            .all(|(&b, &v)| b == bf16::from_f32(v)),
        "f32 -> bf16 RNE"
    );
    let back = x.to_dtype(DType::BF16).unwrap().to_vec_f32().unwrap();
    assert!(
        back.iter().zip(&data).all(|(&b, &v)| b == bf16::round(v)),
        "bf16 -> f32 exact"
    );
}

/// Tensors, parameters and gradients cross threads (data-parallel ranks,
/// rayon workers).
#[test]
fn tape_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tensor>();
    send_sync::<Param>();
    send_sync::<mxswitch_runtime::Gradients>();
    send_sync::<mxswitch_runtime::optim::AdamW>();
}
