//! The ROCm backend (issue 15, in progress): the HIP runtime, hiprtc and
//! hipBLASLt found and loaded at run time, the device probe, the HIP
//! `Driver` under the shared GPU context
//! (`driver`: `--device rocm` runs the CUDA backend's storage and kernels
//! over it), hipBLASLt as its BLAS library (`blas`), the table of which GEMM
//! runs on which architecture ([`gemm_path`]), the kernel compilation with
//! hiprtc ([`hiprtc`]), the entry points ([`hip`], [`hipblaslt`]) and the
//! pinned constants ([`consts`]). Opening a ROCm device without the
//! libraries or without a GPU ends in one line (naming what was looked for
//! and where, or that HIP sees no device); the probe stops at
//! `hipGetDeviceCount` and nothing reaches `hipblasLtCreate`, which exits the
//! process without a GPU. Nothing here has run on AMD hardware.

/// A table of a library's C entry points: a struct of typed symbols that
/// `new` resolves (naming the first one missing) and `SYMBOLS`, their
/// names in order. Each entry returns the library's status code (`int`).
macro_rules! entry_points {
    ($name:ident, $($field:ident = $symbol:literal: fn($($arg:ty),*);)+) => {
        /// The entry points, borrowed from the loaded library.
        pub struct $name<'l> {
            $(
                #[doc = concat!("`", $symbol, "`.")]
                pub $field: ::libloading::Symbol<'l, unsafe extern "C" fn($($arg),*) -> ::std::ffi::c_int>,
            )+
        }

        /// Every symbol this table resolves, in order.
        pub const SYMBOLS: &[&str] = &[$($symbol),+];

        impl<'l> $name<'l> {
            /// Resolves every entry point of `lib` (loaded from `path`), or
            /// names the first one it lacks.
            pub fn new(lib: &'l ::libloading::Library, path: &str) -> Result<$name<'l>, String> {
                Ok($name {
                    $(
                        // SAFETY: the field's type is the symbol's C signature.
                        $field: unsafe { lib.get(concat!($symbol, "\0").as_bytes()) }
                            .map_err(|_| format!("{path} has no {}", $symbol))?,
                    )+
                })
            }
        }
    };
}
pub(crate) use entry_points;

pub(crate) mod blas;
pub mod consts;
pub(crate) mod driver;
pub mod gemm_path;
pub mod hip;
pub mod hipblaslt;
pub mod hiprtc;
pub mod rccl;

use std::path::PathBuf;

use libloading::Library;

/// One library the backend needs: its role and the file names tried, in order.
struct Wanted {
    what: &'static str,
    names: &'static [&'static str],
}

const LIBRARIES: [Wanted; 3] = [
    Wanted {
        what: "the HIP runtime",
        names: &["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"],
    },
    Wanted {
        what: "hiprtc",
        names: &["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6"],
    },
    Wanted {
        what: "hipBLASLt",
        names: &["libhipblaslt.so", "libhipblaslt.so.1"],
    },
];

/// Where the libraries are looked for before the system loader's own path
/// (`LD_LIBRARY_PATH`, the ldconfig cache): `$ROCM_PATH/lib`, then
/// `/opt/rocm/lib`.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("ROCM_PATH")
        .map(|p| PathBuf::from(p).join("lib"))
        .into_iter()
        .collect();
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    dirs
}

/// The three libraries, loaded, with the files they came from.
pub struct Libraries {
    /// The HIP runtime ([`hip::Hip`] resolves its entry points).
    pub hip: Library,
    /// The file of each library, in the order HIP runtime, hiprtc, hipBLASLt.
    pub paths: Vec<String>,
    hiprtc: Library,
    /// hipBLASLt ([`hipblaslt::HipBlasLt`] resolves its entry points).
    pub hipblaslt: Library,
}

/// The first of `w`'s names that loads: from the search directories, then
/// through the system loader.
fn open(w: &Wanted, dirs: &[PathBuf]) -> Option<(Library, String)> {
    let in_dirs = dirs
        .iter()
        .flat_map(|d| w.names.iter().map(move |n| d.join(n)));
    for path in in_dirs.filter(|p| p.exists()) {
        // SAFETY: loading a shared library runs its initializers; these are
        // AMD's runtime libraries, loaded the way the HIP toolchain does.
        if let Ok(lib) = unsafe { Library::new(&path) } {
            return Some((lib, path.display().to_string()));
        }
    }
    w.names.iter().find_map(|n| {
        // SAFETY: as above, by name through the system loader.
        unsafe { Library::new(*n) }
            .ok()
            .map(|lib| (lib, n.to_string()))
    })
}

