//! The CUDA [`Driver`]: cudarc's driver API on one primary context and one
//! stream, and [`open`], the CUDA start-up checks. The calls are the ones
//! the context made before the driver layer existed, one for one.

use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{self, result as dresult, sys as dsys, CudaStream, LaunchConfig};

use super::context::DeviceInfo;
use super::driver::{Driver, Handle};
use super::nvrtc::{self, KernelSource, Platform};
use super::{driver_err, CudaError, Result};

/// A CUDA device: its primary context and the stream every call uses.
pub(crate) struct CudaDriver {
    stream: Arc<CudaStream>,
    ctx: Arc<driver::CudaContext>,
    /// NVRTC's `--gpu-architecture`, e.g. `compute_90`.
    arch: String,
    include_dirs: Vec<PathBuf>,
}

/// Opens CUDA device `ordinal`: the libraries can be opened (cudarc's
/// loader would panic), the driver sees the device, NVRTC and cuBLASLt
/// answer a version query (which loads their first symbols).
pub(crate) fn open(ordinal: usize) -> Result<(Arc<dyn Driver>, DeviceInfo)> {
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
    let ctx = driver::CudaContext::new(ordinal).map_err(driver_err("cuCtx (primary context)"))?;
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
    let smem = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
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
        platform: Platform::Cuda,
        name: ctx.name().map_err(driver_err("cuDeviceGetName"))?,
        arch: format!("sm_{}{}", cc.0, cc.1),
        compute_capability: cc,
        total_mem: ctx.total_mem().map_err(driver_err("cuDeviceTotalMem"))?,
        multiprocessors,
        shared_mem_per_block: smem.max(0) as usize,
        versions: format!(
            "driver {driver_version}, nvrtc {major}.{minor}, cublasLt {cublaslt_version}"
        ),
        libraries,
        include_dirs: include_dirs.clone(),
    };
    let drv = CudaDriver {
        stream,
        ctx,
        arch: format!("compute_{}{}", cc.0, cc.1),
        include_dirs,
    };
    Ok((Arc::new(drv), info))
}

fn cu(h: Handle) -> dsys::CUevent {
    h as dsys::CUevent
}

