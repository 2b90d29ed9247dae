//! [`CudaContext`]: one GPU, one stream, the buffer pool, the loaded kernel
//! modules and the BLAS handle, over a `Driver` (CUDA, or HIP with the
//! `rocm` feature): the same code serves both platforms.
//!
//! Start-up checks (`cuda_driver::open`, `rocm::driver::open`) fail with
//! one line instead of a panic. The whole start runs under `catch_unwind`
//! with a silent panic hook as a last guard against a loader panic (for
//! example a symbol missing from an old library).

use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::alloc::{Pool, PoolStats};
use super::driver::{Driver, Handle};
use super::gemm::Blas;
use super::nvrtc::{KernelSource, Platform};
use super::staging::Staging;
use super::{CudaError, DevBuf, Result};

/// What the context runs on, for logs and reports.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// The device ordinal (`cuda:N` or `rocm:N`).
    pub ordinal: usize,
    /// CUDA or HIP.
    pub platform: Platform,
    /// The device name, e.g. "NVIDIA H200".
    pub name: String,
    /// The architecture: `sm_90`, or HIP's `gcnArchName` such as
    /// `gfx942:sramecc+:xnack-`.
    pub arch: String,
    /// CUDA's compute capability (major, minor), (9, 0) on Hopper; (0, 0) on HIP.
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_mem: usize,
    /// Number of streaming multiprocessors (SMs) or compute units (CUs).
    pub multiprocessors: i32,
    /// The most shared memory (LDS) one block may use, in bytes (CUDA's
    /// opt-in limit).
    pub shared_mem_per_block: usize,
    /// Driver, compiler and BLAS library versions, as one phrase.
    pub versions: String,
    /// Paths of the GPU libraries this process loaded.
    pub libraries: Vec<PathBuf>,
    /// Include directories handed to NVRTC (none on HIP).
    pub include_dirs: Vec<PathBuf>,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let libs: Vec<String> = self
            .libraries
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let incs: Vec<String> = self
            .include_dirs
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let (prefix, units) = match self.platform {
            Platform::Cuda => ("cuda", "SMs"),
            Platform::Hip => ("rocm", "CUs"),
        };
        write!(
            f,
            "{prefix}:{} {} ({}, {} {units}, {:.1} GiB), {}; libs [{}]; include [{}]",
            self.ordinal,
            self.name,
            self.arch,
            self.multiprocessors,
            self.total_mem as f64 / (1u64 << 30) as f64,
            self.versions,
            libs.join(", "),
            incs.join(", ")
        )
    }
}

/// A handle to one GPU. Cloning shares the device, stream, pool and caches.
#[derive(Clone)]
pub struct CudaContext {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    // Field order is drop order: everything that holds device memory or
    // handles goes before the driver (the modules are unloaded in `drop`).
    pub(crate) blas: Mutex<Option<Blas>>,
    staging: Mutex<Staging>,
    deferred: Mutex<DeferredChecks>,
    functions: Mutex<HashMap<&'static str, GpuFunction>>,
    modules: Mutex<HashMap<&'static str, Handle>>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) driver: Arc<dyn Driver>,
    pub(crate) info: DeviceInfo,
}

// SAFETY: the module handles are only used under their mutex and unloaded
// once, in `drop`; the driver is Send + Sync.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        lock(&self.functions).clear();
        for (_, m) in lock(&self.modules).drain() {
            // SAFETY: loaded once by this context; no function of it is used again.
            unsafe { self.driver.unload_module(m) };
        }
    }
}

/// A kernel of a loaded module.
#[derive(Clone)]
pub struct GpuFunction {
    raw: Handle,
    driver: Arc<dyn Driver>,
}

// SAFETY: a function handle is an immutable driver object, usable from any
// thread while its module is loaded (the context keeps it loaded).
unsafe impl Send for GpuFunction {}
unsafe impl Sync for GpuFunction {}

