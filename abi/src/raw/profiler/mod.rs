//! Profiler ABI v1–v7 (`ncclProfiler_v1` … `_v7`, NCCL 2.23–2.31; NCCL_ABI.md §1.3, §3.4).
//!
//! A profiler table has the same six slots in every version (48 bytes); what changes is
//! `init`'s arguments (v4: communicator info, v5: `commId` first) and the event
//! descriptor handed to `startEvent`, whose anonymous union NCCL extends version by
//! version. Each version's module mirrors that descriptor with named sub-structs (C
//! has anonymous ones; the bytes are the same) and asserts every offset.
//!
//! Two deliberate departures from the C spelling, both layout-neutral:
//! * the anonymous union is the field `u` (C: `eDescr->coll`, here `eDescr.u.coll`);
//! * C `bool` fields are `u8`, because a foreign byte other than 0/1 in a Rust `bool`
//!   is undefined behaviour; read them as `!= 0`.

#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::{c_int, c_void};

use crate::raw::assert_layout;
use crate::raw::common::c_enum;

mod net;
pub mod v1;
pub mod v2;
pub mod v3;
pub mod v4;
pub mod v5;
pub mod v6;
pub mod v7;

pub use net::*;

/// Event-type bits: the descriptor's `type` holds exactly one; `init`'s activation
/// mask is their union (`ncclProfileGroup` …, an anonymous C enum). The C header
/// spells them with NCCL's names ([`event::C_NAMES`]).
///
/// cbindgen:ignore
pub mod event {
    /// `ncclProfileGroup`: a group of operations (NCCL's `ncclGroupStart/End` or an
    /// implicit group around one call).
    pub const GROUP: u64 = 1 << 0;
    /// `ncclProfileColl`: one collective as NCCL schedules it.
    pub const COLL: u64 = 1 << 1;
    /// `ncclProfileP2p`: one send or receive.
    pub const P2P: u64 = 1 << 2;
    /// `ncclProfileProxyOp`: the proxy's work for one channel and peer.
    pub const PROXY_OP: u64 = 1 << 3;
    /// `ncclProfileProxyStep`: one step (chunk) of a proxy operation.
    pub const PROXY_STEP: u64 = 1 << 4;
    /// `ncclProfileProxyCtrl`: the proxy thread's own activity (idle, sleep, append).
    pub const PROXY_CTRL: u64 = 1 << 5;
    /// `ncclProfileKernelCh` (v3+): one kernel channel.
    pub const KERNEL_CH: u64 = 1 << 6;
    /// `ncclProfileNetPlugin` (v3+): an event defined by the net plugin.
    pub const NET_PLUGIN: u64 = 1 << 7;
    /// `ncclProfileGroupApi` (v5+): the user's `ncclGroupStart` … `ncclGroupEnd`.
    pub const GROUP_API: u64 = 1 << 8;
    /// `ncclProfileCollApi` (v5+): the user's collective call.
    pub const COLL_API: u64 = 1 << 9;
    /// `ncclProfileP2pApi` (v5+): the user's send/recv call.
    pub const P2P_API: u64 = 1 << 10;
    /// `ncclProfileKernelLaunch` (v5+): a kernel launch on a stream.
    pub const KERNEL_LAUNCH: u64 = 1 << 11;
    /// `ncclProfileCeColl` (v6+): a copy-engine collective.
    pub const CE_COLL: u64 = 1 << 12;
    /// `ncclProfileCeSync` (v6+): a copy-engine synchronisation.
    pub const CE_SYNC: u64 = 1 << 13;
    /// `ncclProfileCeBatch` (v6+): a copy-engine batch.
    pub const CE_BATCH: u64 = 1 << 14;
    /// `ncclProfileKernelPhase` (v7+): a phase of a symmetric kernel.
    pub const KERNEL_PHASE: u64 = 1 << 15;

