//! The registration cache of one device, keyed by page-aligned range.
//!
//! NCCL registers user buffers early (`regIsGlobal = 1`: on a loopback comm) and later
//! calls `regMr`/`deregMr` on sub-ranges from the real comms, expecting a fast hit.
//! So `regMr` rounds the range out to whole pages and reuses any registration that
//! already covers it; each hit takes a reference, and the NIC registration is dropped
//! only when the last reference is released (as NCCL's own IB cache does).

use std::sync::Arc;

use cclkit_abi::{Error, Result};

/// One NIC registration shared by every `regMr` it covers.
pub struct CacheEntry<M> {
    /// Unique id within the cache.
    pub id: u64,
    /// Page-aligned start.
    pub start: usize,
    /// Length (whole pages).
    pub len: usize,
    /// `NCCL_PTR_HOST` / `NCCL_PTR_CUDA`.
    pub kind: i32,
    /// The NIC registration.
    pub mr: M,
}

impl<M> CacheEntry<M> {
    /// Whether `[addr, addr + len)` lies inside this registration.
    pub fn covers(&self, addr: usize, len: usize) -> bool {
        addr >= self.start
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.start + self.len)
    }
}

/// Counters for logs and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// `regMr` served from an existing registration.
    pub hits: u64,
    /// `regMr` that registered with the NIC.
    pub misses: u64,
    /// NIC registrations released.
    pub releases: u64,
}

/// Live registrations of one device with their reference counts.
pub struct MrCache<M> {
    page: usize,
    entries: Vec<(Arc<CacheEntry<M>>, usize)>,
    next_id: u64,
    stats: CacheStats,
}

impl<M> MrCache<M> {
    /// An empty cache for pages of `page` bytes (a power of two).
    pub fn new(page: usize) -> Self {
        Self {
            page: page.max(1).next_power_of_two(),
            entries: Vec::new(),
            next_id: 1,
            stats: CacheStats::default(),
        }
    }

    /// The page-aligned range covering `[addr, addr + len)` (at least one page).
    pub fn align(&self, addr: usize, len: usize) -> Result<(usize, usize)> {
        let start = addr & !(self.page - 1);
        let end = addr
            .checked_add(len.max(1))
            .and_then(|e| e.checked_next_multiple_of(self.page))
            .ok_or_else(|| {
                Error::invalid_argument(format!("regMr: range {addr:#x}+{len} overflows"))
            })?;
        Ok((start, end - start))
    }

    /// A registration covering `[addr, addr + len)`: an existing one (a hit), or a new
    /// one made by `register(start, len)` over the page-aligned range.
    pub fn acquire(
        &mut self,
        addr: usize,
        len: usize,
        kind: i32,
        register: impl FnOnce(usize, usize) -> Result<M>,
    ) -> Result<Arc<CacheEntry<M>>> {
        let (start, aligned) = self.align(addr, len)?;
        if let Some((entry, refs)) = self
            .entries
            .iter_mut()
            .find(|(e, _)| e.kind == kind && e.covers(start, aligned))
        {
            *refs += 1;
            self.stats.hits += 1;
            return Ok(Arc::clone(entry));
        }
        let mr = register(start, aligned)?;
        let entry = Arc::new(CacheEntry {
            id: self.next_id,
            start,
            len: aligned,
            kind,
            mr,
        });
        self.next_id += 1;
        self.stats.misses += 1;
        self.entries.push((Arc::clone(&entry), 1));
        Ok(entry)
    }

