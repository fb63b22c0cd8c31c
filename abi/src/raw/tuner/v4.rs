//! Tuner ABI v4 (NCCL 2.24–2.27): v3 plus the `regBuff` argument.

use core::ffi::c_char;

use super::super::assert_layout;
use super::{GetCollInfoV4, InitV2, TunerFinalize};

/// `ncclTuner_v4_t` (NCCL 2.24–2.27): v3 plus `regBuff`. 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v4_t {
    /// Tuner name (data).
    pub name: *const c_char,
    /// `init(nRanks, nNodes, logFunction, context)`.
    pub init: InitV2,
    /// `getCollInfo(context, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, regBuff, nChannels)`.
    pub getCollInfo: GetCollInfoV4,
    /// `destroy(context)`.
    pub destroy: TunerFinalize,
}
assert_layout!(
    ncclTuner_v4_t,
    size = 32,
    align = 8,
    name = 0,
    init = 8,
    getCollInfo = 16,
    destroy = 24
);
