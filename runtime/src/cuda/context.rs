//! [`CudaContext`]: one GPU, one stream, the buffer pool, the loaded kernel
//! modules and the cuBLASLt handle.
//!
//! Start-up checks, in order, each failing with one line instead of a panic:
//! the three shared libraries can be opened (cudarc's loader would panic), the
//! driver initialises and sees a device with the requested ordinal, NVRTC and
//! cuBLASLt answer a version query (which loads their first symbols). The
//! whole start runs under `catch_unwind` with a silent panic hook as a last
//! guard against a loader panic (for example a symbol missing from an old
//! library).

use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    self, result as dresult, sys as dsys, CudaFunction, CudaModule, CudaStream, DeviceRepr,
};

use super::alloc::{Pool, PoolStats};
use super::gemm::Blas;
use super::nvrtc::{self, KernelSource};
use super::staging::Staging;
use super::{driver_err, CudaError, DevBuf, Result};

/// What the context runs on, for logs and reports.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// The CUDA device ordinal (`cuda:N`).
    pub ordinal: usize,
    /// The device name from cuDeviceGetName, e.g. "NVIDIA H200".
    pub name: String,
    /// Compute capability (major, minor): (9, 0) on Hopper.
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_mem: usize,
    /// Number of streaming multiprocessors (SMs).
    pub multiprocessors: i32,
    /// cuDriverGetVersion, e.g. 13000.
    pub driver_version: i32,
    /// NVRTC version (major, minor), e.g. (13, 0).
    pub nvrtc_version: (i32, i32),
    /// cublasLtGetVersion, e.g. 130100.
    pub cublaslt_version: usize,
    /// Paths of the CUDA libraries this process loaded.
    pub libraries: Vec<PathBuf>,
    /// Include directories handed to NVRTC.
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
        write!(
            f,
            "cuda:{} {} (sm_{}{}, {} SMs, {:.1} GiB), driver {}, nvrtc {}.{}, cublasLt {}; libs [{}]; include [{}]",
            self.ordinal,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.multiprocessors,
            self.total_mem as f64 / (1u64 << 30) as f64,
            self.driver_version,
            self.nvrtc_version.0,
            self.nvrtc_version.1,
            self.cublaslt_version,
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
    // handles goes before the driver context.
    pub(crate) blas: Mutex<Option<Blas>>,
    staging: Mutex<Staging>,
    deferred: Mutex<DeferredChecks>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) ctx: Arc<driver::CudaContext>,
    pub(crate) info: DeviceInfo,
}

impl CudaContext {
    /// Opens GPU `ordinal`. Fails with [`CudaError::Unavailable`] (one line:
    /// what was looked for and where) when there is no GPU, driver or library.
    pub fn new(ordinal: usize) -> Result<CudaContext> {
        match quietly(|| Self::open(ordinal)) {
            Ok(r) => r,
            Err(msg) => Err(CudaError::Unavailable(format!(
                "the CUDA loader failed: {}",
                msg.replace('\n', " ")
            ))),
        }
    }

