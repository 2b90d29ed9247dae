//! Every CUDA kernel source compiles with NVRTC for sm_90, with the flags the
//! backend uses. Needs only libnvrtc (no GPU): where it cannot be loaded the
//! test says it skipped. Run locally with the pip wheel's NVRTC, e.g.
//! `LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cu13, os; print(os.path.dirname(nvidia.cu13.__file__))')/lib`.
//!
//! With `MXSWITCH_PTX_DUMP=<dir>` it also writes each module's PTX there.
//!
//! Also: the HIP assembly of the same modules keeps to the portable rules,
//! and with `MXSWITCH_KERNEL_DUMP=<dir>` writes each module's full HIP text
//! to `<dir>/<name>` for `.ci/rocm-kernels` (which compiles them for AMD).
#![cfg(feature = "cuda")]

use mxswitch_runtime::cuda::nvrtc::{self, Platform};

#[test]
fn every_kernel_source_compiles_for_sm90() {
    // SAFETY: only dlopens and closes the candidate library names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("SKIPPED: libnvrtc could not be loaded (set LD_LIBRARY_PATH to a CUDA 13 lib directory to run this check)");
        return;
    }
    // With MXSWITCH_PTX_DUMP=<dir>, each module's PTX goes to <dir>/<name>.ptx,
    // for `ptxas -arch sm_90 -v` (registers and spills per kernel).
    let dump = std::env::var_os("MXSWITCH_PTX_DUMP").map(std::path::PathBuf::from);
    let mut failures = Vec::new();
    for src in nvrtc::all_sources() {
        match nvrtc::ptx_for(&src, "compute_90", &[]) {
            Ok(ptx) => {
                if let Some(dir) = &dump {
                    std::fs::create_dir_all(dir).unwrap();
                    std::fs::write(dir.join(format!("{}.ptx", src.name)), ptx.to_src()).unwrap();
                }
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The HIP modules are the CUDA ones but for the prelude and the shims, and
/// name no CUDA-only construct (inline PTX, `*_sync` warp intrinsics,
/// `__syncwarp`).
#[test]
fn hip_sources_are_the_cuda_modules_without_cuda_only_code() {
    let cuda = nvrtc::all_sources_for(Platform::Cuda);
    let hip = nvrtc::all_sources_for(Platform::Hip);
    let names = |v: &[nvrtc::KernelSource]| v.iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names(&cuda), names(&nvrtc::all_sources()));
    assert_eq!(names(&hip), names(&cuda));
    for src in &hip {
        let text = nvrtc::full_source_for(src, Platform::Hip);
        for bad in ["asm(", "asm volatile", "_sync(", "__syncwarp"] {
            assert!(!text.contains(bad), "{} (HIP) contains {bad:?}", src.name);
        }
        for line in text.lines().filter(|l| l.starts_with("#line")) {
            assert!(
                !line.ends_with("_cuda.cuh\""),
                "{} (HIP) includes {line}",
                src.name
            );
        }
    }
}

#[test]
fn dump_hip_sources() {
    let Some(dir) = std::env::var_os("MXSWITCH_KERNEL_DUMP") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    for src in nvrtc::all_sources_for(Platform::Hip) {
        let path = dir.join(src.name);
        assert!(!path.exists(), "two modules named {}", src.name);
        std::fs::write(&path, nvrtc::full_source_for(&src, Platform::Hip)).unwrap();
        eprintln!("wrote {}", path.display());
    }
}
