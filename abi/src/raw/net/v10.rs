//! Net ABI v10 (NCCL 2.26–2.27): comm config in `connect`, profiler handles. 20 slots, 160 bytes.
//! Properties are identical to v9.

use core::ffi::{c_char, c_int};

use super::fns::*;
use crate::raw::{assert_layout, table_is_sync};

/// `ncclNetProperties_v10_t` is identical to v9 (104 bytes).
pub type ncclNetProperties_v10_t = super::v9::ncclNetProperties_v9_t;

/// `ncclNet_v10_t`: the table exported as `ncclNetPlugin_v10`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNet_v10_t {
    /// Plugin name (data, not a function); compared case-insensitively with `NCCL_NET`.
    pub name: *const c_char,
    /// `init(logFunction, profFunction)`.
    pub init: InitV10,
    /// `devices(ndev)`.
    pub devices: Devices,
    /// `getProperties(dev, props)`; v10 properties are the v9 struct.
    pub getProperties: Option<
        unsafe extern "C" fn(
            dev: c_int,
            props: *mut super::v9::ncclNetProperties_v9_t,
        ) -> crate::raw::common::NcclResult,
    >,
    /// `listen(dev, handle, listenComm)`.
    pub listen: ListenV6,
    /// `connect(dev, config, handle, sendComm, sendDevComm)`, non-blocking.
    pub connect: ConnectV10,
    /// `accept(listenComm, recvComm, recvDevComm)`, non-blocking.
    pub accept: AcceptV7,
    /// `regMr` with a `size_t` size.
    pub regMr: RegMrV8,
    /// `regMrDmaBuf(comm, data, size, type, offset, fd, mhandle)`.
    pub regMrDmaBuf: RegMrDmaBuf,
    /// `deregMr(comm, mhandle)`.
    pub deregMr: DeregMr,
    /// `isend` with a profiler handle.
    pub isend: IsendV10,
    /// `irecv` with profiler handles.
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
}
assert_layout!(
    ncclNet_v10_t,
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
table_is_sync!(ncclNet_v10_t);
