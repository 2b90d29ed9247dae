//! The HIP [`Driver`]: the HIP runtime entry points of [`super::hip`] on one
//! device and one stream, kernels compiled by hiprtc for the device's
//! `gcnArchName` ([`super::hiprtc`], cached per process) and loaded with
//! `hipModuleLoadData`, launches through `hipModuleLaunchKernel`. Written
//! from HIP's documented C API; nothing here has run on an AMD GPU.

use std::ffi::{c_int, c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::LaunchConfig;

use super::consts::{self, device_prop};
use super::hip::Hip;
use super::hiprtc::Hiprtc;
use super::{Libraries, Probe};
use crate::cuda::context::DeviceInfo;
use crate::cuda::driver::{Driver, Handle};
use crate::cuda::nvrtc::{self, KernelSource, Platform};
use crate::cuda::{CudaError, Result};

/// One AMD GPU: its ordinal, its stream and what it compiles for.
pub(crate) struct HipDriver {
    hip: Hip<'static>,
    ordinal: c_int,
    stream: Handle,
    /// hiprtc's `--offload-arch`: `gcnArchName` up to the first `:`.
    arch: String,
}

// SAFETY: the stream is a HIP handle, usable from any thread; the entry
// points are plain function pointers.
unsafe impl Send for HipDriver {}
unsafe impl Sync for HipDriver {}

/// A HIP status as the context's error, naming the call.
fn check(op: &str, rc: c_int) -> Result<()> {
    if rc == consts::HIP_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver {
            op: op.to_string(),
            err: format!("hipError_t {rc}"),
        })
    }
}

/// hiprtc, shared by every device of the process so that each module is
/// compiled once per architecture.
fn compiler(libs: &'static Libraries) -> Result<&'static Mutex<Hiprtc<'static>>> {
    static RTC: OnceLock<std::result::Result<Mutex<Hiprtc<'static>>, String>> = OnceLock::new();
    RTC.get_or_init(|| Hiprtc::new(libs).map(Mutex::new))
        .as_ref()
        .map_err(|e| CudaError::RocmUnavailable(format!("ROCm backend unavailable: {e}")))
}

/// Opens AMD GPU `ordinal`. Without the libraries, or without a device,
/// it fails with the one line of [`super::probe`], before any hipBLASLt
/// call (`hipblasLtCreate` exits the process when there is no GPU).
pub(crate) fn open(ordinal: usize) -> Result<(Arc<dyn Driver>, DeviceInfo)> {
    let count = match super::probe() {
        Probe::NoLibraries(line) | Probe::NoDevice(line) => {
            return Err(CudaError::RocmUnavailable(line))
        }
        Probe::Devices(n) => n,
    };
    if ordinal >= count {
        return Err(CudaError::RocmUnavailable(format!(
            "no ROCm device rocm:{ordinal}: HIP sees {count} device(s)"
        )));
    }
    let libs = super::libraries().map_err(CudaError::RocmUnavailable)?;
    let hip = Hip::new(&libs.hip, &libs.paths[0])
        .map_err(|e| CudaError::RocmUnavailable(format!("ROCm backend unavailable: {e}")))?;
    let dev = ordinal as c_int;
    // SAFETY: a device HIP reported.
    check("hipSetDevice", unsafe { (hip.set_device)(dev) })?;
    // Eight-byte aligned room for the struct, with slack for a newer runtime.
    let mut prop = vec![0u64; 2 * device_prop::SIZE / 8];
    // SAFETY: the buffer holds more than sizeof(hipDeviceProp_t).
    check("hipGetDeviceProperties", unsafe {
        (hip.device_properties)(prop.as_mut_ptr() as *mut c_void, dev)
    })?;
    // SAFETY: u64s viewed as their bytes.
    let bytes = unsafe { std::slice::from_raw_parts(prop.as_ptr() as *const u8, prop.len() * 8) };
    let props = Properties::read(bytes);
    let (mut driver_version, mut runtime_version) = (0, 0);
    // SAFETY: plain out-parameter queries.
    unsafe {
        check(
            "hipDriverGetVersion",
            (hip.driver_version)(&mut driver_version),
        )?;
        check(
            "hipRuntimeGetVersion",
            (hip.runtime_version)(&mut runtime_version),
        )?;
    }
    let mut stream: Handle = std::ptr::null_mut();
    // SAFETY: an out-parameter; the stream lives as long as the process.
    check("hipStreamCreate", unsafe {
        (hip.stream_create)(&mut stream)
    })?;
    compiler(libs)?;
    let info = DeviceInfo {
        ordinal,
        platform: Platform::Hip,
        name: props.name.clone(),
        arch: props.gcn_arch_name.clone(),
        compute_capability: (0, 0),
        total_mem: props.total_mem,
        multiprocessors: props.multiprocessors,
        shared_mem_per_block: props.shared_mem_per_block,
        versions: format!("HIP driver {driver_version}, runtime {runtime_version}"),
        libraries: libs.paths.iter().map(Into::into).collect(),
        include_dirs: Vec::new(),
    };
    let drv = HipDriver {
        hip,
        ordinal: dev,
        stream,
        arch: offload_arch(&props.gcn_arch_name),
    };
    Ok((Arc::new(drv), info))
}

