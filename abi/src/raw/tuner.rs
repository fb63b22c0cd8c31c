//! `ncclTuner` ABI v1–v6 (NCCL_ABI.md §4).
//!
//! The cost table is typed `float**` in C but is a flat row-major
//! `float[numAlgo][numProto]` (element `(a, p)` at `a * numProto + p`); never
//! dereference it as pointer-to-pointer.

use core::ffi::{c_char, c_int, c_void};

use super::common::NCCL_NUM_TUNING_SCALES;
use super::common::{Func, NcclResult, ncclDebugLogger_t};
use super::common::{
    NCCL_NUM_ALGORITHMS, NCCL_NUM_COMPCAPS, NCCL_NUM_HW_LINKS, NCCL_NUM_PROTOCOLS,
};
use super::{assert_layout, table_is_sync};

/// `ncclNvlDomainInfo_v5_t` (= v6), 12 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ncclNvlDomainInfo_v5_t {
    /// Number of NVLink domains in the communicator.
    pub nNvlDomains: c_int,
    /// Fewest ranks in one domain.
    pub minRanksPerNvlDomain: c_int,
    /// Most ranks in one domain.
    pub maxRanksPerNvlDomain: c_int,
}
assert_layout!(
    ncclNvlDomainInfo_v5_t,
    size = 12,
    align = 4,
    nNvlDomains = 0,
    minRanksPerNvlDomain = 4,
    maxRanksPerNvlDomain = 8
);

/// A `[compcap][scale]` table of bandwidths in GB/s.
pub type BwTable = [[f64; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS];

/// `ncclTunerConstants_v5_t` (= v6) as NCCL core defines it: 1152 bytes of doubles.
///
/// NVIDIA's example headers omit the last field (1056 bytes); a host must allocate
/// the full core size. NCCL fills it before `init` and re-reads it afterwards.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ncclTunerConstants_v5_t {
    /// Base latency in µs per `[algo][proto]`.
    pub baseLatencies: [[f64; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS],
    /// Hardware latency in µs per `[hw link][algo][proto]`.
    pub hwLatencies: [[[f64; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS]; NCCL_NUM_HW_LINKS],
    /// LL bandwidth ceiling per `[compcap][scale]`.
    pub llMaxBws: BwTable,
    /// Per-channel ring LL128 bandwidth ceiling.
    pub perChMaxRingLL128Bws: BwTable,
    /// Per-channel tree LL128 bandwidth ceiling.
    pub perChMaxTreeLL128Bws: BwTable,
    /// Per-channel tree bandwidth ceiling.
    pub perChMaxTreeBws: BwTable,
    /// Per-channel NVLS tree bandwidth ceiling (absent from NVIDIA's example header).
    pub perChMaxNVLSTreeBws: BwTable,
}
assert_layout!(
    ncclTunerConstants_v5_t,
    size = 1152,
    align = 8,
    baseLatencies = 0,
    hwLatencies = 168,
    llMaxBws = 672,
    perChMaxRingLL128Bws = 768,
    perChMaxTreeLL128Bws = 864,
    perChMaxTreeBws = 960,
    perChMaxNVLSTreeBws = 1056
);

impl Default for ncclTunerConstants_v5_t {
    fn default() -> Self {
        Self {
            baseLatencies: [[0.0; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS],
            hwLatencies: [[[0.0; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS]; NCCL_NUM_HW_LINKS],
            llMaxBws: [[0.0; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS],
            perChMaxRingLL128Bws: [[0.0; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS],
            perChMaxTreeLL128Bws: [[0.0; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS],
            perChMaxTreeBws: [[0.0; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS],
            perChMaxNVLSTreeBws: [[0.0; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS],
        }
    }
}

/// `ncclNvlDomainInfo_v6_t` is identical to v5.
pub type ncclNvlDomainInfo_v6_t = ncclNvlDomainInfo_v5_t;
/// `ncclTunerConstants_v6_t` is identical to v5.
pub type ncclTunerConstants_v6_t = ncclTunerConstants_v5_t;

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

table_is_sync!(
    ncclTuner_v1_t,
    ncclTuner_v2_t,
    ncclTuner_v3_t,
    ncclTuner_v4_t,
    ncclTuner_v5_t,
    ncclTuner_v6_t
);

/// Every tuner ABI version, newest first (NCCL 2.30 tries v6 … v2; v1 only 2.19–2.20).
pub const VERSIONS: [u32; 6] = [6, 5, 4, 3, 2, 1];

/// Exported symbol name of a tuner table version, NUL-terminated.
pub const fn symbol(version: u32) -> Option<&'static str> {
    match version {
        6 => Some("ncclTunerPlugin_v6\0"),
        5 => Some("ncclTunerPlugin_v5\0"),
        4 => Some("ncclTunerPlugin_v4\0"),
        3 => Some("ncclTunerPlugin_v3\0"),
        2 => Some("ncclTunerPlugin_v2\0"),
        1 => Some("ncclTunerPlugin_v1\0"),
        _ => None,
    }
}
