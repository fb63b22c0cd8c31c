//! Profiler ABI v2 (NCCL 2.24–2.25): string func/datatype/algo/proto. Descriptor 128 bytes.

use core::ffi::{c_char, c_int, c_void};

use super::*;
use crate::raw::common::NcclResult;
use crate::raw::{assert_layout, table_is_sync};

/// `coll` member of the v2 descriptor (104 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCollDescr_v2_t {
    /// Communicator name.
    pub name: *const c_char,
    /// Communicator hash.
    pub commHash: u64,
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
    /// Bytes moved over the network.
    pub trafficBytes: usize,
    /// Channels used at most.
    pub nMaxChannels: u8,
    /// Warps per block.
    pub nWarps: u8,
    /// Algorithm name (`"RING"`, …).
    pub algo: *const c_char,
    /// Protocol name (`"SIMPLE"`, …).
    pub proto: *const c_char,
}
assert_layout!(
    ncclProfilerCollDescr_v2_t,
    size = 104,
    align = 8,
    name = 0,
    commHash = 8,
    seqNumber = 16,
    func = 24,
    sendBuff = 32,
    recvBuff = 40,
    count = 48,
    root = 56,
    datatype = 64,
    trafficBytes = 72,
    nMaxChannels = 80,
    nWarps = 81,
    algo = 88,
    proto = 96
);

/// `p2p` member of the v2 and v3 descriptors (56 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerP2pDescr_v2_t {
    /// Communicator name.
    pub name: *const c_char,
    /// Communicator hash.
    pub commHash: u64,
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
}
assert_layout!(
    ncclProfilerP2pDescr_v2_t,
    size = 56,
    align = 8,
    name = 0,
    commHash = 8,
    func = 16,
    buff = 24,
    datatype = 32,
    count = 40,
    peer = 48
);

/// The v2 descriptor's union (104 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclProfilerEventDescrUnion_v2_t {
    /// `ncclProfileColl`.
    pub coll: ncclProfilerCollDescr_v2_t,
    /// `ncclProfileP2p`.
    pub p2p: ncclProfilerP2pDescr_v2_t,
    /// `ncclProfileProxyOp`.
    pub proxyOp: ncclProfilerProxyOpDescr_v1_t,
    /// `ncclProfileProxyStep`.
    pub proxyStep: ncclProfilerProxyStepDescr_v1_t,
}
assert_layout!(ncclProfilerEventDescrUnion_v2_t, size = 104, align = 8);

/// `ncclProfilerEventDescr_v2_t` (128 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclProfilerEventDescr_v2_t {
    /// One `ncclProfile*` bit (a byte before v5).
    pub type_: u8,
    /// The parent's event handle (NULL for roots or when the parent was declined).
    pub parentObj: *mut c_void,
    /// Originating rank.
    pub rank: c_int,
    /// The member selected by `type_`.
    pub u: ncclProfilerEventDescrUnion_v2_t,
}
assert_layout!(
    ncclProfilerEventDescr_v2_t,
    size = 128,
    align = 8,
    type_ = 0,
    parentObj = 8,
    rank = 16,
    u = 24
);

/// `ncclProfiler_v2_t`: the table exported as `ncclProfiler_v2` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfiler_v2_t {
    /// Profiler name (data, not a function).
    pub name: *const c_char,
    /// `init(context, eActivationMask)`.
    pub init: ProfilerInitV1,
    /// `startEvent(context, eHandle, eDescr)`; `*eHandle = NULL` declines the event.
    pub startEvent: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            eHandle: *mut *mut c_void,
            eDescr: *mut ncclProfilerEventDescr_v2_t,
        ) -> NcclResult,
    >,
    /// `stopEvent(eHandle)`.
    pub stopEvent: ProfilerStopEvent,
    /// `recordEventState(eHandle, eState, eStateArgs)`.
    pub recordEventState: ProfilerRecordV1,
    /// `finalize(context)`.
    pub finalize: ProfilerFinalize,
}
assert_layout!(
    ncclProfiler_v2_t,
    size = 48,
    align = 8,
    name = 0,
    init = 8,
    startEvent = 16,
    stopEvent = 24,
    recordEventState = 32,
    finalize = 40
);
table_is_sync!(ncclProfiler_v2_t);
