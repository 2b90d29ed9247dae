//! Fused attention on the CPU ([`AttentionBackend`]): flash-attention's
//! tiling. A tile of `BR` query rows walks the keys `BC` rows at a time,
//! keeping a running max `m`, a running sum `l` and an unnormalized output;
//! the scores of one tile pair are the only `[BR, BC]` buffer, so memory
//! beyond the inputs and outputs is O(BR * BC) per thread, whatever L is.
//! The backward recomputes the scores from q, k and the saved log-sum-exp:
//! one pass over query tiles for dq, one over key tiles for dk and dv, so no
//! tile is written by two threads. All math is f32.

use gemm::{gemm, Parallelism};
use rayon::prelude::*;

use super::CpuStorage;
use crate::backend::{AttentionBackend, AttentionSaved, AttentionShape, BackendStorage};
use crate::{Layout, Result, Shape};

/// Query rows per tile.
const BR: usize = 64;
/// Key rows per tile.
const BC: usize = 128;

/// A row-major matrix in a slice: element (r, c) at `r * rs + c * cs`.
#[derive(Clone, Copy)]
struct Mat<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

impl<'a> Mat<'a> {
    /// `rows` packed rows of width `cols` starting at row `first` of `data`.
    fn rows(data: &'a [f32], first: usize, cols: usize) -> Mat<'a> {
        Mat {
            data: &data[first * cols..],
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of the same view.
    fn t(self) -> Mat<'a> {
        Mat {
            data: self.data,
            rs: self.cs,
            cs: self.rs,
        }
    }
}

/// dst `[m, n]` (packed, row stride `n`) = a `[m, k]` · b `[k, n]`, plus the
/// old dst when `accumulate`, on this thread.
fn mm(m: usize, n: usize, k: usize, dst: &mut [f32], a: Mat, b: Mat, accumulate: bool) {
    if m == 0 || n == 0 {
        return;
    }
    let extent = |x: Mat, r: usize, c: usize| (r - 1) * x.rs + (c - 1) * x.cs + 1;
    assert!(
        dst.len() >= m * n && a.data.len() >= extent(a, m, k) && b.data.len() >= extent(b, k, n),
        "attention tile out of bounds"
    );
    // SAFETY: the assert above keeps every read and write inside the slices.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

/// One head's operands, packed.
struct Head<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
}

/// Scaled scores of query rows `q0..q0+br` against key rows `k0..k0+bc`.
fn scores(
    h: &Head,
    sh: &AttentionShape,
    (q0, br): (usize, usize),
    (k0, bc): (usize, usize),
    scale: f32,
    s: &mut [f32],
) {
    let q = Mat::rows(h.q, q0, sh.d);
    let k = Mat::rows(h.k, k0, sh.d).t();
    mm(br, bc, sh.d, s, q, k, false);
    s[..br * bc].iter_mut().for_each(|x| *x *= scale);
}

/// o and lse of one query tile (`o` holds its `br` rows, `lse` its `br` values).
fn forward_tile(
    h: &Head,
    sh: &AttentionShape,
    q0: usize,
    scale: f32,
    o: &mut [f32],
    lse: &mut [f32],
) {
    let br = lse.len();
    let mut s = vec![0f32; br * BC];
    let mut m = vec![f32::NEG_INFINITY; br];
    let mut l = vec![0f32; br];
    o.iter_mut().for_each(|x| *x = 0.0);
    for k0 in (0..sh.s).step_by(BC) {
        let bc = BC.min(sh.s - k0);
        scores(h, sh, (q0, br), (k0, bc), scale, &mut s);
        for r in 0..br {
            let row = &mut s[r * bc..(r + 1) * bc];
            let m_new = row.iter().fold(m[r], |a, &x| a.max(x));
            let corr = (m[r] - m_new).exp();
            let mut sum = 0f32;
            for x in row.iter_mut() {
                *x = (*x - m_new).exp();
                sum += *x;
            }
            l[r] = l[r] * corr + sum;
            m[r] = m_new;
            o[r * sh.dv..(r + 1) * sh.dv]
                .iter_mut()
                .for_each(|x| *x *= corr);
        }
        let p = Mat::rows(&s, 0, bc);
        mm(br, sh.dv, bc, o, p, Mat::rows(h.v, k0, sh.dv), true);
    }
    for r in 0..br {
        let inv = 1.0 / l[r];
        o[r * sh.dv..(r + 1) * sh.dv]
            .iter_mut()
            .for_each(|x| *x *= inv);
        lse[r] = m[r] + l[r].ln();
    }
}

/// One head's view of what its backward reads.
struct HeadGrad<'a> {
    h: Head<'a>,
    d_o: &'a [f32],
    lse: &'a [f32],
    /// D = rowsum(dO * O) of the head's rows.
    dsum: &'a [f32],
    sh: &'a AttentionShape,
    scale: f32,
}

/// The buffers of one tile pair, `[br, BC]` each: the scores (ds on
/// return of [`HeadGrad::probs_and_ds`]), p and dp.
struct Scratch {
    s: Vec<f32>,
    p: Vec<f32>,
    dp: Vec<f32>,
}

impl Scratch {
    fn new(br: usize) -> Scratch {
        Scratch {
            s: vec![0f32; br * BC],
            p: vec![0f32; br * BC],
            dp: vec![0f32; br * BC],
        }
    }
}

impl HeadGrad<'_> {
    /// p = exp(s - lse) into `t.p` and ds = p * (dp - D) into `t.s` for
    /// query rows `q0..q0+br` against key rows `k0..k0+bc`.
    fn probs_and_ds(&self, (q0, br): (usize, usize), (k0, bc): (usize, usize), t: &mut Scratch) {
        let (h, sh) = (&self.h, self.sh);
        scores(h, sh, (q0, br), (k0, bc), self.scale, &mut t.s);
        let dov = Mat::rows(self.d_o, q0, sh.dv);
        mm(
            br,
            bc,
            sh.dv,
            &mut t.dp,
            dov,
            Mat::rows(h.v, k0, sh.dv).t(),
            false,
        );
        for r in 0..br {
            for c in 0..bc {
                let i = r * bc + c;
                t.p[i] = (t.s[i] - self.lse[q0 + r]).exp();
                t.s[i] = t.p[i] * (t.dp[i] - self.dsum[q0 + r]);
            }
        }
    }
}

