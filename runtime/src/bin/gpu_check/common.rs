//! What every check shares: seeded data, error wording, comparisons, the
//! GPU timers and the pass/fail tally.

use rayon::prelude::*;

use mxswitch_runtime::cpu::CpuStorage;
use mxswitch_runtime::cuda::{CudaContext, CudaError, DevBuf};
use mxswitch_runtime::formats::bf16;
use mxswitch_runtime::module::SplitMix64;
use mxswitch_runtime::DType;

/// A check's outcome: what was checked, or what went wrong (one line).
pub type CheckResult = Result<String, String>;

/// Tally of the PASS / FAIL lines of a run.
#[derive(Default)]
pub struct Report {
    pub passed: usize,
    pub failed: usize,
}

impl Report {
    /// Prints `PASS name: ..` or `FAIL name: ..` and counts it.
    pub fn line(&mut self, name: &str, r: CheckResult) {
        match r {
            Ok(msg) => {
                self.passed += 1;
                println!("PASS {name}: {msg}");
            }
            Err(msg) => {
                self.failed += 1;
                println!("FAIL {name}: {msg}");
            }
        }
    }

    /// Runs one check and reports it; `?` inside ends only this check.
    pub fn check(&mut self, name: &str, f: impl FnOnce() -> CheckResult) {
        self.line(name, f());
    }
}

/// Many cases as one check: how many ran and the failures.
pub struct Cases {
    /// After the count when all pass: `"N <passed>"`.
    passed: String,
    /// After "F of N" when some fail.
    failed: String,
    n: usize,
    fails: Vec<String>,
}

impl Cases {
    pub fn new(passed: String, failed: String) -> Cases {
        Cases {
            passed,
            failed,
            n: 0,
            fails: Vec::new(),
        }
    }

    /// Counts one case and keeps its failure.
    pub fn add(&mut self, r: Result<(), String>) {
        self.n += 1;
        if let Err(e) = r {
            self.fails.push(e);
        }
    }

    /// `"N <passed>"` when every case passed, else `"F of N <failed>; first:"`
    /// and the first four failures.
    pub fn result(self) -> CheckResult {
        if self.fails.is_empty() {
            return Ok(format!("{} {}", self.n, self.passed));
        }
        let shown: Vec<&str> = self.fails.iter().take(4).map(String::as_str).collect();
        Err(format!(
            "{} of {} {}; first: {}",
            self.fails.len(),
            self.n,
            self.failed,
            shown.join(" | ")
        ))
    }
}

/// `Ok` when a case found nothing wrong, else `<what>: ` and the findings.
pub fn none_bad(bad: Vec<String>, what: impl FnOnce() -> String) -> Result<(), String> {
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {}", what(), bad.join("; ")))
    }
}

/// A GPU error as a check failure.
pub fn gpu<T>(r: Result<T, CudaError>) -> Result<T, String> {
    r.map_err(|e| format!("GPU error: {e}"))
}

/// A CPU reference error as a check failure.
pub fn cpu<T>(r: mxswitch_runtime::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("CPU error: {e}"))
}

/// A tensor-level error of either device as a check failure.
pub fn err(e: mxswitch_runtime::Error) -> String {
    format!("error: {e}")
}

/// The runtime's SplitMix64 with the distributions the checks draw from.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-300);
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * self.unit()).cos()
    }

    /// Uniform in [lo, hi), 24 bits.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// `n` normal values in chunks of `chunk`, generated in parallel: chunk `c`
