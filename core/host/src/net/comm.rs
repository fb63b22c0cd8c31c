//! Listen, send and receive comms: connection setup, memory registration, posting.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use cclkit_abi::net::Sizes as AbiSizes;
use cclkit_abi::raw::net::{NCCL_NET_HANDLE_MAXSIZE, ncclNetDeviceHandle_v7_t};

use super::context::{CtxInner, dev_int};
use super::request::Request;
use super::table::{TableRef, common_slot};
use super::{ConnectHandle, NetError, NetShared, null};
use crate::logger;

/// Most buffers in one grouped receive or flush (NCCL's `int sizes[64]` for `test`).
pub const MAX_GROUPED: usize = AbiSizes::MAX;

/// A comm handle as the plugin returned it, closed on drop.
pub(super) struct Comm {
    ctx: Arc<CtxInner>,
    pub(super) raw: NonNull<c_void>,
    side: Side,
    closed: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Listen,
    Send,
    Recv,
}

// SAFETY: a comm is an opaque plugin pointer; NCCL uses each comm from one thread at a
// time but not always the same thread (the ABI contract), which `&mut self` methods on
// the public wrappers enforce.
unsafe impl Send for Comm {}

impl Comm {
    pub(super) fn shared(&self) -> &NetShared {
        &self.ctx.plugin.shared
    }

    pub(super) fn id(&self) -> usize {
        self.raw.as_ptr() as usize
    }

    fn new(ctx: Arc<CtxInner>, raw: NonNull<c_void>, side: Side) -> Self {
        Self {
            ctx,
            raw,
            side,
            closed: false,
        }
    }

    /// Closes the comm once; later calls do nothing.
    fn close(&mut self) -> Result<(), NetError> {
        if std::mem::replace(&mut self.closed, true) {
            return Ok(());
        }
        let s = &self.ctx.plugin.shared;
        let (call, f) = match self.side {
            Side::Listen => ("closeListen", common_slot!(s.raw, closeListen)),
            Side::Send => ("closeSend", common_slot!(s.raw, closeSend)),
            Side::Recv => ("closeRecv", common_slot!(s.raw, closeRecv)),
        };
        let f = f.ok_or_else(|| s.missing(call))?;
        let mark = logger::warn_mark();
        // SAFETY: closes a comm this plugin returned, exactly once (from drop/close).
        let rc = unsafe { f(self.raw.as_ptr()) };
        s.check(call, mark, rc)
    }

    /// `regMr`, refusing sizes an `int` ABI cannot carry (net_v6.cc / net_v7.cc).
    fn reg_mr(&mut self, data: *mut u8, size: usize, ptr_type: i32) -> Result<Mr, NetError> {
        let s = &self.ctx.plugin.shared;
        let (c, d) = (self.raw.as_ptr(), data.cast::<c_void>());
        let mut mh = null();
        let narrow = |size: usize| {
            c_int::try_from(size).map_err(|_| {
                s.refuse(
                    "regMr",
                    format!(
                        "{size} bytes: net v{} registers at most 2 GiB - 1",
                        s.raw.version()
                    ),
                )
            })
        };
        let mark = logger::warn_mark();
        // SAFETY: `regMr` of the table's version on this comm; the caller
        // guarantees the memory (see `SendComm::reg_mr`).
        let rc = unsafe {
            match s.raw.get() {
                TableRef::V6(t) => t
                    .regMr
                    .map(|f| narrow(size).map(|n| f(c, d, n, ptr_type, &mut mh))),
                TableRef::V7(t) => t
                    .regMr
                    .map(|f| narrow(size).map(|n| f(c, d, n, ptr_type, &mut mh))),
                TableRef::V8(t) => t.regMr.map(|f| Ok(f(c, d, size, ptr_type, &mut mh))),
                TableRef::V9(t) => t.regMr.map(|f| Ok(f(c, d, size, ptr_type, &mut mh))),
                TableRef::V10(t) => t.regMr.map(|f| Ok(f(c, d, size, ptr_type, &mut mh))),
                TableRef::V11(t) => t.regMr.map(|f| Ok(f(c, d, size, ptr_type, &mut mh))),
                TableRef::V12(t) => t.regMr.map(|f| Ok(f(c, d, size, ptr_type, &mut mh))),
            }
        }
        .ok_or_else(|| s.missing("regMr"))??;
        s.check("regMr", mark, rc)?;
        Ok(Mr {
            mhandle: mh,
            comm: self.id(),
        })
    }

    fn reg_mr_dmabuf(
        &mut self,
        data: *mut u8,
        size: usize,
        ptr_type: i32,
        offset: u64,
        fd: i32,
    ) -> Result<Mr, NetError> {
        let s = &self.ctx.plugin.shared;
        let f = common_slot!(s.raw, regMrDmaBuf).ok_or_else(|| s.missing("regMrDmaBuf"))?;
        let mut mh = null();
        let mark = logger::warn_mark();
        // SAFETY: `regMrDmaBuf` on this comm; the caller guarantees the memory and fd.
        let rc = unsafe {
            f(
                self.raw.as_ptr(),
                data.cast(),
                size,
                ptr_type,
                offset,
                fd,
                &mut mh,
            )
        };
        s.check("regMrDmaBuf", mark, rc)?;
        Ok(Mr {
            mhandle: mh,
            comm: self.id(),
        })
    }

