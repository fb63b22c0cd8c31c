//! Tuner ABI v5 (NCCL 2.28–2.29): per-communicator `init` that receives the
//! model constants ([`super::ncclTunerConstants_v5_t`]).

use core::ffi::c_char;

use super::super::assert_layout;
use super::{GetCollInfoV4, InitV5, TunerFinalize};

/// `ncclTuner_v5_t` (NCCL 2.28–2.29): context-first init with constants. 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v5_t {
    /// Tuner name (data).
    pub name: *const c_char,
    /// `init(context, commId, nRanks, nNodes, logFunction, nvlDomainInfo, constants)`.
    pub init: InitV5,
    /// As v4.
    pub getCollInfo: GetCollInfoV4,
    /// `finalize(context)`.
    pub finalize: TunerFinalize,
}
assert_layout!(
    ncclTuner_v5_t,
    size = 32,
    align = 8,
    name = 0,
    init = 8,
    getCollInfo = 16,
    finalize = 24
);