/// What the context reads of `hipDeviceProp_t`.
#[derive(Debug, PartialEq, Eq)]
struct Properties {
    name: String,
    gcn_arch_name: String,
    total_mem: usize,
    shared_mem_per_block: usize,
    multiprocessors: i32,
}

impl Properties {
    /// The fields at the offsets of [`device_prop`] in the struct's bytes.
    fn read(b: &[u8]) -> Properties {
        let text = |at: usize| {
            let field = &b[at..at + 256];
            let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
            String::from_utf8_lossy(&field[..end]).into_owned()
        };
        let word = |at: usize| usize::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let int = |at: usize| i32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        Properties {
            name: text(device_prop::NAME),
            gcn_arch_name: text(device_prop::GCN_ARCH_NAME),
            total_mem: word(device_prop::TOTAL_GLOBAL_MEM),
            shared_mem_per_block: word(device_prop::SHARED_MEM_PER_BLOCK),
            multiprocessors: int(device_prop::MULTI_PROCESSOR_COUNT),
        }
    }
}

/// hiprtc's `--offload-arch` for a `gcnArchName` (`gfx942:sramecc+:xnack-`
/// compiles for `gfx942`, which runs with either feature setting).
fn offload_arch(gcn_arch_name: &str) -> String {
    gcn_arch_name.split(':').next().unwrap_or("").to_string()
}

impl HipDriver {
    fn call(&self, op: &str, rc: c_int) -> Result<()> {
        check(op, rc)
    }
}

impl Driver for HipDriver {
    fn bind(&self) -> Result<()> {
        // SAFETY: a device HIP reported; the current device is per thread.
        self.call("hipSetDevice", unsafe {
            (self.hip.set_device)(self.ordinal)
        })
    }