impl GpuFunction {
    /// Sets a function attribute (CUDA's enum; HIP maps the dynamic shared
    /// memory limit, the only one the backend sets).
    pub fn set_attribute(&self, attr: CUfunction_attribute_enum, value: i32) -> Result<()> {
        self.driver.bind()?;
        // SAFETY: a live function of this driver.
        unsafe { self.driver.set_function_attribute(self.raw, attr, value) }
    }
}

impl CudaContext {
    /// Opens CUDA GPU `ordinal`. Fails with [`CudaError::Unavailable`] (one
    /// line: what was looked for and where) when there is no GPU, driver or
    /// library.
    pub fn new(ordinal: usize) -> Result<CudaContext> {
        Self::open_with("CUDA", || super::cuda_driver::open(ordinal))
    }

    /// Opens AMD GPU `ordinal` through HIP, with the same one-line failures.
    #[cfg(feature = "rocm")]
    pub fn new_rocm(ordinal: usize) -> Result<CudaContext> {
        Self::open_with("HIP", || crate::rocm::driver::open(ordinal))
    }

    fn open_with(
        platform: &str,
        open: impl FnOnce() -> Result<(Arc<dyn Driver>, DeviceInfo)>,
    ) -> Result<CudaContext> {
        let (driver, info) = match quietly(open) {
            Ok(r) => r?,
            Err(msg) => {
                return Err(CudaError::Unavailable(format!(
                    "the {platform} loader failed: {}",
                    msg.replace('\n', " ")
                )))
            }
        };
        let pool = Pool::new(driver.clone());
        Ok(CudaContext {
            inner: Arc::new(Inner {
                blas: Mutex::new(None),
                staging: Mutex::new(Staging::new(driver.clone())),
                deferred: Mutex::new(DeferredChecks::default()),
                functions: Mutex::new(HashMap::new()),
                modules: Mutex::new(HashMap::new()),
                pool,
                driver,
                info,
            }),
        })
    }

    /// What this context runs on (device, driver and library versions).
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// CUDA or HIP.
    pub fn platform(&self) -> Platform {
        self.inner.info.platform
    }

    /// The stream every launch, copy and GEMM of this context runs on (a
    /// `CUstream` or `hipStream_t`).
    pub fn stream_handle(&self) -> *mut std::ffi::c_void {
        self.inner.driver.stream()
    }

    /// The buffer pool's counters so far (allocations, reuses, bytes, peak).
    pub fn pool_stats(&self) -> PoolStats {
        self.inner.pool.stats()
    }

