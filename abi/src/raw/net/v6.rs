//! Net ABI v6 (NCCL 2.13–2.18; still loaded by 2.30). 17 slots, 136 bytes.

use core::ffi::{c_char, c_int};

use super::fns::*;
use crate::raw::common::NcclResult;
use crate::raw::{assert_layout, table_is_sync};

/// `ncclNetProperties_v6_t` (= v5), 48 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v6_t {
    /// Device name for logs; plugin-owned.
    pub name: *mut c_char,
    /// `/sys` PCI path of the device, or NULL.
    pub pciPath: *mut c_char,
    /// Same guid ⇒ same physical port.
    pub guid: u64,
    /// `NCCL_PTR_*` bitmask.
    pub ptrSupport: c_int,
    /// Link speed in Mbps.
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// Latency in µs (0 = NCCL default).
    pub latency: f32,
    /// Maximum number of comms.
    pub maxComms: c_int,
    /// Maximum `n` in a grouped `irecv`.
    pub maxRecvs: c_int,
}
assert_layout!(
    ncclNetProperties_v6_t,
    size = 48,
    align = 8,
    name = 0,
    pciPath = 8,
    guid = 16,
    ptrSupport = 24,
    speed = 28,
    port = 32,
    latency = 36,
    maxComms = 40,
    maxRecvs = 44
);

/// `ncclNet_v6_t`: the table exported as `ncclNetPlugin_v6`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNet_v6_t {
    /// Plugin name (data, not a function); compared case-insensitively with `NCCL_NET`.
    pub name: *const c_char,
    /// `init(logFunction)`.
    pub init: InitV6,
    /// `devices(ndev)`.
    pub devices: Devices,
    /// `getProperties(dev, props)`.
    pub getProperties:
        Option<unsafe extern "C" fn(dev: c_int, props: *mut ncclNetProperties_v6_t) -> NcclResult>,
    /// `listen(dev, handle, listenComm)`.
    pub listen: ListenV6,
    /// `connect(dev, handle, sendComm)`, non-blocking.
    pub connect: ConnectV6,
    /// `accept(listenComm, recvComm)`, non-blocking.
    pub accept: AcceptV6,
    /// `regMr` with an `int` size.
    pub regMr: RegMrV6,
    /// `regMrDmaBuf(comm, data, size, type, offset, fd, mhandle)` (new in v6).
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
}
assert_layout!(
    ncclNet_v6_t,
    size = 136,
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
    closeListen = 128
);
table_is_sync!(ncclNet_v6_t);
