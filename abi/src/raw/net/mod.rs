//! `ncclNet` ABI: constants and the types shared by several versions (NCCL_ABI.md §2).
//!
//! One module per version (`v6` … `v12`) holds that version's properties struct and
//! function table. Types that several versions share under different C names are
//! defined once here and re-exported under each name.

use core::ffi::{c_int, c_void};

use super::assert_layout;
use super::common::c_enum;

pub mod fns;
pub mod v10;
pub mod v11;
pub mod v12;
pub mod v6;
pub mod v7;
pub mod v8;
pub mod v9;

/// `NCCL_NET_HANDLE_MAXSIZE`: bytes of the opaque listen handle (64 up to net v4).
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// `NCCL_NET_HANDLE_MAXSIZE_V4`.
pub const NCCL_NET_HANDLE_MAXSIZE_V4: usize = 64;
/// `NCCL_NET_MAX_REQUESTS`: in-flight requests per comm (8 for NCCL ≤ 2.18).
pub const NCCL_NET_MAX_REQUESTS: usize = 32;
/// `NCCL_NET_OPTIONAL_RECV_COMPLETION`: sentinel stored in `*request` before `irecv`.
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;
/// `NCCL_NET_MULTI_REQUEST`.
pub const NCCL_NET_MULTI_REQUEST: usize = 0x2;
/// `NCCL_MAX_NET_SIZE_BYTES`: the largest maxP2pBytes/maxCollBytes NCCL accepts (1 TiB).
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1_099_511_627_776;
/// `MAX_NET_SIZE`: maxP2pBytes the shims report for pre-v9 plugins (1 GiB).
pub const MAX_NET_SIZE: usize = 1_073_741_824;
/// `MAX_COLLNET_SIZE`: maxCollBytes the shims report for pre-v9 plugins (512 MiB).
pub const MAX_COLLNET_SIZE: usize = 536_870_912;
/// `NCCL_NET_MAX_PLUGINS`: net plugin slots per process.
pub const NCCL_NET_MAX_PLUGINS: usize = 16;
/// `NCCL_NET_MAX_DEVS_PER_NIC_V11`: `devs[]` length in VDeviceProps v9–v11.
pub const NCCL_NET_MAX_DEVS_PER_NIC_V11: usize = 4;
/// `NCCL_NET_MAX_DEVS_PER_NIC_V12`: `devs[]` length in VDeviceProps v12.
pub const NCCL_NET_MAX_DEVS_PER_NIC_V12: usize = 8;
/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`.
pub const NCCL_NET_TRAFFIC_CLASS_UNDEF: c_int = -1;
/// `NCCL_NET_ATTR_UNDEF` (v11+).
pub const NCCL_NET_ATTR_UNDEF: i32 = -1;
/// `NCCL_NET_ID_UNDEF`: railId/planeId "ignore me" (v12).
pub const NCCL_NET_ID_UNDEF: i16 = -1;
/// `NCCL_NET_DEVICE_INVALID_VERSION`.
pub const NCCL_NET_DEVICE_INVALID_VERSION: c_int = 0;
/// `NCCL_NET_MTU_SIZE`.
pub const NCCL_NET_MTU_SIZE: usize = 4096;
/// `NCCL_NET_DEVICE_UNPACK_VERSION`: the only UNPACK version NCCL 2.30 accepts.
pub const NCCL_NET_DEVICE_UNPACK_VERSION: c_int = 0x7;
/// `NCCL_STEPS`: slots per connection per protocol.
pub const NCCL_STEPS: usize = 8;

c_enum! {
    /// `ncclNetDeviceType` (NCCL_ABI.md §2.1).
    NetDeviceType {
        /// `NCCL_NET_DEVICE_HOST`
        HOST = 0 => "HOST" as NCCL_NET_DEVICE_HOST,
        /// `NCCL_NET_DEVICE_UNPACK`
        UNPACK = 1 => "UNPACK" as NCCL_NET_DEVICE_UNPACK,
        /// `NCCL_NET_DEVICE_GIN_PROXY`
        GIN_PROXY = 2 => "GIN_PROXY" as NCCL_NET_DEVICE_GIN_PROXY,
        /// `NCCL_NET_DEVICE_GIN_GDAKI`
        GIN_GDAKI = 3 => "GIN_GDAKI" as NCCL_NET_DEVICE_GIN_GDAKI,
        /// `NCCL_NET_DEVICE_GIN_GPI` (core only)
        GIN_GPI = 4 => "GIN_GPI" as NCCL_NET_DEVICE_GIN_GPI,
    }
}

/// `ncclNetDeviceHandle_v7_t` (identical in v8 … v12), 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetDeviceHandle_v7_t {
    /// Device offload type.
    pub netDeviceType: NetDeviceType,
    /// Version of the device offload.
    pub netDeviceVersion: c_int,
    /// Plugin-owned device-side handle.
    pub handle: *mut c_void,
    /// Size of `handle`.
    pub size: usize,
    /// Whether the proxy must keep progressing this connection.
    pub needsProxyProgress: c_int,
}
assert_layout!(
    ncclNetDeviceHandle_v7_t,
    size = 32,
    align = 8,
    netDeviceType = 0,
    netDeviceVersion = 4,
    handle = 8,
    size = 16,
    needsProxyProgress = 24
);

/// `ncclNetVDeviceProps_v9_t` (= v10 = v11): a fused NIC made of up to 4 devices.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ncclNetVDeviceProps_v9_t {
    /// Number of physical devices in `devs`.
    pub ndevs: c_int,
    /// Physical device indices.
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC_V11],
}
assert_layout!(
    ncclNetVDeviceProps_v9_t,
    size = 20,
    align = 4,
    ndevs = 0,
    devs = 4
);

/// `ncclNetVDeviceProps_v12_t`: a fused NIC made of up to 8 devices.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ncclNetVDeviceProps_v12_t {
    /// Number of physical devices in `devs`.
    pub ndevs: c_int,
    /// Physical device indices.
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC_V12],
}
assert_layout!(
    ncclNetVDeviceProps_v12_t,
    size = 36,
    align = 4,
    ndevs = 0,
    devs = 4
);

/// `ncclNetCommConfig_v10_t` (= v11 = v12): per-communicator QoS.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ncclNetCommConfig_v10_t {
    /// Plugin-specific traffic class; -1 (`NCCL_NET_TRAFFIC_CLASS_UNDEF`) when unset.
    pub trafficClass: c_int,
}
assert_layout!(
    ncclNetCommConfig_v10_t,
    size = 4,
    align = 4,
    trafficClass = 0
);

/// `ncclNetCommAttr_v11_t` (= v12), 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ncclNetCommAttr_v11_t {
    /// Upper bound on peers this side talks to concurrently.
    pub maxConcurrentPeers: i32,
    /// Lower bound on concurrent peers.
    pub minConcurrentPeers: i32,
    /// Upper bound on flows per peer.
    pub maxFlowsPerPeer: i32,
    /// Lower bound on flows per peer.
    pub minFlowsPerPeer: i32,
}
assert_layout!(
    ncclNetCommAttr_v11_t,
    size = 16,
    align = 4,
    maxConcurrentPeers = 0,
    minConcurrentPeers = 4,
    maxFlowsPerPeer = 8,
    minFlowsPerPeer = 12
);

/// `ncclNetAttr_v11_t` (= v12): hints passed to `setNetAttr`, 44 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ncclNetAttr_v11_t {
    /// Send-side hints.
    pub sendCommAttr: ncclNetCommAttr_v11_t,
    /// Receive-side hints.
    pub recvCommAttr: ncclNetCommAttr_v11_t,
    /// `1 << ncclFunc_t` bits of the operations; `u32::MAX` when unset.
    pub op: u32,
    /// `1 << algorithm` bits; `u32::MAX` when unset.
    pub algo: u32,
    /// `1 << protocol` bits; `u32::MAX` when unset.
    pub proto: u32,
}
assert_layout!(
    ncclNetAttr_v11_t,
    size = 44,
    align = 4,
    sendCommAttr = 0,
    recvCommAttr = 16,
    op = 32,
    algo = 36,
    proto = 40
);

impl Default for ncclNetAttr_v11_t {
    /// Every field -1, as NCCL initialises it.
    fn default() -> Self {
        let undef = ncclNetCommAttr_v11_t {
            maxConcurrentPeers: -1,
            minConcurrentPeers: -1,
            maxFlowsPerPeer: -1,
            minFlowsPerPeer: -1,
        };
        Self {
            sendCommAttr: undef,
            recvCommAttr: undef,
            op: u32::MAX,
            algo: u32::MAX,
            proto: u32::MAX,
        }
    }
}

/// `ncclNetSGE_v8_t`: CollNet scatter-gather entry with a 32-bit size, 24 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetSGE_v8_t {
    /// Registration of `address`.
    pub mhandle: *mut c_void,
    /// Start of the part.
    pub address: *mut c_void,
    /// Bytes in the part.
    pub size: u32,
}
assert_layout!(
    ncclNetSGE_v8_t,
    size = 24,
    align = 8,
    mhandle = 0,
    address = 8,
    size = 16
);

/// `ncclNetSGE_v9_t` (= v10 … v12): CollNet scatter-gather entry, 24 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetSGE_v9_t {
    /// Registration of `address`.
    pub mhandle: *mut c_void,
    /// Start of the part.
    pub address: *mut c_void,
    /// Bytes in the part.
    pub size: usize,
}
assert_layout!(
    ncclNetSGE_v9_t,
    size = 24,
    align = 8,
    mhandle = 0,
    address = 8,
    size = 16
);

/// Every net ABI version NCCL 2.30 loads, newest first (its `dlsym` order).
pub const VERSIONS: [u32; 7] = [12, 11, 10, 9, 8, 7, 6];

/// Exported symbol name of a net table version, NUL-terminated (`ncclNetPlugin_v12\0`).
pub const fn symbol(version: u32) -> Option<&'static str> {
    match version {
        12 => Some("ncclNetPlugin_v12\0"),
        11 => Some("ncclNetPlugin_v11\0"),
        10 => Some("ncclNetPlugin_v10\0"),
        9 => Some("ncclNetPlugin_v9\0"),
        8 => Some("ncclNetPlugin_v8\0"),
        7 => Some("ncclNetPlugin_v7\0"),
        6 => Some("ncclNetPlugin_v6\0"),
        5 => Some("ncclNetPlugin_v5\0"),
        4 => Some("ncclNetPlugin_v4\0"),
        3 => Some("ncclNetPlugin_v3\0"),
        2 => Some("ncclNetPlugin_v2\0"),
        _ => None,
    }
}

/// Size in bytes of `ncclNetProperties_vN_t`, or `None` for a version without one here.
pub const fn properties_size(version: u32) -> Option<usize> {
    match version {
        12 => Some(core::mem::size_of::<v12::ncclNetProperties_v12_t>()),
        11 => Some(core::mem::size_of::<v11::ncclNetProperties_v11_t>()),
        9 | 10 => Some(core::mem::size_of::<v9::ncclNetProperties_v9_t>()),
        8 => Some(core::mem::size_of::<v8::ncclNetProperties_v8_t>()),
        7 => Some(core::mem::size_of::<v7::ncclNetProperties_v7_t>()),
        5 | 6 => Some(core::mem::size_of::<v6::ncclNetProperties_v6_t>()),
        _ => None,
    }
}
