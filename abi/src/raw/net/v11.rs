//! Net ABI v11 (NCCL 2.28–2.29): per-communicator `init`/`finalize`, `setNetAttr`. 22 slots, 176 bytes.

use core::ffi::{c_char, c_int};

use super::fns::*;
use crate::raw::{assert_layout, table_is_sync};

/// `ncclNetProperties_v11_t`, 112 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v11_t {
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
    /// Multi-request size; 1 = no multi-request.
    pub maxMultiRequestSize: c_int,
}
assert_layout!(
    ncclNetProperties_v11_t,
    size = 112,
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
    maxCollBytes = 96,
    maxMultiRequestSize = 104
);

/// `ncclNet_v11_t`: the table exported as `ncclNetPlugin_v11`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNet_v11_t {
    /// Plugin name (data, not a function); compared case-insensitively with `NCCL_NET`.
    pub name: *const c_char,
    /// `init(ctx, commId, config, logFunction, profFunction)`, once per communicator.
    pub init: InitV11,
    /// `devices(ndev)`.
    pub devices: Devices,
    /// `getProperties(dev, props)`.
    pub getProperties: Option<
        unsafe extern "C" fn(
            dev: c_int,
            props: *mut ncclNetProperties_v11_t,
        ) -> crate::raw::common::NcclResult,
    >,
    /// `listen(ctx, dev, handle, listenComm)`.
    pub listen: ListenV11,
    /// `connect(ctx, dev, handle, sendComm, sendDevComm)`, non-blocking.
    pub connect: ConnectV11,
    /// `accept(listenComm, recvComm, recvDevComm)`, non-blocking.
    pub accept: AcceptV7,
    /// `regMr(comm, data, size, type, mhandle)`.
    pub regMr: RegMrV8,
    /// `regMrDmaBuf(comm, data, size, type, offset, fd, mhandle)`.
    pub regMrDmaBuf: RegMrDmaBuf,
    /// `deregMr(comm, mhandle)`.
    pub deregMr: DeregMr,
    /// `isend(sendComm, data, size, tag, mhandle, phandle, request)`.
    pub isend: IsendV10,
    /// `irecv(recvComm, n, data, sizes, tags, mhandles, phandles, request)`.
    pub irecv: IrecvV10,
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
    /// `finalize(ctx)`: required, called when a communicator releases the net.
    pub finalize: Finalize,
    /// `setNetAttr(ctx, netAttr)` (optional).
    pub setNetAttr: SetNetAttr,
}
assert_layout!(
    ncclNet_v11_t,
    size = 176,
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
    makeVDevice = 152,
    finalize = 160,
    setNetAttr = 168
);
table_is_sync!(ncclNet_v11_t);
