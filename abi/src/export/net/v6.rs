//! Net v6 table: int sizes, no device handles (NCCL 2.13–2.18).

use super::NetExport;
use super::shims::*;
use crate::raw::net::v6::ncclNet_v6_t;

/// The `ncclNetPlugin_v6` table for `T`.
pub const fn table<T: NetExport>() -> ncclNet_v6_t {
    ncclNet_v6_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v6::<T, 6>),
        devices: Some(devices::<T>),
        getProperties: Some(get_properties_v6::<T>),
        listen: Some(listen_v6::<T>),
        connect: Some(connect_v6::<T>),
        accept: Some(accept_v6::<T>),
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
    }
}