/// is seeded from `seed` and `c`, and its values are multiplied by `scale(c)`.
pub fn normal_chunks(
    n: usize,
    chunk: usize,
    seed: u64,
    scale: impl Fn(usize) -> f64 + Sync,
) -> Vec<f32> {
    let mut x = vec![0.0f32; n];
    x.par_chunks_mut(chunk.max(1))
        .enumerate()
        .for_each(|(c, out)| {
            let mut r = Rng::new(seed ^ (c as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
            let s = scale(c);
            for v in out {
                *v = (r.normal() * s) as f32;
            }
        });
    x
}

/// `n` normal values times `scale`.
pub fn normal_data(n: usize, seed: u64, scale: f64) -> Vec<f32> {
    normal_chunks(n, 1 << 16, seed, |_| scale)
}

/// The f32 column sums of the row-major `[rows, cols]` x in the order a
/// kernel takes them: per chunk of `chunk_rows` rows, the sum over
/// `groups.0` groups (in order) of each group's sum over `groups.1` rows (in
/// order), the i-th row of group g at offset `row(g, i)` in the chunk; then
/// the chunks in row order (`lin_colsum_final`). Each sum from +0; rows past
/// the matrix add +0.
pub fn chunked_column_sums(
    x: &[f32],
    (rows, cols): (usize, usize),
    (chunk_rows, groups): (usize, (usize, usize)),
    row: impl Fn(usize, usize) -> usize,
) -> Vec<f32> {
    let at = |r: usize, c: usize| if r < rows { x[r * cols + c] } else { 0.0 };
    (0..cols)
        .map(|c| {
            (0..rows.div_ceil(chunk_rows)).fold(0f32, |total, chunk| {
                let r0 = chunk_rows * chunk;
                total
                    + (0..groups.0).fold(0f32, |acc, g| {
                        acc + (0..groups.1).fold(0f32, |s, i| s + at(r0 + row(g, i), c))
                    })
            })
        })
        .collect()
}

/// Column sums compared bit for bit (any NaN for any NaN): the first
/// difference, or a length mismatch, as one line.
pub fn same_sums(got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} column sums, want {}", got.len(), want.len()));
    }
    match (0..want.len()).find(|&i| !same_f32(got[i], want[i])) {
        Some(i) => Err(format!("column sum {i}: {}, want {}", got[i], want[i])),
        None => Ok(()),
    }
}

/// Same f32, every NaN equal to every NaN (payloads are not specified).
pub fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// The first index where two slices differ (the shorter length if only
/// the lengths do).
pub fn first_diff<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// The f32 spacing at |x| (0 for Inf and NaN).
pub fn f32_ulp(x: f32) -> f32 {
    let a = x.abs();
    if !a.is_finite() {
        return 0.0;
    }
    f32::from_bits(a.to_bits() + 1) - a
}

/// The BF16 spacing at |x| rounded to BF16 (that of the smallest normal for
/// 0 and non-finite values).
pub fn bf16_ulp(x: f32) -> f32 {
    let a = bf16::round(x.abs());
    if !a.is_finite() || a == 0.0 {
        return f32::from_bits(1 << 16);
    }
    let b = bf16::from_f32(a);
    bf16::to_f32(b + 1) - a
}

/// Element-wise comparison; `allowed(i)` is the bound of element i. NaN
/// equals NaN; the message gives the worst element relative to its bound.
pub fn compare(cpu: &[f32], gpu: &[f32], allowed: impl Fn(usize) -> f32) -> CheckResult {
    if cpu.len() != gpu.len() {
        return Err(format!(
            "lengths {} (cpu) and {} (gpu)",
            cpu.len(),
            gpu.len()
        ));
    }
    let mut worst = (0usize, 0f32, 0f32);
    let mut bad = 0usize;
    let mut first_bad = None;
    for (i, (&c, &g)) in cpu.iter().zip(gpu).enumerate() {
        if c.is_nan() && g.is_nan() || c == g {
            continue;
        }
        let d = (c - g).abs();
        let lim = allowed(i);
        let ratio = if lim > 0.0 { d / lim } else { f32::INFINITY };
        if d.is_nan() || d > lim {
            bad += 1;
            first_bad.get_or_insert((i, c, g, lim));
        }
        if ratio > worst.1 || worst.1 == 0.0 {
            worst = (i, ratio, d);
        }
    }
    if let Some((i, c, g, lim)) = first_bad {
        return Err(format!(
            "{bad}/{} elements off; first at {i}: cpu {c:e} gpu {g:e} (|d| {:e} > {lim:e})",
            cpu.len(),
            (c - g).abs()
        ));
    }
    Ok(if worst.2 == 0.0 {
        format!("{} elements bit-equal", cpu.len())
    } else {
        format!(
            "{} elements, max |d| {:e} ({:.2} of the bound, at {})",
            cpu.len(),
            worst.2,
            worst.1,
            worst.0
        )
    })
}

pub fn dtype_name(dtype: DType) -> &'static str {
    if dtype == DType::BF16 {
        "bf16"
    } else {
        "f32"
    }
}

/// BF16 bits of each value (round to nearest even).
pub fn to_bf16(x: &[f32]) -> Vec<u16> {
    x.par_iter().map(|&v| bf16::from_f32(v)).collect()
}

