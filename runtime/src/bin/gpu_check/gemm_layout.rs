//! [`CudaContext::gemm`] called directly against an f64 reference: every
//! transpose combination, batches (strided and with a shared b), element
//! offsets, padded rows and gaps between batch matrices, the bias epilogue
//! into BF16 and f32, FP8 (TN only) and the calls it must refuse. The bound
//! is the f32 accumulation of k + 1 terms (the bias), 2^-9 sum|terms| more
//! for FP8 (as in `gemm.rs`), 1 ulp and 1 BF16 ulp for a BF16 output.

use mxswitch_runtime::cuda::gemm::{GemmBias, GemmSpec, MatLayout};
use mxswitch_runtime::cuda::{CudaContext, CudaError, DevBuf, GemmDType, GemmOperand};
use mxswitch_runtime::formats::{bf16, ElemFormat};

use crate::common::{bf16_ulp, compare, f32_ulp, Report, Rng};
use crate::ops::{sample, Dist};

/// One direct [`CudaContext::gemm`] call against an f64 reference, with
/// element offsets, padded rows and gaps between batch matrices, so every
/// [`MatLayout`] field is exercised.
struct GemmCase {
    name: &'static str,
    /// Type of both operands.
    dtype: GemmDType,
    out: GemmDType,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    /// a stored `[K, M]`, b stored `[K, N]`.
    a_t: bool,
    b_t: bool,
    /// b's batch stride is 0 (one b for the whole batch).
    b_shared: bool,
    /// Per a, b, y: element offset, row padding, gap after each matrix.
    pads: [(usize, usize, usize); 3],
    bias: Option<GemmDType>,
    /// The call must be refused with `CudaError::Invalid`.
    invalid: bool,
}

/// The layout of `batch` matrices of logical `rows x cols` (stored the
/// other way when `t`) and the buffer length it needs.
fn gemm_mat(
    rows: usize,
    cols: usize,
    t: bool,
    (off, pad, gap): (usize, usize, usize),
    batch: usize,
    shared: bool,
) -> (MatLayout, usize) {
    let (sr, sc) = if t { (cols, rows) } else { (rows, cols) };
    let ld = sc + pad;
    let per = sr * ld + gap;
    let l = MatLayout {
        offset_elems: off,
        ld,
        batch_stride: if shared { 0 } else { per },
        transposed: t,
    };
    (l, off + if shared { 1 } else { batch } * per)
}

/// Buffer index of logical element (r, c) of matrix `bi`.
fn gemm_pos(l: &MatLayout, bi: usize, r: usize, c: usize) -> usize {
    let (sr, sc) = if l.transposed { (c, r) } else { (r, c) };
    l.offset_elems + bi * l.batch_stride + sr * l.ld + sc
}

/// Random values exact in `t`, and the buffer holding them.
fn gemm_upload(
    ctx: &CudaContext,
    rng: &mut Rng,
    len: usize,
    t: GemmDType,
) -> std::result::Result<(Vec<f32>, DevBuf), String> {
    let raw = sample(rng, len, Dist::Sym);
    let up = |r: std::result::Result<DevBuf, CudaError>| r.map_err(|e| e.to_string());
    Ok(match t {
        GemmDType::F32 => (raw.clone(), up(ctx.upload(&raw))?),
        GemmDType::Bf16 => {
            let bits: Vec<u16> = raw.iter().map(|&v| bf16::from_f32(v)).collect();
            (
                bits.iter().map(|&b| bf16::to_f32(b)).collect(),
                up(ctx.upload(&bits))?,
            )
        }
        GemmDType::Fp8E4M3 | GemmDType::Fp8E5M2 => {
            let f = if t == GemmDType::Fp8E4M3 {
                ElemFormat::E4M3FN
            } else {
                ElemFormat::E5M2
            };
            let codes: Vec<u8> = raw.iter().map(|&v| f.encode(v)).collect();
            (
                codes.iter().map(|&c| f.decode(c)).collect(),
                up(ctx.upload(&codes))?,
            )
        }
        other => return Err(format!("the layout cases take no {other:?} operands")),
    })
}

