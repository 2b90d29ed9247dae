//! Pinned host blocks for uploads. A host-to-device copy from pageable
//! memory makes the driver wait for the stream first (CUDA's rule for
//! pageable copies), so every upload of a step's batch drained the GPU's
//! queue. An upload instead copies the data into a pinned block on the
//! host, queues `cuMemcpyHtoDAsync` (`hipMemcpyHtoDAsync`) from it in
//! stream order and returns; an event recorded after the copy says when the
//! block may be reused. The same blocks serve both drivers.

use std::sync::Arc;

use super::driver::{Driver, Handle};
use super::Result;

/// Smallest block: small uploads share few, reused blocks.
const MIN_BLOCK: usize = 64 << 10;

/// Most pinned bytes held at once; past it an upload first waits for the
/// copies in flight (loading a model's parameters queues many at once).
const MAX_PINNED: usize = 512 << 20;

/// One pinned block and the event recorded after its latest copy.
struct Block {
    ptr: *mut u8,
    cap: usize,
    event: Handle,
    /// A copy out of this block was queued and may not have run yet.
    pending: bool,
}

/// The pinned blocks of one context (held in a mutex by the context).
pub(super) struct Staging {
    blocks: Vec<Block>,
    driver: Arc<dyn Driver>,
}

// SAFETY: the raw pointers are pinned host memory and an event owned by
// this struct; the context's mutex serializes every use.
unsafe impl Send for Staging {}

impl Staging {
    pub(super) fn new(driver: Arc<dyn Driver>) -> Staging {
        Staging {
            blocks: Vec::new(),
            driver,
        }
    }

    /// Copies `bytes` bytes at `src` to device address `dst` on the stream
    /// through a free pinned block of its size class (a new one when every
    /// block of the class still has a copy in flight).
    ///
    /// # Safety
    /// `src` must be readable for `bytes` bytes, `dst` writable for as many,
    /// and the driver's device current on this thread.
    pub(super) unsafe fn upload(&mut self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        if bytes > MAX_PINNED / 4 {
            // A large one-off (a big parameter): straight from pageable memory.
            // SAFETY: as the caller promised; the driver stages the source
            // before the call returns.
            return unsafe { self.driver.copy_htod(dst, src, bytes) };
        }
        let i = self.free_block(bytes)?;
        let b = &mut self.blocks[i];
        // SAFETY: the block holds cap >= bytes and no copy reads it now.
        unsafe { std::ptr::copy_nonoverlapping(src, b.ptr, bytes) };
        // SAFETY: pinned source of `bytes` bytes, device destination of as many.
        unsafe { self.driver.copy_htod(dst, b.ptr, bytes) }?;
        // SAFETY: our event, recorded on the same stream after the copy.
        unsafe { self.driver.event_record(b.event) }?;
        b.pending = true;
        Ok(())
    }

    /// A block of `bytes`'s size class (a power of two, at least
    /// [`MIN_BLOCK`]) whose copies have finished: classes do not lend to
    /// each other, so a small upload never holds the batch's big block.
    fn free_block(&mut self, bytes: usize) -> Result<usize> {
        let cap = bytes.next_power_of_two().max(MIN_BLOCK);
        let mut busy = None;
        let drv = &*self.driver;
        for (i, b) in self.blocks.iter_mut().enumerate() {
            if b.cap != cap {
                continue;
            }
            // SAFETY: the block's own, live event.
            if !b.pending || unsafe { drv.event_done(b.event) }? {
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
                unsafe { drv.event_synchronize(b.event) }?;
                b.pending = false;
                return Ok(i);
            }
            // None of this class yet: free the idle blocks of the others.
            self.blocks.retain(|b| {
                // SAFETY: the block's own, live event.
                let idle = !b.pending || unsafe { drv.event_done(b.event) }.unwrap_or(false);
                if idle {
                    // SAFETY: no copy reads an idle block.
                    unsafe { free(drv, b) };
                }
                !idle
            });
        }
        // A plain pinned allocation, freed in `free`.
        let ptr = drv.host_alloc(cap)?;
        let event = drv.event_create(false).inspect_err(|_| {
            // SAFETY: allocated above, used nowhere else.
            unsafe { drv.host_free(ptr) }
        })?;
        self.blocks.push(Block {
            ptr,
            cap,
            event,
            pending: false,
        });
        Ok(self.blocks.len() - 1)
    }
}

/// Destroys a block's event and frees its memory.
///
/// # Safety
/// No queued copy may still read the block.
unsafe fn free(drv: &dyn Driver, b: &Block) {
    // SAFETY: our own event and pinned block.
    unsafe {
        drv.event_destroy(b.event);
        drv.host_free(b.ptr);
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let drv = self.driver.clone();
        for b in self.blocks.drain(..) {
            // SAFETY: the copies out of the block finish before it is freed.
            unsafe {
                let _ = drv.event_synchronize(b.event);
                free(&*drv, &b);
            }
        }
    }
}
