//! Bytes the runtime itself writes while running primitives, by copy site: a
//! deterministic measure of copies per byte (timing-free evidence of what a change to
//! the data path saves), plus the bytes that skipped staging altogether.
//!
//! The counters are process-wide (all communicators of the process) and relaxed
//! atomics: one add per slice and site, nothing on paths that copy nothing. Network
//! copies inside a plugin (socket reads and writes) are not counted: they are the
//! floor any runtime, MPI included, pays.

use std::sync::atomic::{AtomicU64, Ordering};

/// Where the engine writes (or avoids writing) bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// A received slot copied out (receive FIFO slot → user buffer, send slot or scratch).
    RecvCopy,
    /// This rank's input copied (with the pre-op when it enters a reduction).
    SrcCopy,
    /// Output of a reduction (`src ⊕ received…`), wherever it is written.
    Reduce,
    /// A result copied or encoded into a send FIFO slot.
    SendSlot,
    /// A result copied from a slot or scratch into the user's destination.
    ToDst,
    /// LL/LL128 lines decoded into scratch.
    Decode,
    /// Received by the plugin straight into the user buffer (no copy).
    DirectRecv,
    /// Sent by the plugin straight from the user buffer (no copy).
    DirectSend,
}

const SITES: usize = 8;

static COUNTS: [AtomicU64; SITES] = [const { AtomicU64::new(0) }; SITES];

/// Adds `bytes` to `site`'s counter.
pub(crate) fn add(site: Site, bytes: usize) {
    COUNTS[site as usize].fetch_add(bytes as u64, Ordering::Relaxed);
}

/// A snapshot of the counters (see [`copy_counts`]); subtract two snapshots to get
/// what one operation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyCounts {
    /// `Site::RecvCopy` bytes.
    pub recv_copy: u64,
    /// `Site::SrcCopy` bytes.
    pub src_copy: u64,
    /// `Site::Reduce` bytes.
    pub reduce: u64,
    /// `Site::SendSlot` bytes.
    pub send_slot: u64,
    /// `Site::ToDst` bytes.
    pub to_dst: u64,
    /// `Site::Decode` bytes.
    pub decode: u64,
    /// `Site::DirectRecv` bytes (not copies).
    pub direct_recv: u64,
    /// `Site::DirectSend` bytes (not copies).
    pub direct_send: u64,
}

impl CopyCounts {
    /// Bytes the runtime copied (every site but the reduction's output and the
    /// direct transfers, which copy nothing).
    pub fn copied(&self) -> u64 {
        self.recv_copy + self.src_copy + self.send_slot + self.to_dst + self.decode
    }

    /// `self − earlier`, site by site.
    pub fn since(&self, earlier: &CopyCounts) -> CopyCounts {
        CopyCounts {
            recv_copy: self.recv_copy.saturating_sub(earlier.recv_copy),
            src_copy: self.src_copy.saturating_sub(earlier.src_copy),
            reduce: self.reduce.saturating_sub(earlier.reduce),
            send_slot: self.send_slot.saturating_sub(earlier.send_slot),
            to_dst: self.to_dst.saturating_sub(earlier.to_dst),
            decode: self.decode.saturating_sub(earlier.decode),
            direct_recv: self.direct_recv.saturating_sub(earlier.direct_recv),
            direct_send: self.direct_send.saturating_sub(earlier.direct_send),
        }
    }
}

/// The process-wide counters now.
pub fn copy_counts() -> CopyCounts {
    let g = |s: Site| COUNTS[s as usize].load(Ordering::Relaxed);
    CopyCounts {
        recv_copy: g(Site::RecvCopy),
        src_copy: g(Site::SrcCopy),
        reduce: g(Site::Reduce),
        send_slot: g(Site::SendSlot),
        to_dst: g(Site::ToDst),
        decode: g(Site::Decode),
        direct_recv: g(Site::DirectRecv),
        direct_send: g(Site::DirectSend),
    }
}