fn gemm_case(ctx: &CudaContext, c: &GemmCase, seed: u64) -> std::result::Result<String, String> {
    let mut rng = Rng::new(seed);
    let (m, n, k, batch) = (c.m, c.n, c.k, c.batch);
    let (la, len_a) = gemm_mat(m, k, c.a_t, c.pads[0], batch, false);
    let (lb, len_b) = gemm_mat(n, k, c.b_t, c.pads[1], batch, c.b_shared);
    let (ly, len_y) = gemm_mat(m, n, false, c.pads[2], batch, false);
    let (av, abuf) = gemm_upload(ctx, &mut rng, len_a, c.dtype)?;
    let (bv, bbuf) = gemm_upload(ctx, &mut rng, len_b, c.dtype)?;
    let (biasv, biasbuf) = match c.bias {
        Some(t) => {
            let (v, b) = gemm_upload(ctx, &mut rng, n, t)?;
            (v, Some((b, t)))
        }
        None => (vec![0.0; n], None),
    };
    let fp8 = c.dtype.is_fp8();
    let (sa, sb) = if fp8 { (0.5f32, 0.25f32) } else { (1.0, 1.0) };
    // One 16-byte slot per scale, as the FP8 quantizers keep them.
    let scales = ctx
        .upload(&[sa, 0.0, 0.0, 0.0, sb, 0.0, 0.0, 0.0])
        .map_err(|e| e.to_string())?;
    let scale_inv = |i: u64| fp8.then(|| scales.ptr() + 16 * i);
    // y starts as a sentinel (exact in BF16), so writes outside its matrices show.
    const SENTINEL: f32 = 4096.0;
    let ybuf = match c.out {
        GemmDType::F32 => ctx.upload(&vec![SENTINEL; len_y]),
        _ => ctx.upload(&vec![bf16::from_f32(SENTINEL); len_y]),
    }
    .map_err(|e| e.to_string())?;
    let spec = GemmSpec {
        m,
        n,
        k,
        batch,
        a: la,
        b: lb,
        y: ly,
        bias: biasbuf
            .as_ref()
            .map(|(buf, dtype)| GemmBias { buf, dtype: *dtype }),
        alpha: None,
    };
    let op = |buf, i| GemmOperand {
        buf,
        dtype: c.dtype,
        scale_inv: scale_inv(i),
    };
    let r = ctx.gemm(&op(&abuf, 0), &op(&bbuf, 1), &spec, &ybuf, c.out);
    if c.invalid {
        return match r {
            Err(CudaError::Invalid(m)) => Ok(format!("refused as expected: {m}")),
            Err(e) => Err(format!("expected an invalid-argument error, got: {e}")),
            Ok(()) => Err("expected an invalid-argument error, the call ran".into()),
        };
    }
    r.map_err(|e| e.to_string())?;
    let got: Vec<f32> = match c.out {
        GemmDType::F32 => ctx.download::<f32>(&ybuf, len_y),
        _ => ctx
            .download::<u16>(&ybuf, len_y)
            .map(|v| v.iter().map(|&b| bf16::to_f32(b)).collect()),
    }
    .map_err(|e| e.to_string())?;
    let mut written = vec![false; len_y];
    let (mut cpu, mut gpu, mut bound) = (vec![], vec![], vec![]);
    // f32 accumulation of k products and the bias; FP8 tensor cores keep
    // ~14 bits inside one MMA before promoting (as in gemm.rs).
    let acc = (k + 1) as f64 * 2f64.powi(-23) + if fp8 { 2f64.powi(-9) } else { 0.0 };
    let scale = f64::from(sa) * f64::from(sb);
    for bi in 0..batch {
        let bb = if c.b_shared { 0 } else { bi };
        for i in 0..m {
            for j in 0..n {
                let (mut r, mut mag) = (f64::from(biasv[j]), f64::from(biasv[j].abs()));
                for p in 0..k {
                    let t = f64::from(av[gemm_pos(&la, bi, i, p)])
                        * f64::from(bv[gemm_pos(&lb, bb, j, p)])
                        * scale;
                    r += t;
                    mag += t.abs();
                }
                let at = gemm_pos(&ly, bi, i, j);
                written[at] = true;
                cpu.push(r as f32);
                gpu.push(got[at]);
                bound.push((acc * mag) as f32);
            }
        }
    }
    if let Some(at) = (0..len_y).find(|&i| !written[i] && got[i] != SENTINEL) {
        return Err(format!(
            "element {at} outside y's matrices was overwritten ({})",
            got[at]
        ));
    }
    let bf = c.out == GemmDType::Bf16;
    compare(&cpu, &gpu, |i| {
        bound[i]
            + f32_ulp(cpu[i])
            + if bf {
                bf16_ulp(cpu[i].abs().max(gpu[i].abs()))
            } else {
                0.0
            }
    })
}

