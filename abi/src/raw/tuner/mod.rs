//! `ncclTuner` ABI v1–v7 (NCCL_ABI.md §4, §4.4b), one file per version as in `raw/net/`.
//!
//! * [`constants`]: the model constants and NVLink-domain info a v5/v6 `init` receives.
//! * [`defaults`]: NCCL 2.30's own values for those constants.
//! * [`rccl`]: RCCL's wider constants (7 or 8 algorithms plus `bwRatio`).
//! * `v1` … `v7`: one function table per version (v7 also holds its wider constants); the argument types they share
//!   (`init`, `getCollInfo`, `finalize`) are declared here.
//!
//! The cost table is typed `float**` in C but is a flat row-major
//! `float[numAlgo][numProto]` (element `(a, p)` at `a * numProto + p`); never
//! dereference it as pointer-to-pointer.

use core::ffi::{c_int, c_void};

use super::common::{Func, NcclResult, ncclDebugLogger_t};
use super::table_is_sync;

pub mod constants;
pub mod defaults;
pub mod rccl;
mod v1;
mod v2;
mod v3;
mod v4;
mod v5;
mod v6;
mod v7;

pub use constants::{
    BwTable, NCCL_AMPERE_COMPCAP_IDX, NCCL_BLACKWELL_COMPCAP_IDX, NCCL_HOPPER_COMPCAP_IDX,
    NCCL_HW_NET, NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_VOLTA_COMPCAP_IDX, ncclNvlDomainInfo_v5_t,
    ncclNvlDomainInfo_v6_t, ncclTunerConstants_v5_t, ncclTunerConstants_v6_t,
};
pub use defaults::NCCL_DEFAULT_CONSTANTS;
pub use rccl::{
    RCCL_ALGO_DIRECT_A2A, rcclTunerConstants_a7_t, rcclTunerConstants_a8_t, rcclTunerConstants_v5_t,
};
pub use v1::ncclTuner_v1_t;
pub use v2::ncclTuner_v2_t;
pub use v3::ncclTuner_v3_t;
pub use v4::ncclTuner_v4_t;
pub use v5::ncclTuner_v5_t;
pub use v6::{GetChunkSize, ncclTuner_v6_t};
pub use v7::{
    BwTableV7, InitV7, NCCL_NUM_COMPCAPS_V7, ncclNvlDomainInfo_v7_t, ncclTuner_v7_t,
    ncclTunerConstants_v7_t,
};

/// `getCollInfo` of v3: `(ctx, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, nChannels)`.
pub type GetCollInfoV3 = Option<
    unsafe extern "C" fn(
        context: *mut c_void,
        collType: Func,
        nBytes: usize,
        numPipeOps: c_int,
        collCostTable: *mut *mut f32,
        numAlgo: c_int,
        numProto: c_int,
        nChannels: *mut c_int,
    ) -> NcclResult,
>;

/// `getCollInfo` of v4–v6: v3 plus `regBuff` before `nChannels`.
pub type GetCollInfoV4 = Option<
    unsafe extern "C" fn(
        context: *mut c_void,
        collType: Func,
        nBytes: usize,
        numPipeOps: c_int,
        collCostTable: *mut *mut f32,
        numAlgo: c_int,
        numProto: c_int,
        regBuff: c_int,
        nChannels: *mut c_int,
    ) -> NcclResult,
>;

/// `init` of v2–v4: context out-pointer **last**.
pub type InitV2 = Option<
    unsafe extern "C" fn(
        nRanks: usize,
        nNodes: usize,
        logFunction: ncclDebugLogger_t,
        context: *mut *mut c_void,
    ) -> NcclResult,
>;

/// `init` of v5/v6: context out-pointer **first**, plus commId, NVL info and constants.
pub type InitV5 = Option<
    unsafe extern "C" fn(
        context: *mut *mut c_void,
        commId: u64,
        nRanks: usize,
        nNodes: usize,
        logFunction: ncclDebugLogger_t,
        nvlDomainInfo: *mut ncclNvlDomainInfo_v5_t,
        constants: *mut ncclTunerConstants_v5_t,
    ) -> NcclResult,
>;

/// `destroy(ctx)` (v2–v4) / `finalize(ctx)` (v5/v6).
pub type TunerFinalize = Option<unsafe extern "C" fn(context: *mut c_void) -> NcclResult>;

table_is_sync!(
    ncclTuner_v1_t,
    ncclTuner_v2_t,
    ncclTuner_v3_t,
    ncclTuner_v4_t,
    ncclTuner_v5_t,
    ncclTuner_v6_t,
    ncclTuner_v7_t
);

/// Every tuner ABI version, newest first (NCCL 2.30 tries v6 … v2; v1 only 2.19–2.20;
/// v7 is in NCCL's source after 2.31).
pub const VERSIONS: [u32; 7] = [7, 6, 5, 4, 3, 2, 1];

/// Exported symbol name of a tuner table version, NUL-terminated.
pub const fn symbol(version: u32) -> Option<&'static str> {
    match version {
        7 => Some("ncclTunerPlugin_v7\0"),
        6 => Some("ncclTunerPlugin_v6\0"),
        5 => Some("ncclTunerPlugin_v5\0"),
        4 => Some("ncclTunerPlugin_v4\0"),
        3 => Some("ncclTunerPlugin_v3\0"),
        2 => Some("ncclTunerPlugin_v2\0"),
        1 => Some("ncclTunerPlugin_v1\0"),
        _ => None,
    }
}
