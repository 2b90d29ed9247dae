//! A caching device allocator: freed buffers go back to a free list keyed by
//! size class and are handed out again, so steady-state training performs no
//! `cuMemAlloc`/`cuMemFree` (or `hipMalloc`/`hipFree`) per op: one pool over
//! the context's `Driver`.
//!
//! All work runs on the context's one stream, so a buffer freed by the host
//! while a kernel still reads it can be reused at once: the next kernel that
//! writes it is ordered after the reader on the same stream. Device memory is
//! returned to the driver only when an allocation fails (then every cached
//! buffer is freed and the allocation retried) and when the pool is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::driver::Driver;
use super::{CudaError, Result};

/// A device address.
type DevPtr = u64;

/// Smallest allocation: cuMemAlloc aligns to 256 bytes anyway.
const MIN_CLASS: usize = 256;
/// Up to this size, classes are powers of two (at most 2x waste on small buffers).
const POW2_LIMIT: usize = 1 << 20;
/// Above it, sizes round up to whole multiples of this granule (under 1 MiB waste).
const LARGE_GRANULE: usize = 1 << 20;

/// The size class a request of `bytes` is served from.
pub fn size_class(bytes: usize) -> usize {
    let b = bytes.max(MIN_CLASS);
    if b <= POW2_LIMIT {
        b.next_power_of_two()
    } else {
        b.div_ceil(LARGE_GRANULE) * LARGE_GRANULE
    }
}

/// Counters of the pool, for checking that steady state does not allocate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// cuMemAlloc calls so far.
    pub device_allocs: u64,
    /// Requests served from the free lists.
    pub reuses: u64,
    /// Bytes held by live [`DevBuf`]s (size classes, not requests).
    pub bytes_in_use: usize,
    /// Bytes sitting in the free lists.
    pub bytes_cached: usize,
    /// The most `bytes_in_use` has been: the peak memory of the tensors.
    pub peak_bytes_in_use: usize,
}

pub(crate) struct Pool {
    driver: Arc<dyn Driver>,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    free: HashMap<usize, Vec<DevPtr>>,
    stats: PoolStats,
}

impl Pool {
    pub(crate) fn new(driver: Arc<dyn Driver>) -> Arc<Pool> {
        Arc::new(Pool {
            driver,
            state: Mutex::new(PoolState::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // A panic while holding the lock cannot leave the lists inconsistent
        // (each update is one push or pop), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// A buffer of at least `bytes` bytes (uninitialized).
    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DevBuf> {
        let class = size_class(bytes);
        {
            let mut st = self.lock();
            if let Some(ptr) = st.free.get_mut(&class).and_then(Vec::pop) {
                st.stats.reuses += 1;
                st.stats.bytes_cached -= class;
                st.stats.bytes_in_use += class;
                st.stats.peak_bytes_in_use = st.stats.peak_bytes_in_use.max(st.stats.bytes_in_use);
                return Ok(self.wrap(ptr, bytes, class));
            }
        }
        // The pointer is owned by the returned DevBuf and freed only
        // through the pool.
        let ptr = match self.driver.malloc(class) {
            Ok(p) => p,
            Err(_) => {
                // Out of memory (or fragmented): give the cache back and retry once.
                self.release_cached()?;
                self.driver.malloc(class).map_err(|e| match e {
                    CudaError::Driver { op, err } => CudaError::Driver {
                        op: format!("{op}({class} bytes)"),
                        err: format!("{err}; {:?}", self.stats()),
                    },
                    other => other,
                })?
            }
        };
        let mut st = self.lock();
        st.stats.device_allocs += 1;
        st.stats.bytes_in_use += class;
        st.stats.peak_bytes_in_use = st.stats.peak_bytes_in_use.max(st.stats.bytes_in_use);
        Ok(self.wrap(ptr, bytes, class))
    }

    fn wrap(self: &Arc<Self>, ptr: DevPtr, bytes: usize, class: usize) -> DevBuf {
        DevBuf {
            ptr,
            bytes,
            class,
            pool: self.clone(),
        }
    }

    fn give_back(&self, ptr: DevPtr, class: usize) {
        let mut st = self.lock();
        st.free.entry(class).or_default().push(ptr);
        st.stats.bytes_in_use -= class;
        st.stats.bytes_cached += class;
    }

    /// Frees every cached buffer. Waits for the device first, since a cached
    /// buffer may still be read by queued work.
    pub(crate) fn release_cached(&self) -> Result<()> {
        self.driver.device_synchronize()?;
        let free: Vec<(usize, Vec<DevPtr>)> = self.lock().free.drain().collect();
        for (class, ptrs) in free {
            for p in ptrs {
                // SAFETY: p came from this driver's malloc and no DevBuf owns it.
                unsafe { self.driver.free(p) }?;
                self.lock().stats.bytes_cached -= class;
            }
        }
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Every DevBuf holds an Arc of the pool, so none is alive here. Errors
        // cannot be reported from drop; the context is going away anyway.
        let _ = self.release_cached();
    }
}

/// A device buffer from the pool; dropping it returns the memory to the pool.
/// Untyped: kernels and GEMMs are told the element type.
pub struct DevBuf {
    ptr: DevPtr,
    bytes: usize,
    class: usize,
    pool: Arc<Pool>,
}

impl DevBuf {
    /// Device address of the first byte (256-byte aligned).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes requested (the usable length).
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }
}

impl std::fmt::Debug for DevBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        self.pool.give_back(self.ptr, self.class);
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn size_classes() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), 2 << 20);
        assert_eq!(size_class((5 << 20) + 3), 6 << 20);
    }
}
