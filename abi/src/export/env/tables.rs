//! The `extern "C"` entry points of the env tables and the const fns building them.

use std::borrow::Cow;
use std::ffi::{CStr, c_char};

use super::EnvExport;
use crate::env::{EnvInit, NcclVersion};
use crate::error::{Error, Result};
use crate::export::guard::guard;
use crate::log::set_logger;
use crate::raw::common::{NcclResult, ncclDebugLogger_t};
use crate::raw::env::{ncclEnv_v1_t, ncclEnv_v2_t};

/// Reads `suffix` (NULL reads as empty).
///
/// # Safety
/// `suffix` is NULL or a NUL-terminated string valid for the call.
unsafe fn suffix_text<'a>(suffix: *const c_char) -> Cow<'a, str> {
    if suffix.is_null() {
        return Cow::Borrowed("");
    }
    // SAFETY: non-NULL and NUL-terminated per the contract above.
    unsafe { CStr::from_ptr(suffix) }.to_string_lossy()
}

/// # Safety
/// As [`suffix_text`].
unsafe fn init<T: EnvExport>(
    host_abi: u32,
    (major, minor, patch): (u8, u8, u8),
    suffix: *const c_char,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let suffix = unsafe { suffix_text(suffix) };
    T::state().init(EnvInit {
        host_abi,
        nccl_version: NcclVersion {
            major,
            minor,
            patch,
        },
        suffix: &suffix,
    })
}

unsafe extern "C" fn init_v1<T: EnvExport>(
    major: u8,
    minor: u8,
    patch: u8,
    suffix: *const c_char,
) -> NcclResult {
    // v1 has no logger: keep whatever another kind in this library installed.
    // SAFETY: NCCL passes its NUL-terminated NCCL_SUFFIX.
    guard("ncclEnv.init", || unsafe {
        init::<T>(1, (major, minor, patch), suffix)
    })
}

unsafe extern "C" fn init_v2<T: EnvExport>(
    major: u8,
    minor: u8,
    patch: u8,
    suffix: *const c_char,
    log: ncclDebugLogger_t,
) -> NcclResult {
    if log.is_some() {
        set_logger(log);
    }
    // SAFETY: NCCL passes its NUL-terminated NCCL_SUFFIX.
    guard("ncclEnv.init", || unsafe {
        init::<T>(2, (major, minor, patch), suffix)
    })
}

unsafe extern "C" fn finalize<T: EnvExport>() -> NcclResult {
    guard("ncclEnv.finalize", || T::state().finalize())
}

/// `getEnv`: NULL for unset, for any error (logged at WARN) and for a panic.
unsafe extern "C" fn get_env<T: EnvExport>(name: *const c_char) -> *const c_char {
    let mut out = std::ptr::null();
    let rc = guard("ncclEnv.getEnv", || {
        if name.is_null() {
            return Err(Error::invalid_argument("getEnv(NULL)"));
        }
        // SAFETY: non-NULL; NCCL passes a NUL-terminated variable name.
        let name = unsafe { CStr::from_ptr(name) };
        let name = name.to_str().map_err(|_| {
            Error::invalid_argument(format!("getEnv({name:?}): the name is not UTF-8"))
        })?;
        out = T::state().get(name)?;
        Ok(())
    });
    if rc.is_ok() { out } else { std::ptr::null() }
}

/// `ncclEnvPlugin_v1` for `T`.
pub const fn v1<T: EnvExport>() -> ncclEnv_v1_t {
    ncclEnv_v1_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v1::<T>),
        finalize: Some(finalize::<T>),
        getEnv: Some(get_env::<T>),
    }
}

/// `ncclEnvPlugin_v2` for `T`.
pub const fn v2<T: EnvExport>() -> ncclEnv_v2_t {
    ncclEnv_v2_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v2::<T>),
        finalize: Some(finalize::<T>),
        getEnv: Some(get_env::<T>),
    }
}