    /// NCCL's C names of the bits, for the generated header.
    pub const C_NAMES: &[(&str, u64)] = &[
        ("ncclProfileGroup", GROUP),
        ("ncclProfileColl", COLL),
        ("ncclProfileP2p", P2P),
        ("ncclProfileProxyOp", PROXY_OP),
        ("ncclProfileProxyStep", PROXY_STEP),
        ("ncclProfileProxyCtrl", PROXY_CTRL),
        ("ncclProfileKernelCh", KERNEL_CH),
        ("ncclProfileNetPlugin", NET_PLUGIN),
        ("ncclProfileGroupApi", GROUP_API),
        ("ncclProfileCollApi", COLL_API),
        ("ncclProfileP2pApi", P2P_API),
        ("ncclProfileKernelLaunch", KERNEL_LAUNCH),
        ("ncclProfileCeColl", CE_COLL),
        ("ncclProfileCeSync", CE_SYNC),
        ("ncclProfileCeBatch", CE_BATCH),
        ("ncclProfileKernelPhase", KERNEL_PHASE),
    ];

    /// Every bit a host of ABI `version` can emit (v1/v2: 0–5, v3/v4: 0–7, v5: 0–11,
    /// v6: 0–14, v7: 0–15).
    pub const fn known(version: u32) -> u64 {
        match version {
            0 => 0,
            1 | 2 => (1 << 6) - 1,
            3 | 4 => (1 << 8) - 1,
            5 => (1 << 12) - 1,
            6 => (1 << 15) - 1,
            _ => (1 << 16) - 1,
        }
    }

    /// NCCL's name for one event-type bit (`"Coll"`, `"ProxyStep"`, …).
    pub const fn name(bit: u64) -> Option<&'static str> {
        Some(match bit {
            GROUP => "Group",
            COLL => "Coll",
            P2P => "P2p",
            PROXY_OP => "ProxyOp",
            PROXY_STEP => "ProxyStep",
            PROXY_CTRL => "ProxyCtrl",
            KERNEL_CH => "KernelCh",
            NET_PLUGIN => "NetPlugin",
            GROUP_API => "GroupApi",
            COLL_API => "CollApi",
            P2P_API => "P2pApi",
            KERNEL_LAUNCH => "KernelLaunch",
            CE_COLL => "CeColl",
            CE_SYNC => "CeSync",
            CE_BATCH => "CeBatch",
            KERNEL_PHASE => "KernelPhase",
            _ => return None,
        })
    }
}

