//! Kernel compilation with hiprtc, as the ROCm backend does at run time (`driver.rs`)
//! for the device's architecture: the same assembled sources as NVRTC gets
//! (with the HIP prelude and attention shim), FMA contraction off (hiprtc
//! contracts `a * b + c` by default, which would change the quantizers'
//! bits), one program object per source and architecture (hiprtc fails to
//! compile one object twice), and the code objects kept per (module,
//! architecture) so each compiles once per process.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};

use libloading::{Library, Symbol};

use super::Libraries;

/// The options every module is compiled with for `arch` (`gfx942`, ...).
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--offload-arch={arch}"),
        "-O3".into(),
        "-std=c++17".into(),
        "-ffp-contract=off".into(),
    ]
}

type Program = *mut c_void;
type Create = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type Compile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type Read = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;

/// hiprtc's entry points, and the code objects compiled so far.
pub struct Hiprtc<'l> {
    create: Symbol<'l, Create>,
    compile: Symbol<'l, Compile>,
    log_size: Symbol<'l, Size>,
    log: Symbol<'l, Read>,
    code_size: Symbol<'l, Size>,
    code: Symbol<'l, Read>,
    destroy: Symbol<'l, Destroy>,
    cache: HashMap<(String, String), Vec<u8>>,
}

impl<'l> Hiprtc<'l> {
    /// The entry points of the loaded hiprtc, or the one missing.
    pub fn new(libs: &'l Libraries) -> Result<Hiprtc<'l>, String> {
        let (lib, path) = (&libs.hiprtc, libs.paths[1].as_str());
        Ok(Hiprtc {
            create: symbol(lib, path, "hiprtcCreateProgram")?,
            compile: symbol(lib, path, "hiprtcCompileProgram")?,
            log_size: symbol(lib, path, "hiprtcGetProgramLogSize")?,
            log: symbol(lib, path, "hiprtcGetProgramLog")?,
            code_size: symbol(lib, path, "hiprtcGetCodeSize")?,
            code: symbol(lib, path, "hiprtcGetCode")?,
            destroy: symbol(lib, path, "hiprtcDestroyProgram")?,
            cache: HashMap::new(),
        })
    }

    /// The code object of module `name` (full source `source`) for `arch`,
    /// compiled on first use; a failure is one line with the first error.
    pub fn code_object(&mut self, name: &str, source: &str, arch: &str) -> Result<&[u8], String> {
        let key = (name.to_string(), arch.to_string());
        if !self.cache.contains_key(&key) {
            let code = self.compile_once(name, source, arch)?;
            self.cache.insert(key.clone(), code);
        }
        Ok(&self.cache[&key])
    }

    fn compile_once(&self, name: &str, source: &str, arch: &str) -> Result<Vec<u8>, String> {
        let what = |e: String| format!("hiprtc, {name} for {arch}: {e}");
        let src = CString::new(source).map_err(|_| what("the source holds a NUL byte".into()))?;
        let cname = CString::new(name).map_err(|_| what("the name holds a NUL byte".into()))?;
        let opts: Vec<CString> = options(arch)
            .into_iter()
            .map(|o| CString::new(o).expect("options have no NUL"))
            .collect();
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid C strings and out-pointers for the calls' duration;
        // the program is destroyed below on every path.
        unsafe {
            let rc = (self.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            if rc != 0 {
                return Err(what(format!("hiprtcCreateProgram returned {rc}")));
            }
            let rc = (self.compile)(prog, ptrs.len() as c_int, ptrs.as_ptr());
            let result = if rc != 0 {
                Err(what(format!(
                    "hiprtcCompileProgram returned {rc}: {}",
                    first_error(&self.read_log(prog))
                )))
            } else {
                let mut n = 0usize;
                (self.code_size)(prog, &mut n);
                let mut code = vec![0u8; n];
                (self.code)(prog, code.as_mut_ptr() as *mut c_char);
                Ok(code)
            };
            (self.destroy)(&mut prog);
            result
        }
    }

    /// The compile log of `prog`.
    ///
    /// # Safety
    /// `prog` must be a live program.
    unsafe fn read_log(&self, prog: Program) -> String {
        let mut n = 0usize;
        // SAFETY: a live program and buffers of the size hiprtc reports.
        unsafe {
            (self.log_size)(prog, &mut n);
            let mut buf = vec![0u8; n.max(1)];
            (self.log)(prog, buf.as_mut_ptr() as *mut c_char);
            String::from_utf8_lossy(&buf)
                .trim_end_matches('\0')
                .to_string()
        }
    }
}

/// The entry point `name` of `lib` (loaded from `path`), typed as the field
/// it fills: every field's type is hiprtc's C signature since ROCm 5.
fn symbol<'l, T>(lib: &'l Library, path: &str, name: &str) -> Result<Symbol<'l, T>, String> {
    let c = CString::new(name).expect("symbol names have no NUL");
    // SAFETY: the caller's field type is the symbol's C signature.
    unsafe { lib.get(c.as_bytes_with_nul()) }.map_err(|_| format!("{path} has no {name}"))
}

/// The first line of a compile log that reports an error, else its first line.
fn first_error(log: &str) -> String {
    log.lines()
        .find(|l| l.contains("error"))
        .or_else(|| log.lines().next())
        .unwrap_or("(empty log)")
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_gets_the_bit_exact_options() {
        assert_eq!(
            options("gfx950"),
            [
                "--offload-arch=gfx950",
                "-O3",
                "-std=c++17",
                "-ffp-contract=off"
            ]
        );
    }

    #[test]
    fn the_first_error_line_is_reported() {
        let log = "a.cu:1:2: warning: x\na.cu:3:4: error: y\nmore";
        assert_eq!(first_error(log), "a.cu:3:4: error: y");
        assert_eq!(first_error("just text"), "just text");
        assert_eq!(first_error(""), "(empty log)");
    }
}
