//! `fi_getinfo` results (`InfoList`, `InfoRef`, owned `Info`) and the hints
//! that query them (`Hints`).

use std::ffi::{CStr, CString, c_char};
use std::marker::PhantomData;
use std::ptr::NonNull;

use super::error::{FiError, FiResult, check};
use crate::sys;

/// The API version this crate was built against (`FI_VERSION(major, minor)`).
pub const API_VERSION: u32 = (sys::FI_MAJOR_VERSION << 16) | sys::FI_MINOR_VERSION;

/// The runtime library's version as `(major, minor)`.
pub fn runtime_version() -> (u32, u32) {
    // SAFETY: fi_version takes no arguments and has no preconditions.
    let v = unsafe { sys::fi_version() };
    (v >> 16, v & 0xffff)
}

/// Query hints (`fi_allocinfo`), freed with `fi_freeinfo`.
pub struct Hints {
    raw: NonNull<sys::fi_info>,
}

// SAFETY: the hints are plain heap data owned by this value; nothing else points to them.
unsafe impl Send for Hints {}

impl Hints {
    /// Empty hints with every attribute struct allocated.
    pub fn new() -> FiResult<Self> {
        // SAFETY: fi_dupinfo(NULL) is fi_allocinfo: a zeroed fi_info with every
        // attribute struct allocated, or NULL on allocation failure.
        let raw = unsafe { sys::fi_dupinfo(std::ptr::null()) };
        let raw = NonNull::new(raw)
            .ok_or_else(|| FiError::new("fi_allocinfo", i64::from(sys::FI_ENOMEM)))?;
        Ok(Self { raw })
    }

    fn info(&mut self) -> &mut sys::fi_info {
        // SAFETY: `raw` is a live fi_info owned by `self`.
        unsafe { self.raw.as_mut() }
    }

    /// Required capabilities (`FI_TAGGED`, `FI_HMEM`, …).
    pub fn caps(&mut self, caps: u64) -> &mut Self {
        self.info().caps = caps;
        self
    }

    /// Modes the application supports (`FI_CONTEXT`, `FI_CONTEXT2`).
    pub fn mode(&mut self, mode: u64) -> &mut Self {
        self.info().mode = mode;
        self
    }

    /// Endpoint type (`FI_EP_RDM`).
    pub fn ep_type(&mut self, ty: sys::fi_ep_type) -> &mut Self {
        // SAFETY: allocinfo allocated `ep_attr`.
        unsafe { (*self.info().ep_attr).type_ = ty };
        self
    }

    /// Memory-registration modes the application can honour.
    pub fn mr_mode(&mut self, mode: u32) -> &mut Self {
        // SAFETY: allocinfo allocated `domain_attr`; mr_mode is an int bitmask.
        unsafe { (*self.info().domain_attr).mr_mode = mode as i32 };
        self
    }

    /// Threading model.
    pub fn threading(&mut self, t: sys::fi_threading) -> &mut Self {
        // SAFETY: allocinfo allocated `domain_attr`.
        unsafe { (*self.info().domain_attr).threading = t };
        self
    }

    /// Restricts the query to one provider (`"tcp;ofi_rxm"`, `"efa"`).
    pub fn provider(&mut self, name: &str) -> FiResult<&mut Self> {
        let s = dup_cstr(name)?;
        // SAFETY: allocinfo allocated `fabric_attr`; fi_freeinfo frees prov_name
        // with free(), which is why it is strdup'ed. Any previous value is freed.
        unsafe {
            let fa = &mut *self.info().fabric_attr;
            libc::free(fa.prov_name.cast());
            fa.prov_name = s;
        }
        Ok(self)
    }

    /// Restricts the query to one domain (`"lo"`, `"efa_0-rdm"`).
    pub fn domain(&mut self, name: &str) -> FiResult<&mut Self> {
        let s = dup_cstr(name)?;
        // SAFETY: as in `provider`, for `domain_attr->name`.
        unsafe {
            let da = &mut *self.info().domain_attr;
            libc::free(da.name.cast());
            da.name = s;
        }
        Ok(self)
    }

    /// The raw pointer for `fi_getinfo`.
    fn as_ptr(&self) -> *const sys::fi_info {
        self.raw.as_ptr()
    }
}