/// Per head: o `[l, dv]` and lse `[l]` of packed q, k, v.
fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    sh: AttentionShape,
    scale: f32,
) -> (Vec<f32>, Vec<f32>) {
    let mut o = vec![0f32; sh.heads * sh.l * sh.dv];
    let mut lse = vec![0f32; sh.heads * sh.l];
    if o.is_empty() {
        return (o, lse);
    }
    o.par_chunks_mut(sh.l * sh.dv)
        .zip(lse.par_chunks_mut(sh.l))
        .enumerate()
        .for_each(|(hi, (o_h, lse_h))| {
            let h = head(q, k, v, &sh, hi);
            o_h.par_chunks_mut(BR * sh.dv)
                .zip(lse_h.par_chunks_mut(BR))
                .enumerate()
                .for_each(|(t, (o_t, lse_t))| forward_tile(&h, &sh, t * BR, scale, o_t, lse_t));
        });
    (o, lse)
}

fn head<'a>(q: &'a [f32], k: &'a [f32], v: &'a [f32], sh: &AttentionShape, hi: usize) -> Head<'a> {
    Head {
        q: &q[hi * sh.l * sh.d..(hi + 1) * sh.l * sh.d],
        k: &k[hi * sh.s * sh.d..(hi + 1) * sh.s * sh.d],
        v: &v[hi * sh.s * sh.dv..(hi + 1) * sh.s * sh.dv],
    }
}

/// The f32 values a backward reads, one head at a time.
struct Backward<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    lse: &'a [f32],
    d_o: &'a [f32],
    /// D = rowsum(dO * O), `[heads, l]`.
    dsum: &'a [f32],
}

