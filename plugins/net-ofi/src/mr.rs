//! Memory registration honouring the provider's `mr_mode`, with a cache so that
//! repeated `regMr` of the same region (NCCL re-registers often) is a lookup.
//!
//! * `FI_MR_LOCAL`: data calls need a descriptor, so host memory is registered;
//!   without it host memory is not registered at all (descriptor NULL).
//! * `FI_MR_PROV_KEY` unset: each registration asks for a unique key.
//! * `FI_MR_ALLOCATED`: host ranges are widened to whole pages, which are
//!   allocated because they hold the buffer's own bytes.
//! * `FI_MR_VIRT_ADDR`: RMA addresses are virtual addresses; without it they are
//!   offsets into the registration ([`RmaTarget`]), as the write path needs.
//! * `FI_MR_ENDPOINT`: the registration is bound to the device's endpoint.
//! * CUDA memory (`FI_HMEM` providers) is always registered, with its device.
//! * With the write path on (`engine/write.rs`), host memory is always registered,
//!   with `FI_REMOTE_WRITE`, so that a receive buffer can be a write's target.

use std::ffi::c_void;
use std::sync::Arc;

use cclkit_abi::{Error, Result};

use crate::fabric::{Domain, Endpoint, MemIface, Mr};
use crate::sys;

/// A registration held by a caller: release it with [`MrCache::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MrRef {
    /// Cache entry id; 0 = nothing registered (provider needs no registration).
    pub id: u64,
    /// `fi_mr_desc` as an address (0 = NULL).
    pub desc: usize,
    /// How a peer writes into it; `None` unless host memory registered for writes.
    pub rma: Option<RmaTarget>,
}

/// What a peer needs to write into a host registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmaTarget {
    /// The registration's key (`fi_mr_key`).
    pub key: u64,
    /// Subtracted from a virtual address to get the RMA address: 0 with
    /// `FI_MR_VIRT_ADDR`, else the registration's first byte.
    pub base: usize,
}

impl RmaTarget {
    /// The RMA address of virtual address `addr`.
    pub fn addr_of(&self, addr: usize) -> u64 {
        addr.wrapping_sub(self.base) as u64
    }
}

impl MrRef {
    /// The descriptor for data calls.
    pub fn desc_ptr(&self) -> *mut c_void {
        self.desc as *mut c_void
    }
}

struct Entry {
    id: u64,
    start: usize,
    end: usize,
    iface: MemIface,
    refs: usize,
    mr: Mr,
    rma: Option<RmaTarget>,
}

/// The registrations of one domain.
pub struct MrCache {
    entries: Vec<Entry>,
    next_id: u64,
    next_key: u64,
    cache: bool,
    mr_mode: u32,
    remote_write: bool,
}

/// The system's page size (4096 if it cannot be read).
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

const ACCESS: u64 = (sys::FI_SEND | sys::FI_RECV) as u64;

impl MrCache {
    /// An empty cache for a domain with `mr_mode`; `cache` = reuse registrations.
    pub fn new(mr_mode: u32, cache: bool) -> Self {
        Self {
            entries: Vec::new(),
            next_id: 1,
            next_key: 1,
            cache,
            mr_mode,
            remote_write: false,
        }
    }

    /// Registers host memory for peers' writes too (`FI_REMOTE_WRITE`, even where
    /// the provider needs no registration for sends and receives).
    pub fn with_remote_write(mut self, on: bool) -> Self {
        self.remote_write = on;
        self
    }

    fn access(&self) -> u64 {
        ACCESS
            | if self.remote_write {
                sys::FI_REMOTE_WRITE as u64
            } else {
                0
            }
    }

    /// Whether host memory needs registering at all with this provider.
    pub fn host_needs_mr(&self) -> bool {
        self.mr_mode & sys::FI_MR_LOCAL != 0
    }