    /// Free and total device memory in bytes. Free counts the buffers the
    /// pool has cached, which it hands out before asking the driver for more.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        let (free, total) = self.inner.driver.mem_info()?;
        Ok((free.saturating_add(self.pool_stats().bytes_cached), total))
    }

    /// An uninitialized buffer of `bytes` bytes from the pool.
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf> {
        self.inner.pool.alloc(bytes)
    }

    /// A buffer of `bytes` zero bytes (stream-ordered memset).
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DevBuf> {
        let buf = self.alloc(bytes)?;
        self.bind()?;
        // SAFETY: buf owns at least `bytes` bytes.
        unsafe { self.inner.driver.memset_d8(buf.ptr(), 0, bytes) }?;
        Ok(buf)
    }

    /// Copies host data into a new buffer, in stream order, through a pinned
    /// block (`staging.rs`): the call does not wait for the GPU.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<DevBuf> {
        let bytes = std::mem::size_of_val(data);
        let buf = self.alloc(bytes)?;
        if bytes > 0 {
            self.bind()?;
            let mut staging = lock(&self.inner.staging);
            // SAFETY: data is `bytes` readable bytes, buf holds as many, and
            // bind made this context current.
            unsafe { staging.upload(buf.ptr(), data.as_ptr() as *const u8, bytes) }?;
        }
        Ok(buf)
    }

    /// Copies `bytes` bytes from device address `src` to `dst`, in stream
    /// order.
    ///
    /// # Safety
    /// Both ranges must lie in live buffers of this context.
    pub unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: as the caller promised; the copy is ordered on the stream.
        unsafe { self.inner.driver.copy_dtod(dst, src, bytes) }
    }

    /// Copies the first `n` elements of `buf` to the host (waits for the
    /// stream), then raises any deferred non-finite amax
    /// ([`CudaContext::check_deferred`]).
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        buf: &DevBuf,
        n: usize,
    ) -> Result<Vec<T>> {
        let out = self.download_unchecked(buf, n)?;
        self.check_deferred()?;
        Ok(out)
    }

    /// Records that the f32 amax at device address `amax` must be finite,
    /// or else training fails with SPEC section 3's error naming `label`.
    /// Stream-ordered, no wait: the word is copied into a device log that the
    /// next read-back or [`CudaContext::check_deferred`] inspects.
    pub fn defer_finite_check(&self, amax: u64, label: String) -> Result<()> {
        if lock(&self.inner.deferred).labels.len() == DEFERRED_SLOTS {
            self.check_deferred()?;
        }
        let mut d = lock(&self.inner.deferred);
        if d.log.is_none() {
            d.log = Some(self.alloc(DEFERRED_SLOTS * 4)?);
        }
        let slot = d.log.as_ref().expect("allocated above").ptr() + 4 * d.labels.len() as u64;
        // SAFETY: `slot` is inside the log and `amax` is a live f32 on this stream.
        unsafe { self.copy_dtod(slot, amax, 4) }?;
        d.labels.push(label);
        Ok(())
    }

    /// Waits for the stream and fails with [`crate::Error::NonFiniteAmax`]
    /// for the first recorded amax that is NaN or infinite; clears the log.
    pub fn check_deferred(&self) -> Result<()> {
        let (log, labels) = {
            let mut d = lock(&self.inner.deferred);
            if d.labels.is_empty() {
                return Ok(());
            }
            (d.log.take(), std::mem::take(&mut d.labels))
        };
        let log = log.expect("a log exists while labels are pending");
        let words: Vec<u32> = self.download_unchecked(&log, labels.len())?;
        lock(&self.inner.deferred).log = Some(log);
        match words
            .iter()
            .zip(labels)
            .find(|(w, _)| !f32::from_bits(**w).is_finite())
        {
            Some((w, label)) => Err(crate::Error::NonFiniteAmax {
                tensor: label,
                amax: f32::from_bits(*w),
            }
            .into()),
            None => Ok(()),
        }
    }

    fn download_unchecked<T: DeviceRepr + Default + Clone>(
        &self,
        buf: &DevBuf,
        n: usize,
    ) -> Result<Vec<T>> {
        let bytes = n * std::mem::size_of::<T>();
        if bytes > buf.len_bytes() {
            return Err(CudaError::Invalid(format!(
                "download of {bytes} bytes from a buffer of {}",
                buf.len_bytes()
            )));
        }
        let mut out = vec![T::default(); n];
        if n > 0 {
            self.bind()?;
            // SAFETY: out has room for n elements; we synchronize before reading it.
            unsafe {
                self.inner
                    .driver
                    .copy_dtoh(out.as_mut_ptr() as *mut u8, buf.ptr(), bytes)
            }?;
        }
        self.synchronize()?;
        Ok(out)
    }

    /// Waits for all work queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.driver.stream_synchronize()
    }

    pub(crate) fn bind(&self) -> Result<()> {
        self.inner.driver.bind()
    }

    /// The architecture kernels are compiled for: `compute_90` (NVRTC's
    /// virtual architecture) or `gfx942` (the part of HIP's `gcnArchName`
    /// before the first `:`).
    pub fn arch(&self) -> String {
        let info = &self.inner.info;
        match info.platform {
            Platform::Cuda => {
                let (ma, mi) = info.compute_capability;
                format!("compute_{ma}{mi}")
            }
            Platform::Hip => info.arch.split(':').next().unwrap_or("").to_string(),
        }
    }

    /// Kernel `name` of `src`: compiled once per process, loaded once per context.
    pub(crate) fn function(&self, src: &KernelSource, name: &'static str) -> Result<GpuFunction> {
        if let Some(f) = lock(&self.inner.functions).get(name) {
            return Ok(f.clone());
        }
        let module = {
            let mut modules = lock(&self.inner.modules);
            match modules.get(src.name) {
                Some(m) => *m,
                None => {
                    let m = self.inner.driver.load_module(src)?;
                    modules.insert(src.name, m);
                    m
                }
            }
        };
        // SAFETY: a module this context loaded and keeps loaded.
        let raw = unsafe { self.inner.driver.function(module, name) }?;
        let f = GpuFunction {
            raw,
            driver: self.inner.driver.clone(),
        };
        lock(&self.inner.functions).insert(name, f.clone());
        Ok(f)
    }

    /// Launches `f` (kernel `name`) with one pointer per argument; what
    /// `launch_kernel!` expands to. A failure names the kernel.
    ///
    /// # Safety
    /// `args` must point at live values of the kernel's parameter types, and
    /// the buffers they name must be large enough for the launch.
    pub(crate) unsafe fn launch(
        &self,
        f: &GpuFunction,
        name: &str,
        cfg: LaunchConfig,
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        // SAFETY: as the caller promised; f belongs to this context's driver.
        unsafe { self.inner.driver.launch(f.raw, &cfg, args) }.map_err(|e| match e {
            CudaError::Driver { err, .. } => CudaError::Driver {
                op: format!("launch {name}"),
                err,
            },
            other => other,
        })
    }

    /// Starts a timer: events recorded on the stream around queued work.
    pub fn timer(&self) -> Result<GpuTimer> {
        let drv = &self.inner.driver;
        let start = drv.event_create(true)?;
        let end = drv.event_create(true).inspect_err(|_| {
            // SAFETY: created above, used nowhere else.
            unsafe { drv.event_destroy(start) }
        })?;
        let timer = GpuTimer {
            start,
            end,
            driver: drv.clone(),
        };
        // SAFETY: the timer's own live event.
        unsafe { drv.event_record(timer.start) }?;
        Ok(timer)
    }
}

