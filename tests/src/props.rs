//! Support for property tests of bytes that arrive from a peer (plugin connection
//! handles, hellos, headers): a replayable random generator and an allocation probe
//! that tells whether a parser sized a buffer from hostile bytes.
//!
//! The probe needs the test binary's global allocator. Each test file that uses
//! [`peak_alloc`] installs it with one line:
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: cclkit_tests::props::PeakAlloc = cclkit_tests::props::PeakAlloc;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use cclkit_abi::net::NetHandle;

/// splitmix64: each case's seed is printed on failure, so it can be replayed.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)] // the name the property tests read best
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Fills `b` with random bytes.
    pub fn fill(&mut self, b: &mut [u8]) {
        for x in b {
            *x = self.next() as u8;
        }
    }
}

/// A global allocator that forwards to the system allocator and, while
/// [`peak_alloc`] runs on this thread, records the largest single allocation.
pub struct PeakAlloc;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = ARMED.try_with(|a| {
        if a.get() {
            let _ = PEAK.try_with(|p| p.set(p.get().max(size)));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, new) }
    }
}

/// Runs `f` and returns its result with the largest allocation it made on this
/// thread (0 when [`PeakAlloc`] is not the binary's global allocator, which
/// [`assert_probe_armed`] catches).
pub fn peak_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    PEAK.with(|p| p.set(0));
    ARMED.with(|a| a.set(true));
    let r = f();
    ARMED.with(|a| a.set(false));
    (r, PEAK.with(Cell::get))
}

/// Fails unless the probe sees allocations: a test file that forgot to install
/// [`PeakAlloc`] would otherwise pass every bound by measuring nothing.
pub fn assert_probe_armed() {
    // black_box: the optimiser may drop an allocation whose contents nobody reads.
    let (v, peak) = peak_alloc(|| std::hint::black_box(vec![7u8; 5000]));
    assert_eq!((v.len(), peak), (5000, 5000), "PeakAlloc is not installed");
}

/// A net handle whose plugin bytes are `p`.
pub fn handle_of(p: &[u8; NetHandle::PAYLOAD]) -> NetHandle {
    let mut h = NetHandle::zeroed();
    *h.payload_mut() = *p;
    h
}
