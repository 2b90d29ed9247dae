//! The HIP runtime entry points the GPU backend calls, resolved from the
//! loaded `libamdhip64` with their C signatures (HIP 6 and 7). Each is the
//! counterpart of a CUDA driver call the CUDA backend makes (in brackets),
//! so the CUDA/HIP context of `docs/DESIGN.md` maps one to one. Handles
//! (streams, events, modules, functions) are opaque pointers, device
//! addresses are pointers, and every call returns a `hipError_t`.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `hipStream_t`, `hipEvent_t`, `hipModule_t`, `hipFunction_t`.
pub type Handle = *mut c_void;

super::entry_points! {
    Hip,
    // Device (cuInit, cuDeviceGetCount, cuCtxSetCurrent, cuMemGetInfo).
    init = "hipInit": fn(c_uint);
    device_count = "hipGetDeviceCount": fn(*mut c_int);
    set_device = "hipSetDevice": fn(c_int);
    // (hipDeviceProp_t out, as bytes: rocm::consts::device_prop; device)
    // (cuDeviceGetAttribute, cuDeviceGetName, cuDeviceTotalMem).
    device_properties = "hipGetDevicePropertiesR0600": fn(*mut c_void, c_int);
    driver_version = "hipDriverGetVersion": fn(*mut c_int);
    runtime_version = "hipRuntimeGetVersion": fn(*mut c_int);
    device_synchronize = "hipDeviceSynchronize": fn();
    mem_get_info = "hipMemGetInfo": fn(*mut usize, *mut usize);
    // Memory (cuMemAlloc, cuMemFree, cuMemHostAlloc, cuMemFreeHost).
    malloc = "hipMalloc": fn(*mut *mut c_void, usize);
    free = "hipFree": fn(*mut c_void);
    host_malloc = "hipHostMalloc": fn(*mut *mut c_void, usize, c_uint);
    host_free = "hipHostFree": fn(*mut c_void);
    // Copies and fills in stream order (cuMemcpy*Async, cuMemsetD8Async).
    memcpy_htod_async = "hipMemcpyHtoDAsync": fn(*mut c_void, *mut c_void, usize, Handle);
    memcpy_dtoh_async = "hipMemcpyDtoHAsync": fn(*mut c_void, *mut c_void, usize, Handle);
    memcpy_dtod_async = "hipMemcpyDtoDAsync": fn(*mut c_void, *mut c_void, usize, Handle);
    memset_d8_async = "hipMemsetD8Async": fn(*mut c_void, u8, usize, Handle);
    // Streams and events (cuStreamCreate, cuStreamSynchronize, cuEvent*).
    stream_create = "hipStreamCreate": fn(*mut Handle);
    stream_synchronize = "hipStreamSynchronize": fn(Handle);
    event_create = "hipEventCreateWithFlags": fn(*mut Handle, c_uint);
    event_record = "hipEventRecord": fn(Handle, Handle);
    event_query = "hipEventQuery": fn(Handle);
    event_synchronize = "hipEventSynchronize": fn(Handle);
    event_destroy = "hipEventDestroy": fn(Handle);
    event_elapsed_time = "hipEventElapsedTime": fn(*mut f32, Handle, Handle);
    // Kernels: a hiprtc code object in, a launch out (cuModuleLoadData,
    // cuModuleGetFunction, cuLaunchKernel).
    module_load_data = "hipModuleLoadData": fn(*mut Handle, *const c_void);
    module_unload = "hipModuleUnload": fn(Handle);
    module_get_function = "hipModuleGetFunction": fn(*mut Handle, Handle, *const c_char);
    module_launch_kernel = "hipModuleLaunchKernel": fn(
        Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle,
        *mut *mut c_void, *mut *mut c_void
    );
}
