//! RAII wrappers for fabric, domain, completion queue, address vector, endpoint
//! and memory region. Each child holds an `Arc` of its parents, so `fi_close`
//! always runs children first. Objects are opened with `FI_THREAD_SAFE`, which is
//! what makes them `Sync`.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use super::error::{FiError, FiResult, check};
use super::info::InfoRef;
use crate::sys;

/// `FI_ADDR_UNSPEC`: receive from any source.
pub const ADDR_UNSPEC: u64 = u64::MAX;

/// Closes a fid; a failure is only logged (Drop cannot report it).
fn close(fid: *mut sys::fid, what: &str) {
    // SAFETY: callers pass a live fid they own, exactly once.
    let ret = unsafe { sys::fi_close(fid) };
    if ret != 0 {
        cclkit_abi::nccl_warn!(
            "NET/OFI: {}",
            FiError::new("fi_close", i64::from(ret)).with_detail(what.to_owned())
        );
    }
}

macro_rules! fid_wrapper {
    ($(#[$doc:meta])* $name:ident, $raw:ty { $($field:ident : $fty:ty),* }) => {
        $(#[$doc])*
        pub struct $name {
            raw: NonNull<$raw>,
            $($field: $fty,)*
        }
        // SAFETY: opened with FI_THREAD_SAFE: libfabric serialises concurrent calls
        // on this object internally, and the parents it needs are kept alive by Arc.
        unsafe impl Send for $name {}
        // SAFETY: as above.
        unsafe impl Sync for $name {}
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: every fid struct starts with `struct fid`.
                close(self.raw.as_ptr().cast(), stringify!($name));
            }
        }
        impl $name {
            /// The raw object, for calls this layer does not wrap.
            pub fn as_raw(&self) -> *mut $raw {
                self.raw.as_ptr()
            }
        }
    };
}

fid_wrapper!(
    /// A fabric (`fi_fabric`).
    Fabric, sys::fid_fabric {}
);
fid_wrapper!(
    /// A domain (`fi_domain`), i.e. one NIC of one provider.
    Domain, sys::fid_domain { _fabric: Arc<Fabric> }
);
fid_wrapper!(
    /// A completion queue in `FI_CQ_FORMAT_TAGGED`.
    Cq, sys::fid_cq { _domain: Arc<Domain> }
);
fid_wrapper!(
    /// An address vector.
    Av, sys::fid_av { _domain: Arc<Domain> }
);
fid_wrapper!(
    /// A reliable-datagram endpoint bound to one CQ and one AV.
    Endpoint, sys::fid_ep { _domain: Arc<Domain>, _cq: Arc<Cq>, _av: Arc<Av> }
);
fid_wrapper!(
    /// A memory registration.
    Mr, sys::fid_mr { _domain: Arc<Domain> }
);

fn opened<T>(call: &'static str, ret: i32, raw: *mut T) -> FiResult<NonNull<T>> {
    check(call, i64::from(ret))?;
    NonNull::new(raw).ok_or_else(|| FiError::new(call, i64::from(sys::FI_EOTHER)))
}

impl Fabric {
    /// Opens the fabric of `info`.
    pub fn open(info: InfoRef<'_>) -> FiResult<Arc<Self>> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `info` is a live fi_info whose fabric_attr is filled by fi_getinfo.
        let ret =
            unsafe { sys::fi_fabric((*info.as_ptr()).fabric_attr, &mut raw, std::ptr::null_mut()) };
        Ok(Arc::new(Self {
            raw: opened("fi_fabric", ret, raw)?,
        }))
    }
}

impl Domain {
    /// Opens the domain of `info` on `fabric`.
    pub fn open(fabric: &Arc<Fabric>, info: InfoRef<'_>) -> FiResult<Arc<Self>> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: live fabric and info.
        let ret = unsafe {
            sys::fi_domain(
                fabric.as_raw(),
                info.as_ptr(),
                &mut raw,
                std::ptr::null_mut(),
            )
        };
        Ok(Arc::new(Self {
            raw: opened("fi_domain", ret, raw)?,
            _fabric: Arc::clone(fabric),
        }))
    }
}

