//! Kernel sources and their run-time compilation by NVRTC, once per process.
//!
//! The sources live in `runtime/kernels/` and are embedded in the binary.
//! Each is compiled with the platform prelude (`platform_cuda.cuh`) and
//! `common.cuh` prepended (NVRTC through cudarc takes no header list), each
//! part after a `#line` directive so that compiler messages name the right
//! file and line. [`full_source_for`] assembles the same modules for HIP
//! (`platform_hip.cuh`, and [`all_sources_for`] swaps in the HIP shims),
//! which `.ci/rocm-kernels` compile-checks for AMD GPUs. The PTX is cached per (source, architecture) for the
//! life of the process; each [`super::CudaContext`] loads a module once.
//!
//! Compiler flags that the bit-exactness with the CPU depends on:
//! `--fmad=false` (no contraction of `a * b + c` into an FMA), `--ftz=false`
//! (scales like 2^-127 are f32 subnormals), `--prec-div=true`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

use super::{CudaError, Result};

/// One kernel source file.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// File name under `runtime/kernels/`, used in messages and as the cache key.
    pub name: &'static str,
    /// The source text, embedded at build time.
    pub body: &'static str,
}

/// Device code shared by every kernel: formats, scales, Philox, Hadamard.
pub const COMMON: &str = include_str!("../../kernels/common.cuh");

/// The platform a kernel module is assembled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// NVIDIA, compiled by NVRTC: what the backend runs.
    Cuda,
    /// AMD (HIP), compiled by hiprtc for the device (`rocm::driver`) and
    /// compile-checked by `.ci/rocm-kernels`.
    Hip,
}

impl Platform {
    /// The prelude prepended before `common.cuh`: file name and text of the
    /// platform's spelling of the few platform-specific device functions.
    pub fn prelude(self) -> (&'static str, &'static str) {
        match self {
            Platform::Cuda => (
                "platform_cuda.cuh",
                include_str!("../../kernels/platform_cuda.cuh"),
            ),
            Platform::Hip => (
                "platform_hip.cuh",
                include_str!("../../kernels/platform_hip.cuh"),
            ),
        }
    }
}

/// The [`KernelSource`] of `runtime/kernels/<file>`, embedded in the binary
/// (for sources declared in `runtime/src/cuda/`, which the path is relative to).
macro_rules! kernel_source {
    ($file:literal) => {
        $crate::cuda::nvrtc::KernelSource {
            name: $file,
            body: include_str!(concat!("../../kernels/", $file)),
        }
    };
}

/// MX quantize, 32x32 tile scales and dequantize (E2M1 and E4M3FN).
pub const QUANTIZE_MX: KernelSource = kernel_source!("quantize_mx.cu");

/// FP8 tensorwise amax, scale and cast.
pub const QUANTIZE_FP8: KernelSource = kernel_source!("quantize_fp8.cu");

/// Every kernel source of the backend, for compile checks.
pub fn all_sources() -> [KernelSource; 9] {
    [
        QUANTIZE_MX,
        QUANTIZE_FP8,
        super::fp8_group::QUANTIZE_FP8_GROUP,
        super::lin_kernels::LINEAR_OPS,
        super::storage::OPS,
        super::adamw::ADAMW,
        super::mx_tile::MX_TILE,
        super::attention::ATTENTION,
        super::nvfp4::QUANTIZE_NVFP4,
    ]
}

/// [`all_sources`] as assembled for `platform`: for HIP, each module with a
/// CUDA-only shim has it replaced by its HIP form (attention:
/// `ATTENTION_HIP` of `attention.rs`); the other modules are the same text.
pub fn all_sources_for(platform: Platform) -> Vec<KernelSource> {
    all_sources()
        .into_iter()
        .map(|src| source_for(src, platform))
        .collect()
}

/// Module `src` as assembled for `platform` (see [`all_sources_for`]).
pub fn source_for(src: KernelSource, platform: Platform) -> KernelSource {
    match platform {
        Platform::Hip if src.body == super::attention::ATTENTION.body => {
            super::attention::ATTENTION_HIP
        }
        _ => src,
    }
}

