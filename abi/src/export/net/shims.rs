//! The `extern "C"` entry points of the net tables, one per distinct C signature.
//!
//! Versions that share a slot signature share the shim; each body is one [`guard`]
//! around an [`ops`] call plus the argument narrowing NCCL's own shims do.

use std::ffi::{c_int, c_void};

use super::{NetExport, channel, ops, props};
use crate::error::Error;
use crate::export::guard::guard;
use crate::log::set_logger;
use crate::profiler::net::RequestProfiler;
use crate::raw::common::{NcclResult, ncclDebugLogger_t, ncclProfilerCallback_t};
use crate::raw::net::{
    ncclNetAttr_v11_t, ncclNetCommConfig_v10_t, ncclNetDeviceHandle_v7_t, ncclNetVDeviceProps_v9_t,
    ncclNetVDeviceProps_v12_t,
};

/// Largest message the `int`-sized versions accept (NCCL's shims stop at 1 GiB).
const INT_MSG_LIMIT: usize = 1 << 30;

fn int_size(size: c_int) -> crate::Result<usize> {
    let s = ops::size_from(size)?;
    if s > INT_MSG_LIMIT {
        return Err(Error::internal(format!(
            "size {s} exceeds the 1 GiB limit of this ABI version"
        )));
    }
    Ok(s)
}

pub(crate) unsafe extern "C" fn init_v6<T: NetExport, const V: u32>(
    log: ncclDebugLogger_t,
) -> NcclResult {
    set_logger(log);
    guard("ncclNet.init", || ops::init_legacy::<T>(V))
}

pub(crate) unsafe extern "C" fn init_v10<T: NetExport>(
    log: ncclDebugLogger_t,
    prof: ncclProfilerCallback_t,
) -> NcclResult {
    set_logger(log);
    T::state().set_profiler(prof);
    guard("ncclNet.init", || ops::init_legacy::<T>(10))
}

pub(crate) unsafe extern "C" fn init_v11<T: NetExport, const V: u32>(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut ncclNetCommConfig_v10_t,
    log: ncclDebugLogger_t,
    prof: ncclProfilerCallback_t,
) -> NcclResult {
    set_logger(log);
    T::state().set_profiler(prof);
    // SAFETY: NCCL passes a writable ctx out-pointer and NULL or its config.
    guard("ncclNet.init", || unsafe {
        ops::init_ctx::<T>(V, ctx, comm_id, config)
    })
}

pub(crate) unsafe extern "C" fn finalize<T: NetExport>(ctx: *mut c_void) -> NcclResult {
    // SAFETY: NCCL passes back the ctx from init.
    guard("ncclNet.finalize", || unsafe { ops::finalize::<T>(ctx) })
}

pub(crate) unsafe extern "C" fn devices<T: NetExport>(ndev: *mut c_int) -> NcclResult {
    // SAFETY: NCCL passes a writable int.
    guard("ncclNet.devices", || unsafe { ops::devices::<T>(ndev) })
}

