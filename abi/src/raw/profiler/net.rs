//! What net plugins hand to the profiler callback (NCCL_ABI.md §1.3): the callback's
//! `type` values, the plugin-id encoding, and the v1 IB and socket descriptors.

use core::ffi::c_int;

use crate::raw::assert_layout;

/// `ncclProfilerNetEventStart`: start an event; NCCL writes the handle to `*eHandle`
/// (or leaves it untouched when NetPlugin events are not active).
pub const NET_EVENT_START: c_int = 0;
/// `ncclProfilerNetEventStop`: stop the event in `*eHandle`.
pub const NET_EVENT_STOP: c_int = 1;
/// `ncclProfilerNetEventUpdate`: record `extData` as a `NetPluginUpdate` state.
pub const NET_EVENT_UPDATE: c_int = 2;
/// `ncclProfilerNetEventUpdateAndStop`: update, then stop.
pub const NET_EVENT_UPDATE_AND_STOP: c_int = 3;

/// `NCCL_PROFILER_NET_VER_BITS`: the low bits of a plugin id hold the descriptor version.
pub const NCCL_PROFILER_NET_VER_BITS: u32 = 16;
/// `NCCL_PROFILER_NET_VER_MASK`.
pub const NCCL_PROFILER_NET_VER_MASK: u32 = !0u32 >> NCCL_PROFILER_NET_VER_BITS;
/// `NCCL_PROFILER_NET_TYPE_MASK`.
pub const NCCL_PROFILER_NET_TYPE_MASK: u32 = !0u32 << NCCL_PROFILER_NET_VER_BITS;
/// `NCCL_PROFILER_NET_TYPE_IB`: InfiniBand descriptors ([`ncclProfilerNetIbDescr_v1_t`]).
pub const NCCL_PROFILER_NET_TYPE_IB: u32 = 1 << NCCL_PROFILER_NET_VER_BITS;
/// `NCCL_PROFILER_NET_TYPE_SOCK`: socket descriptors ([`ncclProfilerNetSockDescr_v1_t`]).
pub const NCCL_PROFILER_NET_TYPE_SOCK: u32 = 2 << NCCL_PROFILER_NET_VER_BITS;
/// `NCCL_PROFILER_NET_IB_VER`.
pub const NCCL_PROFILER_NET_IB_VER: u32 = 1;
/// `NCCL_PROFILER_NET_SOCKET_VER`.
pub const NCCL_PROFILER_NET_SOCKET_VER: u32 = 1;
/// `ncclProfileQp`: the one IB event type (descriptor `type`).
pub const NCCL_PROFILE_QP: u8 = 1;
/// `ncclProfileSocket`: the one socket event type (descriptor `type`).
pub const NCCL_PROFILE_SOCKET: u8 = 1;

/// `qp` member of [`ncclProfilerNetIbDescr_v1_t`] (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerNetIbQpDescr_v1_t {
    /// Network device id.
    pub device: c_int,
    /// Work request id.
    pub wr_id: u64,
    /// `ibv_wr_opcode`.
    pub opcode: c_int,
    /// QP number.
    pub qpNum: c_int,
    /// Bytes of the work request.
    pub length: usize,
}
assert_layout!(
    ncclProfilerNetIbQpDescr_v1_t,
    size = 32,
    align = 8,
    device = 0,
    wr_id = 8,
    opcode = 16,
    qpNum = 20,
    length = 24
);

/// `ncclProfilerNetIbDescr_v1_t` (40 bytes): plugin id `NCCL_PROFILER_NET_TYPE_IB | 1`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerNetIbDescr_v1_t {
    /// Event type, [`NCCL_PROFILE_QP`].
    pub type_: u8,
    /// The C anonymous union's only member, `qp`.
    pub qp: ncclProfilerNetIbQpDescr_v1_t,
}
assert_layout!(
    ncclProfilerNetIbDescr_v1_t,
    size = 40,
    align = 8,
    type_ = 0,
    qp = 8
);

/// `sock` member of [`ncclProfilerNetSockDescr_v1_t`] (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerNetSockSockDescr_v1_t {
    /// Socket file descriptor.
    pub fd: c_int,
    /// Operation (NCCL's socket plugin: 0 = send, 1 = receive).
    pub op: c_int,
    /// Bytes of the operation.
    pub length: usize,
}
assert_layout!(
    ncclProfilerNetSockSockDescr_v1_t,
    size = 16,
    align = 8,
    fd = 0,
    op = 4,
    length = 8
);

/// `ncclProfilerNetSockDescr_v1_t` (24 bytes): plugin id `NCCL_PROFILER_NET_TYPE_SOCK | 1`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclProfilerNetSockDescr_v1_t {
    /// Event type, [`NCCL_PROFILE_SOCKET`].
    pub type_: u8,
    /// The C anonymous union's only member, `sock`.
    pub sock: ncclProfilerNetSockSockDescr_v1_t,
}
assert_layout!(
    ncclProfilerNetSockDescr_v1_t,
    size = 24,
    align = 8,
    type_ = 0,
    sock = 8
);
