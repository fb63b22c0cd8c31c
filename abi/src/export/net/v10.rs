//! Net v10 table: config passed to `connect` (one context per traffic class), profiler handles (NCCL 2.26–2.27).

use super::NetExport;
use super::shims::*;
use crate::raw::net::v10::ncclNet_v10_t;

/// The `ncclNetPlugin_v10` table for `T`.
pub const fn table<T: NetExport>() -> ncclNet_v10_t {
    ncclNet_v10_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v10::<T>),
        devices: Some(devices::<T>),
        getProperties: Some(get_properties_v9::<T>),
        listen: Some(listen_v6::<T>),
        connect: Some(connect_v10::<T>),
        accept: Some(accept_v7::<T>),
        regMr: Some(reg_mr_v8::<T>),
        regMrDmaBuf: if T::SUPPORTS_DMABUF {
            Some(reg_mr_dmabuf::<T>)
        } else {
            None
        },
        deregMr: Some(dereg_mr::<T>),
        isend: Some(isend_v10::<T>),
        irecv: Some(irecv_v10::<T>),
        iflush: Some(iflush::<T>),
        test: Some(test::<T>),
        closeSend: Some(close_send::<T>),
        closeRecv: Some(close_recv::<T>),
        closeListen: Some(close_listen::<T>),
        // Host-memory plugins have no device-side registrations.
        getDeviceMr: None,
        irecvConsumed: if T::HAS_IRECV_CONSUMED {
            Some(irecv_consumed::<T>)
        } else {
            None
        },
        makeVDevice: if T::HAS_MAKE_VDEVICE {
            Some(make_vdevice_v9::<T>)
        } else {
            None
        },
    }
}
