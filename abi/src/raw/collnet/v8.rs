//! CollNet ABI v8 (NCCL 2.20–2.23; 17 slots, 136 bytes).

use core::ffi::{c_char, c_int, c_void};

use super::super::assert_layout;
use super::super::common::{DataType, NcclResult, RedOp, ncclDebugLogger_t};

/// `ncclCollNet_v8_t`: NCCL 2.20–2.23; 17 slots, 136 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclCollNet_v8_t {
    /// Plugin name (data).
    pub name: *const c_char,
    /// `init(logFunction)`.
    pub init: Option<unsafe extern "C" fn(logFunction: ncclDebugLogger_t) -> NcclResult>,
    /// `devices(ndev)`; 0 disables CollNet (the rest may then be NULL).
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult>,
    /// `getProperties(dev, props)`.
    pub getProperties: Option<
        unsafe extern "C" fn(
            dev: c_int,
            props: *mut crate::raw::net::v8::ncclNetProperties_v8_t,
        ) -> NcclResult,
    >,
    /// `listen(dev, handle, listenComm)`.
    pub listen: Option<
        unsafe extern "C" fn(
            dev: c_int,
            handle: *mut c_void,
            listenComm: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// `connect(handles, nranks, rank, listenComm, collComm)`.
    pub connect: Option<
        unsafe extern "C" fn(
            handles: *mut *mut c_void,
            nranks: c_int,
            rank: c_int,
            listenComm: *mut c_void,
            collComm: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// `reduceSupport(dataType, redOp, supported)`.
    pub reduceSupport: Option<
        unsafe extern "C" fn(dataType: DataType, redOp: RedOp, supported: *mut c_int) -> NcclResult,
    >,
    /// `regMr(collComm, data, size, type, mhandle)`.
    pub regMr: Option<
        unsafe extern "C" fn(
            collComm: *mut c_void,
            data: *mut c_void,
            size: usize,
            type_: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// `regMrDmaBuf(collComm, data, size, type, offset, fd, mhandle)`.
    pub regMrDmaBuf: Option<
        unsafe extern "C" fn(
            collComm: *mut c_void,
            data: *mut c_void,
            size: usize,
            type_: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// `deregMr(collComm, mhandle)`.
    pub deregMr:
        Option<unsafe extern "C" fn(collComm: *mut c_void, mhandle: *mut c_void) -> NcclResult>,
    /// `iallreduce(…)` with a `int` count.
    pub iallreduce: Option<
        unsafe extern "C" fn(
            collComm: *mut c_void,
            sendData: *mut c_void,
            recvData: *mut c_void,
            count: c_int,
            dataType: DataType,
            redOp: RedOp,
            sendMhandle: *mut c_void,
            recvMhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// `iallgather(…)`.
    pub iallgather: Option<
        unsafe extern "C" fn(
            collComm: *mut c_void,
            sendData: *mut c_void,
            nRecvParts: c_int,
            recvParts: *mut crate::raw::net::ncclNetSGE_v8_t,
            bytesPerRank: usize,
            windowOffset: usize,
            windowBytes: usize,
            sendMhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// `ireducescatter(…)`.
    pub ireducescatter: Option<
        unsafe extern "C" fn(
            collComm: *mut c_void,
            nSendParts: c_int,
            sendParts: *mut crate::raw::net::ncclNetSGE_v8_t,
            recvData: *mut c_void,
            bytesPerRank: usize,
            windowOffset: usize,
            windowBytes: usize,
            dataType: DataType,
            redOp: RedOp,
            recvMhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// `iflush(collComm, data, size, mhandle, request)`.
    pub iflush: Option<
        unsafe extern "C" fn(
            collComm: *mut c_void,
            data: *mut c_void,
            size: c_int,
            mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// `test(request, done, size)`.
    pub test: Option<
        unsafe extern "C" fn(
            request: *mut c_void,
            done: *mut c_int,
            size: *mut c_int,
        ) -> NcclResult,
    >,
    /// `closeColl(collComm)`.
    pub closeColl: Option<unsafe extern "C" fn(collComm: *mut c_void) -> NcclResult>,
    /// `closeListen(listenComm)`.
    pub closeListen: Option<unsafe extern "C" fn(listenComm: *mut c_void) -> NcclResult>,
}
assert_layout!(
    ncclCollNet_v8_t,
    size = 136,
    align = 8,
    name = 0,
    init = 8,
    devices = 16,
    getProperties = 24,
    listen = 32,
    connect = 40,
    reduceSupport = 48,
    regMr = 56,
    regMrDmaBuf = 64,
    deregMr = 72,
    iallreduce = 80,
    iallgather = 88,
    ireducescatter = 96,
    iflush = 104,
    test = 112,
    closeColl = 120,
    closeListen = 128
);
super::super::table_is_sync!(ncclCollNet_v8_t);
