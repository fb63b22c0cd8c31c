//! `ncclEnv_v1_t` (NCCL 2.28.7 – 2.30.4 load only this version; 2.30.7 still accepts it).

use core::ffi::c_char;

use super::super::common::NcclResult;
use super::super::{assert_layout, table_is_sync};
use super::{EnvFinalize, EnvGetEnv};

/// `init(ncclMajor, ncclMinor, ncclPatch, suffix)` of v1: no logger.
///
/// The version numbers are `uint8_t` in C; `suffix` is NCCL's version suffix
/// (`NCCL_SUFFIX`, often empty), never NULL from NCCL but treated as hostile here.
pub type EnvInitV1 = Option<
    unsafe extern "C" fn(
        ncclMajor: u8,
        ncclMinor: u8,
        ncclPatch: u8,
        suffix: *const c_char,
    ) -> NcclResult,
>;

/// `ncclEnv_v1_t`: 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclEnv_v1_t {
    /// Plugin name (data), used in NCCL's INFO logs.
    pub name: *const c_char,
    /// `init(ncclMajor, ncclMinor, ncclPatch, suffix)`.
    pub init: EnvInitV1,
    /// `finalize()`.
    pub finalize: EnvFinalize,
    /// `getEnv(name)`.
    pub getEnv: EnvGetEnv,
}
assert_layout!(
    ncclEnv_v1_t,
    size = 32,
    align = 8,
    name = 0,
    init = 8,
    finalize = 16,
    getEnv = 24
);

table_is_sync!(ncclEnv_v1_t);