    fn open(ordinal: usize) -> Result<CudaContext> {
        check_libraries()?;
        let count = match driver::CudaContext::device_count() {
            Ok(n) => n,
            Err(e) => {
                return Err(CudaError::Unavailable(format!(
                    "the CUDA driver ({}) found no usable GPU: cuInit/cuDeviceGetCount gave {e:?}",
                    loaded_libraries(&["libcuda"])
                        .first()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "libcuda".into())
                )))
            }
        };
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::Unavailable(format!(
                "no GPU with ordinal {ordinal}: the CUDA driver sees {count} device(s)"
            )));
        }
        let ctx =
            driver::CudaContext::new(ordinal).map_err(driver_err("cuCtx (primary context)"))?;
        // Buffers are raw pointers from our own pool, not CudaSlices, so
        // cudarc's per-slice event tracking has nothing to track.
        // SAFETY: no CudaSlice of this context exists yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err("cuStreamCreate"))?;

        let attr = |a| ctx.attribute(a).map_err(driver_err("cuDeviceGetAttribute"));
        use dsys::CUdevice_attribute as A;
        let cc = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let multiprocessors = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let mut driver_version = 0i32;
        // SAFETY: plain out-parameter query.
        unsafe { dsys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(driver_err("cuDriverGetVersion"))?;
        let (mut major, mut minor) = (0i32, 0i32);
        // SAFETY: plain out-parameter query; loads libnvrtc's first symbol.
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| CudaError::Unavailable(format!("nvrtcVersion failed: {e:?}")))?;
        // SAFETY: no arguments; loads libcublasLt's first symbol.
        let cublaslt_version = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
        let libraries = loaded_libraries(&["libcuda.so", "libnvrtc", "libcublasLt"]);
        let include_dirs = nvrtc::include_dirs(&libraries);
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(driver_err("cuDeviceGetName"))?,
            compute_capability: cc,
            total_mem: ctx.total_mem().map_err(driver_err("cuDeviceTotalMem"))?,
            multiprocessors,
            driver_version,
            nvrtc_version: (major, minor),
            cublaslt_version,
            libraries,
            include_dirs,
        };
        let pool = Pool::new(ctx.clone());
        Ok(CudaContext {
            inner: Arc::new(Inner {
                blas: Mutex::new(None),
                staging: Mutex::new(Staging::default()),
                deferred: Mutex::new(DeferredChecks::default()),
                functions: Mutex::new(HashMap::new()),
                modules: Mutex::new(HashMap::new()),
                pool,
                stream,
                ctx,
                info,
            }),
        })
    }

    /// What this context runs on (device, driver and library versions).
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// The stream every launch, copy and GEMM of this context runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// The buffer pool's counters so far (allocations, reuses, bytes, peak).
    pub fn pool_stats(&self) -> PoolStats {
        self.inner.pool.stats()
    }

    /// Free and total device memory in bytes. Free counts the buffers the
    /// pool has cached, which it hands out before asking the driver for more.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        let (free, total) = self
            .inner
            .ctx
            .mem_get_info()
            .map_err(driver_err("cuMemGetInfo"))?;
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
        unsafe { dresult::memset_d8_async(buf.ptr(), 0, bytes, self.inner.stream.cu_stream()) }
            .map_err(driver_err("cuMemsetD8Async"))?;
        Ok(buf)
    }

    /// Copies host data into a new buffer, in stream order, through a pinned
    /// block (`staging.rs`): the call does not wait for the GPU.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<DevBuf> {
        let bytes = std::mem::size_of_val(data);
        let buf = self.alloc(bytes)?;
        if bytes > 0 {
            self.bind()?;
            let mut staging = self.inner.staging.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: data is `bytes` readable bytes, buf holds as many, and
            // bind made this context current.
            unsafe {
                staging.upload(
                    buf.ptr(),
                    data.as_ptr() as *const u8,
                    bytes,
                    self.inner.stream.cu_stream(),
                )
            }?;
        }
        Ok(buf)
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
        self.bind()?;
        // SAFETY: `slot` is inside the log and `amax` is a live f32 on this stream.
        unsafe { dresult::memcpy_dtod_async(slot, amax, 4, self.inner.stream.cu_stream()) }
            .map_err(driver_err("cuMemcpyDtoDAsync"))?;
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
                dresult::memcpy_dtoh_async(&mut out, buf.ptr(), self.inner.stream.cu_stream())
            }
            .map_err(driver_err("cuMemcpyDtoHAsync"))?;
        }
        self.synchronize()?;
        Ok(out)
    }

    /// Waits for all work queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }

    pub(crate) fn bind(&self) -> Result<()> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))
    }

    /// The virtual architecture kernels are compiled for, e.g. `compute_90`.
    pub fn arch(&self) -> String {
        let (ma, mi) = self.inner.info.compute_capability;
        format!("compute_{ma}{mi}")
    }

    /// Kernel `name` of `src`: compiled once per process, loaded once per context.
    pub(crate) fn function(&self, src: &KernelSource, name: &'static str) -> Result<CudaFunction> {
        if let Some(f) = lock(&self.inner.functions).get(name) {
            return Ok(f.clone());
        }
        let module = {
            let mut modules = lock(&self.inner.modules);
            match modules.get(src.name) {
                Some(m) => m.clone(),
                None => {
                    let ptx = nvrtc::ptx_for(src, &self.arch(), &self.inner.info.include_dirs)?;
                    let m = self
                        .inner
                        .ctx
                        .load_module(ptx)
                        .map_err(driver_err(format!("cuModuleLoadData({})", src.name)))?;
                    modules.insert(src.name, m.clone());
                    m
                }
            }
        };
        let f = module
            .load_function(name)
            .map_err(driver_err(format!("cuModuleGetFunction({name})")))?;
        lock(&self.inner.functions).insert(name, f.clone());
        Ok(f)
    }

    /// Starts a timer: events recorded on the stream around queued work.
    pub fn timer(&self) -> Result<GpuTimer> {
        let ev = || {
            self.inner
                .ctx
                .new_event(Some(dsys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver_err("cuEventCreate"))
        };
        let (start, end) = (ev()?, ev()?);
        start
            .record(&self.inner.stream)
            .map_err(driver_err("cuEventRecord"))?;
        Ok(GpuTimer {
            start,
            end,
            stream: self.inner.stream.clone(),
        })
    }
}

