//! RAII wrappers over the verbs objects: device list, context, PD, CQ, QP, MR.
//!
//! Inners are reference counted so a parent outlives its children (a QP keeps its CQ
//! and PD, a PD keeps its context); every failure names the verbs call and keeps
//! errno ([`VerbsError`]). Destroy failures are logged, never panicked on: a plugin
//! must not abort NCCL while it tears down.

use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use cclkit_abi::{Error, nccl_warn};

use super::loader::Verbs;
use super::sys::*;

/// A failed verbs call: its name and the OS error it left.
#[derive(Debug)]
pub struct VerbsError {
    /// The verbs function, e.g. `"ibv_reg_mr"`.
    pub call: &'static str,
    /// errno as an `io::Error`.
    pub source: io::Error,
}

impl VerbsError {
    /// From a call that returned NULL or -1 and set errno.
    pub fn last(call: &'static str) -> Self {
        Self {
            call,
            source: io::Error::last_os_error(),
        }
    }

    /// From a call that returns an errno value (0 = success), as most `ibv_*` calls
    /// that return `int` do; a negative return means "see errno".
    pub fn check(call: &'static str, ret: c_int) -> Result<(), Self> {
        match ret {
            0 => Ok(()),
            r if r > 0 => Err(Self {
                call,
                source: io::Error::from_raw_os_error(r),
            }),
            _ => Err(Self::last(call)),
        }
    }

    /// The operation is not supported by this kernel, library or device.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self.source.raw_os_error(),
            Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOSYS)
        )
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unsupported() {
            write!(f, "{}: unsupported ({})", self.call, self.source)
        } else {
            write!(f, "{}: {}", self.call, self.source)
        }
    }
}

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Self {
        if e.is_unsupported() {
            Error::internal(e.to_string())
        } else {
            Error::system(e.to_string())
        }
    }
}

/// `ibv_get_device_list`: the HCAs, to be opened before the list is dropped.
pub struct DeviceList {
    verbs: &'static Verbs,
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Lists the devices. NULL (no uverbs support in the kernel: errno ENOSYS) is an
    /// error here; the caller turns it into "no RDMA devices".
    pub fn new(verbs: &'static Verbs) -> Result<Self, VerbsError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        let list = unsafe { (verbs.get_device_list)(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| VerbsError::last("ibv_get_device_list"))?;
        Ok(Self {
            verbs,
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the kernel has RDMA support but no device.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn device(&self, i: usize) -> Option<*mut ibv_device> {
        if i >= self.len {
            return None;
        }
        // SAFETY: the array holds `len` valid entries until it is freed in Drop.
        let d = unsafe { self.list.as_ptr().add(i).read() };
        (!d.is_null()).then_some(d)
    }

    /// Name of device `i` (`mlx5_0`, …).
    pub fn name(&self, i: usize) -> Option<String> {
        let d = self.device(i)?;
        // SAFETY: `d` is a live device of the list; the name is a NUL-terminated
        // string owned by it.
        let name = unsafe { (self.verbs.get_device_name)(d) };
        if name.is_null() {
            return None;
        }
        // SAFETY: non-NULL names are NUL-terminated C strings owned by the list.
        let name = unsafe { CStr::from_ptr(name) };
        Some(name.to_string_lossy().into_owned())
    }

    /// `ibv_open_device` on device `i`; the context stays valid after the list is freed.
    pub fn open(&self, i: usize) -> Result<Context, VerbsError> {
        let d = self.device(i).ok_or(VerbsError {
            call: "ibv_open_device",
            source: io::Error::from_raw_os_error(libc::ENODEV),
        })?;
        // SAFETY: `d` is a live device of the list.
        let ctx = unsafe { (self.verbs.open_device)(d) };
        let ctx = NonNull::new(ctx).ok_or_else(|| VerbsError::last("ibv_open_device"))?;
        Ok(Context(Arc::new(ContextInner {
            verbs: self.verbs,
            ctx,
        })))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { (self.verbs.free_device_list)(self.list.as_ptr()) };
    }
}

struct ContextInner {
    verbs: &'static Verbs,
    ctx: NonNull<ibv_context>,
}

// SAFETY: verbs objects may be used from any thread (rdma-core's verbs are thread
// safe); the pointer is only freed in Drop, when no other reference remains.
unsafe impl Send for ContextInner {}
// SAFETY: as above; shared use only issues thread-safe verbs calls.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: every child (PD, CQ, …) holds an Arc to this inner, so none is left.
        let r = unsafe { (self.verbs.close_device)(self.ctx.as_ptr()) };
        if let Err(e) = VerbsError::check("ibv_close_device", r) {
            nccl_warn!("NET/cclkit-ib: {e}");
        }
    }
}

/// An open device (`ibv_context`).
#[derive(Clone)]
pub struct Context(Arc<ContextInner>);

impl Context {
    /// The library table.
    pub fn verbs(&self) -> &'static Verbs {
        self.0.verbs
    }

