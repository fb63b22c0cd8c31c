//! Bundles on the engine (`crate::bundle` has the idea and the wire format): the
//! sending side's open bundle and in-flight count, the receiving side's posted
//! bundle buffers, the receives waiting for records and the records waiting for
//! receives.

use std::sync::atomic::{AtomicU64, Ordering};

mod rx;
mod tx;

pub use rx::Rx;
pub(in crate::engine) use rx::{BundleBuf, RX_BUFFERS};
pub use tx::Tx;

static BUNDLES: AtomicU64 = AtomicU64::new(0);
static RECORDS: AtomicU64 = AtomicU64::new(0);
static EARLY: AtomicU64 = AtomicU64::new(0);
static OVERDUE: AtomicU64 = AtomicU64::new(0);
static DEFERRED: AtomicU64 = AtomicU64::new(0);
static REPOSTED: AtomicU64 = AtomicU64::new(0);
static SINGLES: AtomicU64 = AtomicU64::new(0);
static GROWN: AtomicU64 = AtomicU64::new(0);
static HELD: AtomicU64 = AtomicU64::new(0);

/// Counts one send `isend` held for a full open bundle (once per send, not
/// per call; see `Engine::bundle_full`).
pub fn count_bundle_hold() {
    HELD.fetch_add(1, Ordering::Relaxed);
}

/// What bundling did in this process (all devices), for tests and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BundleCounts {
    /// Bundles sent.
    pub bundles: u64,
    /// Sends they carried.
    pub records: u64,
    /// Bundles among them written into the receiver's bundle slots
    /// (`engine/slots.rs`): those larger than one eager message.
    pub written: u64,
    /// Sends queued in a bundle that outgrew a tagged one and found no slot
    /// within the time bound: each went as its own message.
    pub singles: u64,
    /// Slot offers receive comms made (each slot at connect, and again each
    /// time its bundle was delivered).
    pub slot_offers: u64,
    /// Slot offers send comms read.
    pub slot_offers_read: u64,
    /// Records received before their receive was posted (kept until it was).
    pub early: u64,
    /// Open bundles that went out on their time bound (200 µs) while sends were
    /// still in flight, instead of when those completed.
    pub overdue: u64,
    /// Bundle receive posts that met a full receive queue (`-FI_EAGAIN`); each is
    /// retried by later progress calls (and counts again should it meet the
    /// full queue again).
    pub deferred: u64,
    /// Bundle receives posted by such a retry (or dropped by it, their comm
    /// closing).
    pub reposted: u64,
    /// Sends `isend` held back while the open bundle they would join was full
    /// and could not go yet.
    pub held: u64,
    /// Receive comms that posted all their bundle receives, their first bundle
    /// having come (each posts one until then).
    pub grown: u64,
}

/// This process's [`BundleCounts`] so far.
pub fn bundle_counts() -> BundleCounts {
    let (written, slot_offers, slot_offers_read) = super::slots::slot_counts();
    BundleCounts {
        bundles: BUNDLES.load(Ordering::Relaxed),
        records: RECORDS.load(Ordering::Relaxed),
        written,
        singles: SINGLES.load(Ordering::Relaxed),
        slot_offers,
        slot_offers_read,
        early: EARLY.load(Ordering::Relaxed),
        overdue: OVERDUE.load(Ordering::Relaxed),
        deferred: DEFERRED.load(Ordering::Relaxed),
        reposted: REPOSTED.load(Ordering::Relaxed),
        held: HELD.load(Ordering::Relaxed),
        grown: GROWN.load(Ordering::Relaxed),
    }
}
