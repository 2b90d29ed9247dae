//! Run-time selection of wider vector units for the quantizer loops.
//!
//! The quantizers are plain loops that the compiler vectorizes; built for the
//! baseline x86-64 target they get 4-lane SSE2. `with_avx2` compiles the
//! closure it is given a second time with AVX2 enabled and picks that copy
//! when the CPU has it, so one binary runs everywhere and fast where it can.

/// Call `f`, compiled with AVX2 when the running CPU supports it.
#[inline(always)]
pub fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU reports AVX2, the only feature `run` enables.
            return unsafe { run(f) };
        }
    }
    f()
}
