//! Opt-in time per operation, for finding where a training step goes.
//!
//! With `MXSWITCH_PROFILE=1` in the environment, every backend operation on
//! a GPU waits for the device before and after it runs, and the wall time in
//! between is added to the operation's total. That serializes the device, so
//! a profiled step is slower than a normal one; what it shows is the share of
//! each operation. [`report`] prints the totals, largest first; `mxswitch
//! train` resets them after its first step, whose kernel compilations would
//! otherwise dominate. The training loop also times the host parts of each
//! step ([`timed`]: batch upload, forward, loss read back, backward,
//! clipping and AdamW); `MXSWITCH_PROFILE=host` times only those, without
//! waiting for the device, so the step runs as it does unprofiled and the
//! parts that wait show where the host stalls.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::Device;

/// The environment variable that turns profiling on.
pub const ENV: &str = "MXSWITCH_PROFILE";

/// Whether profiling is on (`MXSWITCH_PROFILE` set, not empty or `0`).
fn enabled() -> bool {
    mode().is_some()
}

/// `Some(true)` times every operation; `Some(false)` (`MXSWITCH_PROFILE=host`)
/// only the host parts of the step, with no waits for the device, so the
/// step runs as it does unprofiled.
fn mode() -> Option<bool> {
    static MODE: OnceLock<Option<bool>> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var(ENV).ok().as_deref() {
        None | Some("") | Some("0") => None,
        Some("host") => Some(false),
        Some(_) => Some(true),
    })
}

/// Per operation: (calls, seconds in all, seconds before the closing wait).
type Totals = HashMap<&'static str, (u64, f64, f64)>;

fn totals() -> &'static Mutex<Totals> {
    static T: OnceLock<Mutex<Totals>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Times one operation on `device` until dropped; a no-op unless profiling.
pub struct Scope {
    name: &'static str,
    device: Device,
    t0: Instant,
}

/// Starts timing `name` on `device` (CPU operations are not timed).
pub fn scope(name: &'static str, device: Device) -> Option<Scope> {
    if mode() != Some(true) || device == Device::Cpu {
        return None;
    }
    wait(device);
    Some(Scope {
        name,
        device,
        t0: Instant::now(),
    })
}

impl Drop for Scope {
    fn drop(&mut self) {
        let host = self.t0.elapsed().as_secs_f64();
        wait(self.device);
        let dt = self.t0.elapsed().as_secs_f64();
        note_peak(self.name, self.device);
        let mut t = totals().lock().unwrap_or_else(|p| p.into_inner());
        let e = t.entry(self.name).or_insert((0, 0.0, 0.0));
        e.0 += 1;
        e.1 += dt;
        e.2 += host;
    }
}

fn wait(device: Device) {
    // A failure here shows up at the operation's own next call.
    let _ = crate::storage::synchronize(&device);
    let mut seen = timed_device().lock().unwrap_or_else(|p| p.into_inner());
    seen.get_or_insert(device);
}

/// The first device an operation was timed on, whose allocator the report shows.
fn timed_device() -> &'static Mutex<Option<Device>> {
    static D: OnceLock<Mutex<Option<Device>>> = OnceLock::new();
    D.get_or_init(|| Mutex::new(None))
}

/// `f()`, its wall time added to the host part `name` of a training step; no
/// timing unless profiling. Unlike [`scope`] it does not wait for the device,
/// so what it shows is where the host spends the step: a part that waits (a
/// loss read back, a synchronous copy) shows the device's work before it.
pub fn timed<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    let t0 = Instant::now();
    let out = f();
    let dt = t0.elapsed().as_secs_f64();
    let mut t = host_totals().lock().unwrap_or_else(|p| p.into_inner());
    let e = t.entry(name).or_insert((0, 0.0));
    e.0 += 1;
    e.1 += dt;
    out
}

fn host_totals() -> &'static Mutex<HashMap<&'static str, (u64, f64)>> {
    static T: OnceLock<Mutex<HashMap<&'static str, (u64, f64)>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The operation during which the allocator's peak was last raised, and that peak.
fn peak_op() -> &'static Mutex<Option<(&'static str, u64)>> {
    static P: OnceLock<Mutex<Option<(&'static str, u64)>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(None))
}

/// Remembers `name` if the device's peak grew while it ran, so the report
/// can say which operation holds the step's memory high-water mark.
fn note_peak(name: &'static str, device: Device) {
    let Some(st) = crate::storage::memory_stats(&device) else {
        return;
    };
    let mut p = peak_op().lock().unwrap_or_else(|p| p.into_inner());
    if p.is_none_or(|(_, peak)| st.peak_bytes > peak) {
        *p = Some((name, st.peak_bytes));
    }
}

/// Forgets the totals so far (for example those of a first step that
/// compiled kernels).
pub fn reset() {
    totals().lock().unwrap_or_else(|p| p.into_inner()).clear();
    host_totals()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
}

/// The totals so far, one line per operation, largest first; None unless profiling.
pub fn report() -> Option<String> {
    if !enabled() {
        return None;
    }
    let t = totals().lock().unwrap_or_else(|p| p.into_inner());
    let mut rows: Vec<(&'static str, u64, f64, f64)> =
        t.iter().map(|(k, v)| (*k, v.0, v.1, v.2)).collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    let all: f64 = rows.iter().map(|r| r.2).sum();
    let mut out = match rows.is_empty() {
        true => format!("profile ({ENV}):\n"),
        false => format!(
            "profile ({ENV}): {:.1} ms in timed operations (host: time until the work was queued)\n",
            all * 1e3
        ),
    };
    for (name, n, s, host) in rows {
        out += &format!(
            "  {name:<26} {:>9.1} ms {:>5.1}%  {n:>7} calls  {:>8.1} us/call  host {:>7.1} us/call\n",
            s * 1e3,
            100.0 * s / all.max(1e-12),
            s * 1e6 / n as f64,
            host * 1e6 / n as f64
        );
    }
    let host = host_totals().lock().unwrap_or_else(|p| p.into_inner());
    let mut parts: Vec<_> = host.iter().map(|(k, v)| (*k, v.0, v.1)).collect();
    parts.sort_by(|a, b| b.2.total_cmp(&a.2));
    if !parts.is_empty() {
        out += "  host parts of the step (wall time, overlapping the operations above):\n";
    }
    for (name, n, s) in parts {
        out += &format!(
            "    {name:<24} {:>9.1} ms  {n:>7} calls  {:>8.1} us/call\n",
            s * 1e3,
            s * 1e6 / n as f64
        );
    }
    let device = *timed_device().lock().unwrap_or_else(|p| p.into_inner());
    if let Some((d, st)) = device
        .filter(|_| !t.is_empty())
        .and_then(|d| Some((d, crate::storage::memory_stats(&d)?)))
    {
        out += &format!(
            "  {d} pool: {} cuMemAlloc calls, {} reuses, peak {:.1} MiB\n",
            st.device_allocs,
            st.reuses,
            st.peak_bytes as f64 / 1048576.0
        );
        if let Some((op, _)) = *peak_op().lock().unwrap_or_else(|p| p.into_inner()) {
            out += &format!("  peak last raised during: {op}\n");
        }
    }
    Some(out)
}