/// Two events around a stretch of stream work.
pub struct GpuTimer {
    start: Handle,
    end: Handle,
    driver: Arc<dyn Driver>,
}

// SAFETY: the events are owned by the timer and used by one thread at a time.
unsafe impl Send for GpuTimer {}

impl GpuTimer {
    /// Milliseconds of stream time since the timer started (waits for the work).
    pub fn stop_ms(self) -> Result<f32> {
        self.stop()?.ms()
    }

    /// Marks the end on the stream without waiting, so that the host can
    /// queue more work; [`StoppedTimer::ms`] reads the time later.
    pub fn stop(self) -> Result<StoppedTimer> {
        self.driver.bind()?;
        // SAFETY: the timer's own live event.
        unsafe { self.driver.event_record(self.end) }?;
        Ok(StoppedTimer(self))
    }
}

/// A [`GpuTimer`] whose end is recorded on the stream.
pub struct StoppedTimer(GpuTimer);

impl StoppedTimer {
    /// Milliseconds between the two events (waits for the work).
    pub fn ms(&self) -> Result<f32> {
        let t = &self.0;
        t.driver.bind()?;
        // SAFETY: the timer's own live events, both recorded on the stream.
        unsafe { t.driver.event_elapsed_ms(t.start, t.end) }
    }
}

impl Drop for GpuTimer {
    fn drop(&mut self) {
        // SAFETY: the timer's own events, destroyed once.
        unsafe {
            self.driver.event_destroy(self.start);
            self.driver.event_destroy(self.end);
        }
    }
}

/// Slots of the deferred finite-check log (a check runs when it is full).
const DEFERRED_SLOTS: usize = 4096;

/// Amax words awaiting a finite check, and the tensor each one names.
#[derive(Default)]
struct DeferredChecks {
    log: Option<DevBuf>,
    labels: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f`, turning a panic into its message, with the panic hook silenced
/// so nothing is printed. The hook is process-global; this is only used while
/// a context starts.
fn quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    let prev = panic::take_hook();
    panic::set_hook(Box::new(|_| {}));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    panic::set_hook(prev);
    r.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into())
    })
}
