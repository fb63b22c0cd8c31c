//! Net ABI v9 (NCCL 2.24–2.25): `size_t` isend/irecv sizes, NIC fusion, max*Bytes. 20 slots, 160 bytes.

use core::ffi::{c_char, c_int};

use super::fns::*;
use crate::raw::{assert_layout, table_is_sync};

/// `ncclNetProperties_v9_t`, 104 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v9_t {
    /// Device name for logs; plugin-owned, valid while the library is loaded.
    pub name: *mut c_char,
    /// `/sys` PCI device path (realpath), or NULL for a virtual NIC.
    pub pciPath: *mut c_char,
    /// Same guid ⇒ same physical port.
    pub guid: u64,
    /// `NCCL_PTR_*` bitmask of the memory types `regMr` accepts.
    pub ptrSupport: c_int,
    /// Registrations are not tied to one comm (fast re-registration).
    pub regIsGlobal: c_int,
    /// NCCL must flush after every GPU receive.
    pub forceFlush: c_int,
    /// Link speed in Mbps (100000 = 100 Gb/s).
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// Latency in µs; 0 = NCCL default.
    pub latency: f32,
    /// Maximum number of comms.
    pub maxComms: c_int,
    /// Maximum `n` in a grouped `irecv`.
    pub maxRecvs: c_int,
    /// Device offload type (HOST or UNPACK).
    pub netDeviceType: super::NetDeviceType,
    /// Version of the device offload.
    pub netDeviceVersion: c_int,
    /// Physical devices fused into this one.
    pub vProps: super::ncclNetVDeviceProps_v9_t,
    /// NCCL cuts point-to-point transfers to this size.
    pub maxP2pBytes: usize,
    /// NCCL cuts collective transfers to this size.
    pub maxCollBytes: usize,
}
assert_layout!(
    ncclNetProperties_v9_t,
    size = 104,
    align = 8,
    name = 0,
    pciPath = 8,
    guid = 16,
    ptrSupport = 24,
    regIsGlobal = 28,
    forceFlush = 32,
    speed = 36,
    port = 40,
    latency = 44,
    maxComms = 48,
    maxRecvs = 52,
    netDeviceType = 56,
    netDeviceVersion = 60,
    vProps = 64,
    maxP2pBytes = 88,
    maxCollBytes = 96
);

/// `ncclNetVDeviceProps_v9_t` under its v9 name.
pub type ncclNetVDeviceProps_t = super::ncclNetVDeviceProps_v9_t;

/// `ncclNet_v9_t`: the table exported as `ncclNetPlugin_v9`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNet_v9_t {
    /// Plugin name (data, not a function); compared case-insensitively with `NCCL_NET`.
    pub name: *const c_char,
    /// `init(logFunction)`.
    pub init: InitV6,
    /// `devices(ndev)`.
    pub devices: Devices,
    /// `getProperties(dev, props)`.
    pub getProperties: Option<
        unsafe extern "C" fn(
            dev: c_int,
            props: *mut ncclNetProperties_v9_t,
        ) -> crate::raw::common::NcclResult,
    >,
    /// `listen(dev, handle, listenComm)`.
    pub listen: ListenV6,
    /// `connect(dev, handle, sendComm, sendDevComm)`, non-blocking.
    pub connect: ConnectV7,
    /// `accept(listenComm, recvComm, recvDevComm)`, non-blocking.
    pub accept: AcceptV7,
    /// `regMr` with a `size_t` size.
    pub regMr: RegMrV8,
    /// `regMrDmaBuf(comm, data, size, type, offset, fd, mhandle)`.
    pub regMrDmaBuf: RegMrDmaBuf,
    /// `deregMr(comm, mhandle)`.
    pub deregMr: DeregMr,
    /// `isend` with a `size_t` size.
    pub isend: IsendV9,
    /// `irecv` with `size_t` sizes.
    pub irecv: IrecvV9,
    /// `iflush(recvComm, n, data, sizes, mhandles, request)`.
    pub iflush: Iflush,
    /// `test(request, done, sizes)`.
    pub test: Test,
    /// `closeSend(sendComm)`.
    pub closeSend: Close,
    /// `closeRecv(recvComm)`.
    pub closeRecv: Close,
    /// `closeListen(listenComm)`.
    pub closeListen: Close,
    /// `getDeviceMr(comm, mhandle, dptr_mhandle)` (optional).
    pub getDeviceMr: GetDeviceMr,
    /// `irecvConsumed(recvComm, n, request)` (optional).
    pub irecvConsumed: IrecvConsumed,
    /// `makeVDevice(d, props)` (optional): fuse devices into a virtual NIC.
    pub makeVDevice: Option<
        unsafe extern "C" fn(
            d: *mut c_int,
            props: *mut super::ncclNetVDeviceProps_v9_t,
        ) -> crate::raw::common::NcclResult,
    >,
}
assert_layout!(
    ncclNet_v9_t,
    size = 160,
    align = 8,
    name = 0,
    init = 8,
    devices = 16,
    getProperties = 24,
    listen = 32,
    connect = 40,
    accept = 48,
    regMr = 56,
    regMrDmaBuf = 64,
    deregMr = 72,
    isend = 80,
    irecv = 88,
    iflush = 96,
    test = 104,
    closeSend = 112,
    closeRecv = 120,
    closeListen = 128,
    getDeviceMr = 136,
    irecvConsumed = 144,
    makeVDevice = 152
);
table_is_sync!(ncclNet_v9_t);
