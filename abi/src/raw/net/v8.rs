//! Net ABI v8 (NCCL 2.20–2.23): `size_t` regMr size, `regIsGlobal`. 19 slots, 152 bytes.

use core::ffi::{c_char, c_int};

use super::fns::*;
use crate::raw::{assert_layout, table_is_sync};

/// `ncclNetProperties_v8_t`, 64 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v8_t {
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
}
assert_layout!(
    ncclNetProperties_v8_t,
    size = 64,
    align = 8,
    name = 0,
    pciPath = 8,
    guid = 16,
    ptrSupport = 24,
    regIsGlobal = 28,
    speed = 32,
    port = 36,
    latency = 40,
    maxComms = 44,
    maxRecvs = 48,
    netDeviceType = 52,
    netDeviceVersion = 56
);

/// `ncclNet_v8_t`: the table exported as `ncclNetPlugin_v8`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNet_v8_t {
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
            props: *mut ncclNetProperties_v8_t,
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
    /// `isend` with an `int` size.
    pub isend: IsendV6,
    /// `irecv` with `int` sizes.
    pub irecv: IrecvV6,
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
}
assert_layout!(
    ncclNet_v8_t,
    size = 152,
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
    irecvConsumed = 144
);
table_is_sync!(ncclNet_v8_t);