    /// Drops one reference; returns the registration when it was the last, for the
    /// caller to deregister.
    pub fn release(&mut self, entry: Arc<CacheEntry<M>>) -> Result<Option<M>> {
        let pos = self
            .entries
            .iter()
            .position(|(e, _)| e.id == entry.id)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "deregMr: registration {} ({:#x}+{}) is not live on this device",
                    entry.id, entry.start, entry.len
                ))
            })?;
        let refs = &mut self.entries[pos].1;
        *refs -= 1;
        if *refs > 0 {
            return Ok(None);
        }
        drop(self.entries.swap_remove(pos));
        self.stats.releases += 1;
        match Arc::try_unwrap(entry) {
            Ok(e) => Ok(Some(e.mr)),
            Err(_) => Err(Error::internal(
                "deregMr: last cache reference released while a handle still uses it",
            )),
        }
    }

    /// Live NIC registrations.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cclkit_abi::raw::common::ptr;
    use std::cell::RefCell;

    const PAGE: usize = 4096;

    #[test]
    fn sub_ranges_of_a_registration_hit_and_the_last_release_deregisters() {
        let made = RefCell::new(Vec::new());
        let mut cache = MrCache::<u32>::new(PAGE);
        let register = |s: usize, l: usize| {
            made.borrow_mut().push((s, l));
            Ok(made.borrow().len() as u32)
        };
        // NCCL's early registration of a user buffer (odd start and size).
        let base = 0x10_0000 + 100;
        let big = cache.acquire(base, 10 * PAGE, ptr::HOST, register).unwrap();
        assert_eq!((big.start, big.len), (0x10_0000, 11 * PAGE));
        // Sub-ranges from the real comms: hits, no new registration.
        let a = cache
            .acquire(base + 5000, 3 * PAGE, ptr::HOST, register)
            .unwrap();
        let b = cache.acquire(0x10_0000, 1, ptr::HOST, register).unwrap();
        let c = cache
            .acquire(base + 10 * PAGE - 1, 1, ptr::HOST, register)
            .unwrap();
        assert_eq!(made.borrow().len(), 1);
        assert_eq!((a.id, b.id, c.id), (big.id, big.id, big.id));
        assert_eq!(cache.stats().hits, 3);
        // Past the end, another kind: new registrations.
        let d = cache
            .acquire(0x10_0000 + 11 * PAGE, 8, ptr::HOST, register)
            .unwrap();
        let e = cache.acquire(base, 16, ptr::CUDA, register).unwrap();
        assert_ne!(d.id, big.id);
        assert_ne!(e.id, big.id);
        assert_eq!(made.borrow().len(), 3);
        assert_eq!(cache.len(), 3);
        // Refcounted: only the fourth release of `big` hands the registration back.
        assert_eq!(cache.release(a).unwrap(), None);
        assert_eq!(cache.release(big).unwrap(), None);
        assert_eq!(cache.release(c).unwrap(), None);
        assert_eq!(cache.release(b).unwrap(), Some(1));
        assert_eq!(cache.release(d).unwrap(), Some(2));
        assert_eq!(cache.release(e).unwrap(), Some(3));
        assert!(cache.is_empty());
        assert_eq!(
            cache.stats(),
            CacheStats {
                hits: 3,
                misses: 3,
                releases: 3
            }
        );
    }

    #[test]
    fn released_entries_are_not_reused_and_double_release_is_an_error() {
        let mut cache = MrCache::<u32>::new(PAGE);
        let first = cache.acquire(8192, 100, ptr::HOST, |_, _| Ok(7)).unwrap();
        let keep = Arc::clone(&first);
        // `keep` is an extra handle that should not exist: the release reports it.
        assert!(cache.release(first).is_err());
        assert!(cache.release(keep).is_err(), "already gone from the cache");
        let again = cache.acquire(8192, 100, ptr::HOST, |_, _| Ok(8)).unwrap();
        assert_eq!(again.mr, 8);
        assert_eq!(cache.release(again).unwrap(), Some(8));
    }

    #[test]
    fn failed_registration_leaves_nothing_and_alignment_is_page_exact() {
        let mut cache = MrCache::<u32>::new(PAGE);
        assert!(
            cache
                .acquire(4096, 1, ptr::HOST, |_, _| Err(Error::system("boom")))
                .is_err()
        );
        assert!(cache.is_empty());
        assert_eq!(cache.align(4095, 2).unwrap(), (0, 8192));
        assert_eq!(cache.align(4096, 4096).unwrap(), (4096, 4096));
        assert_eq!(cache.align(4096, 0).unwrap(), (4096, 4096));
        assert!(cache.align(usize::MAX - 10, 100).is_err());
    }
}
