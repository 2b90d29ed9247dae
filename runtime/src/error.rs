//! The runtime's error type. Every failure on user data is one of these, never a panic.

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor's amax was NaN or Inf, so it cannot be scaled (SPEC section 3).
    #[error("non-finite amax ({amax}) in tensor `{tensor}`: it cannot be quantized; look for NaN or Inf upstream")]
    NonFiniteAmax {
        /// The tensor's name, e.g. a linear's input.
        tensor: String,
        /// The amax found.
        amax: f32,
    },
    /// A shape did not fit what an operation needs.
    #[error("shape error: {0}")]
    Shape(String),
    /// An axis index outside the tensor's rank.
    #[error("axis {axis} is out of range for a tensor of rank {rank}")]
    AxisOutOfRange {
        /// The axis asked for (negative counts from the end).
        axis: isize,
        /// The tensor's rank.
        rank: usize,
    },
    /// An option that the chosen format or operation does not accept.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// A device this build has no backend for.
    #[error("device {device} is not available: this build of mxswitch has no backend for it")]
    DeviceUnavailable {
        /// The device as written, e.g. `rocm:0`.
        device: String,
    },
    /// An element type an operation does not accept, or operands whose types differ.
    #[error("dtype error: {0}")]
    DType(String),
    /// Autograd misuse: backward of a tensor without a tape, a gradient of the wrong shape.
    #[error("autograd: {0}")]
    Autograd(String),
    /// A device backend failed (a GPU that could not be opened, a driver,
    /// compiler or library error); the message is one line.
    #[error("{0}")]
    Backend(String),
    /// A file could not be read or written; the message names it.
    #[error("{0}")]
    Io(String),
    /// Training could not go on (the loss diverged); the message says why and what to try.
    #[error("{0}")]
    Training(String),
    /// A config file or preset that parsed but holds a bad value; the message
    /// names where (`file:line:column`) and the field.
    #[error("{0}")]
    Config(String),
    /// A layer or parameter was used before the model's weights were
    /// allocated; names what (a linear's plan path, a parameter's path).
    #[error("{what} has no weights: allocate the model (mxswitch_runtime::module::allocate) before running it")]
    NotAllocated {
        /// What was used, e.g. "linear `blocks.3.fc1`".
        what: String,
    },
    /// A quantized linear ran forward before any schedule gave it a recipe;
    /// names it (its plan path once a walk has seen it, else its shape).
    #[error("{what} has no recipe: no precision plan has placed it; mark its field #[quantize] (inside a struct marked #[precision(layer)] and held by a #[layers] or #[layer] field), then allocate the model or call `model.apply(iteration)`")]
    Unplanned {
        /// The linear, e.g. "quantized linear `blocks.3.fc1`".
        what: String,
    },
    /// A model's precision plan cannot run as asked: it is empty, a schedule
    /// names a recipe the model's attribute does not, or warm-up found
    /// linears its forward never reaches. The message says what to change.
    #[error("{0}")]
    Plan(String),
    /// A combination that is valid but not implemented.
    #[error("not implemented: {0}")]
    NotImplemented(String),
}

/// Result with the runtime's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
