//! The ROCm libraries as the backend uses them, with no GPU: every HIP
//! runtime and hipBLASLt entry point of `rocm::hip` and `rocm::hipblaslt`
//! resolves, and every kernel module
//! compiles with hiprtc through the backend's own loader and compile path
//! (`rocm::hiprtc`) for gfx942 and gfx950, each code object naming its
//! processor. Where the HIP runtime, hiprtc and hipBLASLt cannot be loaded
//! each test says it skipped. `.ci/rocm-sid-chroot` runs them inside a
//! Debian sid chroot with ROCm 6.4.
#![cfg(all(feature = "rocm", feature = "cuda"))]

use mxswitch_runtime::cuda::nvrtc::{self, Platform};
use mxswitch_runtime::rocm::{self, hip, hipblaslt, hiprtc::Hiprtc};

/// The libraries, or `None` after saying the test skipped.
fn libraries() -> Option<rocm::Libraries> {
    rocm::load().map_err(|e| eprintln!("SKIPPED: {e}")).ok()
}

/// Resolving is all: `hipblasLtCreate` exits the process without a GPU.
#[test]
fn every_hip_and_hipblaslt_entry_point_resolves() {
    let Some(libs) = libraries() else { return };
    let resolved = [
        hip::Hip::new(&libs.hip, &libs.paths[0]).map(|_| (hip::SYMBOLS.len(), &libs.paths[0])),
        hipblaslt::HipBlasLt::new(&libs.hipblaslt, &libs.paths[2])
            .map(|_| (hipblaslt::SYMBOLS.len(), &libs.paths[2])),
    ];
    for r in resolved {
        let (n, path) = r.unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{n} entry points resolved from {path}");
    }
}

#[test]
fn every_module_compiles_with_hiprtc_for_gfx942_and_gfx950() {
    let Some(libs) = libraries() else { return };
    let mut rtc = Hiprtc::new(&libs).unwrap();
    let mut failures = Vec::new();
    let mut passed = 0;
    for src in nvrtc::all_sources_for(Platform::Hip) {
        let text = nvrtc::full_source_for(&src, Platform::Hip);
        for arch in ["gfx942", "gfx950"] {
            match rtc.code_object(src.name, &text, arch) {
                Ok(code) if contains(code, arch.as_bytes()) => {
                    eprintln!("PASS {} {arch}: {} bytes", src.name, code.len());
                    passed += 1;
                }
                Ok(_) => failures.push(format!(
                    "{} {arch}: the code object does not name {arch}",
                    src.name
                )),
                Err(e) => failures.push(e),
            }
        }
    }
    eprintln!("{passed} passed, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A second request is the cached object.
    let first = nvrtc::all_sources_for(Platform::Hip).remove(0);
    let text = nvrtc::full_source_for(&first, Platform::Hip);
    let a = rtc
        .code_object(first.name, &text, "gfx942")
        .unwrap()
        .as_ptr();
    let b = rtc
        .code_object(first.name, &text, "gfx942")
        .unwrap()
        .as_ptr();
    assert_eq!(a, b, "compiled once per module and architecture");
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