c_enum! {
    /// `ncclProfilerEventState_t` (one enum for every version; v4 retired the
    /// ProxyOp states 0–7 in favour of ProxyStep states).
    ProfilerEventState {
        /// `ncclProfilerProxyOpSendPosted` (v1–v3)
        PROXY_OP_SEND_POSTED = 0 => "ProxyOpSendPosted" as ncclProfilerProxyOpSendPosted,
        /// `ncclProfilerProxyOpSendRemFifoWait` (v1–v3)
        PROXY_OP_SEND_REM_FIFO_WAIT = 1 => "ProxyOpSendRemFifoWait" as ncclProfilerProxyOpSendRemFifoWait,
        /// `ncclProfilerProxyOpSendTransmitted` (v1–v3)
        PROXY_OP_SEND_TRANSMITTED = 2 => "ProxyOpSendTransmitted" as ncclProfilerProxyOpSendTransmitted,
        /// `ncclProfilerProxyOpSendDone` (v1–v3)
        PROXY_OP_SEND_DONE = 3 => "ProxyOpSendDone" as ncclProfilerProxyOpSendDone,
        /// `ncclProfilerProxyOpRecvPosted` (v1–v3)
        PROXY_OP_RECV_POSTED = 4 => "ProxyOpRecvPosted" as ncclProfilerProxyOpRecvPosted,
        /// `ncclProfilerProxyOpRecvReceived` (v1–v3)
        PROXY_OP_RECV_RECEIVED = 5 => "ProxyOpRecvReceived" as ncclProfilerProxyOpRecvReceived,
        /// `ncclProfilerProxyOpRecvTransmitted` (v1–v3)
        PROXY_OP_RECV_TRANSMITTED = 6 => "ProxyOpRecvTransmitted" as ncclProfilerProxyOpRecvTransmitted,
        /// `ncclProfilerProxyOpRecvDone` (v1–v3)
        PROXY_OP_RECV_DONE = 7 => "ProxyOpRecvDone" as ncclProfilerProxyOpRecvDone,
        /// `ncclProfilerProxyStepSendGPUWait`
        PROXY_STEP_SEND_GPU_WAIT = 8 => "ProxyStepSendGPUWait" as ncclProfilerProxyStepSendGPUWait,
        /// `ncclProfilerProxyStepSendWait`
        PROXY_STEP_SEND_WAIT = 9 => "ProxyStepSendWait" as ncclProfilerProxyStepSendWait,
        /// `ncclProfilerProxyStepRecvWait`
        PROXY_STEP_RECV_WAIT = 10 => "ProxyStepRecvWait" as ncclProfilerProxyStepRecvWait,
        /// `ncclProfilerProxyStepRecvFlushWait`
        PROXY_STEP_RECV_FLUSH_WAIT = 11 => "ProxyStepRecvFlushWait" as ncclProfilerProxyStepRecvFlushWait,
        /// `ncclProfilerProxyStepRecvGPUWait`
        PROXY_STEP_RECV_GPU_WAIT = 12 => "ProxyStepRecvGPUWait" as ncclProfilerProxyStepRecvGPUWait,
        /// `ncclProfilerProxyCtrlIdle`
        PROXY_CTRL_IDLE = 13 => "ProxyCtrlIdle" as ncclProfilerProxyCtrlIdle,
        /// `ncclProfilerProxyCtrlActive`
        PROXY_CTRL_ACTIVE = 14 => "ProxyCtrlActive" as ncclProfilerProxyCtrlActive,
        /// `ncclProfilerProxyCtrlSleep`
        PROXY_CTRL_SLEEP = 15 => "ProxyCtrlSleep" as ncclProfilerProxyCtrlSleep,
        /// `ncclProfilerProxyCtrlWakeup`
        PROXY_CTRL_WAKEUP = 16 => "ProxyCtrlWakeup" as ncclProfilerProxyCtrlWakeup,
        /// `ncclProfilerProxyCtrlAppend`
        PROXY_CTRL_APPEND = 17 => "ProxyCtrlAppend" as ncclProfilerProxyCtrlAppend,
        /// `ncclProfilerProxyCtrlAppendEnd` (args: `proxyCtrl.appendedProxyOps`)
        PROXY_CTRL_APPEND_END = 18 => "ProxyCtrlAppendEnd" as ncclProfilerProxyCtrlAppendEnd,
        /// `ncclProfilerProxyOpInProgress_v4`
        PROXY_OP_IN_PROGRESS = 19 => "ProxyOpInProgress" as ncclProfilerProxyOpInProgress_v4,
        /// `ncclProfilerProxyStepSendPeerWait_v4`
        PROXY_STEP_SEND_PEER_WAIT = 20 => "ProxyStepSendPeerWait" as ncclProfilerProxyStepSendPeerWait_v4,
        /// `ncclProfilerNetPluginUpdate` (args: `netPlugin.data`)
        NET_PLUGIN_UPDATE = 21 => "NetPluginUpdate" as ncclProfilerNetPluginUpdate,
        /// `ncclProfilerKernelChStop` (args: `kernelCh.pTimer`)
        KERNEL_CH_STOP = 22 => "KernelChStop" as ncclProfilerKernelChStop,
        /// `ncclProfilerGroupStartApiStop`
        GROUP_START_API_STOP = 23 => "GroupStartApiStop" as ncclProfilerGroupStartApiStop,
        /// `ncclProfilerGroupEndApiStart`
        GROUP_END_API_START = 24 => "GroupEndApiStart" as ncclProfilerGroupEndApiStart,
        /// `ncclProfilerCeCollStart`
        CE_COLL_START = 25 => "CeCollStart" as ncclProfilerCeCollStart,
        /// `ncclProfilerCeCollComplete`
        CE_COLL_COMPLETE = 26 => "CeCollComplete" as ncclProfilerCeCollComplete,
        /// `ncclProfilerCeSyncStart`
        CE_SYNC_START = 27 => "CeSyncStart" as ncclProfilerCeSyncStart,
        /// `ncclProfilerCeSyncComplete`
        CE_SYNC_COMPLETE = 28 => "CeSyncComplete" as ncclProfilerCeSyncComplete,
        /// `ncclProfilerCeBatchStart`
        CE_BATCH_START = 29 => "CeBatchStart" as ncclProfilerCeBatchStart,
        /// `ncclProfilerCeBatchComplete`
        CE_BATCH_COMPLETE = 30 => "CeBatchComplete" as ncclProfilerCeBatchComplete,
        /// `ncclProfilerKernelPhaseStop` (v7; args: `kernelCh.pTimer`)
        KERNEL_PHASE_STOP = 31 => "KernelPhaseStop" as ncclProfilerKernelPhaseStop,
    }
}