impl Drop for Hints {
    fn drop(&mut self) {
        // SAFETY: allocated by fi_dupinfo, freed once here.
        unsafe { sys::fi_freeinfo(self.raw.as_ptr()) };
    }
}

/// A `strdup`'ed C string that libfabric may later `free()`.
fn dup_cstr(s: &str) -> FiResult<*mut c_char> {
    let c = CString::new(s).map_err(|_| {
        FiError::new("fi_getinfo", i64::from(sys::FI_EINVAL)).with_detail(format!("NUL in {s:?}"))
    })?;
    // SAFETY: `c` is a valid C string; strdup returns NULL only on ENOMEM.
    let p = unsafe { libc::strdup(c.as_ptr()) };
    if p.is_null() {
        return Err(FiError::new("strdup", i64::from(sys::FI_ENOMEM)));
    }
    Ok(p)
}

/// The list `fi_getinfo` returned.
pub struct InfoList {
    head: *mut sys::fi_info,
}

// SAFETY: the list is heap data owned by this value and only read through it.
unsafe impl Send for InfoList {}
// SAFETY: shared access only reads.
unsafe impl Sync for InfoList {}

/// Calls `fi_getinfo`. `Ok(empty list)` when nothing matches (`-FI_ENODATA`).
pub fn getinfo(
    node: Option<&str>,
    service: Option<&str>,
    flags: u64,
    hints: &Hints,
) -> FiResult<InfoList> {
    let node = node.map(CString::new).transpose().map_err(|_| {
        FiError::new("fi_getinfo", i64::from(sys::FI_EINVAL)).with_detail("NUL in node")
    })?;
    let service = service.map(CString::new).transpose().map_err(|_| {
        FiError::new("fi_getinfo", i64::from(sys::FI_EINVAL)).with_detail("NUL in service")
    })?;
    let mut head = std::ptr::null_mut();
    // SAFETY: every pointer is NULL or valid for the call; `head` receives a list we own.
    let ret = unsafe {
        sys::fi_getinfo(
            API_VERSION,
            node.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            service.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            flags,
            hints.as_ptr(),
            &mut head,
        )
    };
    match check("fi_getinfo", i64::from(ret)) {
        Ok(_) => Ok(InfoList { head }),
        Err(e) if e.is_no_data() => Ok(InfoList {
            head: std::ptr::null_mut(),
        }),
        Err(e) => Err(e),
    }
}

impl InfoList {
    /// The entries in provider order.
    pub fn iter(&self) -> impl Iterator<Item = InfoRef<'_>> {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            let p = NonNull::new(cur)?;
            // SAFETY: every `next` in a list from fi_getinfo is NULL or a live entry.
            cur = unsafe { p.as_ref().next };
            Some(InfoRef {
                raw: p,
                _list: PhantomData,
            })
        })
    }
}

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.head.is_null() {
            // SAFETY: the list came from fi_getinfo and is freed once here.
            unsafe { sys::fi_freeinfo(self.head) };
        }
    }
}

/// One borrowed `fi_info`.
#[derive(Clone, Copy)]
pub struct InfoRef<'a> {
    raw: NonNull<sys::fi_info>,
    _list: PhantomData<&'a sys::fi_info>,
}

/// One owned `fi_info` (`fi_dupinfo` of a list entry).
pub struct Info {
    raw: NonNull<sys::fi_info>,
}

// SAFETY: owned heap data, read-only after creation.
unsafe impl Send for Info {}
// SAFETY: shared access only reads.
unsafe impl Sync for Info {}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: from fi_dupinfo, freed once here.
        unsafe { sys::fi_freeinfo(self.raw.as_ptr()) };
    }
}