    fn malloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-parameter; the caller owns the allocation.
        self.call("hipMalloc", unsafe { (self.hip.malloc)(&mut p, bytes) })?;
        Ok(p as u64)
    }

    unsafe fn free(&self, ptr: u64) -> Result<()> {
        // SAFETY: as the caller promised.
        self.call("hipFree", unsafe { (self.hip.free)(ptr as *mut c_void) })
    }

    fn device_synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments.
        self.call("hipDeviceSynchronize", unsafe {
            (self.hip.device_synchronize)()
        })
    }

    fn stream_synchronize(&self) -> Result<()> {
        // SAFETY: our live stream.
        self.call("hipStreamSynchronize", unsafe {
            (self.hip.stream_synchronize)(self.stream)
        })
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-parameters.
        self.call("hipMemGetInfo", unsafe {
            (self.hip.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free, total))
    }

    unsafe fn memset_d8(&self, ptr: u64, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: as the caller promised.
        self.call("hipMemsetD8Async", unsafe {
            (self.hip.memset_d8_async)(ptr as *mut c_void, value, bytes, self.stream)
        })
    }

    unsafe fn copy_htod(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: as the caller promised.
        self.call("hipMemcpyHtoDAsync", unsafe {
            (self.hip.memcpy_htod_async)(dst as *mut c_void, src as *mut c_void, bytes, self.stream)
        })
    }

    unsafe fn copy_dtoh(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: as the caller promised.
        self.call("hipMemcpyDtoHAsync", unsafe {
            (self.hip.memcpy_dtoh_async)(dst as *mut c_void, src as *mut c_void, bytes, self.stream)
        })
    }

    unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: as the caller promised.
        self.call("hipMemcpyDtoDAsync", unsafe {
            (self.hip.memcpy_dtod_async)(dst as *mut c_void, src as *mut c_void, bytes, self.stream)
        })
    }

    fn host_alloc(&self, bytes: usize) -> Result<*mut u8> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-parameter; flags 0 is hipHostMallocDefault.
        self.call("hipHostMalloc", unsafe {
            (self.hip.host_malloc)(&mut p, bytes, 0)
        })?;
        Ok(p as *mut u8)
    }

    unsafe fn host_free(&self, ptr: *mut u8) {
        // SAFETY: as the caller promised.
        unsafe { (self.hip.host_free)(ptr as *mut c_void) };
    }

    fn event_create(&self, timing: bool) -> Result<Handle> {
        self.bind()?;
        let flags = if timing {
            consts::HIP_EVENT_DEFAULT
        } else {
            consts::HIP_EVENT_DISABLE_TIMING
        };
        let mut e: Handle = std::ptr::null_mut();
        // SAFETY: an out-parameter.
        self.call("hipEventCreateWithFlags", unsafe {
            (self.hip.event_create)(&mut e, flags)
        })?;
        Ok(e)
    }

    unsafe fn event_record(&self, event: Handle) -> Result<()> {
        // SAFETY: as the caller promised.
        self.call("hipEventRecord", unsafe {
            (self.hip.event_record)(event, self.stream)
        })
    }

    unsafe fn event_done(&self, event: Handle) -> Result<bool> {
        // SAFETY: as the caller promised.
        match unsafe { (self.hip.event_query)(event) } {
            consts::HIP_SUCCESS => Ok(true),
            consts::HIP_ERROR_NOT_READY => Ok(false),
            rc => check("hipEventQuery", rc).map(|_| false),
        }
    }

    unsafe fn event_synchronize(&self, event: Handle) -> Result<()> {
        // SAFETY: as the caller promised.
        self.call("hipEventSynchronize", unsafe {
            (self.hip.event_synchronize)(event)
        })
    }

    unsafe fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: as the caller promised.
        unsafe {
            self.event_synchronize(start)?;
            self.event_synchronize(end)?;
            self.call(
                "hipEventElapsedTime",
                (self.hip.event_elapsed_time)(&mut ms, start, end),
            )?;
        }
        Ok(ms)
    }

    unsafe fn event_destroy(&self, event: Handle) {
        // SAFETY: as the caller promised.
        unsafe { (self.hip.event_destroy)(event) };
    }

    fn load_module(&self, src: &KernelSource) -> Result<Handle> {
        let libs = super::libraries().map_err(CudaError::RocmUnavailable)?;
        let hip_src = nvrtc::source_for(*src, Platform::Hip);
        let text = nvrtc::full_source_for(&hip_src, Platform::Hip);
        let mut rtc = compiler(libs)?.lock().unwrap_or_else(|p| p.into_inner());
        let code = rtc
            .code_object(src.name, &text, &self.arch)
            .map_err(|log| CudaError::Compile {
                source_name: src.name.to_string(),
                options: super::hiprtc::options(&self.arch).join(" "),
                log,
            })?;
        self.bind()?;
        let mut m: Handle = std::ptr::null_mut();
        // SAFETY: a code object hiprtc produced for this device's architecture.
        self.call(&format!("hipModuleLoadData({})", src.name), unsafe {
            (self.hip.module_load_data)(&mut m, code.as_ptr() as *const c_void)
        })?;
        Ok(m)
    }

    unsafe fn unload_module(&self, module: Handle) {
        if self.bind().is_ok() {
            // SAFETY: as the caller promised.
            unsafe { (self.hip.module_unload)(module) };
        }
    }

    unsafe fn function(&self, module: Handle, name: &str) -> Result<Handle> {
        let c = CString::new(name).expect("kernel names have no NUL");
        let mut f: Handle = std::ptr::null_mut();
        // SAFETY: as the caller promised.
        self.call(&format!("hipModuleGetFunction({name})"), unsafe {
            (self.hip.module_get_function)(&mut f, module, c.as_ptr())
        })?;
        Ok(f)
    }

    /// HIP has no per-function opt-in for dynamic shared memory: each
    /// launch's own size is checked against the device's limit.
    unsafe fn set_function_attribute(
        &self,
        _f: Handle,
        attr: CUfunction_attribute_enum,
        _value: i32,
    ) -> Result<()> {
        function_attribute(attr)
    }

    unsafe fn launch(&self, f: Handle, cfg: &LaunchConfig, args: &mut [*mut c_void]) -> Result<()> {
        self.bind()?;
        let (g, b) = (cfg.grid_dim, cfg.block_dim);
        // SAFETY: as the caller promised; `extra` is unused (null).
        self.call("hipModuleLaunchKernel", unsafe {
            (self.hip.module_launch_kernel)(
                f,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                cfg.shared_mem_bytes,
                self.stream,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn stream(&self) -> Handle {
        self.stream
    }
}

/// What HIP does with CUDA's function attribute `attr`: the dynamic
/// shared memory limit needs nothing (see `set_function_attribute`), any
/// other attribute is refused rather than ignored.
fn function_attribute(attr: CUfunction_attribute_enum) -> Result<()> {
    match attr {
        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => Ok(()),
        other => Err(CudaError::Invalid(format!(
            "the ROCm backend sets no function attribute {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hipDeviceProp_t as an MI300X would fill it, at the pinned offsets.
    fn mi300x_bytes() -> Vec<u8> {
        let mut b = vec![0u8; device_prop::SIZE];
        let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(&mut b, device_prop::NAME, b"AMD Instinct MI300X\0");
        put(
            &mut b,
            device_prop::GCN_ARCH_NAME,
            b"gfx942:sramecc+:xnack-\0",
        );
        put(
            &mut b,
            device_prop::TOTAL_GLOBAL_MEM,
            &(192usize << 30).to_ne_bytes(),
        );
        put(
            &mut b,
            device_prop::SHARED_MEM_PER_BLOCK,
            &(64usize << 10).to_ne_bytes(),
        );
        put(
            &mut b,
            device_prop::MULTI_PROCESSOR_COUNT,
            &304i32.to_ne_bytes(),
        );
        b
    }

    #[test]
    fn properties_are_read_at_the_pinned_offsets() {
        let p = Properties::read(&mi300x_bytes());
        assert_eq!(
            p,
            Properties {
                name: "AMD Instinct MI300X".into(),
                gcn_arch_name: "gfx942:sramecc+:xnack-".into(),
                total_mem: 192 << 30,
                shared_mem_per_block: 64 << 10,
                multiprocessors: 304,
            }
        );
    }

    #[test]
    fn the_offload_arch_drops_the_feature_flags() {
        assert_eq!(offload_arch("gfx942:sramecc+:xnack-"), "gfx942");
        assert_eq!(offload_arch("gfx950"), "gfx950");
    }

    #[test]
    fn only_the_shared_memory_attribute_is_accepted() {
        use CUfunction_attribute_enum as A;
        assert!(function_attribute(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).is_ok());
        let e =
            function_attribute(A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT).unwrap_err();
        assert!(e.to_string().contains("CARVEOUT"), "{e}");
    }
}
