//! Tuner ABI v1 (NCCL 2.19–2.20): a process-global tuner without a context.

use core::ffi::{c_char, c_int};

use super::super::assert_layout;
use super::super::common::{Func, NcclResult, ncclDebugLogger_t};

/// `ncclTuner_v1_t` (NCCL 2.19–2.20): process-global, no context. 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v1_t {
    /// Tuner name (data).
    pub name: *const c_char,
    /// `init(nRanks, nNodes, logFunction)`.
    pub init: Option<
        unsafe extern "C" fn(
            nRanks: usize,
            nNodes: usize,
            logFunction: ncclDebugLogger_t,
        ) -> NcclResult,
    >,
    /// `getCollInfo(collType, nBytes, collNetSupport, nvlsSupport, numPipeOps, algorithm, protocol, nChannels)`.
    pub getCollInfo: Option<
        unsafe extern "C" fn(
            collType: Func,
            nBytes: usize,
            collNetSupport: c_int,
            nvlsSupport: c_int,
            numPipeOps: c_int,
            algorithm: *mut c_int,
            protocol: *mut c_int,
            nChannels: *mut c_int,
        ) -> NcclResult,
    >,
    /// `destroy()`.
    pub destroy: Option<unsafe extern "C" fn() -> NcclResult>,
}
assert_layout!(
    ncclTuner_v1_t,
    size = 32,
    align = 8,
    name = 0,
    init = 8,
    getCollInfo = 16,
    destroy = 24
);
