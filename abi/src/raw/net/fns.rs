//! Function-pointer types shared by several net table versions.
//!
//! Each alias is named after its slot and, where versions differ, after the version
//! that introduced that shape (`IsendV6` = `int` size, `IsendV9` = `size_t`, `IsendV10`
//! adds `phandle`). Each is an `Option<fn>` so a NULL slot is representable.

use core::ffi::{c_int, c_void};

use super::{ncclNetAttr_v11_t, ncclNetCommConfig_v10_t, ncclNetDeviceHandle_v7_t};
use crate::raw::common::{NcclResult, ncclDebugLogger_t, ncclProfilerCallback_t};

/// `init(logFunction)` (v6–v9).
pub type InitV6 = Option<unsafe extern "C" fn(logFunction: ncclDebugLogger_t) -> NcclResult>;
/// `init(logFunction, profFunction)` (v10).
pub type InitV10 = Option<
    unsafe extern "C" fn(
        logFunction: ncclDebugLogger_t,
        profFunction: ncclProfilerCallback_t,
    ) -> NcclResult,
>;
/// `init(ctx, commId, config, logFunction, profFunction)` (v11+), once per communicator.
pub type InitV11 = Option<
    unsafe extern "C" fn(
        ctx: *mut *mut c_void,
        commId: u64,
        config: *mut ncclNetCommConfig_v10_t,
        logFunction: ncclDebugLogger_t,
        profFunction: ncclProfilerCallback_t,
    ) -> NcclResult,
>;
/// `devices(ndev)`.
pub type Devices = Option<unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult>;
/// `listen(dev, handle, listenComm)` (v6–v10).
pub type ListenV6 = Option<
    unsafe extern "C" fn(
        dev: c_int,
        handle: *mut c_void,
        listenComm: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `listen(ctx, dev, handle, listenComm)` (v11+).
pub type ListenV11 = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        dev: c_int,
        handle: *mut c_void,
        listenComm: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `connect(dev, handle, sendComm)` (v6).
pub type ConnectV6 = Option<
    unsafe extern "C" fn(dev: c_int, handle: *mut c_void, sendComm: *mut *mut c_void) -> NcclResult,
>;
/// `connect(dev, handle, sendComm, sendDevComm)` (v7–v9).
pub type ConnectV7 = Option<
    unsafe extern "C" fn(
        dev: c_int,
        handle: *mut c_void,
        sendComm: *mut *mut c_void,
        sendDevComm: *mut *mut ncclNetDeviceHandle_v7_t,
    ) -> NcclResult,
>;
/// `connect(dev, config, handle, sendComm, sendDevComm)` (v10).
pub type ConnectV10 = Option<
    unsafe extern "C" fn(
        dev: c_int,
        config: *mut ncclNetCommConfig_v10_t,
        handle: *mut c_void,
        sendComm: *mut *mut c_void,
        sendDevComm: *mut *mut ncclNetDeviceHandle_v7_t,
    ) -> NcclResult,
>;
/// `connect(ctx, dev, handle, sendComm, sendDevComm)` (v11+).
pub type ConnectV11 = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        dev: c_int,
        handle: *mut c_void,
        sendComm: *mut *mut c_void,
        sendDevComm: *mut *mut ncclNetDeviceHandle_v7_t,
    ) -> NcclResult,
>;
/// `accept(listenComm, recvComm)` (v6).
pub type AcceptV6 =
    Option<unsafe extern "C" fn(listenComm: *mut c_void, recvComm: *mut *mut c_void) -> NcclResult>;
/// `accept(listenComm, recvComm, recvDevComm)` (v7+).
pub type AcceptV7 = Option<
    unsafe extern "C" fn(
        listenComm: *mut c_void,
        recvComm: *mut *mut c_void,
        recvDevComm: *mut *mut ncclNetDeviceHandle_v7_t,
    ) -> NcclResult,
>;
/// `regMr(comm, data, size, type, mhandle)` with an `int` size (v6, v7).
pub type RegMrV6 = Option<
    unsafe extern "C" fn(
        comm: *mut c_void,
        data: *mut c_void,
        size: c_int,
        type_: c_int,
        mhandle: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `regMr(comm, data, size, type, mhandle)` with a `size_t` size (v8+).
pub type RegMrV8 = Option<
    unsafe extern "C" fn(
        comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        type_: c_int,
        mhandle: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `regMrDmaBuf(comm, data, size, type, offset, fd, mhandle)` (v6+).
pub type RegMrDmaBuf = Option<
    unsafe extern "C" fn(
        comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        type_: c_int,
        offset: u64,
        fd: c_int,
        mhandle: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `deregMr(comm, mhandle)`.
pub type DeregMr =
    Option<unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult>;
/// `isend(sendComm, data, size, tag, mhandle, request)` with an `int` size (v6–v8).
pub type IsendV6 = Option<
    unsafe extern "C" fn(
        sendComm: *mut c_void,
        data: *mut c_void,
        size: c_int,
        tag: c_int,
        mhandle: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `isend(sendComm, data, size, tag, mhandle, request)` with a `size_t` size (v9).
pub type IsendV9 = Option<
    unsafe extern "C" fn(
        sendComm: *mut c_void,
        data: *mut c_void,
        size: usize,
        tag: c_int,
        mhandle: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `isend(sendComm, data, size, tag, mhandle, phandle, request)` (v10+).
pub type IsendV10 = Option<
    unsafe extern "C" fn(
        sendComm: *mut c_void,
        data: *mut c_void,
        size: usize,
        tag: c_int,
        mhandle: *mut c_void,
        phandle: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `irecv(recvComm, n, data, sizes, tags, mhandles, request)` with `int` sizes (v6–v8).
pub type IrecvV6 = Option<
    unsafe extern "C" fn(
        recvComm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut c_int,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `irecv(recvComm, n, data, sizes, tags, mhandles, request)` with `size_t` sizes (v9).
pub type IrecvV9 = Option<
    unsafe extern "C" fn(
        recvComm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut usize,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `irecv(recvComm, n, data, sizes, tags, mhandles, phandles, request)` (v10+).
pub type IrecvV10 = Option<
    unsafe extern "C" fn(
        recvComm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut usize,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        phandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `iflush(recvComm, n, data, sizes, mhandles, request)`; sizes stay `int*` in every version.
pub type Iflush = Option<
    unsafe extern "C" fn(
        recvComm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut c_int,
        mhandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `test(request, done, sizes)`; sizes stay `int*` and may be NULL.
pub type Test = Option<
    unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult,
>;
/// `closeSend` / `closeRecv` / `closeListen`.
pub type Close = Option<unsafe extern "C" fn(comm: *mut c_void) -> NcclResult>;
/// `getDeviceMr(comm, mhandle, dptr_mhandle)` (v7+, optional).
pub type GetDeviceMr = Option<
    unsafe extern "C" fn(
        comm: *mut c_void,
        mhandle: *mut c_void,
        dptr_mhandle: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `irecvConsumed(recvComm, n, request)` (v7+, optional).
pub type IrecvConsumed = Option<
    unsafe extern "C" fn(recvComm: *mut c_void, n: c_int, request: *mut c_void) -> NcclResult,
>;
/// `finalize(ctx)` (v11+, required).
pub type Finalize = Option<unsafe extern "C" fn(ctx: *mut c_void) -> NcclResult>;
/// `setNetAttr(ctx, netAttr)` (v11+, optional).
pub type SetNetAttr =
    Option<unsafe extern "C" fn(ctx: *mut c_void, netAttr: *mut ncclNetAttr_v11_t) -> NcclResult>;
