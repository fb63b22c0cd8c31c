//! Profiler ABI v1 (NCCL 2.23): numeric func/datatype/algo/proto, Group/Coll/P2p and
//! proxy events only. Descriptor 120 bytes.

use core::ffi::{c_char, c_int, c_void};

use super::{
    ProfilerFinalize, ProfilerInitV1, ProfilerRecordV1, ProfilerStopEvent,
    ncclProfilerProxyOpDescr_v1_t, ncclProfilerProxyStepDescr_v1_t,
};
use crate::raw::common::NcclResult;
use crate::raw::{assert_layout, table_is_sync};

/// `coll` member of the v1 descriptor (96 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCollDescr_v1_t {
    /// Communicator name.
    pub name: *const c_char,
    /// Communicator hash.
    pub commHash: u64,
    /// Per-communicator collective sequence number.
    pub seqNumber: u64,
    /// `ncclFunc_t` as a byte.
    pub func: u8,
    /// Send buffer.
    pub sendBuff: *const c_void,
    /// Receive buffer.
    pub recvBuff: *mut c_void,
    /// Element count.
    pub count: usize,
    /// Root rank (rooted collectives).
    pub root: c_int,
    /// `ncclDataType_t` as a byte.
    pub datatype: u8,
    /// `ncclRedOp_t`.
    pub op: u32,
    /// Bytes moved over the network.
    pub trafficBytes: usize,
    /// Channels used at most.
    pub nMaxChannels: u8,
    /// Warps per block.
    pub nWarps: u8,
    /// `ncclAlgorithm_t` as a byte.
    pub algo: u8,
    /// `ncclProtocol_t` as a byte.
    pub proto: u8,
    /// Non-zero for a CollNet algorithm.
    pub isCollnet: c_int,
    /// Non-zero for an NVLS algorithm.
    pub isNvls: c_int,
}
assert_layout!(
    ncclProfilerCollDescr_v1_t,
    size = 96,
    align = 8,
    name = 0,
    commHash = 8,
    seqNumber = 16,
    func = 24,
    sendBuff = 32,
    recvBuff = 40,
    count = 48,
    root = 56,
    datatype = 60,
    op = 64,
    trafficBytes = 72,
    nMaxChannels = 80,
    nWarps = 81,
    algo = 82,
    proto = 83,
    isCollnet = 84,
    isNvls = 88
);

/// `p2p` member of the v1 descriptor (56 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerP2pDescr_v1_t {
    /// Communicator name.
    pub name: *const c_char,
    /// Communicator hash.
    pub commHash: u64,
    /// `ncclFunc_t` as a byte (Send or Recv).
    pub func: u8,
    /// User buffer.
    pub buff: *mut c_void,
    /// `ncclDataType_t` as a byte.
    pub datatype: u8,
    /// Element count.
    pub count: usize,
    /// Remote rank.
    pub peer: c_int,
}
assert_layout!(
    ncclProfilerP2pDescr_v1_t,
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

/// The v1 descriptor's union (96 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclProfilerEventDescrUnion_v1_t {
    /// `ncclProfileColl`.
    pub coll: ncclProfilerCollDescr_v1_t,
    /// `ncclProfileP2p`.
    pub p2p: ncclProfilerP2pDescr_v1_t,
    /// `ncclProfileProxyOp`.
    pub proxyOp: ncclProfilerProxyOpDescr_v1_t,
    /// `ncclProfileProxyStep`.
    pub proxyStep: ncclProfilerProxyStepDescr_v1_t,
}
assert_layout!(ncclProfilerEventDescrUnion_v1_t, size = 96, align = 8);

/// `ncclProfilerEventDescr_v1_t` (120 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclProfilerEventDescr_v1_t {
    /// One `ncclProfile*` bit (a byte before v5).
    pub type_: u8,
    /// The parent's event handle (NULL for roots or when the parent was declined).
    pub parentObj: *mut c_void,
    /// Originating rank.
    pub rank: c_int,
    /// The member selected by `type_`.
    pub u: ncclProfilerEventDescrUnion_v1_t,
}
assert_layout!(
    ncclProfilerEventDescr_v1_t,
    size = 120,
    align = 8,
    type_ = 0,
    parentObj = 8,
    rank = 16,
    u = 24
);

/// `ncclProfiler_v1_t`: the table exported as `ncclProfiler_v1` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfiler_v1_t {
    /// Profiler name (data, not a function).
    pub name: *const c_char,
    /// `init(context, eActivationMask)`.
    pub init: ProfilerInitV1,
    /// `startEvent(context, eHandle, eDescr)`; `*eHandle = NULL` declines the event.
    pub startEvent: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            eHandle: *mut *mut c_void,
            eDescr: *mut ncclProfilerEventDescr_v1_t,
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
    ncclProfiler_v1_t,
    size = 48,
    align = 8,
    name = 0,
    init = 8,
    startEvent = 16,
    stopEvent = 24,
    recordEventState = 32,
    finalize = 40
);
table_is_sync!(ncclProfiler_v1_t);
