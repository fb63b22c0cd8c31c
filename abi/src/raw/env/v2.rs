//! `ncclEnv_v2_t` (NCCL 2.30.7, current): v1 plus the logger as `init`'s last argument.

use core::ffi::c_char;

use super::super::common::{NcclResult, ncclDebugLogger_t};
use super::super::{assert_layout, table_is_sync};
use super::{EnvFinalize, EnvGetEnv};

/// `init(ncclMajor, ncclMinor, ncclPatch, suffix, logFunction)` of v2.
pub type EnvInitV2 = Option<
    unsafe extern "C" fn(
        ncclMajor: u8,
        ncclMinor: u8,
        ncclPatch: u8,
        suffix: *const c_char,
        logFunction: ncclDebugLogger_t,
    ) -> NcclResult,
>;

/// `ncclEnv_v2_t`: 32 bytes, the same slots as v1.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclEnv_v2_t {
    /// Plugin name (data), used in NCCL's INFO logs.
    pub name: *const c_char,
    /// `init(ncclMajor, ncclMinor, ncclPatch, suffix, logFunction)`.
    pub init: EnvInitV2,
    /// `finalize()`.
    pub finalize: EnvFinalize,
    /// `getEnv(name)`.
    pub getEnv: EnvGetEnv,
}
assert_layout!(
    ncclEnv_v2_t,
    size = 32,
    align = 8,
    name = 0,
    init = 8,
    finalize = 16,
    getEnv = 24
);

table_is_sync!(ncclEnv_v2_t);
