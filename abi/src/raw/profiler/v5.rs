//! Profiler ABI v5 (NCCL 2.28): `init(ctx, commId, …)`, a 64-bit event type, and the API
//! events GroupApi/CollApi/P2pApi/KernelLaunch. Descriptor 112 bytes.

use core::ffi::{c_char, c_int, c_void};

use super::*;
use crate::raw::common::NcclResult;
use crate::raw::{assert_layout, table_is_sync};

/// `groupApi` member (v5+, 8 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerGroupApiDescr_v5_t {
    /// C `bool`: the call is being captured into a CUDA graph.
    pub graphCaptured: u8,
    /// Nesting depth of `ncclGroupStart`.
    pub groupDepth: c_int,
}
assert_layout!(
    ncclProfilerGroupApiDescr_v5_t,
    size = 8,
    align = 4,
    graphCaptured = 0,
    groupDepth = 4
);

/// `collApi` member of v5/v6 (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCollApiDescr_v5_t {
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
}
assert_layout!(
    ncclProfilerCollApiDescr_v5_t,
    size = 48,
    align = 8,
    func = 0,
    count = 8,
    datatype = 16,
    root = 24,
    stream = 32,
    graphCaptured = 40
);

/// `p2pApi` member of v5/v6 (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerP2pApiDescr_v5_t {
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
}
assert_layout!(
    ncclProfilerP2pApiDescr_v5_t,
    size = 40,
    align = 8,
    func = 0,
    count = 8,
    datatype = 16,
    stream = 24,
    graphCaptured = 32
);

/// `kernelLaunch` member (v5+, 8 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerKernelLaunchDescr_v5_t {
    /// The CUDA stream (opaque).
    pub stream: *mut c_void,
}
assert_layout!(
    ncclProfilerKernelLaunchDescr_v5_t,
    size = 8,
    align = 8,
    stream = 0
);

/// `coll` member of v5/v6 (88 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCollDescr_v5_t {
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
}
assert_layout!(
    ncclProfilerCollDescr_v5_t,
    size = 88,
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
    parentGroup = 80
);

/// `p2p` member of v5/v6 (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerP2pDescr_v5_t {
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
}
assert_layout!(
    ncclProfilerP2pDescr_v5_t,
    size = 48,
    align = 8,
    func = 0,
    buff = 8,
    datatype = 16,
    count = 24,
    peer = 32,
    nChannels = 36,
    parentGroup = 40
);

/// The v5 descriptor's union (88 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclProfilerEventDescrUnion_v5_t {
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
}
assert_layout!(ncclProfilerEventDescrUnion_v5_t, size = 88, align = 8);

/// `ncclProfilerEventDescr_v5_t` (112 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclProfilerEventDescr_v5_t {
    /// One `ncclProfile*` bit.
    pub type_: u64,
    /// The parent's event handle (NULL for roots or when the parent was declined).
    pub parentObj: *mut c_void,
    /// Originating rank.
    pub rank: c_int,
    /// The member selected by `type_`.
    pub u: ncclProfilerEventDescrUnion_v5_t,
}
assert_layout!(
    ncclProfilerEventDescr_v5_t,
    size = 112,
    align = 8,
    type_ = 0,
    parentObj = 8,
    rank = 16,
    u = 24
);

/// `ncclProfiler_v5_t`: the table exported as `ncclProfiler_v5` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfiler_v5_t {
    /// Profiler name (data, not a function).
    pub name: *const c_char,
    /// `init(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn)`.
    pub init: ProfilerInitV5,
    /// `startEvent(context, eHandle, eDescr)`; `*eHandle = NULL` declines the event.
    pub startEvent: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            eHandle: *mut *mut c_void,
            eDescr: *mut ncclProfilerEventDescr_v5_t,
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
    ncclProfiler_v5_t,
    size = 48,
    align = 8,
    name = 0,
    init = 8,
    startEvent = 16,
    stopEvent = 24,
    recordEventState = 32,
    finalize = 40
);
table_is_sync!(ncclProfiler_v5_t);
