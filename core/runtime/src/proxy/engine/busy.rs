//! Which connections a pass drives.
//!
//! A communicator installs a connection per channel, peer and link class (ring,
//! tree, point-to-point), while a small operation uses one or two of them: a pass
//! that asked every installed connection for progress spent most of its time on
//! idle ones (on 2 ranks at 8 B, callgrind counted 9 send-connection calls per
//! pass, for one link in use). The engine instead lists the links that may have
//! network work: a send link from the slice that fills one of its slots until
//! every posted send completed, a receive link from the batch that announces slices
//! on it until every receive it posted completed. A link on the list that turns
//! out idle costs one check and leaves.

use std::sync::atomic::{AtomicU64, Ordering};

use super::LinkMap;
use crate::error::Result;
use crate::schedule::Link;

/// Passes of progress made by this process's engines, and the connections those
/// passes drove (see [`pass_visits`]).
static PASSES: AtomicU64 = AtomicU64::new(0);
static VISITS: AtomicU64 = AtomicU64::new(0);

/// Passes of progress this process made (all engines) and how many connections
/// they asked for progress in all, for tests and benchmarks: a pass of a small
/// operation drives the few links it uses, however many are installed.
pub fn pass_visits() -> (u64, u64) {
    (
        PASSES.load(Ordering::Relaxed),
        VISITS.load(Ordering::Relaxed),
    )
}

/// The links with possible network work, by direction, and those holding the
/// batch's user-buffer registrations.
#[derive(Default)]
pub(in crate::proxy) struct Busy {
    /// Send links with filled or in-flight slots.
    pub(in crate::proxy) sends: Vec<Link>,
    /// Receive links with announced slices to post or receives in flight.
    pub(in crate::proxy) recvs: Vec<Link>,
    /// Send links holding registrations of the batch's user buffers (direct
    /// paths, `direct.rs`): the batch ends once their sends from them completed,
    /// and then releases them.
    pub(in crate::proxy) direct_sends: Vec<Link>,
    /// Receive links holding registrations of the batch's user buffers.
    pub(in crate::proxy) direct_recvs: Vec<Link>,
    /// Passes made since the counts were last published.
    pub(in crate::proxy) passes: u64,
    /// Connections those passes (and the background thread's) drove.
    pub(in crate::proxy) visits: u64,
}

impl Busy {
    /// Puts `l` on `list` unless it is there (lists hold a few links: a scan is
    /// cheaper than hashing).
    pub(in crate::proxy) fn mark(list: &mut Vec<Link>, l: &Link) {
        if !list.contains(l) {
            list.push(*l);
        }
    }

    /// Counts one pass.
    pub(in crate::proxy) fn count_pass(&mut self) {
        self.passes += 1;
    }

    /// Adds the passes and visits counted so far to the process-wide counts (once
    /// per operation: two atomic additions rather than two per pass).
    pub(in crate::proxy) fn publish(&mut self) {
        PASSES.fetch_add(std::mem::take(&mut self.passes), Ordering::Relaxed);
        VISITS.fetch_add(std::mem::take(&mut self.visits), Ordering::Relaxed);
    }
}

/// Drives the connections of the links on `list` (counting each in `visits`) and
/// drops from the list those left without work; whether any made progress.
pub(super) fn drive<C>(
    list: &mut Vec<Link>,
    conns: &mut LinkMap<C>,
    visits: &mut u64,
    progress: impl Fn(&mut C) -> Result<bool>,
    idle: impl Fn(&C) -> bool,
) -> Result<bool> {
    let mut moved = false;
    let mut i = 0;
    while let Some(l) = list.get(i) {
        match conns.get_mut(l) {
            Some(c) => {
                *visits += 1;
                moved |= progress(c)?;
                if idle(c) {
                    list.swap_remove(i);
                } else {
                    i += 1;
                }
            }
            None => {
                list.swap_remove(i);
            }
        }
    }
    Ok(moved)
}
