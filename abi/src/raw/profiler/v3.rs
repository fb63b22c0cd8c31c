//! Profiler ABI v3 (NCCL 2.26): KernelCh and NetPlugin events; net plugins report through
//! the callback given to net `init` (v10+). Descriptor 120 bytes.

use core::ffi::{c_char, c_int, c_void};

use super::*;
use crate::raw::common::NcclResult;
use crate::raw::{assert_layout, table_is_sync};

/// `coll` member of the v3 descriptor (96 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerCollDescr_v3_t {
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
    ncclProfilerCollDescr_v3_t,
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
    datatype = 64,
    nMaxChannels = 72,
    nWarps = 73,
    algo = 80,
    proto = 88
);

/// `p2p` member of the v3 descriptor: the v2 layout.
pub type ncclProfilerP2pDescr_v3_t = super::v2::ncclProfilerP2pDescr_v2_t;

/// The v3 descriptor's union (96 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclProfilerEventDescrUnion_v3_t {
    /// `ncclProfileColl`.
    pub coll: ncclProfilerCollDescr_v3_t,
    /// `ncclProfileP2p`.
    pub p2p: ncclProfilerP2pDescr_v3_t,
    /// `ncclProfileProxyOp`.
    pub proxyOp: ncclProfilerProxyOpDescr_v1_t,
    /// `ncclProfileProxyStep`.
    pub proxyStep: ncclProfilerProxyStepDescr_v1_t,
    /// `ncclProfileKernelCh`.
    pub kernelCh: ncclProfilerKernelChDescr_v3_t,
    /// `ncclProfileNetPlugin`.
    pub netPlugin: ncclProfilerNetPluginDescr_v3_t,
}
assert_layout!(ncclProfilerEventDescrUnion_v3_t, size = 96, align = 8);

/// `ncclProfilerEventDescr_v3_t` (120 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclProfilerEventDescr_v3_t {
    /// One `ncclProfile*` bit (a byte before v5).
    pub type_: u8,
    /// The parent's event handle (NULL for roots or when the parent was declined).
    pub parentObj: *mut c_void,
    /// Originating rank.
    pub rank: c_int,
    /// The member selected by `type_`.
    pub u: ncclProfilerEventDescrUnion_v3_t,
}
assert_layout!(
    ncclProfilerEventDescr_v3_t,
    size = 120,
    align = 8,
    type_ = 0,
    parentObj = 8,
    rank = 16,
    u = 24
);

/// `ncclProfiler_v3_t`: the table exported as `ncclProfiler_v3` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfiler_v3_t {
    /// Profiler name (data, not a function).
    pub name: *const c_char,
    /// `init(context, eActivationMask)`.
    pub init: ProfilerInitV1,
    /// `startEvent(context, eHandle, eDescr)`; `*eHandle = NULL` declines the event.
    pub startEvent: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            eHandle: *mut *mut c_void,
            eDescr: *mut ncclProfilerEventDescr_v3_t,
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
    ncclProfiler_v3_t,
    size = 48,
    align = 8,
    name = 0,
    init = 8,
    startEvent = 16,
    stopEvent = 24,
    recordEventState = 32,
    finalize = 40
);
table_is_sync!(ncclProfiler_v3_t);
