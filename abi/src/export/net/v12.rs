//! Net v12 table: current (NCCL 2.30); used in place by NCCL.

use super::NetExport;
use super::shims::*;
use crate::raw::net::v12::ncclNet_v12_t;

/// The `ncclNetPlugin_v12` table for `T`.
pub const fn table<T: NetExport>() -> ncclNet_v12_t {
    ncclNet_v12_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v11::<T, 12>),
        devices: Some(devices::<T>),
        getProperties: Some(get_properties_v12::<T>),
        listen: Some(listen_v11::<T>),
        connect: Some(connect_v11::<T>),
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
            Some(make_vdevice_v12::<T>)
        } else {
            None
        },
        finalize: Some(finalize::<T>),
        setNetAttr: if T::HAS_SET_NET_ATTR {
            Some(set_net_attr::<T>)
        } else {
            None
        },
    }
}