fn cstr_field(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's name fields are NULL or NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl<'a> InfoRef<'a> {
    fn info(&self) -> &'a sys::fi_info {
        // SAFETY: valid for the list's lifetime 'a.
        unsafe { &*self.raw.as_ptr() }
    }

    /// An owned copy of this entry.
    pub fn to_owned(&self) -> FiResult<Info> {
        // SAFETY: the entry is valid; fi_dupinfo copies only this entry.
        let raw = unsafe { sys::fi_dupinfo(self.raw.as_ptr()) };
        NonNull::new(raw)
            .map(|raw| Info { raw })
            .ok_or_else(|| FiError::new("fi_dupinfo", i64::from(sys::FI_ENOMEM)))
    }

    /// Provider name (`"tcp;ofi_rxm"`).
    pub fn provider(&self) -> String {
        // SAFETY: fi_getinfo always fills fabric_attr.
        cstr_field(unsafe { (*self.info().fabric_attr).prov_name })
    }

    /// Fabric name (`"127.0.0.1/32"`).
    pub fn fabric_name(&self) -> String {
        // SAFETY: as above.
        cstr_field(unsafe { (*self.info().fabric_attr).name })
    }

    /// Domain name (`"lo"`, `"efa_0-rdm"`, `"shm"`).
    pub fn domain_name(&self) -> String {
        // SAFETY: fi_getinfo always fills domain_attr.
        cstr_field(unsafe { (*self.info().domain_attr).name })
    }

    /// Capabilities.
    pub fn caps(&self) -> u64 {
        self.info().caps
    }

    /// Memory-registration mode bits the provider requires.
    pub fn mr_mode(&self) -> u32 {
        // SAFETY: fi_getinfo always fills domain_attr.
        unsafe { (*self.info().domain_attr).mr_mode as u32 }
    }

    /// Number of tag bits the provider matches (from `mem_tag_format`; 64 if unset).
    pub fn tag_bits(&self) -> u32 {
        // SAFETY: fi_getinfo always fills ep_attr.
        let fmt = unsafe { (*self.info().ep_attr).mem_tag_format };
        if fmt == 0 {
            64
        } else {
            64 - fmt.leading_zeros()
        }
    }

    /// Largest message the endpoint accepts.
    pub fn max_msg_size(&self) -> usize {
        // SAFETY: fi_getinfo always fills ep_attr.
        unsafe { (*self.info().ep_attr).max_msg_size }
    }

    /// Bytes of remote CQ data the domain carries with a write (0 = none).
    pub fn cq_data_size(&self) -> usize {
        // SAFETY: fi_getinfo always fills domain_attr.
        unsafe { (*self.info().domain_attr).cq_data_size }
    }

    /// Receives the endpoint can have posted at once (0 when not reported).
    pub fn rx_size(&self) -> usize {
        let rx = self.info().rx_attr;
        if rx.is_null() {
            return 0;
        }
        // SAFETY: non-NULL attributes filled by fi_getinfo.
        unsafe { (*rx).size }
    }

    /// Address format (`FI_SOCKADDR_IN`, `FI_ADDR_STR`, …).
    pub fn addr_format(&self) -> u32 {
        self.info().addr_format
    }

    /// The source address bytes, if the provider reported one.
    pub fn src_addr(&self) -> Option<&'a [u8]> {
        let i = self.info();
        if i.src_addr.is_null() || i.src_addrlen == 0 {
            return None;
        }
        // SAFETY: libfabric guarantees `src_addrlen` readable bytes at `src_addr`.
        Some(unsafe { std::slice::from_raw_parts(i.src_addr.cast::<u8>(), i.src_addrlen) })
    }

    /// PCI address `(domain, bus, device, function)` from the NIC attributes.
    pub fn pci(&self) -> Option<(u16, u8, u8, u8)> {
        let nic = self.info().nic;
        if nic.is_null() {
            return None;
        }
        // SAFETY: a non-NULL nic points to a fid_nic whose attr pointers are NULL or valid.
        unsafe {
            let bus = (*nic).bus_attr;
            if bus.is_null() || (*bus).bus_type != sys::FI_BUS_PCI {
                return None;
            }
            let p = (*bus).attr.pci;
            Some((p.domain_id, p.bus_id, p.device_id, p.function_id))
        }
    }

    /// Link speed in bits per second, when the provider reports it.
    pub fn link_speed_bps(&self) -> Option<u64> {
        let nic = self.info().nic;
        if nic.is_null() {
            return None;
        }
        // SAFETY: as in `pci`.
        let speed = unsafe {
            let link = (*nic).link_attr;
            if link.is_null() {
                return None;
            }
            (*link).speed
        };
        (speed > 0).then_some(speed as u64)
    }

    /// The raw entry, for opening objects.
    pub(crate) fn as_ptr(&self) -> *mut sys::fi_info {
        self.raw.as_ptr()
    }
}

impl Info {
    /// Borrowed view of this entry.
    pub fn as_ref(&self) -> InfoRef<'_> {
        InfoRef {
            raw: self.raw,
            _list: PhantomData,
        }
    }
}
