//! Pinned host blocks for uploads. A host-to-device copy from pageable
//! memory makes the driver wait for the stream first (CUDA's rule for
//! pageable copies), so every upload of a step's batch drained the GPU's
//! queue. An upload instead copies the data into a pinned block on the
//! host, queues `cuMemcpyHtoDAsync` from it in stream order and returns;
//! an event recorded after the copy says when the block may be reused.

use std::ffi::c_void;

use cudarc::driver::{result as dresult, sys as dsys};

use super::{driver_err, Result};

/// Smallest block: small uploads share few, reused blocks.
const MIN_BLOCK: usize = 64 << 10;

/// Most pinned bytes held at once; past it an upload first waits for the
/// copies in flight (loading a model's parameters queues many at once).
const MAX_PINNED: usize = 512 << 20;

/// One pinned block and the event recorded after its latest copy.
struct Block {
    ptr: *mut u8,
    cap: usize,
    event: dsys::CUevent,
    /// A copy out of this block was queued and may not have run yet.
    pending: bool,
}

/// The pinned blocks of one context (held in a mutex by the context).
#[derive(Default)]
pub(super) struct Staging {
    blocks: Vec<Block>,
}

// SAFETY: the raw pointers are pinned host memory and an event owned by
// this struct; the context's mutex serializes every use.
unsafe impl Send for Staging {}

impl Staging {
    /// Copies `bytes` bytes at `src` to device address `dst` on `stream`
    /// through a free pinned block of its size class (a new one when every
    /// block of the class still has a copy in flight).
    ///
    /// # Safety
    /// `src` must be readable for `bytes` bytes, `dst` writable for as many,
    /// and the context of `stream` current on this thread.
    pub(super) unsafe fn upload(
        &mut self,
        dst: dsys::CUdeviceptr,
        src: *const u8,
        bytes: usize,
        stream: dsys::CUstream,
    ) -> Result<()> {
        if bytes > MAX_PINNED / 4 {
            // A large one-off (a big parameter): straight from pageable memory.
            // SAFETY: as the caller promised; the driver stages the source
            // before the call returns.
            return unsafe { dsys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, stream) }
                .result()
                .map_err(driver_err("cuMemcpyHtoDAsync"));
        }
        let i = self.free_block(bytes)?;
        let b = &mut self.blocks[i];
        // SAFETY: the block holds cap >= bytes and no copy reads it now.
        unsafe { std::ptr::copy_nonoverlapping(src, b.ptr, bytes) };
        // SAFETY: pinned source of `bytes` bytes, device destination of as many.
        unsafe { dsys::cuMemcpyHtoDAsync_v2(dst, b.ptr as *const c_void, bytes, stream) }
            .result()
            .map_err(driver_err("cuMemcpyHtoDAsync"))?;
        // SAFETY: our event, recorded on the same stream after the copy.
        unsafe { dresult::event::record(b.event, stream) }.map_err(driver_err("cuEventRecord"))?;
        b.pending = true;
        Ok(())
    }

    /// A block of `bytes`'s size class (a power of two, at least
    /// [`MIN_BLOCK`]) whose copies have finished: classes do not lend to
    /// each other, so a small upload never holds the batch's big block.
    fn free_block(&mut self, bytes: usize) -> Result<usize> {
        let cap = bytes.next_power_of_two().max(MIN_BLOCK);
        let mut busy = None;
        for (i, b) in self.blocks.iter_mut().enumerate() {
            if b.cap != cap {
                continue;
            }
            if !b.pending || finished(b.event)? {
                b.pending = false;
                return Ok(i);
            }
            busy = Some(i);
        }
        let held: usize = self.blocks.iter().map(|b| b.cap).sum();
        if held + cap > MAX_PINNED {
            if let Some(i) = busy {
                // At the cap: wait for a block of this class to come free.
                let b = &mut self.blocks[i];
                // SAFETY: the block's own, live event.
                unsafe { dresult::event::synchronize(b.event) }
                    .map_err(driver_err("cuEventSynchronize"))?;
                b.pending = false;
                return Ok(i);
            }
            // None of this class yet: free the idle blocks of the others.
            self.blocks.retain(|b| {
                let idle = !b.pending || finished(b.event).unwrap_or(false);
                if idle {
                    // SAFETY: no copy reads an idle block.
                    unsafe { free(b) };
                }
                !idle
            });
        }
        // SAFETY: a plain pinned allocation, freed in `free`.
        let ptr = unsafe { dresult::malloc_host(cap, 0) }.map_err(driver_err("cuMemHostAlloc"))?;
        let event = dresult::event::create(dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(driver_err("cuEventCreate"))?;
        self.blocks.push(Block {
            ptr: ptr as *mut u8,
            cap,
            event,
            pending: false,
        });
        Ok(self.blocks.len() - 1)
    }
}

/// Whether everything before `event` on its stream has run.
fn finished(event: dsys::CUevent) -> Result<bool> {
    // SAFETY: a live event of this module.
    match unsafe { dresult::event::query(event) } {
        Ok(()) => Ok(true),
        Err(dresult::DriverError(dsys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
        Err(e) => Err(driver_err("cuEventQuery")(e)),
    }
}

/// Destroys a block's event and frees its memory.
///
/// # Safety
/// No queued copy may still read the block.
unsafe fn free(b: &Block) {
    // SAFETY: our own event and pinned block. Errors here (at teardown) have
    // nowhere to go.
    unsafe {
        let _ = dresult::event::destroy(b.event);
        let _ = dresult::free_host(b.ptr as *mut c_void);
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        for b in self.blocks.drain(..) {
            // SAFETY: the copies out of the block finish before it is freed.
            unsafe {
                let _ = dresult::event::synchronize(b.event);
                free(&b);
            }
        }
    }
}