/// Two events around a stretch of stream work.
pub struct GpuTimer {
    start: driver::CudaEvent,
    end: driver::CudaEvent,
    stream: Arc<CudaStream>,
}

impl GpuTimer {
    /// Milliseconds of stream time since the timer started (waits for the work).
    pub fn stop_ms(self) -> Result<f32> {
        self.end
            .record(&self.stream)
            .map_err(driver_err("cuEventRecord"))?;
        self.start
            .elapsed_ms(&self.end)
            .map_err(driver_err("cuEventElapsedTime"))
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

/// Checks that the driver, NVRTC and cuBLASLt libraries can be opened,
/// before cudarc's loader (which panics) is asked for them.
fn check_libraries() -> Result<()> {
    // SAFETY: each probe only dlopens and closes the candidate names.
    let probes: [(&str, &str, bool); 3] = unsafe {
        [
            ("cuda", "CUDA driver", dsys::is_culib_present()),
            ("nvrtc", "NVRTC", cudarc::nvrtc::sys::is_culib_present()),
            (
                "cublasLt",
                "cuBLASLt",
                cudarc::cublaslt::sys::is_culib_present(),
            ),
        ]
    };
    let missing: Vec<String> = probes
        .iter()
        .filter(|(_, _, present)| !present)
        .map(|(lib, what, _)| {
            let names = cudarc::get_lib_name_candidates(lib);
            let so: Vec<&String> = names
                .iter()
                .filter(|n| n.starts_with(&format!("lib{lib}.so")))
                .collect();
            format!(
                "{what} ({}{})",
                so.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                if names.len() > so.len() {
                    format!(" and {} other spellings", names.len() - so.len())
                } else {
                    String::new()
                }
            )
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let ld = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    Err(CudaError::Unavailable(format!(
        "could not load {}; searched LD_LIBRARY_PATH={} and the system library paths (ld.so.cache, /lib, /usr/lib); install the NVIDIA driver and CUDA 13 libraries or add their lib directories to LD_LIBRARY_PATH",
        missing.join("; "),
        if ld.is_empty() { "(unset)" } else { ld.as_str() }
    )))
}

/// Paths of the mapped shared objects whose file name starts with one of `prefixes`.
fn loaded_libraries(prefixes: &[&str]) -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let p = PathBuf::from(path);
        let Some(file) = p.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        if prefixes.iter().any(|pre| file.starts_with(pre)) && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}
