//! Net v7 table: device handles, int regMr size (NCCL 2.19).

use super::NetExport;
use super::shims::*;
use crate::raw::net::v7::ncclNet_v7_t;

/// The `ncclNetPlugin_v7` table for `T`.
pub const fn table<T: NetExport>() -> ncclNet_v7_t {
    ncclNet_v7_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v6::<T, 7>),
        devices: Some(devices::<T>),
        getProperties: Some(get_properties_v7::<T>),
        listen: Some(listen_v6::<T>),
        connect: Some(connect_v7::<T>),
        accept: Some(accept_v7::<T>),
        regMr: Some(reg_mr_v6::<T>),
        regMrDmaBuf: if T::SUPPORTS_DMABUF {
            Some(reg_mr_dmabuf::<T>)
        } else {
            None
        },
        deregMr: Some(dereg_mr::<T>),
        isend: Some(isend_v6::<T>),
        irecv: Some(irecv_v6::<T>),
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
    }
}