/// C name `ncclProfilerEventState_t`.
pub type ncclProfilerEventState_t = ProfilerEventState;

/// `ncclPid_t` on Linux (`pid_t`).
pub type ncclPid_t = c_int;

/// `proxyOp` member of every descriptor version (24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerProxyOpDescr_v1_t {
    /// Pid of the process that posted the operation.
    pub pid: ncclPid_t,
    /// Channel of this proxy operation.
    pub channelId: u8,
    /// Remote rank.
    pub peer: c_int,
    /// Steps in the operation.
    pub nSteps: c_int,
    /// Bytes per step.
    pub chunkSize: c_int,
    /// Non-zero for a send.
    pub isSend: c_int,
}
assert_layout!(
    ncclProfilerProxyOpDescr_v1_t,
    size = 24,
    align = 4,
    pid = 0,
    channelId = 4,
    peer = 8,
    nSteps = 12,
    chunkSize = 16,
    isSend = 20
);

/// `proxyStep` member of every descriptor version (4 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerProxyStepDescr_v1_t {
    /// Step number within the proxy operation.
    pub step: c_int,
}
assert_layout!(
    ncclProfilerProxyStepDescr_v1_t,
    size = 4,
    align = 4,
    step = 0
);

/// `kernelCh` member in v3 (1 byte).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerKernelChDescr_v3_t {
    /// Channel id.
    pub channelId: u8,
}
assert_layout!(
    ncclProfilerKernelChDescr_v3_t,
    size = 1,
    align = 1,
    channelId = 0
);

/// `kernelCh` member from v4 (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerKernelChDescr_v4_t {
    /// Channel id.
    pub channelId: u8,
    /// Start timestamp from the GPU global timer (ns).
    pub pTimer: u64,
}
assert_layout!(
    ncclProfilerKernelChDescr_v4_t,
    size = 16,
    align = 8,
    channelId = 0,
    pTimer = 8
);

/// `netPlugin` member from v3 (16 bytes): what a net plugin passed to the callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerNetPluginDescr_v3_t {
    /// Plugin id: net type in the high 16 bits, descriptor version in the low 16.
    pub id: i64,
    /// The net plugin's own descriptor (e.g. [`ncclProfilerNetSockDescr_v1_t`]).
    pub data: *mut c_void,
}
assert_layout!(
    ncclProfilerNetPluginDescr_v3_t,
    size = 16,
    align = 8,
    id = 0,
    data = 8
);

/// `proxyOp` member of the v1–v3 state arguments.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerProxyOpStateArgs_v1_t {
    /// Bytes transferred so far.
    pub transSize: usize,
    /// Steps completed so far.
    pub steps: c_int,
}
assert_layout!(
    ncclProfilerProxyOpStateArgs_v1_t,
    size = 16,
    align = 8,
    transSize = 0,
    steps = 8
);

/// `proxyCtrl` member of the state arguments (every version).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerProxyCtrlStateArgs_v1_t {
    /// Proxy operations appended by this `ProxyCtrlAppendEnd`.
    pub appendedProxyOps: c_int,
}
assert_layout!(
    ncclProfilerProxyCtrlStateArgs_v1_t,
    size = 4,
    align = 4,
    appendedProxyOps = 0
);

/// `proxyStep` member of the v4+ state arguments.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerProxyStepStateArgs_v4_t {
    /// Bytes of the step.
    pub transSize: usize,
}
assert_layout!(
    ncclProfilerProxyStepStateArgs_v4_t,
    size = 8,
    align = 8,
    transSize = 0
);

/// `netPlugin` member of the v4+ state arguments.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclProfilerNetPluginStateArgs_v4_t {
    /// The net plugin's updated descriptor.
    pub data: *mut c_void,
}
assert_layout!(
    ncclProfilerNetPluginStateArgs_v4_t,
    size = 8,
    align = 8,
    data = 0
);

/// `kernelCh` member of the v4+ state arguments.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerKernelChStateArgs_v4_t {
    /// Stop timestamp from the GPU global timer (ns).
    pub pTimer: u64,
}
assert_layout!(
    ncclProfilerKernelChStateArgs_v4_t,
    size = 8,
    align = 8,
    pTimer = 0
);