impl Driver for CudaDriver {
    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))
    }

    fn malloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        // SAFETY: the context is current; the caller owns the pointer.
        unsafe { dresult::malloc_sync(bytes) }.map_err(driver_err("cuMemAlloc"))
    }

    unsafe fn free(&self, ptr: u64) -> Result<()> {
        // SAFETY: as the caller promised.
        unsafe { dresult::free_sync(ptr) }.map_err(driver_err("cuMemFree"))
    }

    fn device_synchronize(&self) -> Result<()> {
        self.ctx
            .synchronize()
            .map_err(driver_err("cuCtxSynchronize"))
    }

    fn stream_synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(driver_err("cuMemGetInfo"))
    }

    unsafe fn memset_d8(&self, ptr: u64, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: as the caller promised.
        unsafe { dresult::memset_d8_async(ptr, value, bytes, self.stream.cu_stream()) }
            .map_err(driver_err("cuMemsetD8Async"))
    }

    unsafe fn copy_htod(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: as the caller promised.
        unsafe {
            dsys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, self.stream.cu_stream())
        }
        .result()
        .map_err(driver_err("cuMemcpyHtoDAsync"))
    }

    unsafe fn copy_dtoh(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: as the caller promised.
        unsafe {
            dsys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, bytes, self.stream.cu_stream())
        }
        .result()
        .map_err(driver_err("cuMemcpyDtoHAsync"))
    }

    unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: as the caller promised.
        unsafe { dresult::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(driver_err("cuMemcpyDtoDAsync"))
    }

    fn host_alloc(&self, bytes: usize) -> Result<*mut u8> {
        // SAFETY: a plain pinned allocation, freed by host_free.
        unsafe { dresult::malloc_host(bytes, 0) }
            .map(|p| p as *mut u8)
            .map_err(driver_err("cuMemHostAlloc"))
    }

    unsafe fn host_free(&self, ptr: *mut u8) {
        // SAFETY: as the caller promised.
        let _ = unsafe { dresult::free_host(ptr as *mut c_void) };
    }

    fn event_create(&self, timing: bool) -> Result<Handle> {
        let flags = if timing {
            dsys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        self.bind()?;
        dresult::event::create(flags)
            .map(|e| e as Handle)
            .map_err(driver_err("cuEventCreate"))
    }

    unsafe fn event_record(&self, event: Handle) -> Result<()> {
        // SAFETY: as the caller promised.
        unsafe { dresult::event::record(cu(event), self.stream.cu_stream()) }
            .map_err(driver_err("cuEventRecord"))
    }

    unsafe fn event_done(&self, event: Handle) -> Result<bool> {
        // SAFETY: as the caller promised.
        match unsafe { dresult::event::query(cu(event)) } {
            Ok(()) => Ok(true),
            Err(dresult::DriverError(dsys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(e) => Err(driver_err("cuEventQuery")(e)),
        }
    }

    unsafe fn event_synchronize(&self, event: Handle) -> Result<()> {
        // SAFETY: as the caller promised.
        unsafe { dresult::event::synchronize(cu(event)) }.map_err(driver_err("cuEventSynchronize"))
    }

    unsafe fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32> {
        self.bind()?;
        // SAFETY: as the caller promised.
        unsafe {
            self.event_synchronize(start)?;
            self.event_synchronize(end)?;
            dresult::event::elapsed(cu(start), cu(end)).map_err(driver_err("cuEventElapsedTime"))
        }
    }

    unsafe fn event_destroy(&self, event: Handle) {
        // SAFETY: as the caller promised.
        let _ = unsafe { dresult::event::destroy(cu(event)) };
    }

    fn load_module(&self, src: &KernelSource) -> Result<Handle> {
        let ptx = nvrtc::ptx_for(src, &self.arch, &self.include_dirs)?;
        let text = CString::new(ptx.to_src())
            .map_err(|_| CudaError::Invalid(format!("the PTX of {} holds a NUL byte", src.name)))?;
        self.bind()?;
        // SAFETY: a NUL-terminated PTX image; the module is unloaded by unload_module.
        unsafe { dresult::module::load_data(text.as_ptr() as *const c_void) }
            .map(|m| m as Handle)
            .map_err(driver_err(format!("cuModuleLoadData({})", src.name)))
    }

    unsafe fn unload_module(&self, module: Handle) {
        if self.bind().is_ok() {
            // SAFETY: as the caller promised.
            let _ = unsafe { dresult::module::unload(module as dsys::CUmodule) };
        }
    }

    unsafe fn function(&self, module: Handle, name: &str) -> Result<Handle> {
        let c = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: as the caller promised.
        unsafe { dresult::module::get_function(module as dsys::CUmodule, c) }
            .map(|f| f as Handle)
            .map_err(driver_err(format!("cuModuleGetFunction({name})")))
    }

    unsafe fn set_function_attribute(
        &self,
        f: Handle,
        attr: CUfunction_attribute_enum,
        value: i32,
    ) -> Result<()> {
        // SAFETY: as the caller promised.
        unsafe { dresult::function::set_function_attribute(f as dsys::CUfunction, attr, value) }
            .map_err(driver_err("cuFuncSetAttribute"))
    }

    unsafe fn launch(&self, f: Handle, cfg: &LaunchConfig, args: &mut [*mut c_void]) -> Result<()> {
        self.bind()?;
        // SAFETY: as the caller promised.
        unsafe {
            dresult::launch_kernel(
                f as dsys::CUfunction,
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                self.stream.cu_stream(),
                args,
            )
        }
        .map_err(driver_err("cuLaunchKernel"))
    }

    fn stream(&self) -> Handle {
        self.stream.cu_stream() as Handle
    }
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
