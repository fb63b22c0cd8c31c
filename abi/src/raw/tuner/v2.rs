//! Tuner ABI v2 (NCCL 2.21): the plugin returns one algorithm/protocol pair.

use core::ffi::{c_char, c_int, c_void};

use super::super::assert_layout;
use super::super::common::{Func, NcclResult};
use super::{InitV2, TunerFinalize};

/// `ncclTuner_v2_t` (NCCL 2.21): the plugin returns algorithm/protocol. 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v2_t {
    /// Tuner name (data).
    pub name: *const c_char,
    /// `init(nRanks, nNodes, logFunction, context)`.
    pub init: InitV2,
    /// `getCollInfo(context, collType, nBytes, collNetSupport, nvlsSupport, numPipeOps, algorithm, protocol, nChannels)`.
    pub getCollInfo: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
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
    /// `destroy(context)`.
    pub destroy: TunerFinalize,
}
assert_layout!(
    ncclTuner_v2_t,
    size = 32,
    align = 8,
    name = 0,
    init = 8,
    getCollInfo = 16,
    destroy = 24
);
