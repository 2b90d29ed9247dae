//! Where a tensor lives.

/// A device a tensor can be placed on.
///
/// [`Device::Cpu`] always has a backend; [`Device::Cuda`] has one when the
/// `cuda` feature is on and the GPU can be opened, [`Device::Rocm`] (the
/// same GPU backend over HIP) when the `rocm` feature is on and HIP finds
/// the GPU. Asking for a device
/// without one gives an error (never a panic), so a `--device cuda` run fails
/// with one clear line (DESIGN.md, "Backends").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory; always available (the default).
    #[default]
    Cpu,
    /// An NVIDIA GPU by ordinal.
    Cuda(usize),
    /// An AMD GPU by ordinal.
    Rocm(usize),
}

impl Device {
    /// Whether this build can run tensors on the device.
    pub fn is_available(&self) -> bool {
        crate::storage::is_available(self)
    }

    /// The most memory the device's tensors have held at once in this
    /// process, in bytes (the caching allocator's peak); None on the CPU or
    /// where the device is not open.
    pub fn peak_memory_bytes(&self) -> Option<u64> {
        crate::storage::memory_stats(self).map(|s| s.peak_bytes)
    }

    /// Free and total bytes of a GPU's memory, for checking that a job fits
    /// before it allocates; `Ok(None)` on the CPU, whose memory is the host's.
    pub fn memory_info(&self) -> crate::Result<Option<(u64, u64)>> {
        crate::storage::memory_info(self)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Rocm(i) => write!(f, "rocm:{i}"),
        }
    }
}
