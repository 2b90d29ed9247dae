//! RCCL, ROCm's NCCL: the same C API under the same names, loaded from
//! `librccl.so` at run time like the other ROCm libraries. Only the entry
//! points data parallelism uses. Compile-checked; never run on AMD hardware.

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

use super::{open, search_dirs, Wanted};

/// `ncclUniqueId`: 128 opaque bytes (NCCL_UNIQUE_ID_BYTES), passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// The bytes `ncclGetUniqueId` wrote.
    pub internal: [c_char; 128],
}

/// `ncclComm_t`.
pub type Comm = *mut c_void;

/// `ncclFloat32` of `ncclDataType_t` (rccl.h, as in nccl.h).
pub const FLOAT32: c_int = 7;
/// `ncclSum` of `ncclRedOp_t`.
pub const SUM: c_int = 0;
/// `ncclSuccess`.
pub const SUCCESS: c_int = 0;

entry_points! {
    Rccl,
    get_unique_id = "ncclGetUniqueId": fn(*mut UniqueId);
    comm_init_rank = "ncclCommInitRank": fn(*mut Comm, c_int, UniqueId, c_int);
    all_reduce = "ncclAllReduce": fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, *mut c_void);
    comm_destroy = "ncclCommDestroy": fn(Comm);
}

const WANTED: Wanted = Wanted {
    what: "RCCL",
    names: &["librccl.so", "librccl.so.1"],
};

/// RCCL, loaded once per process, with its entry points.
pub fn rccl() -> Result<&'static Rccl<'static>, String> {
    static LIB: std::sync::OnceLock<Result<&'static Rccl<'static>, String>> =
        std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let dirs = search_dirs();
        let (lib, path) = open(&WANTED, &dirs).ok_or_else(|| {
            let where_: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            format!(
                "RCCL unavailable: {} not found in {} or on the system loader's path (LD_LIBRARY_PATH)",
                WANTED.names.join(", "),
                where_.join(", ")
            )
        })?;
        let lib: &'static Library = Box::leak(Box::new(lib));
        Rccl::new(lib, &path).map(|r| &*Box::leak(Box::new(r)))
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::nccl::sys;

    /// RCCL's header repeats NCCL's values; cudarc's bindings are generated
    /// from nccl.h, so the copies here must equal them.
    #[test]
    fn constants_are_nccls() {
        assert_eq!(FLOAT32, sys::ncclDataType_t::ncclFloat32 as c_int);
        assert_eq!(SUM, sys::ncclRedOp_t::ncclSum as c_int);
        assert_eq!(SUCCESS, sys::ncclResult_t::ncclSuccess as c_int);
        assert_eq!(
            std::mem::size_of::<UniqueId>(),
            std::mem::size_of::<sys::ncclUniqueId>()
        );
    }
}
