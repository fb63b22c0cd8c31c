//! Tuner ABI v6 (NCCL 2.30, current): v5 plus an optional `getChunkSize`.

use core::ffi::{c_char, c_int, c_void};

use super::super::assert_layout;
use super::super::common::{Func, NcclResult};
use super::{GetCollInfoV4, InitV5, TunerFinalize};

/// `getChunkSize(context, collType, nBytes, algo, proto, nChannels, chunkSize)` (v6).
pub type GetChunkSize = Option<
    unsafe extern "C" fn(
        context: *mut c_void,
        collType: Func,
        nBytes: usize,
        algo: c_int,
        proto: c_int,
        nChannels: c_int,
        chunkSize: *mut usize,
    ) -> NcclResult,
>;

/// `ncclTuner_v6_t` (NCCL 2.30, current): v5 plus optional `getChunkSize`. 40 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v6_t {
    /// Tuner name (data).
    pub name: *const c_char,
    /// `init(context, commId, nRanks, nNodes, logFunction, nvlDomainInfo, constants)`.
    pub init: InitV5,
    /// As v4.
    pub getCollInfo: GetCollInfoV4,
    /// `finalize(context)`.
    pub finalize: TunerFinalize,
    /// `getChunkSize(…)`, optional (NULL allowed).
    pub getChunkSize: GetChunkSize,
}
assert_layout!(
    ncclTuner_v6_t,
    size = 40,
    align = 8,
    name = 0,
    init = 8,
    getCollInfo = 16,
    finalize = 24,
    getChunkSize = 32
);