/// `getProperties` for any version: `build` makes that version's struct.
fn get_properties<P>(props: *mut P, build: impl FnOnce() -> crate::Result<P>) -> NcclResult {
    guard("ncclNet.getProperties", || {
        if props.is_null() {
            return Err(Error::invalid_argument("getProperties: props is NULL"));
        }
        let value = build()?;
        // SAFETY: non-NULL; NCCL provides a buffer of exactly this version's struct.
        unsafe { props.write(value) };
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn get_properties_v6<T: NetExport>(
    dev: c_int,
    p: *mut crate::raw::net::v6::ncclNetProperties_v6_t,
) -> NcclResult {
    get_properties(p, || props::v6::<T>(dev))
}

pub(crate) unsafe extern "C" fn get_properties_v7<T: NetExport>(
    dev: c_int,
    p: *mut crate::raw::net::v7::ncclNetProperties_v7_t,
) -> NcclResult {
    get_properties(p, || props::v7::<T>(dev))
}

pub(crate) unsafe extern "C" fn get_properties_v8<T: NetExport>(
    dev: c_int,
    p: *mut crate::raw::net::v8::ncclNetProperties_v8_t,
) -> NcclResult {
    get_properties(p, || props::v8::<T>(dev))
}

pub(crate) unsafe extern "C" fn get_properties_v9<T: NetExport>(
    dev: c_int,
    p: *mut crate::raw::net::v9::ncclNetProperties_v9_t,
) -> NcclResult {
    get_properties(p, || props::v9::<T>(dev))
}

pub(crate) unsafe extern "C" fn get_properties_v11<T: NetExport>(
    dev: c_int,
    p: *mut crate::raw::net::v11::ncclNetProperties_v11_t,
) -> NcclResult {
    get_properties(p, || props::v11::<T>(dev))
}

pub(crate) unsafe extern "C" fn get_properties_v12<T: NetExport>(
    dev: c_int,
    p: *mut crate::raw::net::v12::ncclNetProperties_v12_t,
) -> NcclResult {
    get_properties(p, || props::v12::<T>(dev))
}

pub(crate) unsafe extern "C" fn listen_v6<T: NetExport>(
    dev: c_int,
    handle: *mut c_void,
    lc: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL passes a 128-byte handle and a writable listenComm.
    guard("ncclNet.listen", || unsafe {
        ops::listen::<T>(ops::Ctx::Legacy, dev, handle, lc)
    })
}

pub(crate) unsafe extern "C" fn listen_v11<T: NetExport>(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    lc: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: as above; ctx is the one from init.
    guard("ncclNet.listen", || unsafe {
        ops::listen::<T>(ops::Ctx::Raw(ctx), dev, handle, lc)
    })
}

pub(crate) unsafe extern "C" fn connect_v6<T: NetExport>(
    dev: c_int,
    handle: *mut c_void,
    sc: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL passes the peer's handle (same pointer on retries) and a writable sendComm.
    guard("ncclNet.connect", || unsafe {
        ops::connect::<T>(ops::Ctx::Legacy, dev, handle, sc)
    })
}

pub(crate) unsafe extern "C" fn connect_v7<T: NetExport>(
    dev: c_int,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    dev_comm: *mut *mut ncclNetDeviceHandle_v7_t,
) -> NcclResult {
    // SAFETY: as above; host-memory plugins leave the device handle untouched (under
    // RCCL it carries the channel id, read only).
    guard("ncclNet.connect", || unsafe {
        channel::with_channel(dev_comm.cast(), || {
            ops::connect::<T>(ops::Ctx::Legacy, dev, handle, sc)
        })
    })
}

pub(crate) unsafe extern "C" fn connect_v10<T: NetExport>(
    dev: c_int,
    config: *mut ncclNetCommConfig_v10_t,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    dev_comm: *mut *mut ncclNetDeviceHandle_v7_t,
) -> NcclResult {
    let ctx = ops::Ctx::Config(ops::config_from(config));
    // SAFETY: as above.
    guard("ncclNet.connect", || unsafe {
        channel::with_channel(dev_comm.cast(), || ops::connect::<T>(ctx, dev, handle, sc))
    })
}

pub(crate) unsafe extern "C" fn connect_v11<T: NetExport>(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    dev_comm: *mut *mut ncclNetDeviceHandle_v7_t,
) -> NcclResult {
    // SAFETY: as above; ctx is the one from init.
    guard("ncclNet.connect", || unsafe {
        channel::with_channel(dev_comm.cast(), || {
            ops::connect::<T>(ops::Ctx::Raw(ctx), dev, handle, sc)
        })
    })
}

pub(crate) unsafe extern "C" fn accept_v6<T: NetExport>(
    lc: *mut c_void,
    rc: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL passes its listenComm and a writable recvComm.
    guard("ncclNet.accept", || unsafe { ops::accept::<T>(lc, rc) })
}

pub(crate) unsafe extern "C" fn accept_v7<T: NetExport>(
    lc: *mut c_void,
    rc: *mut *mut c_void,
    dev_comm: *mut *mut ncclNetDeviceHandle_v7_t,
) -> NcclResult {
    // SAFETY: as above.
    guard("ncclNet.accept", || unsafe {
        channel::with_channel(dev_comm.cast(), || ops::accept::<T>(lc, rc))
    })
}

pub(crate) unsafe extern "C" fn reg_mr_v6<T: NetExport>(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    kind: c_int,
    mh: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL passes a live comm and a writable mhandle.
    guard("ncclNet.regMr", || unsafe {
        ops::reg_mr::<T>(comm, data, ops::size_from(size)?, kind, None, mh)
    })
}

pub(crate) unsafe extern "C" fn reg_mr_v8<T: NetExport>(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    mh: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: as above.
    guard("ncclNet.regMr", || unsafe {
        ops::reg_mr::<T>(comm, data, size, kind, None, mh)
    })
}

pub(crate) unsafe extern "C" fn reg_mr_dmabuf<T: NetExport>(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    offset: u64,
    fd: c_int,
    mh: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: as above.
    guard("ncclNet.regMrDmaBuf", || unsafe {
        ops::reg_mr::<T>(comm, data, size, kind, Some((offset, fd)), mh)
    })
}

pub(crate) unsafe extern "C" fn dereg_mr<T: NetExport>(
    comm: *mut c_void,
    mh: *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL passes a live comm and an mhandle from regMr.
    guard("ncclNet.deregMr", || unsafe {
        ops::dereg_mr::<T>(comm, mh)
    })
}

pub(crate) unsafe extern "C" fn isend_v6<T: NetExport>(
    sc: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mh: *mut c_void,
    req: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL passes a live sendComm, a buffer valid until completion, a writable request.
    guard("ncclNet.isend", || unsafe {
        ops::isend::<T>(sc, data, int_size(size)?, tag, mh, req)
    })
}

pub(crate) unsafe extern "C" fn isend_v9<T: NetExport>(
    sc: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    req: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: as above.
    guard("ncclNet.isend", || unsafe {
        ops::isend::<T>(sc, data, size, tag, mh, req)
    })
}

pub(crate) unsafe extern "C" fn isend_v10<T: NetExport>(
    sc: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    phandle: *mut c_void,
    req: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: as above; `phandle` is NCCL's handle for this request, valid until
    // it completes.
    guard("ncclNet.isend", || unsafe {
        let prof = RequestProfiler::new(T::state().profiler(), phandle);
        ops::isend_profiled::<T>(sc, data, size, tag, mh, req, prof)
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn irecv_v6<T: NetExport>(
    rc: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL passes a live recvComm and arrays of n entries.
    guard("ncclNet.irecv", || unsafe {
        ops::irecv::<T, c_int>(rc, n, data, sizes, tags, mh, req)
    })
}

pub(crate) unsafe extern "C" fn irecv_v9<T: NetExport>(
    rc: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: as above.
    guard("ncclNet.irecv", || unsafe {
        ops::irecv::<T, usize>(rc, n, data, sizes, tags, mh, req)
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn irecv_v10<T: NetExport>(
    rc: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    phandles: *mut *mut c_void,
    req: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: as above; `phandles` is NULL or `n` (≥ 1) handles valid until the
    // request completes.
    guard("ncclNet.irecv", || unsafe {
        let handles: &[*mut c_void] = match usize::try_from(n) {
            Ok(n) if n >= 1 && !phandles.is_null() => std::slice::from_raw_parts(phandles, n),
            _ => &[],
        };
        let prof = RequestProfiler::new_grouped(T::state().profiler(), handles);
        ops::irecv_profiled::<T, usize>(rc, n, data, sizes, tags, mh, req, prof)
    })
}

pub(crate) unsafe extern "C" fn iflush<T: NetExport>(
    rc: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: as above.
    guard("ncclNet.iflush", || unsafe {
        ops::iflush::<T>(rc, n, data, sizes, mh, req)
    })
}

pub(crate) unsafe extern "C" fn test<T: NetExport>(
    req: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> NcclResult {
    // SAFETY: NCCL passes a live request, a writable done flag and NULL or a sizes array.
    guard("ncclNet.test", || unsafe {
        ops::test::<T>(req, done, sizes)
    })
}

pub(crate) unsafe extern "C" fn close_send<T: NetExport>(comm: *mut c_void) -> NcclResult {
    // SAFETY: NCCL passes a live sendComm and never uses it again.
    guard("ncclNet.closeSend", || unsafe {
        ops::close_send::<T>(comm)
    })
}

pub(crate) unsafe extern "C" fn close_recv<T: NetExport>(comm: *mut c_void) -> NcclResult {
    // SAFETY: NCCL passes a live recvComm and never uses it again.
    guard("ncclNet.closeRecv", || unsafe {
        ops::close_recv::<T>(comm)
    })
}

pub(crate) unsafe extern "C" fn close_listen<T: NetExport>(comm: *mut c_void) -> NcclResult {
    // SAFETY: NCCL passes a live listenComm and never uses it again.
    guard("ncclNet.closeListen", || unsafe {
        ops::close_listen::<T>(comm)
    })
}

pub(crate) unsafe extern "C" fn irecv_consumed<T: NetExport>(
    rc: *mut c_void,
    n: c_int,
    req: *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL passes a live recvComm; `req` is only an identifier.
    guard("ncclNet.irecvConsumed", || unsafe {
        ops::irecv_consumed::<T>(rc, n, req)
    })
}

pub(crate) unsafe extern "C" fn set_net_attr<T: NetExport>(
    ctx: *mut c_void,
    attr: *mut ncclNetAttr_v11_t,
) -> NcclResult {
    // SAFETY: NCCL passes the ctx from init and its attribute struct.
    guard("ncclNet.setNetAttr", || unsafe {
        ops::set_net_attr::<T>(ctx, attr)
    })
}

pub(crate) unsafe extern "C" fn make_vdevice_v9<T: NetExport>(
    d: *mut c_int,
    p: *mut ncclNetVDeviceProps_v9_t,
) -> NcclResult {
    guard("ncclNet.makeVDevice", || {
        if p.is_null() {
            return Err(Error::invalid_argument("makeVDevice: props is NULL"));
        }
        // SAFETY: non-NULL; plain data of the v9 layout.
        let p = unsafe { p.read() };
        // SAFETY: NCCL passes a writable d.
        unsafe { ops::make_vdevice::<T>(d, p.ndevs, &p.devs) }
    })
}

pub(crate) unsafe extern "C" fn make_vdevice_v12<T: NetExport>(
    d: *mut c_int,
    p: *mut ncclNetVDeviceProps_v12_t,
) -> NcclResult {
    guard("ncclNet.makeVDevice", || {
        if p.is_null() {
            return Err(Error::invalid_argument("makeVDevice: props is NULL"));
        }
        // SAFETY: non-NULL; plain data of the v12 layout.
        let p = unsafe { p.read() };
        // SAFETY: NCCL passes a writable d.
        unsafe { ops::make_vdevice::<T>(d, p.ndevs, &p.devs) }
    })
}
