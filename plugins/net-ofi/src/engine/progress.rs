//! Progress: reading completions (and error completions) and retrying the
//! backlog of posts that got `-FI_EAGAIN`.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use cclkit_abi::nccl_warn;

use super::{Engine, Failure, Lane, Owner, Slot, State};
use crate::sys;

const CQ_BATCH: usize = 16;

/// `fi_cq_read` calls made by this process (all devices).
static CQ_READS: AtomicU64 = AtomicU64::new(0);

/// How many times this process has read a completion queue (`fi_cq_read`), for
/// tests and benchmarks that check how much work a call does: on IP providers a
/// CQ read is a `poll(2)` system call, so `test` of a request that already
/// completed must not make one.
pub fn cq_reads() -> u64 {
    CQ_READS.load(Ordering::Relaxed)
}

/// Receives the providers refused with `-FI_EAGAIN` in this process (all devices).
pub(super) static RECVS_REFUSED: AtomicU64 = AtomicU64::new(0);

/// How many receive posts a provider has refused with `-FI_EAGAIN` in this
/// process, for checks whose premise is a full receive queue: libfabric 2.x's
/// `ofi_rxm` grows its receive pool past `FI_OFI_RXM_RX_SIZE` and refuses none.
pub fn receives_refused() -> u64 {
    RECVS_REFUSED.load(Ordering::Relaxed)
}

/// Bounds one progress call so a flood of completions cannot stall the caller.
const MAX_BATCHES: usize = 64;

impl Engine {
    /// Reads completions and retries backlogged posts.
    pub fn progress(&mut self) {
        self.read_cq();
        self.retry_backlog(Lane::Send);
        self.retry_backlog(Lane::CtrlRecv);
        // Bundle receives the provider refused go before NCCL's receives, which
        // wait for them anyway (`rx_reserved_for_bundles`).
        if !self.rx_unposted.is_empty() {
            self.repost_bundle_recvs();
        }
        self.retry_backlog(Lane::DataRecv);
        self.flush_bundles();
    }

    /// Posts the backlogged posts of `lane` in order until the provider's queue
    /// is full again.
    fn retry_backlog(&mut self, lane: Lane) {
        while let Some(&(op, post)) = self.backlog.queue(lane).front() {
            match self.try_post(op, post) {
                Ok(true) => {
                    self.backlog.queue(lane).pop_front();
                }
                Ok(false) => return,
                Err(e) => {
                    self.backlog.queue(lane).pop_front();
                    self.complete(op.idx, Err(e.into()));
                }
            }
        }
    }

    fn read_cq(&mut self) {
        let mut entries = [sys::fi_cq_tagged_entry::default(); CQ_BATCH];
        for _ in 0..MAX_BATCHES {
            CQ_READS.fetch_add(1, Ordering::Relaxed);
            match self.cq.read(&mut entries) {
                Ok(n) => {
                    for e in &entries[..n] {
                        // A peer's write: no operation of ours (op_context is
                        // undefined), its CQ data names the receive.
                        if e.flags & sys::FI_REMOTE_CQ_DATA as u64 != 0 {
                            self.write_arrived(e.data);
                            continue;
                        }
                        if let Some(idx) = self.slot_of(e.op_context) {
                            self.complete(idx, Ok(e.len));
                        }
                    }
                    if n < CQ_BATCH {
                        return;
                    }
                }
                Err(e) if e.code == sys::FI_EAVAIL as i32 => self.read_errors(),
                Err(e) => {
                    nccl_warn!("NET/OFI: {e}");
                    return;
                }
            }
        }
    }

