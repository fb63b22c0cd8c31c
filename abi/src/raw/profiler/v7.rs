//! Profiler ABI v7 (NCCL 2.31): per-call `userTag`, `kernelVariant`/`isSymColl` on Coll,
//! and the KernelPhase sub-event. Descriptor 136 bytes.

use core::ffi::{c_char, c_int, c_void};

use super::v5::*;
use super::v6::*;
use super::*;
use crate::raw::common::NcclResult;
use crate::raw::{assert_layout, table_is_sync};

/// `collApi` member of v7 (56 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCollApiDescr_v7_t {
    /// NCCL's function name (`"AllReduce"`, `"Send"`, …).
    pub func: *const c_char,
    /// Element count.
    pub count: usize,
    /// Datatype name (`"ncclFloat32"`, …).
    pub datatype: *const c_char,
    /// Root rank (rooted collectives).
    pub root: c_int,
    /// The CUDA stream (opaque).
    pub stream: *mut c_void,
    /// C `bool`: the call is being captured into a CUDA graph.
    pub graphCaptured: u8,
    /// Per-call user profiler tag (0 = untagged).
    pub userTag: u64,
}
assert_layout!(
    ncclProfilerCollApiDescr_v7_t,
    size = 56,
    align = 8,
    func = 0,
    count = 8,
    datatype = 16,
    root = 24,
    stream = 32,
    graphCaptured = 40,
    userTag = 48
);

/// `p2pApi` member of v7 (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerP2pApiDescr_v7_t {
    /// NCCL's function name (`"AllReduce"`, `"Send"`, …).
    pub func: *const c_char,
    /// Element count.
    pub count: usize,
    /// Datatype name (`"ncclFloat32"`, …).
    pub datatype: *const c_char,
    /// The CUDA stream (opaque).
    pub stream: *mut c_void,
    /// C `bool`: the call is being captured into a CUDA graph.
    pub graphCaptured: u8,
    /// Per-call user profiler tag (0 = untagged).
    pub userTag: u64,
}
assert_layout!(
    ncclProfilerP2pApiDescr_v7_t,
    size = 48,
    align = 8,
    func = 0,
    count = 8,
    datatype = 16,
    stream = 24,
    graphCaptured = 32,
    userTag = 40
);

/// `coll` member of v7 (112 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCollDescr_v7_t {
    /// Per-communicator collective sequence number.
    pub seqNumber: u64,
    /// NCCL's function name (`"AllReduce"`, `"Send"`, …).
    pub func: *const c_char,
    /// Send buffer.
    pub sendBuff: *const c_void,
    /// Receive buffer.
    pub recvBuff: *mut c_void,
    /// Element count.
    pub count: usize,
    /// Root rank (rooted collectives).
    pub root: c_int,
    /// Datatype name (`"ncclFloat32"`, …).
    pub datatype: *const c_char,
    /// Channels used.
    pub nChannels: u8,
    /// Warps per block.
    pub nWarps: u8,
    /// Algorithm name (`"RING"`, …).
    pub algo: *const c_char,
    /// Protocol name (`"SIMPLE"`, …).
    pub proto: *const c_char,
    /// The Group event's handle (kept for v4 profilers).
    pub parentGroup: *mut c_void,
    /// Kernel variant name.
    pub kernelVariant: *const c_char,
    /// C `bool`: a symmetric-memory collective.
    pub isSymColl: u8,
    /// Per-call user profiler tag (0 = untagged).
    pub userTag: u64,
}
assert_layout!(
    ncclProfilerCollDescr_v7_t,
    size = 112,
    align = 8,
    seqNumber = 0,
    func = 8,
    sendBuff = 16,
    recvBuff = 24,
    count = 32,
    root = 40,
    datatype = 48,
    nChannels = 56,
    nWarps = 57,
    algo = 64,
    proto = 72,
    parentGroup = 80,
    kernelVariant = 88,
    isSymColl = 96,
    userTag = 104
);

/// `p2p` member of v7 (56 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerP2pDescr_v7_t {
    /// NCCL's function name (`"AllReduce"`, `"Send"`, …).
    pub func: *const c_char,
    /// User buffer.
    pub buff: *mut c_void,
    /// Datatype name (`"ncclFloat32"`, …).
    pub datatype: *const c_char,
    /// Element count.
    pub count: usize,
    /// Remote rank.
    pub peer: c_int,
    /// Channels used.
    pub nChannels: u8,
    /// The Group event's handle (kept for v4 profilers).
    pub parentGroup: *mut c_void,
    /// Per-call user profiler tag (0 = untagged).
    pub userTag: u64,
}
assert_layout!(
    ncclProfilerP2pDescr_v7_t,
    size = 56,
    align = 8,
    func = 0,
    buff = 8,
    datatype = 16,
    count = 24,
    peer = 32,
    nChannels = 36,
    parentGroup = 40,
    userTag = 48
);

