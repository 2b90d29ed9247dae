//! [`Driver`]: the raw device operations under [`super::CudaContext`], one
//! trait with a CUDA implementation (`cuda_driver.rs`, cudarc) and a HIP
//! one (`rocm/driver.rs`). The caching pool, the pinned staging blocks, the
//! function cache and `launch_kernel!` are written once over it, so both
//! GPU platforms run the same code above this line (DESIGN.md, "The ROCm
//! backend").
//!
//! A driver owns its device's one stream: every asynchronous call is queued
//! on it. Device addresses are `u64` and the other handles (events,
//! modules, functions, the stream) opaque pointers, as in both C APIs.

use std::ffi::c_void;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::nvrtc::KernelSource;
use super::Result;

/// A `CUevent`/`hipEvent_t`, `CUmodule`/`hipModule_t` or
/// `CUfunction`/`hipFunction_t`.
pub type Handle = *mut c_void;

/// The operations a GPU context needs from its platform's driver.
///
/// # Safety of the `unsafe` methods
/// Addresses must lie in live allocations of this driver (device) or be
/// readable/writable host memory of the given length, and handles must be
/// live ones this driver created.
pub(crate) trait Driver: Send + Sync {
    /// Makes the device current on the calling thread.
    fn bind(&self) -> Result<()>;
    /// `bytes` of device memory (synchronous allocation).
    fn malloc(&self, bytes: usize) -> Result<u64>;
    /// Frees what [`Driver::malloc`] returned.
    unsafe fn free(&self, ptr: u64) -> Result<()>;
    /// Waits for all work on the device.
    fn device_synchronize(&self) -> Result<()>;
    /// Waits for all work queued on the stream.
    fn stream_synchronize(&self) -> Result<()>;
    /// Free and total device memory in bytes.
    fn mem_info(&self) -> Result<(usize, usize)>;
    /// Fills `bytes` bytes at `ptr` with `value`, in stream order.
    unsafe fn memset_d8(&self, ptr: u64, value: u8, bytes: usize) -> Result<()>;
    /// Host to device, in stream order.
    unsafe fn copy_htod(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()>;
    /// Device to host, in stream order (the host memory must outlive the copy).
    unsafe fn copy_dtoh(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()>;
    /// Device to device, in stream order.
    unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// `bytes` of pinned host memory.
    fn host_alloc(&self, bytes: usize) -> Result<*mut u8>;
    /// Frees what [`Driver::host_alloc`] returned (errors are dropped: teardown).
    unsafe fn host_free(&self, ptr: *mut u8);
    /// A new event; `timing` makes it usable by [`Driver::event_elapsed_ms`].
    fn event_create(&self, timing: bool) -> Result<Handle>;
    /// Records `event` on the stream.
    unsafe fn event_record(&self, event: Handle) -> Result<()>;
    /// Whether everything before `event` has run.
    unsafe fn event_done(&self, event: Handle) -> Result<bool>;
    /// Waits for `event`.
    unsafe fn event_synchronize(&self, event: Handle) -> Result<()>;
    /// Milliseconds between two recorded timing events (waits for both).
    unsafe fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32>;
    /// Destroys `event` (errors are dropped: teardown).
    unsafe fn event_destroy(&self, event: Handle);
    /// Compiles `src` for this device (cached per process) and loads it.
    fn load_module(&self, src: &KernelSource) -> Result<Handle>;
    /// Unloads a module (errors are dropped: teardown).
    unsafe fn unload_module(&self, module: Handle);
    /// Kernel `name` of a loaded module.
    unsafe fn function(&self, module: Handle, name: &str) -> Result<Handle>;
    /// Sets attribute `attr` of a function (only the dynamic shared memory
    /// limit is used).
    unsafe fn set_function_attribute(
        &self,
        f: Handle,
        attr: CUfunction_attribute_enum,
        value: i32,
    ) -> Result<()>;
    /// Launches `f` on the stream with one pointer per kernel argument.
    unsafe fn launch(&self, f: Handle, cfg: &LaunchConfig, args: &mut [*mut c_void]) -> Result<()>;
    /// The stream, for the BLAS library's calls.
    fn stream(&self) -> Handle;
}

/// A kernel argument as the launch's `void**` array takes it: a pointer to
/// the value, which must stay alive until the launch call returns.
pub fn kernel_arg<T: DeviceRepr>(value: &T) -> *mut c_void {
    value as *const T as *mut c_void
}

#[cfg(test)]
mod tests {
    use super::kernel_arg;

    #[test]
    fn a_kernel_argument_points_at_its_value() {
        let (a, b) = (7u64, -3i32);
        let args = [kernel_arg(&a), kernel_arg(&b)];
        // SAFETY: the pointers are the addresses of a and b, still alive.
        unsafe {
            assert_eq!(*(args[0] as *const u64), 7);
            assert_eq!(*(args[1] as *const i32), -3);
        }
        assert_ne!(args[0], args[1]);
    }
}