/// Launches kernel `$name` of source `$src` on `$ctx`'s stream with the
/// arguments given by reference, as a `Result<(), CudaError>` whose error
/// names the kernel. One place for the unsafe launch of every backend kernel.
/// The arguments become one `void**` array of pointers to the values
/// ([`super::driver::kernel_arg`]), built in the same expression as the
/// launch so that every temporary outlives the call; CUDA and HIP take it alike.
macro_rules! launch_kernel {
    ($ctx:expr, $src:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {
        (|| -> $crate::cuda::Result<()> {
            let ctx: &$crate::cuda::CudaContext = $ctx;
            let name: &'static str = $name;
            let f = ctx.function($src, name)?;
            // SAFETY: every call site passes the argument types of the
            // kernel's signature and buffers large enough for the launch (the
            // pool's 256-byte alignment covers the kernels' 16-byte accesses).
            unsafe {
                ctx.launch(
                    &f,
                    name,
                    $cfg,
                    &mut [$($crate::cuda::driver::kernel_arg($arg)),+],
                )
            }
        })()
    };
}
pub(crate) use launch_kernel;

/// Environment variable with extra include directories (`:`-separated), for
/// kernels that include CUDA headers such as `cuda_fp8.h`.
pub const INCLUDE_ENV: &str = "MXSWITCH_CUDA_INCLUDE";

/// The full text NVRTC compiles for `src`.
pub fn full_source(src: &KernelSource) -> String {
    full_source_for(src, Platform::Cuda)
}

/// The full text of `src` for `platform`: the platform prelude, `common.cuh`
/// and the body, each after a `#line` directive. The HIP compile check adds
/// `hip_runtime.h` on the compiler's command line, not here.
pub fn full_source_for(src: &KernelSource, platform: Platform) -> String {
    let (prelude_name, prelude) = platform.prelude();
    format!(
        "#line 1 \"{prelude_name}\"\n{prelude}\n#line 1 \"common.cuh\"\n{COMMON}\n#line 1 \"{}\"\n{}",
        src.name, src.body
    )
}

type PtxKey = (&'static str, String);

fn ptx_cache() -> &'static Mutex<HashMap<PtxKey, Ptx>> {
    static CACHE: OnceLock<Mutex<HashMap<PtxKey, Ptx>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Number of NVRTC compilations this process has run (for checking the cache).
pub fn compile_count() -> usize {
    COMPILES.load(std::sync::atomic::Ordering::Relaxed)
}

static COMPILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The PTX of `src` for virtual architecture `arch` (e.g. `compute_90`),
/// compiled on first use and cached for the process.
pub fn ptx_for(src: &KernelSource, arch: &str, include_dirs: &[PathBuf]) -> Result<Ptx> {
    let key = (src.name, arch.to_string());
    let mut cache = ptx_cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = cache.get(&key) {
        return Ok(p.clone());
    }
    let opts = CompileOptions {
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        fmad: Some(false),
        include_paths: include_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect(),
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some(src.name.to_string()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(full_source(src), opts).map_err(|e| compile_error(src, e))?;
    COMPILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    cache.insert(key, ptx.clone());
    Ok(ptx)
}

fn compile_error(src: &KernelSource, e: CompileError) -> CudaError {
    match e {
        CompileError::CompileError {
            nvrtc,
            options,
            log,
        } => CudaError::Compile {
            source_name: src.name.to_string(),
            options: options.join(" "),
            // Keep the message on one line.
            log: format!(
                "{nvrtc:?}: {}",
                log.to_string_lossy().trim().replace('\n', " | ")
            ),
        },
        other => CudaError::Compile {
            source_name: src.name.to_string(),
            options: String::new(),
            log: format!("{other:?}"),
        },
    }
}

/// Include directories for NVRTC: those of `MXSWITCH_CUDA_INCLUDE` if set;
/// otherwise the first `include/` holding `cuda_fp8.h` found beside the
/// loaded CUDA libraries (`<lib dir>/../include`, as in the pip wheels
/// `nvidia/cu13/{lib,include}` and in a toolkit's `lib64/../include`), then
/// under `$CUDA_HOME` / `$CUDA_PATH` and `/usr/local/cuda`.
pub fn include_dirs(loaded_libs: &[PathBuf]) -> Vec<PathBuf> {
    if let Ok(v) = std::env::var(INCLUDE_ENV) {
        return std::env::split_paths(&v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    for lib in loaded_libs {
        if let Some(dir) = lib.parent() {
            candidates.push(dir.join("../include"));
            candidates.push(dir.join("../../include"));
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(v) = std::env::var(var) {
            candidates.push(Path::new(&v).join("include"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates
        .into_iter()
        .find(|d| d.join("cuda_fp8.h").is_file())
        .map(|d| d.canonicalize().unwrap_or(d))
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HIP swaps in the attention module's HIP shim and nothing else.
    #[test]
    fn only_attention_is_assembled_differently_for_hip() {
        for src in all_sources() {
            let hip = source_for(src, Platform::Hip);
            assert_eq!(hip.name, src.name);
            assert_eq!(
                hip.body == src.body,
                src.name != "attention.cu",
                "{}",
                src.name
            );
            assert_eq!(source_for(src, Platform::Cuda).body, src.body);
        }
    }
}