    /// Number of live registrations (for tests and logs).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn key(&mut self) -> u64 {
        if self.mr_mode & sys::FI_MR_PROV_KEY != 0 {
            return 0;
        }
        let k = self.next_key;
        self.next_key += 1;
        k
    }

    fn push(
        &mut self,
        mr: Mr,
        start: usize,
        end: usize,
        iface: MemIface,
        ep: &Endpoint,
    ) -> Result<MrRef> {
        if self.mr_mode & sys::FI_MR_ENDPOINT != 0 {
            mr.bind_enable(ep)?;
        }
        let id = self.next_id;
        self.next_id += 1;
        let desc = mr.desc() as usize;
        let rma = (self.remote_write && iface == MemIface::System).then(|| RmaTarget {
            key: mr.key(),
            base: if self.mr_mode & sys::FI_MR_VIRT_ADDR != 0 {
                0
            } else {
                start
            },
        });
        self.entries.push(Entry {
            id,
            start,
            end,
            iface,
            refs: 1,
            mr,
            rma,
        });
        Ok(MrRef { id, desc, rma })
    }

    /// Registers `[addr, addr + len)` or takes another reference on a cached
    /// registration that covers it.
    ///
    /// # Safety
    /// The memory must stay allocated until the returned reference is released.
    pub unsafe fn acquire(
        &mut self,
        domain: &Arc<Domain>,
        ep: &Endpoint,
        addr: usize,
        len: usize,
        iface: MemIface,
    ) -> Result<MrRef> {
        if iface == MemIface::System && !self.host_needs_mr() && !self.remote_write {
            return Ok(MrRef::default());
        }
        let end = addr
            .checked_add(len)
            .ok_or_else(|| Error::invalid_argument(format!("regMr: {addr:#x}+{len} overflows")))?;
        if self.cache {
            if let Some(e) = self
                .entries
                .iter_mut()
                .find(|e| e.iface == iface && e.start <= addr && end <= e.end)
            {
                e.refs += 1;
                return Ok(MrRef {
                    id: e.id,
                    desc: e.mr.desc() as usize,
                    rma: e.rma,
                });
            }
        }
        let (start, end) = match iface {
            MemIface::System => {
                let page = page_size();
                (addr & !(page - 1), end.div_ceil(page) * page)
            }
            MemIface::Cuda(_) => (addr, end),
        };
        let key = self.key();
        // SAFETY: forwarded contract (whole pages of a live host allocation, or
        // the exact device range).
        let mr = unsafe {
            Mr::register(
                domain,
                start as *mut c_void,
                (end - start).max(1),
                self.access(),
                key,
                iface,
            )
        }
        .map_err(|e| Error::system(format!("NET/OFI regMr of {len} bytes at {addr:#x}: {e}")))?;
        self.push(mr, start, end, iface, ep)
    }

    /// Registers a dma-buf region (never cached: the fd identifies it, not the address).
    ///
    /// # Safety
    /// `fd` must stay a valid dma-buf until the returned reference is released.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn acquire_dmabuf(
        &mut self,
        domain: &Arc<Domain>,
        ep: &Endpoint,
        fd: i32,
        offset: u64,
        addr: usize,
        len: usize,
        iface: MemIface,
    ) -> Result<MrRef> {
        let key = self.key();
        // SAFETY: forwarded contract.
        let mr = unsafe {
            Mr::register_dmabuf(
                domain,
                fd,
                offset,
                len,
                addr as *mut c_void,
                ACCESS,
                key,
                iface,
            )
        }
        .map_err(|e| Error::system(format!("NET/OFI regMrDmaBuf of {len} bytes (fd {fd}): {e}")))?;
        // start > end: a dma-buf entry never serves an address lookup.
        self.push(mr, 1, 0, iface, ep)
    }

    /// Drops one reference; the registration is closed with the last one.
    pub fn release(&mut self, id: u64) {
        if id == 0 {
            return;
        }
        if let Some(i) = self.entries.iter().position(|e| e.id == id) {
            self.entries[i].refs -= 1;
            if self.entries[i].refs == 0 {
                self.entries.swap_remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{Av, Cq, Fabric, Hints, getinfo};

    /// A real shm domain and endpoint (always available with Debian's libfabric).
    fn shm() -> (Arc<Domain>, Endpoint) {
        let mut h = Hints::new().unwrap();
        h.caps(sys::FI_TAGGED as u64)
            .mode(sys::FI_CONTEXT | sys::FI_CONTEXT2)
            .ep_type(sys::FI_EP_RDM);
        h.provider("shm").unwrap();
        let list = getinfo(None, None, 0, &h).unwrap();
        let info = list.iter().next().expect("shm provider");
        let fabric = Fabric::open(info).unwrap();
        let domain = Domain::open(&fabric, info).unwrap();
        let cq = Cq::open(&domain).unwrap();
        let av = Av::open(&domain).unwrap();
        let ep = Endpoint::open(&domain, info, &cq, &av).unwrap();
        (domain, ep)
    }

    #[test]
    fn cache_reuses_a_covering_registration() {
        let (d, ep) = shm();
        let page = page_size();
        let mut c = MrCache::new(sys::FI_MR_LOCAL, true);
        let buf = vec![0u8; 3 * page];
        let base = buf.as_ptr() as usize;
        let other = vec![0u8; 2 * page];
        // SAFETY: the buffers outlive every registration below.
        unsafe {
            let a = c
                .acquire(&d, &ep, base + 10, 100, MemIface::System)
                .unwrap();
            let b = c.acquire(&d, &ep, base + 50, 20, MemIface::System).unwrap();
            assert_eq!(a, b, "a sub-range of a registration is a cache hit");
            assert_ne!(a.id, 0);
            assert_eq!(c.len(), 1);
            let o = c
                .acquire(
                    &d,
                    &ep,
                    other.as_ptr() as usize,
                    other.len(),
                    MemIface::System,
                )
                .unwrap();
            assert_ne!(o.id, a.id);
            assert_eq!(c.len(), 2);
            c.release(a.id);
            assert_eq!(c.len(), 2, "one reference is left");
            c.release(b.id);
            assert_eq!(c.len(), 1);
            c.release(o.id);
            assert!(c.is_empty());
        }
    }

    #[test]
    fn without_cache_every_call_registers() {
        let (d, ep) = shm();
        let mut c = MrCache::new(sys::FI_MR_LOCAL, false);
        let buf = vec![0u8; 4096];
        let p = buf.as_ptr() as usize;
        // SAFETY: `buf` outlives the registrations.
        unsafe {
            let a = c.acquire(&d, &ep, p, 4096, MemIface::System).unwrap();
            let b = c.acquire(&d, &ep, p, 4096, MemIface::System).unwrap();
            assert_ne!(a.id, b.id);
            c.release(a.id);
            c.release(b.id);
        }
        assert!(c.is_empty());
    }

    #[test]
    fn host_memory_is_not_registered_without_mr_local() {
        let (d, ep) = shm();
        let mut c = MrCache::new(sys::FI_MR_VIRT_ADDR, true);
        let buf = [0u8; 64];
        // SAFETY: nothing is registered.
        let r = unsafe { c.acquire(&d, &ep, buf.as_ptr() as usize, 64, MemIface::System) }.unwrap();
        assert_eq!(r, MrRef::default());
        assert!(c.is_empty());
    }

    #[test]
    fn write_targets_are_registered_with_their_rma_address() {
        let (d, ep) = shm();
        let page = page_size();
        let buf = vec![0u8; 3 * page];
        let p = buf.as_ptr() as usize + 100;
        for (mode, virt) in [(0, false), (sys::FI_MR_VIRT_ADDR, true)] {
            let mut c = MrCache::new(mode, true).with_remote_write(true);
            // SAFETY: `buf` outlives the registrations.
            let r = unsafe { c.acquire(&d, &ep, p, page, MemIface::System) }.unwrap();
            assert_ne!(r.id, 0, "host memory is registered for writes");
            let t = r.rma.expect("a write target");
            let start = p & !(page - 1);
            assert_eq!(
                t.addr_of(p),
                if virt { p as u64 } else { (p - start) as u64 }
            );
            // A cache hit hands out the same target.
            // SAFETY: as above.
            let again = unsafe { c.acquire(&d, &ep, p + 8, 16, MemIface::System) }.unwrap();
            assert_eq!(again.rma, r.rma);
            c.release(r.id);
            c.release(again.id);
            assert!(c.is_empty());
        }
    }
}