impl Cq {
    /// Opens a tagged-format CQ with no wait object (progress is polled).
    pub fn open(domain: &Arc<Domain>) -> FiResult<Arc<Self>> {
        let mut attr = sys::fi_cq_attr {
            format: sys::FI_CQ_FORMAT_TAGGED,
            wait_obj: sys::FI_WAIT_NONE,
            ..Default::default()
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: live domain; `attr` is read during the call only.
        let ret =
            unsafe { sys::fi_cq_open(domain.as_raw(), &mut attr, &mut raw, std::ptr::null_mut()) };
        Ok(Arc::new(Self {
            raw: opened("fi_cq_open", ret, raw)?,
            _domain: Arc::clone(domain),
        }))
    }

    /// Reads up to `out.len()` completions. `Ok(0)` when there are none;
    /// `Err` with code `FI_EAVAIL` when an error completion waits for [`Cq::read_err`].
    pub fn read(&self, out: &mut [sys::fi_cq_tagged_entry]) -> FiResult<usize> {
        // SAFETY: live CQ in tagged format; `out` has room for `out.len()` entries.
        let ret = unsafe { sys::fi_cq_read(self.as_raw(), out.as_mut_ptr().cast(), out.len()) };
        match check("fi_cq_read", ret as i64) {
            Ok(n) => Ok(n as usize),
            Err(e) if e.is_again() => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Reads one error completion, with the provider's text from `fi_cq_strerror`.
    pub fn read_err(&self) -> FiResult<Option<CqError>> {
        let mut entry = sys::fi_cq_err_entry::default();
        // SAFETY: live CQ; `entry` is a zeroed err entry (err_data_size 0 lets the
        // provider use its own buffer, valid until the next call on this CQ).
        let ret = unsafe { sys::fi_cq_readerr(self.as_raw(), &mut entry, 0) };
        match check("fi_cq_readerr", ret as i64) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(e) if e.is_again() => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: live CQ; err_data came from this CQ's last readerr; `buf` is writable.
        let text = unsafe {
            let p = sys::fi_cq_strerror(
                self.as_raw(),
                entry.prov_errno,
                entry.err_data,
                buf.as_mut_ptr(),
                buf.len(),
            );
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Ok(Some(CqError {
            op_context: entry.op_context,
            flags: entry.flags,
            err: entry.err,
            prov_errno: entry.prov_errno,
            len: entry.len,
            olen: entry.olen,
            text,
        }))
    }
}

/// An error completion (`fi_cq_err_entry`) with its provider text.
#[derive(Debug)]
pub struct CqError {
    /// The context of the failed operation (undefined for a peer's operation,
    /// `FI_REMOTE_CQ_DATA` in `flags`).
    pub op_context: *mut c_void,
    /// Completion flags.
    pub flags: u64,
    /// Positive `FI_E*` code.
    pub err: i32,
    /// Provider-specific code.
    pub prov_errno: i32,
    /// Bytes transferred before the error.
    pub len: usize,
    /// Overflow length (for `FI_ETRUNC`: bytes that did not fit).
    pub olen: usize,
    /// `fi_cq_strerror` text.
    pub text: String,
}

impl CqError {
    /// The error as an [`FiError`] of `call`.
    pub fn to_fi_error(&self, call: &'static str) -> FiError {
        FiError::new(call, i64::from(self.err))
            .with_detail(format!("provider error {}: {}", self.prov_errno, self.text))
    }
}

impl Av {
    /// Opens an address vector of `FI_AV_TABLE` type.
    pub fn open(domain: &Arc<Domain>) -> FiResult<Arc<Self>> {
        let mut attr = sys::fi_av_attr {
            type_: sys::FI_AV_TABLE,
            ..Default::default()
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: live domain; `attr` is read during the call only.
        let ret =
            unsafe { sys::fi_av_open(domain.as_raw(), &mut attr, &mut raw, std::ptr::null_mut()) };
        Ok(Arc::new(Self {
            raw: opened("fi_av_open", ret, raw)?,
            _domain: Arc::clone(domain),
        }))
    }

    /// Inserts one peer address (as returned by its `fi_getname`).
    pub fn insert(&self, addr: &[u8]) -> FiResult<u64> {
        let mut fi_addr: u64 = ADDR_UNSPEC;
        // SAFETY: live AV; `addr` holds one address of the provider's format
        // (validated by the provider); one fi_addr_t output.
        let ret = unsafe {
            sys::fi_av_insert(
                self.as_raw(),
                addr.as_ptr().cast(),
                1,
                &mut fi_addr,
                0,
                std::ptr::null_mut(),
            )
        };
        match check("fi_av_insert", i64::from(ret))? {
            1 if fi_addr != ADDR_UNSPEC => Ok(fi_addr),
            n => Err(FiError::new("fi_av_insert", i64::from(sys::FI_EINVAL))
                .with_detail(format!("inserted {n} of 1 address ({} bytes)", addr.len()))),
        }
    }
}

impl Endpoint {
    /// Opens an endpoint for `info`, binds `cq` (send and receive) and `av`, enables it.
    ///
    /// `fi_enable` is retried once after `-FI_EBUSY`: the `shm` provider names its
    /// region after this process's PID and refuses a leftover region of a killed
    /// process whose PID the kernel has since reused for us, unlinking it as it
    /// refuses, so the second attempt creates a fresh region.
    pub fn open(
        domain: &Arc<Domain>,
        info: InfoRef<'_>,
        cq: &Arc<Cq>,
        av: &Arc<Av>,
    ) -> FiResult<Self> {
        match Self::open_once(domain, info, cq, av) {
            Err(e) if e.call == "fi_enable" && e.code == sys::FI_EBUSY as i32 => {
                cclkit_abi::nccl_warn!(
                    "NET/OFI: {e}; retrying once (a stale region left by a killed process with this PID)"
                );
                Self::open_once(domain, info, cq, av)
            }
            other => other,
        }
    }

    fn open_once(
        domain: &Arc<Domain>,
        info: InfoRef<'_>,
        cq: &Arc<Cq>,
        av: &Arc<Av>,
    ) -> FiResult<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: live domain and info.
        let ret = unsafe {
            sys::fi_endpoint(
                domain.as_raw(),
                info.as_ptr(),
                &mut raw,
                std::ptr::null_mut(),
            )
        };
        let ep = Self {
            raw: opened("fi_endpoint", ret, raw)?,
            _domain: Arc::clone(domain),
            _cq: Arc::clone(cq),
            _av: Arc::clone(av),
        };
        let flags = u64::from(sys::FI_TRANSMIT | sys::FI_RECV);
        // SAFETY: live endpoint, CQ and AV of the same domain; `fid` is the first field.
        unsafe {
            check(
                "fi_ep_bind(cq)",
                i64::from(sys::fi_ep_bind(ep.as_raw(), &mut (*cq.as_raw()).fid, flags)),
            )?;
            check(
                "fi_ep_bind(av)",
                i64::from(sys::fi_ep_bind(ep.as_raw(), &mut (*av.as_raw()).fid, 0)),
            )?;
            check("fi_enable", i64::from(sys::fi_enable(ep.as_raw())))?;
        }
        Ok(ep)
    }

    /// The endpoint's address (`fi_getname`), what peers insert into their AV.
    pub fn name(&self) -> FiResult<Vec<u8>> {
        let mut len = 0usize;
        // SAFETY: a zero-length query; libfabric writes the needed length.
        let ret =
            unsafe { sys::fi_getname(&mut (*self.as_raw()).fid, std::ptr::null_mut(), &mut len) };
        if ret != -(sys::FI_ETOOSMALL as i32) && ret != 0 {
            return Err(FiError::new("fi_getname", i64::from(ret)));
        }
        let mut buf = vec![0u8; len.max(1)];
        len = buf.len();
        // SAFETY: `buf` has `len` writable bytes.
        let ret = unsafe {
            sys::fi_getname(&mut (*self.as_raw()).fid, buf.as_mut_ptr().cast(), &mut len)
        };
        check("fi_getname", i64::from(ret))?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Posts a tagged send. `Err` with `is_again()` means: drive progress, retry.
    ///
    /// # Safety
    /// `buf` must be valid for `len` reads (or `len == 0`), `desc` NULL or the
    /// descriptor of a live registration covering it, and `ctx` a `fi_context2`
    /// that stays valid and unmoved until this operation's completion is read
    /// (or the endpoint is closed).
    pub unsafe fn tsend(
        &self,
        buf: *const c_void,
        len: usize,
        desc: *mut c_void,
        dest: u64,
        tag: u64,
        ctx: *mut sys::fi_context2,
    ) -> FiResult<()> {
        // SAFETY: forwarded contract.
        let ret = unsafe { sys::fi_tsend(self.as_raw(), buf, len, desc, dest, tag, ctx.cast()) };
        check("fi_tsend", ret as i64).map(drop)
    }

    /// Posts a tagged receive matching `tag` on the bits not set in `ignore`.
    ///
    /// # Safety
    /// As [`Endpoint::tsend`], with `buf` valid for `len` writes.
    pub unsafe fn trecv(
        &self,
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
        tag: u64,
        ignore: u64,
        ctx: *mut sys::fi_context2,
    ) -> FiResult<()> {
        // SAFETY: forwarded contract.
        let ret = unsafe {
            sys::fi_trecv(
                self.as_raw(),
                buf,
                len,
                desc,
                ADDR_UNSPEC,
                tag,
                ignore,
                ctx.cast(),
            )
        };
        check("fi_trecv", ret as i64).map(drop)
    }

    /// Posts an RMA write of `len` bytes from `buf` to `addr` (an address in the
    /// peer's registration `key`, as its `mr_mode` defines it), carrying `data` to
    /// the peer's completion queue (`fi_writedata`).
    ///
    /// # Safety
    /// As [`Endpoint::tsend`]; the endpoint must have been opened with `FI_RMA`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn writedata(
        &self,
        buf: *const c_void,
        len: usize,
        desc: *mut c_void,
        data: u64,
        dest: u64,
        addr: u64,
        key: u64,
        ctx: *mut sys::fi_context2,
    ) -> FiResult<()> {
        // SAFETY: forwarded contract.
        let ret = unsafe {
            sys::fi_writedata(
                self.as_raw(),
                buf,
                len,
                desc,
                data,
                dest,
                addr,
                key,
                ctx.cast(),
            )
        };
        check("fi_writedata", ret as i64).map(drop)
    }

    /// Cancels a posted receive; it then completes with `FI_ECANCELED`.
    ///
    /// # Safety
    /// `ctx` must be the context of an operation posted on this endpoint and not yet
    /// completed.
    pub unsafe fn cancel(&self, ctx: *mut sys::fi_context2) -> FiResult<()> {
        // SAFETY: forwarded contract; `fid` is the first field of fid_ep.
        let ret = unsafe { sys::fi_cancel(&mut (*self.as_raw()).fid, ctx.cast()) };
        check("fi_cancel", ret as i64).map(drop)
    }
}

/// Where registered memory lives (`fi_mr_attr.iface`/`device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemIface {
    /// Host memory.
    System,
    /// CUDA device memory on device `ordinal`.
    Cuda(i32),
}

impl Mr {
    /// Registers `len` bytes at `addr` (`fi_mr_regattr`).
    ///
    /// # Safety
    /// The memory must stay allocated until this `Mr` is dropped.
    pub unsafe fn register(
        domain: &Arc<Domain>,
        addr: *mut c_void,
        len: usize,
        access: u64,
        requested_key: u64,
        iface: MemIface,
    ) -> FiResult<Self> {
        let iov = sys::iovec {
            iov_base: addr,
            iov_len: len,
        };
        let mut attr = sys::fi_mr_attr {
            mr_iov: &iov,
            iov_count: 1,
            access,
            requested_key,
            ..Default::default()
        };
        if let MemIface::Cuda(dev) = iface {
            attr.iface = sys::FI_HMEM_CUDA;
            attr.device.cuda = dev;
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: live domain; `attr` and `iov` outlive the call; memory contract above.
        let ret = unsafe { sys::fi_mr_regattr(domain.as_raw(), &attr, 0, &mut raw) };
        Ok(Self {
            raw: opened("fi_mr_regattr", ret, raw)?,
            _domain: Arc::clone(domain),
        })
    }

    /// Registers a dma-buf (libfabric ≥ 1.20 headers at build time, else `FI_ENOSYS`).
    ///
    /// # Safety
    /// `fd` must be a dma-buf that stays open until this `Mr` is dropped.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn register_dmabuf(
        domain: &Arc<Domain>,
        fd: i32,
        offset: u64,
        len: usize,
        base: *mut c_void,
        access: u64,
        requested_key: u64,
        iface: MemIface,
    ) -> FiResult<Self> {
        let (iface, dev) = match iface {
            MemIface::System => (sys::FI_HMEM_SYSTEM as i32, 0),
            MemIface::Cuda(d) => (sys::FI_HMEM_CUDA as i32, d),
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: live domain; the shim only reads its arguments.
        let ret = unsafe {
            sys::cclkit_ofi_mr_reg_dmabuf(
                domain.as_raw(),
                fd,
                offset,
                len,
                base,
                access,
                requested_key,
                iface,
                dev,
                &mut raw,
            )
        };
        Ok(Self {
            raw: opened("fi_mr_regattr(FI_MR_DMABUF)", ret, raw)?,
            _domain: Arc::clone(domain),
        })
    }

    /// The local descriptor to pass with sends/receives (`fi_mr_desc`).
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: live MR.
        unsafe { sys::fi_mr_desc(self.as_raw()) }
    }

    /// The key a peer names this registration by in RMA (`fi_mr_key`).
    pub fn key(&self) -> u64 {
        // SAFETY: live MR.
        unsafe { sys::fi_mr_key(self.as_raw()) }
    }

    /// Binds the registration to `ep` and enables it (`FI_MR_ENDPOINT` providers).
    pub fn bind_enable(&self, ep: &Endpoint) -> FiResult<()> {
        // SAFETY: live MR and endpoint of the same domain.
        unsafe {
            check(
                "fi_mr_bind",
                i64::from(sys::fi_mr_bind(self.as_raw(), &mut (*ep.as_raw()).fid, 0)),
            )?;
            check("fi_mr_enable", i64::from(sys::fi_mr_enable(self.as_raw())))?;
        }
        Ok(())
    }
}

/// True when this build can register dma-bufs (`FI_MR_DMABUF` in the headers).
pub fn dmabuf_built() -> bool {
    // SAFETY: no arguments, no preconditions.
    unsafe { sys::cclkit_ofi_has_dmabuf() != 0 }
}
