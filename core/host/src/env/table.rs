//! A pointer to whichever `ncclEnv_vN_t` a library exports, found the way NCCL 2.30.7
//! looks (`ncclEnvPlugin_v2`, then `ncclEnvPlugin_v1`).

use std::ffi::{CStr, c_void};
use std::mem::size_of;
use std::ptr::NonNull;

use cclkit_abi::raw::env::{self, ncclEnv_v1_t, ncclEnv_v2_t};

use super::super::library::{Library, symbol_size};

/// The exported table, by version. Both versions have the same 32-byte layout; only
/// `init`'s signature differs.
#[derive(Debug, Clone, Copy)]
pub enum RawEnv {
    /// `ncclEnvPlugin_v1` (NCCL 2.28.7 – 2.30.4).
    V1(NonNull<ncclEnv_v1_t>),
    /// `ncclEnvPlugin_v2` (NCCL 2.30.7).
    V2(NonNull<ncclEnv_v2_t>),
}

// SAFETY: a `RawEnv` only points at a table inside a library its owner keeps loaded;
// the table is only read, and NCCL calls env plugins from any thread.
unsafe impl Send for RawEnv {}
// SAFETY: as above.
unsafe impl Sync for RawEnv {}

/// Why a library cannot serve as an env plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FindError {
    /// No `ncclEnvPlugin_v2` / `_v1` symbol.
    NoSymbol,
    /// The symbol's ELF size is smaller than the 32-byte table.
    TooSmall {
        /// The symbol found.
        symbol: String,
        /// Its `st_size`.
        size: usize,
    },
}

impl RawEnv {
    /// The ABI version.
    pub fn version(self) -> u32 {
        match self {
            Self::V1(_) => 1,
            Self::V2(_) => 2,
        }
    }

    /// The table's `name`, if non-NULL and UTF-8 (read once, at load).
    pub(super) fn name(self) -> Option<String> {
        // SAFETY: the owner keeps the library loaded; `name` is NULL or a C string.
        let ptr = unsafe {
            match self {
                Self::V1(t) => t.as_ref().name,
                Self::V2(t) => t.as_ref().name,
            }
        };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: non-NULL `name` is a NUL-terminated string in the plugin's data.
        let s = unsafe { CStr::from_ptr(ptr) };
        Some(s.to_string_lossy().into_owned())
    }
}

/// Looks for `ncclEnvPlugin_v2`, then `ncclEnvPlugin_v1` (NCCL 2.30.7's order).
pub(super) fn find(lib: &Library) -> Result<(RawEnv, String), FindError> {
    for version in env::VERSIONS {
        let Some(symbol) = env::symbol(version) else {
            continue;
        };
        let symbol = symbol.trim_end_matches('\0');
        let Some(addr) = lib.data_symbol(symbol) else {
            continue;
        };
        let expected = size_of::<ncclEnv_v1_t>();
        if let Some(size) = symbol_size(addr)
            && size < expected
        {
            return Err(FindError::TooSmall {
                symbol: symbol.to_owned(),
                size,
            });
        }
        return Ok((from_addr(addr, version), symbol.to_owned()));
    }
    Err(FindError::NoSymbol)
}

fn from_addr(addr: NonNull<c_void>, version: u32) -> RawEnv {
    if version == 2 {
        RawEnv::V2(addr.cast())
    } else {
        RawEnv::V1(addr.cast())
    }
}