/// Loads the HIP runtime, hiprtc and hipBLASLt, or says in one line which
/// were not found and where they were looked for.
pub fn load() -> Result<Libraries, String> {
    let dirs = search_dirs();
    let found: Vec<_> = LIBRARIES.iter().map(|w| open(w, &dirs)).collect();
    let missing: Vec<String> = LIBRARIES
        .iter()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(w, _)| format!("{} ({})", w.what, w.names.join(", ")))
        .collect();
    if !missing.is_empty() {
        let where_: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(format!(
            "ROCm backend unavailable: {} not found in {} or on the system loader's path (LD_LIBRARY_PATH); install ROCm 6 or 7, or set ROCM_PATH",
            missing.join(" and "),
            where_.join(", ")
        ));
    }
    let mut found = found.into_iter().flatten();
    let mut next = || found.next().expect("every library was found");
    let ((hip, p0), (hiprtc, p1), (hipblaslt, p2)) = (next(), next(), next());
    Ok(Libraries {
        hip,
        paths: vec![p0, p1, p2],
        hiprtc,
        hipblaslt,
    })
}

/// The three libraries, loaded once per process and kept loaded (the
/// entry-point tables of the open devices borrow them).
pub fn libraries() -> Result<&'static Libraries, String> {
    static LIBS: std::sync::OnceLock<Result<&'static Libraries, String>> =
        std::sync::OnceLock::new();
    LIBS.get_or_init(|| load().map(|l| &*Box::leak(Box::new(l))))
        .clone()
}

/// What the probe found on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A library is missing: the one-line reason.
    NoLibraries(String),
    /// The libraries load but HIP sees no device: the one-line reason.
    NoDevice(String),
    /// HIP sees this many devices.
    Devices(usize),
}

/// Loads the libraries and asks HIP how many devices it sees (`hipInit`,
/// `hipGetDeviceCount`); never creates a hipBLASLt handle.
pub fn probe() -> Probe {
    let libs = match libraries() {
        Ok(l) => l,
        Err(e) => return Probe::NoLibraries(e),
    };
    let hip = match hip::Hip::new(&libs.hip, &libs.paths[0]) {
        Ok(h) => h,
        Err(e) => return Probe::NoLibraries(format!("ROCm backend unavailable: {e}")),
    };
    let mut n = 0i32;
    // SAFETY: plain calls with an out-parameter we own.
    let (rc_init, rc_count) = unsafe { ((hip.init)(0), (hip.device_count)(&mut n)) };
    if rc_init != consts::HIP_SUCCESS || rc_count != consts::HIP_SUCCESS || n <= 0 {
        return Probe::NoDevice(no_device_line(rc_init, rc_count, &libs.paths));
    }
    Probe::Devices(n as usize)
}

fn no_device_line(rc_init: i32, rc_count: i32, paths: &[String]) -> String {
    let name = |rc| match rc {
        consts::HIP_SUCCESS => "hipSuccess".to_string(),
        consts::HIP_ERROR_NO_DEVICE => "hipErrorNoDevice".to_string(),
        other => format!("error {other}"),
    };
    format!(
        "no ROCm device found: hipInit gave {}, hipGetDeviceCount {} (libraries {})",
        name(rc_init),
        name(rc_count),
        paths.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each entry-point table names every symbol once, all of its library.
    #[test]
    fn the_entry_point_tables_name_each_symbol_once() {
        for (symbols, prefix) in [(hip::SYMBOLS, "hip"), (hipblaslt::SYMBOLS, "hipblasLt")] {
            let mut s = symbols.to_vec();
            s.sort();
            s.dedup();
            assert_eq!(s.len(), symbols.len(), "{prefix}");
            assert!(symbols.iter().all(|n| n.starts_with(prefix)), "{prefix}");
        }
    }

    /// This machine has no AMD GPU: the probe ends in one of the two
    /// no-GPU lines, never a panic, and names what it looked for.
    #[test]
    fn the_probe_ends_in_one_line_without_a_gpu() {
        let p = probe();
        let line = match &p {
            Probe::NoLibraries(l) => {
                assert!(l.starts_with("ROCm backend unavailable:"), "{l}");
                assert!(l.contains("/opt/rocm/lib") && l.contains(".so"), "{l}");
                l
            }
            Probe::NoDevice(l) => {
                assert!(l.starts_with("no ROCm device found:"), "{l}");
                l
            }
            Probe::Devices(n) => panic!("this test expects no AMD GPU, HIP sees {n}"),
        };
        assert!(!line.contains('\n'), "one line: {line}");
        println!("{line}");
        // The backend's open path ends in the same line.
        let e = crate::cuda::CudaContext::new_rocm(0)
            .err()
            .expect("no AMD GPU here");
        assert_eq!(e.to_string(), *line);
    }

    #[test]
    fn the_no_device_line_names_the_hip_errors() {
        let l = no_device_line(100, 100, &["libamdhip64.so".into()]);
        assert_eq!(
            l,
            "no ROCm device found: hipInit gave hipErrorNoDevice, hipGetDeviceCount hipErrorNoDevice (libraries libamdhip64.so)"
        );
        assert!(no_device_line(0, 0, &[]).contains("hipInit gave hipSuccess"));
        assert!(no_device_line(3, 0, &[]).contains("error 3"));
    }
}