/// `ceColl` member of v7 (96 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCeCollDescr_v7_t {
    /// Per-communicator collective sequence number.
    pub seqNumber: u64,
    /// NCCL's function name (`"AllReduce"`, `"Send"`, …).
    pub func: *const c_char,
    /// Send buffer.
    pub sendBuff: *const c_void,
    /// Receive buffer.
    pub recvBuff: *mut c_void,
    /// Element count.
    pub count: usize,
    /// Root rank (rooted collectives).
    pub root: c_int,
    /// Datatype name (`"ncclFloat32"`, …).
    pub datatype: *const c_char,
    /// Synchronisation strategy name.
    pub syncStrategy: *const c_char,
    /// C `bool`: synchronise inside a batch.
    pub intraBatchSync: u8,
    /// Operations per batch.
    pub batchSize: u32,
    /// Batches.
    pub numBatches: u32,
    /// Copy-engine sequence number.
    pub ceSeqNum: u32,
    /// The CUDA stream (opaque).
    pub stream: *mut c_void,
    /// Per-call user profiler tag (0 = untagged).
    pub userTag: u64,
}
assert_layout!(
    ncclProfilerCeCollDescr_v7_t,
    size = 96,
    align = 8,
    seqNumber = 0,
    func = 8,
    sendBuff = 16,
    recvBuff = 24,
    count = 32,
    root = 40,
    datatype = 48,
    syncStrategy = 56,
    intraBatchSync = 64,
    batchSize = 68,
    numBatches = 72,
    ceSeqNum = 76,
    stream = 80,
    userTag = 88
);

/// `kernelPhase` member of v7 (24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerKernelPhaseDescr_v7_t {
    /// Channel id.
    pub channelId: u8,
    /// Phase: 0 = initial sync, 1 = compute, 2 = final sync.
    pub phaseId: u8,
    /// Phase name.
    pub phaseName: *const c_char,
    /// Start timestamp from the GPU global timer (ns).
    pub pTimer: u64,
}
assert_layout!(
    ncclProfilerKernelPhaseDescr_v7_t,
    size = 24,
    align = 8,
    channelId = 0,
    phaseId = 1,
    phaseName = 8,
    pTimer = 16
);

/// The v7 descriptor's union (112 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclProfilerEventDescrUnion_v7_t {
    /// `ncclProfileGroupApi`.
    pub groupApi: ncclProfilerGroupApiDescr_v5_t,
    /// `ncclProfileCollApi`.
    pub collApi: ncclProfilerCollApiDescr_v7_t,
    /// `ncclProfileP2pApi`.
    pub p2pApi: ncclProfilerP2pApiDescr_v7_t,
    /// `ncclProfileKernelLaunch`.
    pub kernelLaunch: ncclProfilerKernelLaunchDescr_v5_t,
    /// `ncclProfileColl`.
    pub coll: ncclProfilerCollDescr_v7_t,
    /// `ncclProfileP2p`.
    pub p2p: ncclProfilerP2pDescr_v7_t,
    /// `ncclProfileProxyOp`.
    pub proxyOp: ncclProfilerProxyOpDescr_v1_t,
    /// `ncclProfileProxyStep`.
    pub proxyStep: ncclProfilerProxyStepDescr_v1_t,
    /// `ncclProfileKernelCh`.
    pub kernelCh: ncclProfilerKernelChDescr_v4_t,
    /// `ncclProfileNetPlugin`.
    pub netPlugin: ncclProfilerNetPluginDescr_v3_t,
    /// `ncclProfileCeColl`.
    pub ceColl: ncclProfilerCeCollDescr_v7_t,
    /// `ncclProfileCeSync`.
    pub ceCollSync: ncclProfilerCeSyncDescr_v6_t,
    /// `ncclProfileCeBatch`.
    pub ceCollBatch: ncclProfilerCeBatchDescr_v6_t,
    /// `ncclProfileKernelPhase`.
    pub kernelPhase: ncclProfilerKernelPhaseDescr_v7_t,
}
assert_layout!(ncclProfilerEventDescrUnion_v7_t, size = 112, align = 8);

/// `ncclProfilerEventDescr_v7_t` (136 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclProfilerEventDescr_v7_t {
    /// One `ncclProfile*` bit.
    pub type_: u64,
    /// The parent's event handle (NULL for roots or when the parent was declined).
    pub parentObj: *mut c_void,
    /// Originating rank.
    pub rank: c_int,
    /// The member selected by `type_`.
    pub u: ncclProfilerEventDescrUnion_v7_t,
}
assert_layout!(
    ncclProfilerEventDescr_v7_t,
    size = 136,
    align = 8,
    type_ = 0,
    parentObj = 8,
    rank = 16,
    u = 24
);

/// `ncclProfiler_v7_t`: the table exported as `ncclProfiler_v7` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfiler_v7_t {
    /// Profiler name (data, not a function).
    pub name: *const c_char,
    /// `init(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn)`.
    pub init: ProfilerInitV5,
    /// `startEvent(context, eHandle, eDescr)`; `*eHandle = NULL` declines the event.
    pub startEvent: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            eHandle: *mut *mut c_void,
            eDescr: *mut ncclProfilerEventDescr_v7_t,
        ) -> NcclResult,
    >,
    /// `stopEvent(eHandle)`.
    pub stopEvent: ProfilerStopEvent,
    /// `recordEventState(eHandle, eState, eStateArgs)`.
    pub recordEventState: ProfilerRecordV4,
    /// `finalize(context)`.
    pub finalize: ProfilerFinalize,
}
assert_layout!(
    ncclProfiler_v7_t,
    size = 48,
    align = 8,
    name = 0,
    init = 8,
    startEvent = 16,
    stopEvent = 24,
    recordEventState = 32,
    finalize = 40
);
table_is_sync!(ncclProfiler_v7_t);
