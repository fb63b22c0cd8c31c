//! Profiler ABI v6 (NCCL 2.29–2.30): copy-engine events CeColl/CeSync/CeBatch.
//! Descriptor 112 bytes.

use core::ffi::{c_char, c_int, c_void};

use super::v5::*;
use super::*;
use crate::raw::common::NcclResult;
use crate::raw::{assert_layout, table_is_sync};

/// `ceColl` member of v6 (88 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCeCollDescr_v6_t {
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
}
assert_layout!(
    ncclProfilerCeCollDescr_v6_t,
    size = 88,
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
    stream = 80
);

/// `ceCollSync` member (v6+, 8 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCeSyncDescr_v6_t {
    /// C `bool`: the synchronisation completed.
    pub isComplete: u8,
    /// Ranks synchronised.
    pub nRanks: c_int,
}
assert_layout!(
    ncclProfilerCeSyncDescr_v6_t,
    size = 8,
    align = 4,
    isComplete = 0,
    nRanks = 4
);

/// `ceCollBatch` member (v6+, 24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCeBatchDescr_v6_t {
    /// Operations in the batch.
    pub numOps: c_int,
    /// Bytes in the batch.
    pub totalBytes: usize,
    /// C `bool`: intra-batch synchronisation used.
    pub useIntraSync: u8,
}
assert_layout!(
    ncclProfilerCeBatchDescr_v6_t,
    size = 24,
    align = 8,
    numOps = 0,
    totalBytes = 8,
    useIntraSync = 16
);

/// The v6 descriptor's union (88 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclProfilerEventDescrUnion_v6_t {
    /// `ncclProfileGroupApi`.
    pub groupApi: ncclProfilerGroupApiDescr_v5_t,
    /// `ncclProfileCollApi`.
    pub collApi: ncclProfilerCollApiDescr_v5_t,
    /// `ncclProfileP2pApi`.
    pub p2pApi: ncclProfilerP2pApiDescr_v5_t,
    /// `ncclProfileKernelLaunch`.
    pub kernelLaunch: ncclProfilerKernelLaunchDescr_v5_t,
    /// `ncclProfileColl`.
    pub coll: ncclProfilerCollDescr_v5_t,
    /// `ncclProfileP2p`.
    pub p2p: ncclProfilerP2pDescr_v5_t,
    /// `ncclProfileProxyOp`.
    pub proxyOp: ncclProfilerProxyOpDescr_v1_t,
    /// `ncclProfileProxyStep`.
    pub proxyStep: ncclProfilerProxyStepDescr_v1_t,
    /// `ncclProfileKernelCh`.
    pub kernelCh: ncclProfilerKernelChDescr_v4_t,
    /// `ncclProfileNetPlugin`.
    pub netPlugin: ncclProfilerNetPluginDescr_v3_t,
    /// `ncclProfileCeColl`.
    pub ceColl: ncclProfilerCeCollDescr_v6_t,
    /// `ncclProfileCeSync`.
    pub ceCollSync: ncclProfilerCeSyncDescr_v6_t,
    /// `ncclProfileCeBatch`.
    pub ceCollBatch: ncclProfilerCeBatchDescr_v6_t,
}
assert_layout!(ncclProfilerEventDescrUnion_v6_t, size = 88, align = 8);

/// `ncclProfilerEventDescr_v6_t` (112 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclProfilerEventDescr_v6_t {
    /// One `ncclProfile*` bit.
    pub type_: u64,
    /// The parent's event handle (NULL for roots or when the parent was declined).
    pub parentObj: *mut c_void,
    /// Originating rank.
    pub rank: c_int,
    /// The member selected by `type_`.
    pub u: ncclProfilerEventDescrUnion_v6_t,
}
assert_layout!(
    ncclProfilerEventDescr_v6_t,
    size = 112,
    align = 8,
    type_ = 0,
    parentObj = 8,
    rank = 16,
    u = 24
);

/// `ncclProfiler_v6_t`: the table exported as `ncclProfiler_v6` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfiler_v6_t {
    /// Profiler name (data, not a function).
    pub name: *const c_char,
    /// `init(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn)`.
    pub init: ProfilerInitV5,
    /// `startEvent(context, eHandle, eDescr)`; `*eHandle = NULL` declines the event.
    pub startEvent: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            eHandle: *mut *mut c_void,
            eDescr: *mut ncclProfilerEventDescr_v6_t,
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
    ncclProfiler_v6_t,
    size = 48,
    align = 8,
    name = 0,
    init = 8,
    startEvent = 16,
    stopEvent = 24,
    recordEventState = 32,
    finalize = 40
);
table_is_sync!(ncclProfiler_v6_t);
