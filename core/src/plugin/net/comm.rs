//! Listen, send and receive comms: connection setup, memory registration, posting.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use cclkit_abi::net::Sizes as AbiSizes;
use cclkit_abi::raw::net::{
    MAX_NET_SIZE, NCCL_NET_HANDLE_MAXSIZE, NCCL_NET_OPTIONAL_RECV_COMPLETION,
    ncclNetDeviceHandle_v7_t,
};

use super::context::{CtxInner, dev_int};
use super::request::{ReqKind, Request, RequestId};
use super::table::{TableRef, common_slot};
use super::{ConnectHandle, NetError, NetShared, null};
use crate::plugin::logger;

/// Most buffers in one grouped receive or flush (NCCL's `int sizes[64]` for `test`).
pub const MAX_GROUPED: usize = AbiSizes::MAX;

/// A comm handle as the plugin returned it, closed on drop.
struct Comm {
    ctx: Arc<CtxInner>,
    raw: NonNull<c_void>,
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
    fn shared(&self) -> &NetShared {
        &self.ctx.plugin.shared
    }

    fn id(&self) -> usize {
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

    fn owns(&self, comm: usize, call: &'static str) -> Result<(), NetError> {
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
    mhandle: *mut c_void,
    comm: usize,
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
    pub(crate) fn new(ctx: Arc<CtxInner>, raw: *mut c_void) -> Option<Self> {
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
    comm: Comm,
}

/// The receiving side of a connection; closed on drop.
pub struct RecvComm {
    comm: Comm,
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

    /// `isend(data, size, tag, mhandle)`: `Ok(None)` = not now, post again later.
    ///
    /// Sizes over 1 GiB are refused for net v6–v8 (their `int` size), as NCCL does.
    ///
    /// # Safety
    /// `data` must stay valid for `size` bytes, and unmodified, until the request
    /// completes or the comm is closed.
    pub unsafe fn isend(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        mr: Option<&Mr>,
    ) -> Result<Option<Request>, NetError> {
        let s = self.comm.shared();
        if let Some(m) = mr {
            self.comm.owns(m.comm, "isend")?;
        }
        let (c, d) = (self.comm.raw.as_ptr(), data.cast_mut().cast::<c_void>());
        let mh = mr.map_or(null(), |m| m.mhandle);
        let mut req = null();
        let narrow = || {
            if size > MAX_NET_SIZE {
                return Err(s.refuse(
                    "isend",
                    format!("{size} bytes: net v{} sends at most 1 GiB", s.raw.version()),
                ));
            }
            Ok(size as c_int)
        };
        let mark = logger::warn_mark();
        // SAFETY: `isend` of the table's version on this comm; the caller
        // keeps `data` valid; `phandle` (v10+) is NULL (no profiler).
        let rc = unsafe {
            match s.raw.get() {
                TableRef::V6(t) => t
                    .isend
                    .map(|f| narrow().map(|n| f(c, d, n, tag, mh, &mut req))),
                TableRef::V7(t) => t
                    .isend
                    .map(|f| narrow().map(|n| f(c, d, n, tag, mh, &mut req))),
                TableRef::V8(t) => t
                    .isend
                    .map(|f| narrow().map(|n| f(c, d, n, tag, mh, &mut req))),
                TableRef::V9(t) => t.isend.map(|f| Ok(f(c, d, size, tag, mh, &mut req))),
                TableRef::V10(t) => t
                    .isend
                    .map(|f| Ok(f(c, d, size, tag, mh, null(), &mut req))),
                TableRef::V11(t) => t
                    .isend
                    .map(|f| Ok(f(c, d, size, tag, mh, null(), &mut req))),
                TableRef::V12(t) => t
                    .isend
                    .map(|f| Ok(f(c, d, size, tag, mh, null(), &mut req))),
            }
        }
        .ok_or_else(|| s.missing("isend"))??;
        s.check("isend", mark, rc)?;
        Ok(Request::new(req, self.comm.id(), ReqKind::Send))
    }
}

impl RecvComm {
    registration_methods!();

    /// `irecv` of 1 to 64 buffers as one request: `Ok(None)` = not now, post again.
    ///
    /// With `optional_completion`, `*request` holds NCCL's sentinel
    /// (`NCCL_NET_OPTIONAL_RECV_COMPLETION`) before the call for v9+ plugins (v6–v8
    /// shims clear it); a plugin that leaves the sentinel in place is an error.
    ///
    /// # Safety
    /// Every `data` must stay valid for its `size` bytes, untouched by others, until
    /// the request completes or the comm is closed.
    pub unsafe fn irecv(
        &mut self,
        bufs: &[RecvBuffer<'_>],
        optional_completion: bool,
    ) -> Result<Option<Request>, NetError> {
        let s = self.comm.shared();
        let n = self.check_group("irecv", bufs)?;
        let mut data = [null(); MAX_GROUPED];
        let mut sizes = [0usize; MAX_GROUPED];
        let mut sizes_int = [0 as c_int; MAX_GROUPED];
        let mut tags = [0 as c_int; MAX_GROUPED];
        let mut mhs = [null(); MAX_GROUPED];
        let mut phs = [null(); MAX_GROUPED];
        let narrow_int = s.raw.version() <= 8;
        for (i, b) in bufs.iter().enumerate() {
            data[i] = b.data.cast();
            sizes[i] = b.size;
            tags[i] = b.tag;
            mhs[i] = b.mr.map_or(null(), |m| m.mhandle);
            if narrow_int {
                if b.size > MAX_NET_SIZE {
                    return Err(s.refuse(
                        "irecv",
                        format!(
                            "{} bytes: net v{} receives at most 1 GiB",
                            b.size,
                            s.raw.version()
                        ),
                    ));
                }
                sizes_int[i] = b.size as c_int;
            }
        }
        let sentinel = NCCL_NET_OPTIONAL_RECV_COMPLETION as *mut c_void;
        let mut req = if optional_completion && !narrow_int {
            sentinel
        } else {
            null()
        };
        let c = self.comm.raw.as_ptr();
        let (dp, tp, mp) = (data.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr());
        let mark = logger::warn_mark();
        // SAFETY: `irecv` of the table's version with `n` entries in every
        // array; the caller keeps the buffers valid; phandles (v10+) are NULL.
        let rc = unsafe {
            match s.raw.get() {
                TableRef::V6(t) => t
                    .irecv
                    .map(|f| f(c, n, dp, sizes_int.as_mut_ptr(), tp, mp, &mut req)),
                TableRef::V7(t) => t
                    .irecv
                    .map(|f| f(c, n, dp, sizes_int.as_mut_ptr(), tp, mp, &mut req)),
                TableRef::V8(t) => t
                    .irecv
                    .map(|f| f(c, n, dp, sizes_int.as_mut_ptr(), tp, mp, &mut req)),
                TableRef::V9(t) => t
                    .irecv
                    .map(|f| f(c, n, dp, sizes.as_mut_ptr(), tp, mp, &mut req)),
                TableRef::V10(t) => t.irecv.map(|f| {
                    f(
                        c,
                        n,
                        dp,
                        sizes.as_mut_ptr(),
                        tp,
                        mp,
                        phs.as_mut_ptr(),
                        &mut req,
                    )
                }),
                TableRef::V11(t) => t.irecv.map(|f| {
                    f(
                        c,
                        n,
                        dp,
                        sizes.as_mut_ptr(),
                        tp,
                        mp,
                        phs.as_mut_ptr(),
                        &mut req,
                    )
                }),
                TableRef::V12(t) => t.irecv.map(|f| {
                    f(
                        c,
                        n,
                        dp,
                        sizes.as_mut_ptr(),
                        tp,
                        mp,
                        phs.as_mut_ptr(),
                        &mut req,
                    )
                }),
            }
        }
        .ok_or_else(|| s.missing("irecv"))?;
        s.check("irecv", mark, rc)?;
        if req == sentinel {
            return Err(s.refuse(
                "irecv",
                "the plugin returned success but left NCCL_NET_OPTIONAL_RECV_COMPLETION in \
                 *request; it must store a pollable request or NULL",
            ));
        }
        Ok(Request::new(req, self.comm.id(), ReqKind::Recv(bufs.len())))
    }

    /// `iflush` of received GPU data: `Ok(None)` = nothing to wait for (NCCL treats a
    /// NULL request as complete). Sizes are `int` in every version.
    ///
    /// # Safety
    /// As [`irecv`](Self::irecv).
    pub unsafe fn iflush(&mut self, bufs: &[RecvBuffer<'_>]) -> Result<Option<Request>, NetError> {
        let s = self.comm.shared();
        let n = self.check_group("iflush", bufs)?;
        let f = common_slot!(s.raw, iflush).ok_or_else(|| s.missing("iflush"))?;
        let mut data = [null(); MAX_GROUPED];
        let mut sizes = [0 as c_int; MAX_GROUPED];
        let mut mhs = [null(); MAX_GROUPED];
        for (i, b) in bufs.iter().enumerate() {
            data[i] = b.data.cast();
            sizes[i] = c_int::try_from(b.size).map_err(|_| {
                s.refuse(
                    "iflush",
                    format!("{} bytes do not fit iflush's int", b.size),
                )
            })?;
            mhs[i] = b.mr.map_or(null(), |m| m.mhandle);
        }
        let mut req = null();
        let mark = logger::warn_mark();
        // SAFETY: `iflush` with `n` entries per array on this comm; buffers kept valid.
        let rc = unsafe {
            f(
                self.comm.raw.as_ptr(),
                n,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            )
        };
        s.check("iflush", mark, rc)?;
        Ok(Request::new(req, self.comm.id(), ReqKind::Flush))
    }

    /// `irecvConsumed(n, request)` (v7+): the data of a completed receive was consumed.
    /// Returns `Ok(false)` when the plugin has no such hook.
    pub fn irecv_consumed(&mut self, n: usize, request: RequestId) -> Result<bool, NetError> {
        let s = self.comm.shared();
        self.comm.owns(request.comm, "irecvConsumed")?;
        let f = match s.raw.get() {
            TableRef::V6(_) => None,
            TableRef::V7(t) => t.irecvConsumed,
            TableRef::V8(t) => t.irecvConsumed,
            TableRef::V9(t) => t.irecvConsumed,
            TableRef::V10(t) => t.irecvConsumed,
            TableRef::V11(t) => t.irecvConsumed,
            TableRef::V12(t) => t.irecvConsumed,
        };
        let Some(f) = f else { return Ok(false) };
        let n = c_int::try_from(n).map_err(|_| s.refuse("irecvConsumed", "n out of range"))?;
        let mark = logger::warn_mark();
        // SAFETY: the request value is only an identifier here (NCCL_ABI.md §2.11).
        let rc = unsafe { f(self.comm.raw.as_ptr(), n, request.raw as *mut c_void) };
        s.check("irecvConsumed", mark, rc).map(|()| true)
    }

    fn check_group(&self, call: &'static str, bufs: &[RecvBuffer<'_>]) -> Result<c_int, NetError> {
        let s = self.comm.shared();
        if bufs.is_empty() || bufs.len() > MAX_GROUPED {
            return Err(s.refuse(
                call,
                format!("{} buffers; 1 to {MAX_GROUPED} allowed", bufs.len()),
            ));
        }
        for b in bufs {
            if let Some(m) = b.mr {
                self.comm.owns(m.comm, call)?;
            }
        }
        Ok(bufs.len() as c_int)
    }
}