    fn dereg_mr(&mut self, mr: Mr) -> Result<(), NetError> {
        let s = &self.ctx.plugin.shared;
        self.owns(mr.comm, "deregMr")?;
        let f = common_slot!(s.raw, deregMr).ok_or_else(|| s.missing("deregMr"))?;
        let mark = logger::warn_mark();
        // SAFETY: releases a registration this comm created, exactly once (`mr` is moved).
        let rc = unsafe { f(self.raw.as_ptr(), mr.mhandle) };
        s.check("deregMr", mark, rc)
    }

    pub(super) fn owns(&self, comm: usize, call: &'static str) -> Result<(), NetError> {
        if comm == self.id() {
            return Ok(());
        }
        Err(self
            .shared()
            .refuse(call, "the registration or request belongs to another comm"))
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(subsys = cclkit_abi::raw::common::subsys::NET, "{e}");
        }
    }
}

/// A memory registration (`mhandle`), valid on the comm that created it until
/// deregistered. Dropping it without [`SendComm::dereg_mr`] leaks the registration.
#[derive(Debug)]
#[must_use = "deregister it with dereg_mr"]
pub struct Mr {
    pub(super) mhandle: *mut c_void,
    pub(super) comm: usize,
}

// SAFETY: an mhandle is an opaque token; it is only handed back to its own comm.
unsafe impl Send for Mr {}
// SAFETY: as above; `&Mr` only reads the token.
unsafe impl Sync for Mr {}

impl Mr {
    /// The raw `mhandle` (may be NULL: some transports register nothing).
    pub fn as_raw(&self) -> *mut c_void {
        self.mhandle
    }
}

/// One buffer of a grouped receive or flush.
#[derive(Debug, Clone, Copy)]
pub struct RecvBuffer<'a> {
    /// Where the data lands.
    pub data: *mut u8,
    /// Size posted (receives may be larger than the matching send).
    pub size: usize,
    /// Tag the matching send carries (NCCL passes the sender's rank).
    pub tag: i32,
    /// Registration of `data` on this comm.
    pub mr: Option<&'a Mr>,
}

/// A listening endpoint; [`accept`](Self::accept) it until a [`RecvComm`] arrives.
pub struct ListenComm {
    comm: Comm,
}

impl ListenComm {
    /// Wraps a listen comm the plugin returned for `ctx` (`None` if NULL); closed on drop.
    pub fn new(ctx: Arc<CtxInner>, raw: *mut c_void) -> Option<Self> {
        Some(Self {
            comm: Comm::new(ctx, NonNull::new(raw)?, Side::Listen),
        })
    }

    /// `accept`: `Ok(None)` = not yet, call again. NCCL closes the listen comm right
    /// after the first success; a receive comm never depends on it.
    pub fn accept(&mut self) -> Result<Option<RecvComm>, NetError> {
        let s = self.comm.shared();
        let lc = self.comm.raw.as_ptr();
        let mut rc_out = null();
        let mut dev: *mut ncclNetDeviceHandle_v7_t = std::ptr::null_mut();
        let mark = logger::warn_mark();
        // SAFETY: `accept` of the table's version on this listen comm with
        // valid out-pointers; the device-handle slot points to NULL (host memory).
        let rc = unsafe {
            match s.raw.get() {
                TableRef::V6(t) => t.accept.map(|f| f(lc, &mut rc_out)),
                TableRef::V7(t) => t.accept.map(|f| f(lc, &mut rc_out, &mut dev)),
                TableRef::V8(t) => t.accept.map(|f| f(lc, &mut rc_out, &mut dev)),
                TableRef::V9(t) => t.accept.map(|f| f(lc, &mut rc_out, &mut dev)),
                TableRef::V10(t) => t.accept.map(|f| f(lc, &mut rc_out, &mut dev)),
                TableRef::V11(t) => t.accept.map(|f| f(lc, &mut rc_out, &mut dev)),
                TableRef::V12(t) => t.accept.map(|f| f(lc, &mut rc_out, &mut dev)),
            }
        }
        .ok_or_else(|| s.missing("accept"))?;
        let result = s.check("accept", mark, rc);
        let comm = NonNull::new(rc_out).map(|raw| RecvComm {
            comm: Comm::new(Arc::clone(&self.comm.ctx), raw, Side::Recv),
        });
        // On error the returned comm (if any) is closed by its drop.
        result.map(|()| comm)
    }

    /// Closes now, returning the plugin's error if any (dropping also closes).
    pub fn close(self) -> Result<(), NetError> {
        close(self.comm)
    }
}

/// A connection in progress. It owns the 128-byte handle, so the plugin sees the same
/// address on every [`poll`](Self::poll) (plugins keep connect state inside it).
pub struct Connecting {
    ctx: Arc<CtxInner>,
    dev: usize,
    handle: Box<ConnectHandle>,
    done: bool,
}

