//! Profiler ABI v4 (NCCL 2.27): `init` gets the communicator; ProxyStep states replace
//! ProxyOp states; the state arguments shrink to 8 bytes. Descriptor 104 bytes.

use core::ffi::{c_char, c_int, c_void};

use super::*;
use crate::raw::common::NcclResult;
use crate::raw::{assert_layout, table_is_sync};

/// v4 `init(context, eActivationMask, commName, commHash, nNodes, nranks, rank, logfn)`.
pub type ProfilerInitV4 = Option<
    unsafe extern "C" fn(
        context: *mut *mut c_void,
        eActivationMask: *mut c_int,
        commName: *const c_char,
        commHash: u64,
        nNodes: c_int,
        nranks: c_int,
        rank: c_int,
        logfn: crate::raw::common::ncclDebugLogger_t,
    ) -> NcclResult,
>;

/// `coll` member of the v4 descriptor (80 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCollDescr_v4_t {
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
}
assert_layout!(
    ncclProfilerCollDescr_v4_t,
    size = 80,
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
    proto = 72
);

/// `p2p` member of the v4 descriptor (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerP2pDescr_v4_t {
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
}
assert_layout!(
    ncclProfilerP2pDescr_v4_t,
    size = 40,
    align = 8,
    func = 0,
    buff = 8,
    datatype = 16,
    count = 24,
    peer = 32,
    nChannels = 36
);

/// The v4 descriptor's union (80 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclProfilerEventDescrUnion_v4_t {
    /// `ncclProfileColl`.
    pub coll: ncclProfilerCollDescr_v4_t,
    /// `ncclProfileP2p`.
    pub p2p: ncclProfilerP2pDescr_v4_t,
    /// `ncclProfileProxyOp`.
    pub proxyOp: ncclProfilerProxyOpDescr_v1_t,
    /// `ncclProfileProxyStep`.
    pub proxyStep: ncclProfilerProxyStepDescr_v1_t,
    /// `ncclProfileKernelCh`.
    pub kernelCh: ncclProfilerKernelChDescr_v4_t,
    /// `ncclProfileNetPlugin`.
    pub netPlugin: ncclProfilerNetPluginDescr_v3_t,
}
assert_layout!(ncclProfilerEventDescrUnion_v4_t, size = 80, align = 8);

/// `ncclProfilerEventDescr_v4_t` (104 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclProfilerEventDescr_v4_t {
    /// One `ncclProfile*` bit (a byte before v5).
    pub type_: u8,
    /// The parent's event handle (NULL for roots or when the parent was declined).
    pub parentObj: *mut c_void,
    /// Originating rank.
    pub rank: c_int,
    /// The member selected by `type_`.
    pub u: ncclProfilerEventDescrUnion_v4_t,
}
assert_layout!(
    ncclProfilerEventDescr_v4_t,
    size = 104,
    align = 8,
    type_ = 0,
    parentObj = 8,
    rank = 16,
    u = 24
);

/// `ncclProfiler_v4_t`: the table exported as `ncclProfiler_v4` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfiler_v4_t {
    /// Profiler name (data, not a function).
    pub name: *const c_char,
    /// `init(context, eActivationMask, commName, commHash, nNodes, nranks, rank, logfn)`.
    pub init: ProfilerInitV4,
    /// `startEvent(context, eHandle, eDescr)`; `*eHandle = NULL` declines the event.
    pub startEvent: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            eHandle: *mut *mut c_void,
            eDescr: *mut ncclProfilerEventDescr_v4_t,
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
    ncclProfiler_v4_t,
    size = 48,
    align = 8,
    name = 0,
    init = 8,
    startEvent = 16,
    stopEvent = 24,
    recordEventState = 32,
    finalize = 40
);
table_is_sync!(ncclProfiler_v4_t);
