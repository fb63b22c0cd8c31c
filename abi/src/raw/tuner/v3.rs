//! Tuner ABI v3 (NCCL 2.22–2.23): the plugin edits NCCL's cost table.

use core::ffi::c_char;

use super::super::assert_layout;
use super::{GetCollInfoV3, InitV2, TunerFinalize};

/// `ncclTuner_v3_t` (NCCL 2.22–2.23): the plugin edits a cost table. 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v3_t {
    /// Tuner name (data).
    pub name: *const c_char,
    /// `init(nRanks, nNodes, logFunction, context)`.
    pub init: InitV2,
    /// `getCollInfo(context, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, nChannels)`.
    pub getCollInfo: GetCollInfoV3,
    /// `destroy(context)`.
    pub destroy: TunerFinalize,
}
assert_layout!(
    ncclTuner_v3_t,
    size = 32,
    align = 8,
    name = 0,
    init = 8,
    getCollInfo = 16,
    destroy = 24
);