impl Connecting {
    pub(crate) fn new(ctx: Arc<CtxInner>, dev: usize, handle: &ConnectHandle) -> Self {
        Self {
            ctx,
            dev,
            handle: Box::new(*handle),
            done: false,
        }
    }

    /// One `connect` attempt: `Ok(None)` = not yet, poll again.
    pub fn poll(&mut self) -> Result<Option<SendComm>, NetError> {
        let s = &self.ctx.plugin.shared;
        if self.done {
            return Err(s.refuse("connect", "this connection already completed"));
        }
        let d = dev_int(s, "connect", self.dev)?;
        let h = self.handle.as_mut_ptr().cast::<c_void>();
        debug_assert_eq!(self.handle.len(), NCCL_NET_HANDLE_MAXSIZE);
        let ctx = self.ctx.ctx;
        let mut sc = null();
        let mut dev: *mut ncclNetDeviceHandle_v7_t = std::ptr::null_mut();
        let mark = logger::warn_mark();
        // SAFETY: `connect` of the table's version with the stable handle
        // buffer, valid out-pointers and this context (v11+) or its config (v10,
        // net_v10.cc passes the ctx allocation as `config`).
        let rc = unsafe {
            match s.raw.get() {
                TableRef::V6(t) => t.connect.map(|f| f(d, h, &mut sc)),
                TableRef::V7(t) => t.connect.map(|f| f(d, h, &mut sc, &mut dev)),
                TableRef::V8(t) => t.connect.map(|f| f(d, h, &mut sc, &mut dev)),
                TableRef::V9(t) => t.connect.map(|f| f(d, h, &mut sc, &mut dev)),
                TableRef::V10(t) => t.connect.map(|f| f(d, ctx.cast(), h, &mut sc, &mut dev)),
                TableRef::V11(t) => t.connect.map(|f| f(ctx, d, h, &mut sc, &mut dev)),
                TableRef::V12(t) => t.connect.map(|f| f(ctx, d, h, &mut sc, &mut dev)),
            }
        }
        .ok_or_else(|| s.missing("connect"))?;
        let result = s.check("connect", mark, rc);
        // NCCL calls closeSend on a non-NULL sendComm when connect fails: the drop does.
        let comm = NonNull::new(sc).map(|raw| SendComm {
            comm: Comm::new(Arc::clone(&self.ctx), raw, Side::Send),
        });
        result?;
        self.done = comm.is_some();
        Ok(comm)
    }
}

/// The sending side of a connection; closed on drop.
pub struct SendComm {
    pub(super) comm: Comm,
}

/// The receiving side of a connection; closed on drop.
pub struct RecvComm {
    pub(super) comm: Comm,
}

fn close(mut comm: Comm) -> Result<(), NetError> {
    // Marks the comm closed, so its drop does not close it again.
    comm.close()
}

macro_rules! registration_methods {
    () => {
        /// `regMr(data, size, type)`: registers memory for use on this comm.
        ///
        /// # Safety
        /// `data` must be valid for `size` bytes of the kind `ptr_type` says
        /// (`NCCL_PTR_HOST`/`NCCL_PTR_CUDA`) until the registration is deregistered.
        pub unsafe fn reg_mr(
            &mut self,
            data: *mut u8,
            size: usize,
            ptr_type: i32,
        ) -> Result<Mr, NetError> {
            self.comm.reg_mr(data, size, ptr_type)
        }

        /// `regMrDmaBuf(data, size, type, offset, fd)`.
        ///
        /// # Safety
        /// As [`reg_mr`](Self::reg_mr), and `fd` must be a dma-buf describing `data`.
        pub unsafe fn reg_mr_dmabuf(
            &mut self,
            data: *mut u8,
            size: usize,
            ptr_type: i32,
            offset: u64,
            fd: i32,
        ) -> Result<Mr, NetError> {
            self.comm.reg_mr_dmabuf(data, size, ptr_type, offset, fd)
        }

        /// `deregMr`: releases a registration made on this comm.
        pub fn dereg_mr(&mut self, mr: Mr) -> Result<(), NetError> {
            self.comm.dereg_mr(mr)
        }

        /// The plugin's table name and ABI version (for messages about this comm).
        pub fn plugin(&self) -> (&str, u32) {
            let s = self.comm.shared();
            (&s.name, s.raw.version())
        }

        /// `test(request)`: `Ok(Some(sizes))` once complete (the plugin has then freed
        /// the request; testing it again is refused). An error also ends the request.
        pub fn test(&mut self, request: &mut Request) -> Result<Option<super::Sizes>, NetError> {
            self.comm.owns(request.comm, "test")?;
            request.test(self.comm.shared())
        }

        /// Closes now, returning the plugin's error if any (dropping also closes).
        pub fn close(self) -> Result<(), NetError> {
            close(self.comm)
        }
    };
}

impl SendComm {
    registration_methods!();
}

impl RecvComm {
    registration_methods!();
}