/// dq, dk, dv of packed operands.
fn backward(b: &Backward, sh: AttentionShape, scale: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut dq = vec![0f32; sh.heads * sh.l * sh.d];
    let mut dk = vec![0f32; sh.heads * sh.s * sh.d];
    let mut dv = vec![0f32; sh.heads * sh.s * sh.dv];
    if dq.is_empty() || dk.is_empty() {
        return (dq, dk, dv);
    }
    let per_head = |hi: usize| HeadGrad {
        h: head(b.q, b.k, b.v, &sh, hi),
        d_o: &b.d_o[hi * sh.l * sh.dv..(hi + 1) * sh.l * sh.dv],
        lse: &b.lse[hi * sh.l..(hi + 1) * sh.l],
        dsum: &b.dsum[hi * sh.l..(hi + 1) * sh.l],
        sh: &sh,
        scale,
    };
    // dq: each query tile sums over every key tile.
    dq.par_chunks_mut(sh.l * sh.d)
        .enumerate()
        .for_each(|(hi, dq_h)| {
            let g = per_head(hi);
            dq_h.par_chunks_mut(BR * sh.d)
                .enumerate()
                .for_each(|(t, dq_t)| {
                    let (q0, br) = (t * BR, dq_t.len() / sh.d);
                    let mut tile = Scratch::new(br);
                    for k0 in (0..sh.s).step_by(BC) {
                        let bc = BC.min(sh.s - k0);
                        g.probs_and_ds((q0, br), (k0, bc), &mut tile);
                        let ds = Mat::rows(&tile.s, 0, bc);
                        mm(br, sh.d, bc, dq_t, ds, Mat::rows(g.h.k, k0, sh.d), true);
                    }
                    dq_t.iter_mut().for_each(|x| *x *= scale);
                });
        });
    // dk and dv: each key tile sums over every query tile.
    dk.par_chunks_mut(sh.s * sh.d)
        .zip(dv.par_chunks_mut(sh.s * sh.dv))
        .enumerate()
        .for_each(|(hi, (dk_h, dv_h))| {
            let g = per_head(hi);
            dk_h.par_chunks_mut(BC * sh.d)
                .zip(dv_h.par_chunks_mut(BC * sh.dv))
                .enumerate()
                .for_each(|(t, (dk_t, dv_t))| {
                    let (k0, bc) = (t * BC, dk_t.len() / sh.d);
                    let mut tile = Scratch::new(BR);
                    for q0 in (0..sh.l).step_by(BR) {
                        let br = BR.min(sh.l - q0);
                        g.probs_and_ds((q0, br), (k0, bc), &mut tile);
                        // dv += p^T dO, dk += ds^T q (scaled below).
                        let (p, ds) =
                            (Mat::rows(&tile.p, 0, bc).t(), Mat::rows(&tile.s, 0, bc).t());
                        mm(bc, sh.dv, br, dv_t, p, Mat::rows(g.d_o, q0, sh.dv), true);
                        mm(bc, sh.d, br, dk_t, ds, Mat::rows(g.h.q, q0, sh.d), true);
                    }
                    dk_t.iter_mut().for_each(|x| *x *= scale);
                });
        });
    (dq, dk, dv)
}

/// A packed buffer's f32 values (a BF16 one widened).
fn values(s: &CpuStorage, n: usize) -> Result<std::borrow::Cow<'_, [f32]>> {
    s.packed_f32(&Layout::contiguous(Shape::new(vec![n])), "attention")
}

impl AttentionBackend for CpuStorage {
    fn attention_forward(
        q: &Self,
        k: &Self,
        v: &Self,
        sh: AttentionShape,
        scale: f32,
    ) -> Result<(Self, Self)> {
        let qv = values(q, sh.heads * sh.l * sh.d)?;
        let kv = values(k, sh.heads * sh.s * sh.d)?;
        let vv = values(v, sh.heads * sh.s * sh.dv)?;
        let (o, lse) = forward(&qv, &kv, &vv, sh, scale);
        Ok((CpuStorage::from_f32(o, q.dtype()), CpuStorage::F32(lse)))
    }

    fn attention_backward(
        saved: AttentionSaved<'_, Self>,
        d_o: &Self,
        sh: AttentionShape,
        scale: f32,
    ) -> Result<(Self, Self, Self)> {
        let n_o = sh.heads * sh.l * sh.dv;
        let o = values(saved.o, n_o)?;
        let d_ov = values(d_o, n_o)?;
        let dsum: Vec<f32> = o
            .chunks(sh.dv)
            .zip(d_ov.chunks(sh.dv))
            .map(|(o, g)| o.iter().zip(g).map(|(a, b)| a * b).sum())
            .collect();
        let b = Backward {
            q: &values(saved.q, sh.heads * sh.l * sh.d)?,
            k: &values(saved.k, sh.heads * sh.s * sh.d)?,
            v: &values(saved.v, sh.heads * sh.s * sh.dv)?,
            lse: &values(saved.lse, sh.heads * sh.l)?,
            d_o: &d_ov,
            dsum: &dsum,
        };
        let (dq, dk, dv) = backward(&b, sh, scale);
        let dtype = saved.q.dtype();
        Ok((
            CpuStorage::from_f32(dq, dtype),
            CpuStorage::from_f32(dk, dtype),
            CpuStorage::from_f32(dv, dtype),
        ))
    }
}