/// `ncclProfilerEventStateArgs_v1_t` (= v2 = v3), 16 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclProfilerEventStateArgs_v1_t {
    /// For ProxyOp states.
    pub proxyOp: ncclProfilerProxyOpStateArgs_v1_t,
    /// For `ProxyCtrlAppendEnd`.
    pub proxyCtrl: ncclProfilerProxyCtrlStateArgs_v1_t,
}
assert_layout!(
    ncclProfilerEventStateArgs_v1_t,
    size = 16,
    align = 8,
    proxyOp = 0,
    proxyCtrl = 0
);

/// `ncclProfilerEventStateArgs_v4_t` (= v5 = v6 = v7), 8 bytes: every member is one
/// 8-byte (or smaller) scalar at offset 0.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclProfilerEventStateArgs_v4_t {
    /// For ProxyStep states.
    pub proxyStep: ncclProfilerProxyStepStateArgs_v4_t,
    /// For `ProxyCtrlAppendEnd`.
    pub proxyCtrl: ncclProfilerProxyCtrlStateArgs_v1_t,
    /// For `NetPluginUpdate`.
    pub netPlugin: ncclProfilerNetPluginStateArgs_v4_t,
    /// For `KernelChStop` (and v7 `KernelPhaseStop`).
    pub kernelCh: ncclProfilerKernelChStateArgs_v4_t,
}
assert_layout!(
    ncclProfilerEventStateArgs_v4_t,
    size = 8,
    align = 8,
    proxyStep = 0,
    proxyCtrl = 0,
    netPlugin = 0,
    kernelCh = 0
);

/// `ncclProfilerEventStateArgs_v2_t`.
pub type ncclProfilerEventStateArgs_v2_t = ncclProfilerEventStateArgs_v1_t;
/// `ncclProfilerEventStateArgs_v3_t`.
pub type ncclProfilerEventStateArgs_v3_t = ncclProfilerEventStateArgs_v1_t;
/// `ncclProfilerEventStateArgs_v5_t`.
pub type ncclProfilerEventStateArgs_v5_t = ncclProfilerEventStateArgs_v4_t;
/// `ncclProfilerEventStateArgs_v6_t`.
pub type ncclProfilerEventStateArgs_v6_t = ncclProfilerEventStateArgs_v4_t;
/// `ncclProfilerEventStateArgs_v7_t`.
pub type ncclProfilerEventStateArgs_v7_t = ncclProfilerEventStateArgs_v4_t;

/// `stopEvent(eHandle)`, the same in every version.
pub type ProfilerStopEvent =
    Option<unsafe extern "C" fn(eHandle: *mut c_void) -> crate::raw::common::NcclResult>;
/// `finalize(context)`, the same in every version.
pub type ProfilerFinalize =
    Option<unsafe extern "C" fn(context: *mut c_void) -> crate::raw::common::NcclResult>;
/// v1–v3 `init(context, eActivationMask)`.
pub type ProfilerInitV1 = Option<
    unsafe extern "C" fn(
        context: *mut *mut c_void,
        eActivationMask: *mut c_int,
    ) -> crate::raw::common::NcclResult,
>;
/// v5–v7 `init(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn)`.
pub type ProfilerInitV5 = Option<
    unsafe extern "C" fn(
        context: *mut *mut c_void,
        commId: u64,
        eActivationMask: *mut c_int,
        commName: *const core::ffi::c_char,
        nNodes: c_int,
        nranks: c_int,
        rank: c_int,
        logfn: crate::raw::common::ncclDebugLogger_t,
    ) -> crate::raw::common::NcclResult,
>;
/// v1–v3 `recordEventState(eHandle, eState, eStateArgs)`.
pub type ProfilerRecordV1 = Option<
    unsafe extern "C" fn(
        eHandle: *mut c_void,
        eState: ProfilerEventState,
        eStateArgs: *mut ncclProfilerEventStateArgs_v1_t,
    ) -> crate::raw::common::NcclResult,
>;
/// v4–v7 `recordEventState(eHandle, eState, eStateArgs)`.
pub type ProfilerRecordV4 = Option<
    unsafe extern "C" fn(
        eHandle: *mut c_void,
        eState: ProfilerEventState,
        eStateArgs: *mut ncclProfilerEventStateArgs_v4_t,
    ) -> crate::raw::common::NcclResult,
>;