/// Host values as a storage of `dtype` (f32, or BF16 bits).
pub fn host(v: &[f32], dtype: DType) -> CpuStorage {
    if dtype == DType::BF16 {
        CpuStorage::BF16(to_bf16(v))
    } else {
        CpuStorage::F32(v.to_vec())
    }
}

/// BF16 bits widened to f32 (exact).
pub fn widen(h: &[u16]) -> Vec<f32> {
    h.par_iter().map(|&b| bf16::to_f32(b)).collect()
}

/// The input as the device sees it (f32 values, or their BF16 rounding as
/// raw bits) and the f32 values the CPU reference quantizes (for BF16 the
/// widened BF16 values, which the GPU kernels widen to exactly).
pub fn device_input(
    ctx: &CudaContext,
    x: &[f32],
    dtype: DType,
) -> Result<(DevBuf, Vec<f32>), String> {
    match dtype {
        DType::BF16 => {
            let bits = to_bf16(x);
            let wide = widen(&bits);
            Ok((gpu(ctx.upload(&bits))?, wide))
        }
        _ => Ok((gpu(ctx.upload(x))?, x.to_vec())),
    }
}

/// `n` f32 or BF16 values of a device buffer, as f32.
pub fn download_f32(
    ctx: &CudaContext,
    b: &DevBuf,
    n: usize,
    dtype: DType,
) -> Result<Vec<f32>, String> {
    if dtype == DType::BF16 {
        Ok(widen(&gpu(ctx.download::<u16>(b, n))?))
    } else {
        gpu(ctx.download(b, n))
    }
}

/// How each timed run of [`median_ms`] starts.
#[derive(Clone, Copy)]
pub enum Start<'a> {
    /// From an idle device (the stream synchronized first): the time
    /// includes the host's launch latency wherever the GPU waits for it.
    Idle,
    /// Behind a device-to-device copy of this buffer's first half into its
    /// second, so that the host has queued the whole run before the GPU
    /// reaches it: the time is the GPU's, not the launch latency's.
    Queued(&'a DevBuf),
    /// Right behind the previous run, with nothing in between, as the torch
    /// peers time (CUDA events back to back): the host queues a run while
    /// the GPU works on the one before, so the time is the GPU's where the
    /// host keeps ahead and the host's where it does not.
    Behind,
}

/// Median milliseconds of `runs` GPU-timed runs of `f` after `warmups`
/// untimed ones. Each run's result is dropped after its timer stops; the
/// times are read after the last run.
pub fn median_ms<T>(
    ctx: &CudaContext,
    start: Start,
    warmups: usize,
    runs: usize,
    mut f: impl FnMut() -> Result<T, String>,
) -> Result<f64, String> {
    for _ in 0..warmups {
        f()?;
    }
    let mut timers = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        match start {
            Start::Idle => gpu(ctx.synchronize())?,
            Start::Queued(delay) => {
                let half = delay.len_bytes() / 2;
                copy_dtod(ctx, delay.ptr() + half as u64, delay.ptr(), half)?;
            }
            Start::Behind => {}
        }
        let t = gpu(ctx.timer())?;
        let out = f()?;
        timers.push(gpu(t.stop())?);
        drop(out);
    }
    let mut ms = timers
        .iter()
        .map(|t| gpu(t.ms()).map(f64::from))
        .collect::<Result<Vec<_>, _>>()?;
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

/// Mean milliseconds of `iters` back-to-back runs of `f` under one GPU
/// timer, after `warmups` untimed ones.
pub fn mean_ms(
    ctx: &CudaContext,
    warmups: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    for _ in 0..warmups {
        f()?;
    }
    let t = gpu(ctx.timer())?;
    for _ in 0..iters {
        f()?;
    }
    Ok(f64::from(gpu(t.stop_ms())?) / iters.max(1) as f64)
}

/// A device-to-device copy on the context's stream.
pub fn copy_dtod(ctx: &CudaContext, dst: u64, src: u64, bytes: usize) -> Result<(), String> {
    // SAFETY: both ranges lie in live pool buffers of at least `bytes` bytes
    // and do not overlap; the copy is ordered on the context's one stream.
    unsafe { ctx.copy_dtod(dst, src, bytes) }.map_err(|e| e.to_string())
}
