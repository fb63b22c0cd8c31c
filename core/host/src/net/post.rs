//! Posting data: `isend`, grouped `irecv`, `iflush`, `irecvConsumed`, with the size
//! rules of NCCL's version shims.

use std::ffi::{c_int, c_void};

use cclkit_abi::raw::net::{MAX_NET_SIZE, NCCL_NET_OPTIONAL_RECV_COMPLETION};

use super::comm::{MAX_GROUPED, Mr, RecvBuffer, RecvComm, SendComm};

/// Stack arrays for up to this many buffers avoid zeroing 64-entry arrays per call.
const SMALL_GROUP: usize = 8;
use super::request::{ReqKind, Request, RequestId};
use super::table::{TableRef, common_slot};
use super::{NetError, null};
use crate::logger;

impl SendComm {
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
        // SAFETY: forwarded caller contract; a NULL phandle asks for no events.
        unsafe { self.isend_profiled(data, size, tag, mr, null()) }
    }

    /// [`isend`](Self::isend) with the request's profiler `phandle` (net v10+; older
    /// tables have no slot for it and never see it). NULL means "no events".
    ///
    /// # Safety
    /// As [`isend`](Self::isend); `phandle` is NULL or a
    /// [`StepHandle`](crate::profiler::callback::StepHandle) that stays at its address
    /// until the request completes or the comm is closed.
    pub unsafe fn isend_profiled(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        mr: Option<&Mr>,
        phandle: *mut c_void,
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
        // keeps `data` valid and `phandle` (v10+) NULL or live.
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
                    .map(|f| Ok(f(c, d, size, tag, mh, phandle, &mut req))),
                TableRef::V11(t) => t
                    .isend
                    .map(|f| Ok(f(c, d, size, tag, mh, phandle, &mut req))),
                TableRef::V12(t) => t
                    .isend
                    .map(|f| Ok(f(c, d, size, tag, mh, phandle, &mut req))),
            }
        }
        .ok_or_else(|| s.missing("isend"))??;
        s.check("isend", mark, rc)?;
        Ok(Request::new(req, self.comm.id(), ReqKind::Send))
    }
}

impl RecvComm {
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
        // SAFETY: forwarded caller contract; no phandles ask for no events.
        unsafe { self.irecv_profiled(bufs, optional_completion, &[]) }
    }

    /// [`irecv`](Self::irecv) with one profiler `phandle` per buffer (net v10+; older
    /// tables never see them). `phandles` is empty (all NULL) or one per buffer.
    ///
    /// # Safety
    /// As [`irecv`](Self::irecv); every phandle is NULL or a
    /// [`StepHandle`](crate::profiler::callback::StepHandle) that stays at its address
    /// until the request completes or the comm is closed.
    pub unsafe fn irecv_profiled(
        &mut self,
        bufs: &[RecvBuffer<'_>],
        optional_completion: bool,
        phandles: &[*mut c_void],
    ) -> Result<Option<Request>, NetError> {
        let n = self.check_group("irecv", bufs)?;
        if !phandles.is_empty() && phandles.len() != bufs.len() {
            return Err(self.comm.shared().refuse(
                "irecv",
                format!("{} phandles for {} buffers", phandles.len(), bufs.len()),
            ));
        }
        // Small groups (the common case, n = 1) use small stack arrays.
        if bufs.len() <= SMALL_GROUP {
            // SAFETY: forwarded caller contract.
            unsafe { self.irecv_with::<SMALL_GROUP>(n, bufs, optional_completion, phandles) }
        } else {
            // SAFETY: forwarded caller contract.
            unsafe { self.irecv_with::<MAX_GROUPED>(n, bufs, optional_completion, phandles) }
        }
    }

    /// `irecv` with arrays of `N ≥ bufs.len()` entries.
    ///
    /// # Safety
    /// As [`irecv_profiled`](Self::irecv_profiled).
    unsafe fn irecv_with<const N: usize>(
        &mut self,
        n: c_int,
        bufs: &[RecvBuffer<'_>],
        optional_completion: bool,
        phandles: &[*mut c_void],
    ) -> Result<Option<Request>, NetError> {
        let s = self.comm.shared();
        let mut data = [null(); N];
        let mut sizes = [0usize; N];
        let mut sizes_int = [0 as c_int; N];
        let mut tags = [0 as c_int; N];
        let mut mhs = [null(); N];
        let mut phs = [null(); N];
        phs[..phandles.len()].copy_from_slice(phandles);
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
        // array; the caller keeps the buffers valid and phandles (v10+) NULL or live.
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
