//! The op cases of `ops.rs`: every tensor op on strided views, broadcasts
//! and the shapes attention uses, each with its tolerance.

use mxswitch_runtime::{DType, Result, Tensor};

use crate::ops::{case, inp, Case, Dist, Input, Tol};

/// Part `i` (0 = q, 1 = k, 2 = v) of a fused `[B, L, 3, H, D]` projection
/// as the `[B, H, L, D]` view attention multiplies: batch dims that do not
/// coalesce and an offset.
pub fn qkv(x: &Tensor, i: usize) -> Result<Tensor> {
    x.narrow(2, i, 1)?.squeeze(2)?.permute(&[0, 2, 1, 3])
}

/// Parameters of these shapes, uniform in [-4, 4].
fn params(shapes: &[&[usize]]) -> Vec<Input> {
    shapes.iter().map(|s| inp(s, Dist::Sym, true)).collect()
}

/// `a x b` of two parameters, within the accumulation bound over K (a's last dim).
fn matmul(name: &'static str, a: &[usize], b: &[usize]) -> Case {
    let k = a.last().copied().unwrap_or(0);
    case(name, params(&[a, b]), Tol::Accum(k), |x| x[0].matmul(&x[1]))
}

pub fn cases() -> Vec<Case> {
    use Dist::*;
    let u = |name, d, f: fn(&Tensor) -> Result<Tensor>, tol| {
        // A transposed view as input: the strided gather path.
        case(name, vec![inp(&[3, 37, 5], d, true)], tol, move |x| {
            f(&x[0].transpose(0, 2)?)
        })
    };
    let tr = Tol::Ulp(4, 0.0);
    let v = vec![
        case(
            "copy_strided(transpose+narrow)",
            vec![inp(&[4, 6, 35], Sym, true)],
            Tol::Exact,
            |x| x[0].transpose(0, 2)?.narrow(1, 1, 4)?.contiguous(),
        ),
        u("exp", Sym, Tensor::exp, tr),
        u("log", Pos, Tensor::log, tr),
        u("sqrt", Pos, Tensor::sqrt, Tol::Exact),
        u("rsqrt", Pos, Tensor::rsqrt, Tol::Exact),
        u("sqr", Sym, Tensor::sqr, Tol::Exact),
        u("tanh", Sym, Tensor::tanh, tr),
        u("silu", Sym, Tensor::silu, tr),
        u("gelu_tanh", Sym, Tensor::gelu_tanh, tr),
        case("affine", vec![inp(&[5, 67], Sym, true)], Tol::Exact, |x| {
            x[0].t()?.affine(0.37, -1.25)
        }),
        case(
            "add(broadcast)",
            params(&[&[4, 1, 33], &[6, 33]]),
            Tol::Exact,
            |x| x[0].add(&x[1]),
        ),
        case(
            "sub(broadcast)",
            params(&[&[4, 6, 33], &[4, 6, 1]]),
            Tol::Exact,
            |x| x[0].sub(&x[1]),
        ),
        case(
            "mul(transposed)",
            params(&[&[9, 33], &[33, 9]]),
            Tol::Exact,
            |x| x[0].mul(&x[1].t()?),
        ),
        case(
            "div(broadcast)",
            vec![inp(&[5, 40], Sym, true), inp(&[40], Away, true)],
            Tol::Exact,
            |x| x[0].div(&x[1]),
        ),
        case(
            "eq_mask",
            vec![inp(&[7, 45], Small, false), inp(&[45], Small, false)],
            Tol::Exact,
            |x| x[0].eq_mask(&x[1]),
        ),
        case(
            "sum(axis 0)",
            vec![inp(&[37, 5, 9], Sym, true)],
            Tol::Accum(37),
            |x| x[0].sum(&[0], false),
        ),
        case(
            "sum(axis 1)",
            vec![inp(&[3, 300, 7], Sym, true)],
            Tol::Accum(300),
            |x| x[0].sum(&[1], true),
        ),
        case(
            "sum(last, long rows)",
            vec![inp(&[3, 5000], Sym, true)],
            Tol::Accum(5000),
            |x| x[0].sum(&[-1], false),
        ),
        case(
            "sum(last, few rows longer than a chunk)",
            vec![inp(&[2, 40_000], Sym, true)],
            Tol::Accum(40_000),
            |x| x[0].sum(&[-1], false),
        ),
        case(
            "max(last, one row longer than a chunk, with ties)",
            vec![inp(&[1, 50_000], Small, true)],
            Tol::Exact,
            |x| x[0].max(&[-1], false),
        ),
        case(
            "sum(last, transposed)",
            vec![inp(&[70, 6], Sym, true)],
            Tol::Accum(70),
            |x| x[0].t()?.sum(&[-1], false),
        ),
        case(
            "mean(axes 0,2)",
            vec![inp(&[6, 5, 11], Sym, true)],
            Tol::Accum(66),
            |x| x[0].mean(&[0, 2], true),
        ),
        case(
            "max(axis 1, ties)",
            vec![inp(&[4, 50, 3], Small, true)],
            Tol::Exact,
            |x| x[0].max(&[1], false),
        ),
        case(
            "max(last)",
            vec![inp(&[9, 1000], Sym, true)],
            Tol::Exact,
            |x| x[0].max(&[-1], true),
        ),
        matmul("matmul(batched)", &[2, 3, 17, 33], &[2, 3, 33, 19]),
        case(
            "matmul(x w^T, broadcast batch)",
            params(&[&[4, 20, 48], &[24, 48]]),
            Tol::Accum(48),
            |x| x[0].matmul(&x[1].t()?),
        ),
        case(
            "matmul(a^T b, 128x96x200)",
            params(&[&[200, 128], &[200, 96]]),
            Tol::Accum(200),
            |x| x[0].t()?.matmul(&x[1]),
        ),
        matmul(
            "matmul(attention [8,6,256,64] x [8,6,64,256])",
            &[8, 6, 256, 64],
            &[8, 6, 64, 256],
        ),
        case(
            "matmul(q k^T, k transposed view)",
            params(&[&[8, 6, 256, 64], &[8, 6, 256, 64]]),
            Tol::Accum(64),
            |x| x[0].matmul(&x[1].transpose(-1, -2)?),
        ),
        case(
            "matmul(q k^T, q k from a [B,L,3,H,D] view)",
            vec![inp(&[2, 32, 3, 4, 16], Sym, true)],
            Tol::Accum(16),
            |x| qkv(&x[0], 0)?.matmul(&qkv(&x[0], 1)?.transpose(-1, -2)?),
        ),
        case(
            "matmul(p v, v from a [B,L,3,H,D] view)",
            params(&[&[2, 4, 32, 32], &[2, 32, 3, 4, 16]]),
            Tol::Accum(32),
            |x| x[0].matmul(&qkv(&x[1], 2)?),
        ),
        matmul("matmul(odd 7x13x5)", &[7, 13], &[13, 5]),
        case(
            "matmul(odd batched, a^T and b^T views)",
            params(&[&[3, 13, 7], &[3, 5, 13]]),
            Tol::Accum(13),
            |x| x[0].transpose(-1, -2)?.matmul(&x[1].transpose(-1, -2)?),
        ),
        case(
            "matmul(batch dims that do not coalesce)",
            params(&[&[3, 4, 7, 13], &[4, 3, 13, 5]]),
            Tol::Accum(13),
            |x| x[0].transpose(0, 1)?.matmul(&x[1]),
        ),
        case(
            "matmul(narrowed views: odd offsets and padded rows)",
            params(&[&[2, 5, 9, 16], &[2, 5, 12, 8]]),
            Tol::Accum(11),
            |x| x[0].narrow(3, 3, 11)?.matmul(&x[1].narrow(2, 1, 11)?),
        ),
        case(
            "concat(axis 1, strided part)",
            params(&[&[3, 4, 5], &[3, 5, 2]]),
            Tol::Exact,
            |x| Tensor::cat(&[&x[0], &x[1].transpose(1, 2)?], 1),
        ),
        case(
            "concat(axis 0)",
            params(&[&[2, 7], &[5, 7], &[1, 7]]),
            Tol::Exact,
            |x| Tensor::cat(&[&x[0], &x[1], &x[2]], 0),
        ),
        case(
            "concat(last, transposed)",
            params(&[&[6, 4], &[3, 6]]),
            Tol::Exact,
            |x| Tensor::cat(&[&x[0], &x[1].t()?], -1),
        ),
        case(
            "softmax",
            vec![inp(&[7, 129], Sym, true)],
            Tol::Ulp(4, 0.0),
            |x| x[0].softmax_last_dim(),
        ),
        case(
            "softmax(long rows, transposed)",
            vec![inp(&[3000, 2], Sym, true)],
            Tol::Ulp(4, 0.0),
            |x| x[0].t()?.softmax_last_dim(),
        ),
        case(
            "layer_norm",
            vec![inp(&[5, 257], Sym, true)],
            Tol::Ulp(4, 1e-6),
            |x| x[0].layer_norm(1e-5),
        ),
        case(
            "rms_normalize",
            vec![inp(&[6, 3, 100], Sym, true)],
            Tol::Ulp(4, 1e-6),
            |x| x[0].rms_normalize(1e-6),
        ),
        case(
            "rope_interleaved",
            vec![
                inp(&[2, 3, 8, 16], Sym, true),
                inp(&[8, 8], Sym, false),
                inp(&[8, 8], Sym, false),
            ],
            Tol::Exact,
            |x| x[0].rope_interleaved(&x[1], &x[2]),
        ),
        case(
            "rope_interleaved(strided x)",
            vec![
                inp(&[2, 16, 5], Sym, true),
                inp(&[5, 8], Sym, false),
                inp(&[5, 8], Sym, false),
            ],
            Tol::Exact,
            |x| x[0].transpose(1, 2)?.rope_interleaved(&x[1], &x[2]),
        ),
        case(
            "to_dtype round trip",
            vec![inp(&[9, 31], Sym, true)],
            Tol::Exact,
            |x| {
                let other = if x[0].dtype() == DType::F32 {
                    DType::BF16
                } else {
                    DType::F32
                };
                x[0].t()?
                    .to_dtype(other)?
                    .mul_scalar(3.0)?
                    .to_dtype(x[0].dtype())
            },
        ),
        case(
            "mlp block (linear, gelu, rms)",
            params(&[&[8, 32], &[48, 32], &[48]]),
            Tol::Graph,
            |x| {
                mxswitch_runtime::ops::linear(&x[0], &x[1], Some(&x[2]))?
                    .gelu_tanh()?
                    .rms_normalize(1e-6)
            },
        ),
        case(
            "attention",
            params(&[&[2, 8, 16], &[2, 8, 16], &[2, 8, 16]]),
            Tol::Graph,
            |x| mxswitch_runtime::ops::scaled_dot_product_attention(&x[0], &x[1], &x[2]),
        ),
    ];
    v
}
