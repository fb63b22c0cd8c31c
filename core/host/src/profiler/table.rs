//! A pointer to whichever `ncclProfiler_vN_t` (v1–v7) a library exports, found as
//! NCCL's `profiler.cc` looks for it: newest version first.

use std::ffi::CStr;
use std::ptr::NonNull;

use cclkit_abi::raw::profiler::{v1, v2, v3, v4, v5, v6, v7};

use crate::library::Library;

/// The exported table, by version.
#[derive(Debug, Clone, Copy)]
pub enum RawProfiler {
    /// ABI version 1 (NCCL 2.23).
    V1(NonNull<v1::ncclProfiler_v1_t>),
    /// ABI version 2 (NCCL 2.24).
    V2(NonNull<v2::ncclProfiler_v2_t>),
    /// ABI version 3 (NCCL 2.25).
    V3(NonNull<v3::ncclProfiler_v3_t>),
    /// ABI version 4 (NCCL 2.26–2.27).
    V4(NonNull<v4::ncclProfiler_v4_t>),
    /// ABI version 5 (NCCL 2.28).
    V5(NonNull<v5::ncclProfiler_v5_t>),
    /// ABI version 6 (NCCL 2.29–2.30).
    V6(NonNull<v6::ncclProfiler_v6_t>),
    /// ABI version 7 (NCCL 2.31).
    V7(NonNull<v7::ncclProfiler_v7_t>),
}

// SAFETY: a `RawProfiler` only points at an immutable table inside a library its
// owner keeps loaded; NCCL calls profilers from any thread.
unsafe impl Send for RawProfiler {}
// SAFETY: as above; the table is only read.
unsafe impl Sync for RawProfiler {}

/// A borrowed view of the table, by version.
#[derive(Clone, Copy)]
pub enum ProfilerRef<'a> {
    /// v1.
    V1(&'a v1::ncclProfiler_v1_t),
    /// v2.
    V2(&'a v2::ncclProfiler_v2_t),
    /// v3.
    V3(&'a v3::ncclProfiler_v3_t),
    /// v4.
    V4(&'a v4::ncclProfiler_v4_t),
    /// v5.
    V5(&'a v5::ncclProfiler_v5_t),
    /// v6.
    V6(&'a v6::ncclProfiler_v6_t),
    /// v7.
    V7(&'a v7::ncclProfiler_v7_t),
}

/// Versions in the order NCCL tries them.
pub const VERSIONS: [u32; 7] = [7, 6, 5, 4, 3, 2, 1];

/// `ncclProfiler_v<version>`.
pub fn symbol(version: u32) -> String {
    format!("ncclProfiler_v{version}")
}

impl RawProfiler {
    /// The table, borrowed for as long as this value (whose owner keeps the library
    /// loaded).
    pub fn get(&self) -> ProfilerRef<'_> {
        // SAFETY: (every arm) the pointer came from `find` or a `'static` table and
        // points to a live table of this version while the owner of this value lives.
        unsafe {
            match *self {
                RawProfiler::V1(p) => ProfilerRef::V1(p.as_ref()),
                RawProfiler::V2(p) => ProfilerRef::V2(p.as_ref()),
                RawProfiler::V3(p) => ProfilerRef::V3(p.as_ref()),
                RawProfiler::V4(p) => ProfilerRef::V4(p.as_ref()),
                RawProfiler::V5(p) => ProfilerRef::V5(p.as_ref()),
                RawProfiler::V6(p) => ProfilerRef::V6(p.as_ref()),
                RawProfiler::V7(p) => ProfilerRef::V7(p.as_ref()),
            }
        }
    }

    /// The ABI version.
    pub fn version(self) -> u32 {
        match self {
            RawProfiler::V1(_) => 1,
            RawProfiler::V2(_) => 2,
            RawProfiler::V3(_) => 3,
            RawProfiler::V4(_) => 4,
            RawProfiler::V5(_) => 5,
            RawProfiler::V6(_) => 6,
            RawProfiler::V7(_) => 7,
        }
    }

    /// The table's `name`, if it is a non-NULL, UTF-8 C string.
    pub fn name(&self) -> Option<String> {
        let p = match self.get() {
            ProfilerRef::V1(t) => t.name,
            ProfilerRef::V2(t) => t.name,
            ProfilerRef::V3(t) => t.name,
            ProfilerRef::V4(t) => t.name,
            ProfilerRef::V5(t) => t.name,
            ProfilerRef::V6(t) => t.name,
            ProfilerRef::V7(t) => t.name,
        };
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-NULL `name` is a C string in the loaded library's data; read
        // at most 256 bytes so a missing terminator cannot run far.
        let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), bounded_len(p)) };
        CStr::from_bytes_until_nul(bytes)
            .ok()
            .map(|c| c.to_string_lossy().into_owned())
    }

    /// Which required slot is NULL, if any (NCCL calls all six unconditionally).
    pub fn missing_slot(&self) -> Option<&'static str> {
        macro_rules! check {
            ($t:expr) => {
                if $t.init.is_none() {
                    Some("init")
                } else if $t.startEvent.is_none() {
                    Some("startEvent")
                } else if $t.stopEvent.is_none() {
                    Some("stopEvent")
                } else if $t.recordEventState.is_none() {
                    Some("recordEventState")
                } else if $t.finalize.is_none() {
                    Some("finalize")
                } else {
                    None
                }
            };
        }
        match self.get() {
            ProfilerRef::V1(t) => check!(t),
            ProfilerRef::V2(t) => check!(t),
            ProfilerRef::V3(t) => check!(t),
            ProfilerRef::V4(t) => check!(t),
            ProfilerRef::V5(t) => check!(t),
            ProfilerRef::V6(t) => check!(t),
            ProfilerRef::V7(t) => check!(t),
        }
    }
}

/// Length to read of a C string at `p`: up to and including its NUL, at most 256.
fn bounded_len(p: *const std::ffi::c_char) -> usize {
    const MAX: usize = 256;
    for i in 0..MAX {
        // SAFETY: bytes before the first NUL belong to the string.
        if unsafe { *p.add(i) } == 0 {
            return i + 1;
        }
    }
    MAX
}

/// The newest profiler table `lib` exports, with its symbol name.
pub fn find(lib: &Library) -> Option<(RawProfiler, String)> {
    VERSIONS.iter().find_map(|&v| find_version(lib, v))
}

/// The table of one `version` (1–7) if `lib` exports it (what `cclkit check` uses
/// to drive every exported version, not just the newest).
pub fn find_version(lib: &Library, version: u32) -> Option<(RawProfiler, String)> {
    let sym = symbol(version);
    let p = lib.data_symbol(&sym)?;
    let raw = match version {
        7 => RawProfiler::V7(p.cast()),
        6 => RawProfiler::V6(p.cast()),
        5 => RawProfiler::V5(p.cast()),
        4 => RawProfiler::V4(p.cast()),
        3 => RawProfiler::V3(p.cast()),
        2 => RawProfiler::V2(p.cast()),
        1 => RawProfiler::V1(p.cast()),
        _ => return None,
    };
    Some((raw, sym))
}