/// [`CudaContext::gemm`] directly: every transpose combination, batches
/// (strided and with a shared b), offsets and padded rows, the bias
/// epilogue with BF16 and f32 outputs, FP8 (TN only) and its refusals.
pub fn gemm_checks(ctx: &CudaContext, rep: &mut Report) {
    use GemmDType::{Bf16, Fp8E4M3, F32};
    let base = GemmCase {
        name: "",
        dtype: Bf16,
        out: Bf16,
        m: 64,
        n: 48,
        k: 40,
        batch: 1,
        a_t: false,
        b_t: false,
        b_shared: false,
        pads: [(0, 0, 0); 3],
        bias: None,
        invalid: false,
    };
    let fp8_pads = [(16, 16, 32), (32, 16, 16), (8, 8, 8)];
    // cuBLASLt (13.x, Hopper) fuses an f32 bias only for BF16 operands with
    // an f32 output (gemm::fuses_f32_bias); `gemm` refuses the rest up front
    // and the linears add the bias after an f32 GEMM there.
    let cases = [
        GemmCase {
            name: "bf16 TN batch=3 + f32 bias -> f32",
            out: F32,
            batch: 3,
            bias: Some(F32),
            ..base
        },
        GemmCase {
            name: "bf16 a^T b^T, offsets, padded rows, batch=4 + f32 bias -> f32",
            out: F32,
            m: 33,
            n: 20,
            k: 17,
            batch: 4,
            a_t: true,
            b_t: true,
            pads: [(3, 5, 7), (1, 2, 3), (5, 3, 11)],
            bias: Some(F32),
            ..base
        },
        GemmCase {
            name: "bf16 b^T, odd 7x13x5, batch=2 -> bf16",
            m: 7,
            n: 13,
            k: 5,
            batch: 2,
            b_t: true,
            pads: [(1, 0, 1), (0, 1, 0), (0, 0, 0)],
            ..base
        },
        GemmCase {
            name: "bf16 a^T, batch=1 + f32 bias -> f32",
            out: F32,
            m: 40,
            n: 24,
            k: 72,
            a_t: true,
            bias: Some(F32),
            ..base
        },
        GemmCase {
            name: "bf16 shared b (x w^T folded), batch=5 + f32 bias -> f32",
            out: F32,
            m: 24,
            n: 40,
            k: 32,
            batch: 5,
            b_shared: true,
            bias: Some(F32),
            ..base
        },
        GemmCase {
            name: "bf16 shared b, a^T (batch stride 0), batch=3 -> f32",
            out: F32,
            m: 24,
            n: 40,
            k: 32,
            batch: 3,
            a_t: true,
            b_shared: true,
            ..base
        },
        GemmCase {
            name: "f32 b^T, padded, batch=2 + f32 bias -> f32",
            dtype: F32,
            out: F32,
            m: 50,
            n: 30,
            k: 70,
            batch: 2,
            b_t: true,
            pads: [(2, 1, 0), (0, 3, 5), (1, 0, 2)],
            bias: Some(F32),
            ..base
        },
        GemmCase {
            name: "e4m3 TN, offsets, padded, batch=2 -> bf16",
            dtype: Fp8E4M3,
            m: 32,
            n: 48,
            k: 64,
            batch: 2,
            pads: fp8_pads,
            ..base
        },
        GemmCase {
            name: "e4m3 + f32 bias -> bf16 refused (no such cuBLASLt epilogue)",
            dtype: Fp8E4M3,
            m: 32,
            n: 48,
            k: 64,
            bias: Some(F32),
            invalid: true,
            ..base
        },
        GemmCase {
            name: "bf16 + f32 bias -> bf16 refused (no such cuBLASLt epilogue)",
            bias: Some(F32),
            invalid: true,
            ..base
        },
        GemmCase {
            name: "e4m3 TN, batch=1 -> f32",
            dtype: Fp8E4M3,
            out: F32,
            m: 32,
            n: 48,
            k: 64,
            ..base
        },
        GemmCase {
            name: "e4m3 TN, batch=3 -> f32",
            dtype: Fp8E4M3,
            out: F32,
            m: 48,
            n: 32,
            k: 96,
            batch: 3,
            pads: [(16, 16, 32), (32, 16, 16), (16, 16, 16)],
            ..base
        },
        GemmCase {
            name: "e4m3 a^T refused",
            dtype: Fp8E4M3,
            m: 32,
            n: 48,
            k: 64,
            a_t: true,
            invalid: true,
            ..base
        },
        GemmCase {
            name: "e4m3 8-byte offset refused",
            dtype: Fp8E4M3,
            m: 32,
            n: 48,
            k: 64,
            pads: [(8, 0, 0), (0, 0, 0), (0, 0, 0)],
            invalid: true,
            ..base
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let tol = if c.invalid {
            "CudaError::Invalid".to_string()
        } else {
            format!(
                "(k+1) 2^-23{} sum|terms| + 1 ulp{}",
                if c.dtype.is_fp8() { " + 2^-9" } else { "" },
                if c.out == Bf16 { " + 1 bf16 ulp" } else { "" }
            )
        };
        rep.line(
            &format!("gemm {} [{tol}]", c.name),
            gemm_case(ctx, c, 500 + i as u64),
        );
    }
}
