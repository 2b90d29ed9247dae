//! Element types a tensor can hold.

/// The element type of a tensor's storage.
///
/// Float math runs in f32; `BF16` tensors are widened to f32 inside a kernel
/// and rounded back (RNE) on the way out, so every op accepts them. `U8` holds
/// quantized codes and packed scales, whose value depends on a format the
/// tensor does not know, so float ops reject it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 single precision, 4 bytes.
    F32,
    /// bfloat16 stored as its raw u16 bits.
    BF16,
    /// Raw bytes: quantized element codes, packed FP4 pairs or E8M0 scales.
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// Whether float math (and so autograd) applies to this type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16)
    }

    /// Lower-case name used in error messages.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::U8 => "u8",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
