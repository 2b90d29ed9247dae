//! Where a tensor lives.

/// A device a tensor can be placed on.
///
/// Only [`Device::Cpu`] has a backend in this build; asking for the others
/// gives [`crate::Error::DeviceUnavailable`] rather than a panic, so a
/// `--device cuda` run fails with one clear line (DESIGN.md, "Backends").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
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
        matches!(self, Device::Cpu)
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