    /// The raw context.
    pub fn as_raw(&self) -> *mut ibv_context {
        self.0.ctx.as_ptr()
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<ibv_device_attr, VerbsError> {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer.
        let r = unsafe { (self.0.verbs.query_device)(self.as_raw(), &mut attr) };
        VerbsError::check("ibv_query_device", r).map(|()| attr)
    }

    /// `ibv_query_port` (zeroed first: the exported symbol fills the compat prefix).
    pub fn query_port(&self, port: u8) -> Result<ibv_port_attr, VerbsError> {
        let mut attr = ibv_port_attr::default();
        // SAFETY: live context, valid out-pointer of the full struct.
        let r = unsafe { (self.0.verbs.query_port)(self.as_raw(), port, &mut attr) };
        VerbsError::check("ibv_query_port", r).map(|()| attr)
    }

    /// `ibv_query_gid`.
    pub fn query_gid(&self, port: u8, index: c_int) -> Result<[u8; 16], VerbsError> {
        let mut gid = ibv_gid::default();
        // SAFETY: live context, valid out-pointer.
        let r = unsafe { (self.0.verbs.query_gid)(self.as_raw(), port, index, &mut gid) };
        VerbsError::check("ibv_query_gid", r).map(|()| gid.raw)
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd, VerbsError> {
        // SAFETY: live context.
        let pd = unsafe { (self.0.verbs.alloc_pd)(self.as_raw()) };
        let pd = NonNull::new(pd).ok_or_else(|| VerbsError::last("ibv_alloc_pd"))?;
        Ok(Pd(Arc::new(PdInner {
            ctx: self.clone(),
            pd,
        })))
    }

    /// `ibv_create_cq` with `cqe` entries, no completion channel.
    pub fn create_cq(&self, cqe: c_int) -> Result<Cq, VerbsError> {
        // SAFETY: live context; NULL channel and cq_context are allowed.
        let cq = unsafe {
            (self.0.verbs.create_cq)(
                self.as_raw(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| VerbsError::last("ibv_create_cq"))?;
        Ok(Cq(Arc::new(CqInner {
            ctx: self.clone(),
            cq,
        })))
    }
}

struct PdInner {
    ctx: Context,
    pd: NonNull<ibv_pd>,
}

// SAFETY: see ContextInner.
unsafe impl Send for PdInner {}
// SAFETY: see ContextInner.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs hold an Arc to this inner, so none is left.
        let r = unsafe { (self.ctx.verbs().dealloc_pd)(self.pd.as_ptr()) };
        if let Err(e) = VerbsError::check("ibv_dealloc_pd", r) {
            nccl_warn!("NET/cclkit-ib: {e}");
        }
    }
}

/// A protection domain.
#[derive(Clone)]
pub struct Pd(Arc<PdInner>);

impl Pd {
    /// The raw PD.
    pub fn as_raw(&self) -> *mut ibv_pd {
        self.0.pd.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        &self.0.ctx
    }

    /// `ibv_reg_mr`, or `ibv_reg_mr_iova2` when `access` has optional flags (relaxed
    /// ordering), as verbs.h's inline `__ibv_reg_mr` does.
    ///
    /// # Safety
    /// `[addr, addr+len)` must stay allocated until the MR is dropped.
    pub unsafe fn reg_mr(&self, addr: usize, len: usize, access: c_int) -> Result<Mr, VerbsError> {
        let verbs = self.0.ctx.verbs();
        let optional = access & !(IBV_ACCESS_RELAXED_ORDERING - 1) != 0;
        // SAFETY: live PD; memory validity is the caller's contract.
        let mr = unsafe {
            match (optional, verbs.reg_mr_iova2) {
                (true, Some(iova2)) => iova2(
                    self.as_raw(),
                    addr as *mut c_void,
                    len,
                    addr as u64,
                    access as u32,
                ),
                (true, None) => (verbs.reg_mr)(
                    self.as_raw(),
                    addr as *mut c_void,
                    len,
                    access & (IBV_ACCESS_RELAXED_ORDERING - 1),
                ),
                (false, _) => (verbs.reg_mr)(self.as_raw(), addr as *mut c_void, len, access),
            }
        };
        self.wrap_mr(mr, "ibv_reg_mr")
    }

    /// `ibv_reg_dmabuf_mr` of `len` bytes at `offset` in dma-buf `fd`, mapped at `iova`.
    pub fn reg_dmabuf_mr(
        &self,
        offset: u64,
        len: usize,
        iova: u64,
        fd: c_int,
        access: c_int,
    ) -> Result<Mr, VerbsError> {
        let Some(reg) = self.0.ctx.verbs().reg_dmabuf_mr else {
            return Err(VerbsError {
                call: "ibv_reg_dmabuf_mr",
                source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            });
        };
        // SAFETY: live PD; the kernel validates the fd and range (a dma-buf keeps
        // its pages pinned by itself, so no memory contract applies here).
        let mr = unsafe { reg(self.as_raw(), offset, len, iova, fd, access) };
        self.wrap_mr(mr, "ibv_reg_dmabuf_mr")
    }

    fn wrap_mr(&self, mr: *mut ibv_mr, call: &'static str) -> Result<Mr, VerbsError> {
        let mr = NonNull::new(mr).ok_or_else(|| VerbsError::last(call))?;
        Ok(Mr {
            pd: self.clone(),
            mr,
            live: true,
        })
    }

    /// `ibv_create_qp` (RC) on `cq` for both directions.
    pub fn create_rc_qp(&self, cq: &Cq, cap: ibv_qp_cap) -> Result<Qp, VerbsError> {
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.as_raw(),
            recv_cq: cq.as_raw(),
            srq: std::ptr::null_mut(),
            cap,
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQ (same context), valid init attributes.
        let qp = unsafe { (self.0.ctx.verbs().create_qp)(self.as_raw(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(|| VerbsError::last("ibv_create_qp"))?;
        Ok(Qp {
            _pd: self.clone(),
            _cq: cq.clone(),
            qp,
        })
    }
}

/// A memory registration; deregistered on drop (or explicitly by [`Mr::dereg`]).
pub struct Mr {
    pd: Pd,
    mr: NonNull<ibv_mr>,
    live: bool,
}

// SAFETY: see ContextInner; the MR struct is read-only after registration.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    fn release(&mut self) -> Result<(), VerbsError> {
        if !std::mem::replace(&mut self.live, false) {
            return Ok(());
        }
        // SAFETY: the MR is live and, with `live` now false, deregistered only here.
        let r = unsafe { (self.pd.context().verbs().dereg_mr)(self.mr.as_ptr()) };
        VerbsError::check("ibv_dereg_mr", r)
    }

    /// `ibv_dereg_mr`, reporting failure.
    pub fn dereg(mut self) -> Result<(), VerbsError> {
        self.release()
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            nccl_warn!("NET/cclkit-ib: {e}");
        }
    }
}

struct CqInner {
    ctx: Context,
    cq: NonNull<ibv_cq>,
}

// SAFETY: see ContextInner; the owning comm serialises polls.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: QPs hold an Arc to this inner, so none is attached any more.
        let r = unsafe { (self.ctx.verbs().destroy_cq)(self.cq.as_ptr()) };
        if let Err(e) = VerbsError::check("ibv_destroy_cq", r) {
            nccl_warn!("NET/cclkit-ib: {e}");
        }
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct Cq(Arc<CqInner>);

impl Cq {
    /// The raw CQ.
    pub fn as_raw(&self) -> *mut ibv_cq {
        self.0.cq.as_ptr()
    }

    /// `ibv_poll_cq` (through the provider's ops) into `out`; returns how many.
    pub fn poll(&self, out: &mut [ibv_wc]) -> Result<usize, VerbsError> {
        // SAFETY: live context; `ops` is filled by the provider at open.
        let poll = unsafe { (*self.0.ctx.as_raw()).ops.poll_cq };
        let poll = poll.ok_or(VerbsError {
            call: "ibv_poll_cq",
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        })?;
        let n = c_int::try_from(out.len()).unwrap_or(c_int::MAX);
        // SAFETY: live CQ; `out` holds at least `n` entries.
        let r = unsafe { poll(self.as_raw(), n, out.as_mut_ptr()) };
        usize::try_from(r).map_err(|_| VerbsError::last("ibv_poll_cq"))
    }
}

/// A queue pair; destroyed on drop.
pub struct Qp {
    _pd: Pd,
    _cq: Cq,
    qp: NonNull<ibv_qp>,
}

// SAFETY: see ContextInner; the owning comm serialises posts.
unsafe impl Send for Qp {}

impl Qp {
    /// The raw QP.
    pub fn as_raw(&self) -> *mut ibv_qp {
        self.qp.as_ptr()
    }

    /// QP number.
    pub fn num(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    /// `ibv_modify_qp`.
    pub fn modify(&mut self, attr: &mut ibv_qp_attr, mask: c_int) -> Result<(), VerbsError> {
        // SAFETY: live QP, valid attributes.
        let r = unsafe { (self._pd.context().verbs().modify_qp)(self.qp.as_ptr(), attr, mask) };
        VerbsError::check("ibv_modify_qp", r)
    }

    /// `ibv_post_send` of a linked list of work requests.
    ///
    /// # Safety
    /// `wr` must head a valid, NULL-terminated chain whose SGEs reference registered
    /// memory that stays valid until the work completes.
    pub unsafe fn post_send(&mut self, wr: *mut ibv_send_wr) -> Result<(), VerbsError> {
        // SAFETY: live context; `ops` is filled by the provider at open.
        let post = unsafe { (*(*self.qp.as_ptr()).context).ops.post_send };
        let post = post.ok_or(VerbsError {
            call: "ibv_post_send",
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        })?;
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; chain validity is the caller's contract.
        let r = unsafe { post(self.qp.as_ptr(), wr, &mut bad) };
        VerbsError::check("ibv_post_send", r)
    }

    /// `ibv_post_recv` of a linked list of receive requests.
    ///
    /// # Safety
    /// As [`Qp::post_send`].
    pub unsafe fn post_recv(&mut self, wr: *mut ibv_recv_wr) -> Result<(), VerbsError> {
        // SAFETY: live context; `ops` is filled by the provider at open.
        let post = unsafe { (*(*self.qp.as_ptr()).context).ops.post_recv };
        let post = post.ok_or(VerbsError {
            call: "ibv_post_recv",
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        })?;
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; chain validity is the caller's contract.
        let r = unsafe { post(self.qp.as_ptr(), wr, &mut bad) };
        VerbsError::check("ibv_post_recv", r)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: live QP, destroyed once; its PD and CQ outlive it (fields dropped after).
        let r = unsafe { (self._pd.context().verbs().destroy_qp)(self.qp.as_ptr()) };
        if let Err(e) = VerbsError::check("ibv_destroy_qp", r) {
            nccl_warn!("NET/cclkit-ib: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_call_and_keep_errno() {
        let e = VerbsError::check("ibv_modify_qp", libc::EINVAL).unwrap_err();
        assert_eq!(e.source.raw_os_error(), Some(libc::EINVAL));
        assert!(e.to_string().starts_with("ibv_modify_qp: "), "{e}");
        assert!(!e.is_unsupported());
        let err: Error = e.into();
        assert_eq!(
            err.code(),
            cclkit_abi::raw::common::NcclResult::SYSTEM_ERROR
        );

        let e = VerbsError::check("ibv_reg_dmabuf_mr", libc::EOPNOTSUPP).unwrap_err();
        assert!(e.is_unsupported());
        assert!(
            e.to_string().contains("ibv_reg_dmabuf_mr: unsupported"),
            "{e}"
        );
        assert!(VerbsError::check("ibv_dereg_mr", 0).is_ok());
    }
}
