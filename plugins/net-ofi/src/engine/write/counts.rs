//! What the write path did in this process (all devices), for tests,
//! benchmarks and the device's closing INFO line.

use std::sync::atomic::{AtomicU64, Ordering};

pub(super) static OFFERS: AtomicU64 = AtomicU64::new(0);
pub(super) static WRITES: AtomicU64 = AtomicU64::new(0);
pub(super) static LANDED: AtomicU64 = AtomicU64::new(0);
pub(super) static MISSED: AtomicU64 = AtomicU64::new(0);
pub(super) static ARRIVED: AtomicU64 = AtomicU64::new(0);
static WAITED: AtomicU64 = AtomicU64::new(0);
static EXPIRED: AtomicU64 = AtomicU64::new(0);

/// What the write path did in this process (all devices), for tests and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteCounts {
    /// Receives offered as write targets.
    pub offers: u64,
    /// Sends that went as writes.
    pub writes: u64,
    /// Writes that arrived into an offered receive.
    pub landed: u64,
    /// Sends in the write range that found no offer (they went as tagged sends).
    pub missed: u64,
    /// Offers read by send comms (used, stale or not).
    pub arrived: u64,
    /// Sends that waited in `isend` for their offer and got it.
    pub waited: u64,
    /// Sends whose wait for an offer ran out (they went without it).
    pub expired: u64,
}

/// This process's [`WriteCounts`] so far.
pub fn write_counts() -> WriteCounts {
    WriteCounts {
        offers: OFFERS.load(Ordering::Relaxed),
        writes: WRITES.load(Ordering::Relaxed),
        landed: LANDED.load(Ordering::Relaxed),
        missed: MISSED.load(Ordering::Relaxed),
        arrived: ARRIVED.load(Ordering::Relaxed),
        waited: WAITED.load(Ordering::Relaxed),
        expired: EXPIRED.load(Ordering::Relaxed),
    }
}

/// Counts a send that waited for its offer: it came (`got`) or the wait ran out.
pub fn count_offer_wait(got: bool) {
    let c = if got { &WAITED } else { &EXPIRED };
    c.fetch_add(1, Ordering::Relaxed);
}