    fn read_errors(&mut self) {
        loop {
            match self.cq.read_err() {
                Ok(Some(err)) => {
                    if err.flags & sys::FI_REMOTE_CQ_DATA as u64 != 0 {
                        nccl_warn!(
                            "NET/OFI: a peer's write failed here: {}",
                            err.to_fi_error("fi_writedata")
                        );
                        continue;
                    }
                    let Some(idx) = self.slot_of(err.op_context) else {
                        nccl_warn!(
                            "NET/OFI: completion error without an operation: {}",
                            err.to_fi_error("fi_cq_readerr")
                        );
                        continue;
                    };
                    let recv = self.slots[idx as usize].recv;
                    let msg = if err.err == sys::FI_ETRUNC as i32 && err.len + err.olen == 0 {
                        // Some providers (tcp;ofi_rxm) report no sizes for a truncation.
                        format!(
                            "message truncated: the peer sent more than the posted receive \
                             (the provider reported no sizes) ({})",
                            err.to_fi_error("fi_trecv")
                        )
                    } else if err.err == sys::FI_ETRUNC as i32 {
                        format!(
                            "message truncated: {} bytes arrived for a receive of {} ({})",
                            err.len + err.olen,
                            err.len,
                            err.to_fi_error("fi_trecv")
                        )
                    } else {
                        err.to_fi_error(if recv { "fi_trecv" } else { "fi_tsend" })
                            .to_string()
                    };
                    self.complete(idx, Err(Failure { code: err.err, msg }));
                }
                Ok(None) => return,
                Err(e) => {
                    nccl_warn!("NET/OFI: {e}");
                    return;
                }
            }
        }
    }

    /// Maps a completion's context back to its slot.
    fn slot_of(&self, ctx: *mut c_void) -> Option<u32> {
        if ctx.is_null() {
            return None;
        }
        // SAFETY: every context we post is the first field of a live boxed Slot;
        // the index is then checked against the slot table before use.
        let idx = unsafe { (*ctx.cast::<Slot>()).idx };
        let slot = self.slots.get(idx as usize)?;
        std::ptr::eq(&**slot as *const Slot as *const c_void, ctx).then_some(idx)
    }

    fn complete(&mut self, idx: u32, result: std::result::Result<usize, Failure>) {
        self.left_rx_queue(idx);
        let s = &mut self.slots[idx as usize];
        if std::mem::replace(&mut s.cancelling, false) {
            // A receive filled from a bundle: this is its withdrawal ending.
            if s.owner == Owner::Orphan {
                self.release(idx);
            }
            return;
        }
        self.end_send(idx);
        let s = &self.slots[idx as usize];
        let (owner, conn, op) = (
            s.owner,
            s.conn,
            super::OpId {
                idx,
                generation: s.generation,
            },
        );
        match owner {
            Owner::BundleTx => {
                let failure = result.err().map(|f| {
                    let cancelled = f.code == sys::FI_ECANCELED as i32;
                    (format!("sending a bundle failed: {}", f.msg), cancelled)
                });
                return self.bundle_sent(idx, failure);
            }
            Owner::BundleRx => return self.bundle_arrived(idx, result.map_err(|f| f.msg)),
            Owner::CtsRx => return self.cts_arrived(idx, result.map_err(|f| f.msg)),
            Owner::Caller if s.recv => self.forget_waiter(conn, op),
            _ => {}
        }
        let s = &mut self.slots[idx as usize];
        s.state = match &result {
            Ok(n) => State::Done(*n),
            Err(f) => State::Failed(f.msg.clone()),
        };
        // Only failed sends and pings say something about the peer; a failed
        // receive (truncation, cancellation) concerns that request alone.
        let watched = matches!(owner, Owner::Caller | Owner::Ping);
        let peer_error = !s.recv;
        if let Some(c) = conn
            .and_then(|k| self.conns.get_mut(&k))
            .filter(|_| watched)
        {
            match &result {
                Ok(_) if owner == Owner::Caller => c.progressed = true,
                Err(f)
                    if peer_error && f.code != sys::FI_ECANCELED as i32 && c.failed.is_none() =>
                {
                    c.failed = Some(if owner == Owner::Ping {
                        format!("peer unreachable (liveness ping failed): {}", f.msg)
                    } else {
                        f.msg.clone()
                    });
                }
                _ => {}
            }
            if owner == Owner::Ping {
                c.ping = None;
            }
        }
        match owner {
            Owner::Caller | Owner::BundleTx | Owner::BundleRx | Owner::CtsRx => {}
            Owner::Orphan | Owner::Ping => self.release(idx),
            Owner::PingSink => {
                self.release(idx);
                if let Err(e) = self.post_ping_sink() {
                    nccl_warn!("NET/OFI: cannot re-post the ping receive: {e}");
                }
            }
        }
    }
}
