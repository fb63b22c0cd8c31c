//! The receiving side of bundles: the standing bundle receives, the receives a
//! record may fill, and the records that arrived before their receive (see
//! `super`).

use std::sync::atomic::Ordering;

use cclkit_abi::{Result, nccl_warn};

use super::super::{Engine, OpId, Owner, Post, State};
use super::{DEFERRED, EARLY, GROWN, REPOSTED};
use crate::bundle;
use crate::tags::Ctrl;

/// Bundle receives a receive comm keeps posted once its sender has bundled.
/// They stand in the provider's receive queue for the comm's life, next to
/// NCCL's receives. Fewer let a sender outrun them: measured with 2, bundles
/// arriving with no receive posted piled up in `ofi_rxm`'s unexpected list,
/// which every later receive post scans, and 4 KiB streams ran at 0.15-0.8x
/// the raw loop instead of 1.5x.
pub(in crate::engine) const RX_BUFFERS: usize = 8;
/// Bundle receives a receive comm posts before its first bundle arrives. The
/// providers match a message against their posted receives one by one, in
/// posting order (`tcp`'s `xnet_match_tag`), and standing receives posted at
/// connect stay first: with 8 per comm, 2 ranks through the runtime (5
/// receive comms each, no bundles) spent about 1 us per message scanning them
/// (`perf`: `xnet_match_tag` 3 % of all samples, from none with bundles off).
/// The first bundle shows the sender bundles; the others are posted then.
const RX_FIRST: usize = 1;
/// Receive-queue entries NCCL's receives leave to control receives when bundles
/// are on (see [`Engine::rx_reserved_for_bundles`]).
const CTRL_ENTRIES: usize = 4;

/// A posted receive a record may fill instead of its own message.
struct Waiter {
    tag: u64,
    op: OpId,
    addr: usize,
    cap: usize,
}

/// A record that arrived before its receive was posted.
struct Stashed {
    tag: u64,
    held: usize,
    off: usize,
    len: usize,
}

/// Where a received bundle lies.
pub(in crate::engine) enum BundleBuf {
    /// A bundle receive's buffer: posted again once free.
    Posted(Box<[u8]>),
    /// Bundle slot `index` (`engine/slots.rs`) at `ptr`, in memory its
    /// connection owns: offered again once free.
    Slot { index: usize, ptr: usize },
}

impl BundleBuf {
    /// The first `n` bytes.
    fn bytes(&self, n: usize) -> &[u8] {
        match self {
            Self::Posted(b) => &b[..n.min(b.len())],
            // SAFETY: the slot's connection owns its memory, which holds
            // `SLOT_BYTES` >= `n` bytes (`slot_written` checked `n`) and outlives
            // every `BundleBuf` of it (both go with the connection); the peer
            // writes a slot only while it is on offer, which it is not while a
            // `BundleBuf` names it.
            Self::Slot { ptr, .. } => unsafe {
                std::slice::from_raw_parts(
                    *ptr as *const u8,
                    n.min(super::super::slots::SLOT_BYTES),
                )
            },
        }
    }
}

/// A received bundle with records still undelivered.
struct Held {
    buf: BundleBuf,
    len: usize,
    left: usize,
}

/// The receiving side of a connection that accepts bundles.
#[derive(Default)]
pub struct Rx {
    comm_id: u16,
    waiters: Vec<Waiter>,
    stash: Vec<Stashed>,
    held: Vec<Option<Held>>,
    /// All `RX_BUFFERS` bundle receives have been posted (a bundle came).
    grown: bool,
    /// Bytes of each bundle receive.
    buf_len: usize,
    /// Bundle buffers whose post met a full receive queue (`-FI_EAGAIN`): retried
    /// by each progress call, never queued in the receive backlog, where a standing
    /// receive would hold up every post behind it.
    unposted: Vec<Box<[u8]>>,
}

impl std::fmt::Debug for Rx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rx")
            .field("comm_id", &self.comm_id)
            .field("waiters", &self.waiters.len())
            .field("stashed", &self.stash.len())
            .finish()
    }
}

impl Engine {
    /// Bundle receives this endpoint may keep standing, all comms together: a
    /// quarter of the provider's receive queue, so NCCL's receives always find
    /// room. A receive comm beyond that takes no bundles, and a queue under 32
    /// entries (`FI_OFI_RXM_RX_SIZE=4`) none at all.
    pub fn set_bundle_rx_budget(&mut self, rx_queue: usize) {
        self.rx_queue = rx_queue;
        self.bundle_rx_budget = rx_queue / 4;
    }

    /// Whether a data receive must wait (in the backlog): the entries left in
    /// the receive queue belong to the bundle buffers. Those
    /// are posted, or held for records, or about to be posted again; were NCCL's
    /// receives to take their entries, a receive comm could be left with no
    /// bundle receive posted while NCCL's receives wait for records in bundles
    /// nobody receives, and no receive would ever complete to make room.
    /// A few entries past those stay free for control receives (connect,
    /// accept, pings), so setting up a connection never waits for data.
    pub(in crate::engine) fn rx_reserved_for_bundles(&self) -> bool {
        self.bundle_rx_standing > 0
            && self.rx_posted + self.bundle_rx_standing + CTRL_ENTRIES >= self.rx_queue
    }

    /// Slot `idx` is done with the provider's receive queue (completed or freed).
    pub(in crate::engine) fn left_rx_queue(&mut self, idx: u32) {
        let s = &mut self.slots[idx as usize];
        if std::mem::replace(&mut s.in_rx_queue, false) {
            self.rx_posted = self.rx_posted.saturating_sub(1);
        }
    }

    /// Makes connection `conn` (receive comm `comm_id`) take bundles of up to
    /// `max` bytes: reserves `RX_BUFFERS` (8) entries of the receive queue and
    /// posts `RX_FIRST` of them (the rest when the first bundle comes). `false`
    /// (nothing done) when the endpoint's budget of standing receives is spent.
    pub fn enable_bundle_rx(&mut self, conn: u64, comm_id: u16, max: usize) -> Result<bool> {
        if self.bundle_rx_standing + RX_BUFFERS > self.bundle_rx_budget {
            return Ok(false);
        }
        let c = self.conn(conn)?;
        c.rx = Some(Rx {
            comm_id,
            buf_len: max,
            ..Rx::default()
        });
        self.bundle_rx_standing += RX_BUFFERS;
        for _ in 0..RX_FIRST {
            self.post_bundle_recv(conn, vec![0u8; max].into_boxed_slice())?;
        }
        Ok(true)
    }

    /// A retiring connection's standing receives return to the budget.
    pub(in crate::engine) fn bundle_rx_retired(&mut self, rx: Option<Rx>) {
        if rx.is_some() {
            self.bundle_rx_standing = self.bundle_rx_standing.saturating_sub(RX_BUFFERS);
        }
    }

    /// Posts a bundle receive into `buf`, or keeps it for a later progress call
    /// when the provider's queue is full; `true` when it was kept.
    fn post_bundle_recv(&mut self, conn: u64, buf: Box<[u8]>) -> Result<bool> {
        // A closing comm posts nothing new: it retires once its receives are gone.
        let Some(comm_id) = self
            .conns
            .get(&conn)
            .filter(|c| !c.closing)
            .and_then(|c| c.rx.as_ref())
            .map(|r| r.comm_id)
        else {
            return Ok(false);
        };
        let (ptr, len) = (buf.as_ptr() as usize, buf.len());
        let op = self.alloc(Owner::BundleRx, true, Some(conn), Some(buf));
        let desc = self.ctrl_desc(op, ptr, len)?;
        let post = Post::Recv {
            buf: ptr,
            len,
            desc,
            tag: self.layout.ctrl(Ctrl::Bundle, comm_id),
            ignore: 0,
        };
        match self.try_post(op, post) {
            Ok(true) => Ok(false),
            Ok(false) => {
                DEFERRED.fetch_add(1, Ordering::Relaxed);
                let buf = self.slots[op.idx as usize].buf.take();
                self.release(op.idx);
                if let (Some(rx), Some(buf)) = (self.rx(conn), buf) {
                    rx.unposted.push(buf);
                }
                if !self.rx_unposted.contains(&conn) {
                    self.rx_unposted.push(conn);
                }
                Ok(true)
            }
            Err(e) => {
                self.release(op.idx);
                Err(e.into())
            }
        }
    }

    /// Retries the bundle receives that met a full queue.
    pub(in crate::engine) fn repost_bundle_recvs(&mut self) {
        for conn in std::mem::take(&mut self.rx_unposted) {
            let bufs = self
                .rx(conn)
                .map(|rx| std::mem::take(&mut rx.unposted))
                .unwrap_or_default();
            for buf in bufs {
                match self.post_bundle_recv(conn, buf) {
                    Ok(true) => {}
                    Ok(false) => {
                        REPOSTED.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        self.fail_conn(conn, format!("re-posting a bundle receive failed: {e}"))
                    }
                }
            }
        }
    }

    /// Posts a tagged receive into NCCL memory, or fills it at once from a record
    /// that arrived first.
    ///
    /// # Safety
    /// `buf` must stay valid and writable for `len` bytes until the operation
    /// completes or is abandoned; `desc` must be NULL or a live registration
    /// covering it.
    pub unsafe fn recv_data(
        &mut self,
        conn: u64,
        buf: *mut u8,
        len: usize,
        desc: usize,
        tag: u64,
    ) -> Result<OpId> {
        // First come, first matched (`remove`, not `swap_remove`): should a
        // narrow provider's sequence numbers wrap, two records may share a tag.
        let stashed = self.rx(conn).and_then(|rx| {
            let at = rx.stash.iter().position(|s| s.tag == tag)?;
            Some(rx.stash.remove(at))
        });
        if let Some(s) = stashed {
            let op = self.alloc(Owner::Caller, true, Some(conn), None);
            // SAFETY: `buf` holds `len` bytes (caller's contract); the record's
            // bytes lie in a held bundle buffer.
            let state = unsafe { self.fill_from_held(conn, &s, buf, len) };
            self.slots[op.idx as usize].state = state;
            self.record_taken(conn, s.held);
            return Ok(op);
        }
        let op = self.alloc(Owner::Caller, true, Some(conn), None);
        let post = Post::Recv {
            buf: buf as usize,
            len,
            desc,
            tag,
            ignore: 0,
        };
        // `buf` stays valid and writable until the operation completes (caller's
        // contract).
        let op = self.submit(op, post)?;
        if let Some(rx) = self.rx(conn) {
            rx.waiters.push(Waiter {
                tag,
                op,
                addr: buf as usize,
                cap: len,
            });
        }
        Ok(op)
    }

    fn rx(&mut self, conn: u64) -> Option<&mut Rx> {
        self.conns.get_mut(&conn).and_then(|c| c.rx.as_mut())
    }

    /// Copies stashed record `s` into `buf` (`len` bytes); the receive's outcome.
    ///
    /// # Safety
    /// `buf` must be writable for `len` bytes.
    unsafe fn fill_from_held(&mut self, conn: u64, s: &Stashed, buf: *mut u8, len: usize) -> State {
        let Some(held) = self
            .rx(conn)
            .and_then(|rx| rx.held.get(s.held))
            .and_then(Option::as_ref)
        else {
            return State::Failed("internal error: a bundled record lost its buffer".into());
        };
        // SAFETY: forwarded contract; the record lies inside the held buffer.
        unsafe { fill(buf, len, &held.buf.bytes(held.len)[s.off..s.off + s.len]) }
    }

    /// One record of held buffer `h` was delivered; the buffer is posted again
    /// once all were.
    fn record_taken(&mut self, conn: u64, h: usize) {
        let Some(rx) = self.rx(conn) else { return };
        let Some(held) = rx.held.get_mut(h).and_then(Option::as_mut) else {
            return;
        };
        held.left -= 1;
        if held.left > 0 {
            return;
        }
        if let Some(held) = rx.held[h].take() {
            self.bundle_buf_free(conn, held.buf);
        }
    }

    /// A bundle's buffer holds nothing undelivered: a bundle receive's is posted
    /// again, a slot offered again.
    fn bundle_buf_free(&mut self, conn: u64, buf: BundleBuf) {
        let r = match buf {
            BundleBuf::Posted(b) => self.post_bundle_recv(conn, b).map(drop),
            BundleBuf::Slot { index, .. } => self.offer_slot(conn, index),
        };
        if let Err(e) = r {
            self.fail_conn(conn, format!("re-posting a bundle buffer failed: {e}"));
        }
    }

    /// Records `msg` as the connection's failure (later requests report it).
    pub(in crate::engine) fn fail_conn(&mut self, conn: u64, msg: String) {
        nccl_warn!("NET/OFI: {msg}");
        if let Some(c) = self.conns.get_mut(&conn) {
            c.failed.get_or_insert(msg);
        }
    }

    /// A receive stopped waiting (completed by its own message, or given up).
    pub(in crate::engine) fn forget_waiter(&mut self, conn: Option<u64>, op: OpId) {
        self.forget_offer(conn, op);
        if let Some(rx) = conn.and_then(|k| self.rx(k))
            && let Some(at) = rx.waiters.iter().position(|w| w.op == op)
        {
            rx.waiters.remove(at);
        }
    }

    /// A bundle receive completed: delivers its records to the waiting receives,
    /// keeps the others, and posts the buffer again once nothing in it is kept.
    pub(in crate::engine) fn bundle_arrived(
        &mut self,
        idx: u32,
        got: std::result::Result<usize, String>,
    ) {
        let Some((conn, buf)) = self.take_owned(idx) else {
            return;
        };
        let n = match got {
            Ok(n) => n,
            Err(m) => {
                if self.conns.get(&conn).is_some_and(|c| !c.closing) {
                    self.fail_conn(conn, format!("a bundle receive failed: {m}"));
                }
                return;
            }
        };
        self.grow_bundle_rx(conn);
        self.unbundle(conn, BundleBuf::Posted(buf), n);
    }

    /// A bundle came: the comm's sender bundles, so the comm posts the rest of
    /// its `RX_BUFFERS` bundle receives (once).
    fn grow_bundle_rx(&mut self, conn: u64) {
        let Some(rx) = self.rx(conn).filter(|rx| !rx.grown) else {
            return;
        };
        rx.grown = true;
        let len = rx.buf_len;
        GROWN.fetch_add(1, Ordering::Relaxed);
        for _ in RX_FIRST..RX_BUFFERS {
            if let Err(e) = self.post_bundle_recv(conn, vec![0u8; len].into_boxed_slice()) {
                self.fail_conn(conn, format!("posting a bundle receive failed: {e}"));
                return;
            }
        }
    }

    /// Delivers the records of the `n`-byte bundle in `buf` to the waiting
    /// receives, keeps the others, and frees the buffer once nothing in it is kept.
    pub(in crate::engine) fn unbundle(&mut self, conn: u64, buf: BundleBuf, n: usize) {
        let Some(c) = self.conns.get(&conn).filter(|c| !c.closing) else {
            return;
        };
        if c.rx.is_none() {
            return;
        }
        let bytes = buf.bytes(n);
        let records = match bundle::parse(bytes, n) {
            Ok(r) => r,
            Err(m) => {
                self.fail_conn(conn, format!("malformed bundle from the peer: {m}"));
                return;
            }
        };
        let layout = self.layout;
        let mut kept = 0;
        let mut stash = Vec::new();
        for r in &records {
            let Some(rx) = self.rx(conn) else { return };
            if layout.comm_of(r.tag) != Some(rx.comm_id) {
                let comm_id = rx.comm_id;
                self.fail_conn(
                    conn,
                    format!(
                        "malformed bundle from the peer: a record tagged {:#x} is not for comm {comm_id}",
                        r.tag
                    ),
                );
                return;
            }
            match rx.waiters.iter().position(|w| w.tag == r.tag) {
                // The receive posted first, as the provider would match it.
                Some(at) => {
                    let w = rx.waiters.remove(at);
                    self.deliver(w, &bytes[r.off..r.off + r.len]);
                }
                None => {
                    kept += 1;
                    EARLY.fetch_add(1, Ordering::Relaxed);
                    stash.push(*r);
                }
            }
        }
        if kept == 0 {
            return self.bundle_buf_free(conn, buf);
        }
        let Some(rx) = self.rx(conn) else { return };
        let h = match rx.held.iter().position(Option::is_none) {
            Some(h) => h,
            None => {
                rx.held.push(None);
                rx.held.len() - 1
            }
        };
        rx.held[h] = Some(Held {
            buf,
            len: n,
            left: kept,
        });
        rx.stash.extend(stash.into_iter().map(|r| Stashed {
            tag: r.tag,
            held: h,
            off: r.off,
            len: r.len,
        }));
    }

    /// Fills waiting receive `w` with a record's bytes and withdraws its own post.
    fn deliver(&mut self, w: Waiter, bytes: &[u8]) {
        // SAFETY: a waiter exists only while its request holds the buffer (it is
        // forgotten when the receive completes or is given up).
        let state = unsafe { fill(w.addr as *mut u8, w.cap, bytes) };
        self.forget_offer(self.slot(w.op).and_then(|s| s.conn), w.op);
        self.withdraw(w.op, state);
    }

    /// Ends posted receive `op` with `state` (its bytes arrived another way: in a
    /// bundle, or by a write) and withdraws its own post.
    pub(in crate::engine) fn withdraw(&mut self, op: OpId, state: State) {
        let Some(s) = self.slot_mut(op) else { return };
        match s.state {
            State::Posted => {
                s.state = state;
                s.cancelling = true;
                let ctx: *mut crate::sys::fi_context2 = &mut s.ctx;
                // SAFETY: posted on this endpoint and not completed; its completion
                // (FI_ECANCELED) is read later and only ends the cancellation.
                if let Err(e) = unsafe { self.ep.cancel(ctx) } {
                    nccl_warn!("NET/OFI: withdrawing a receive filled another way: {e}");
                }
            }
            State::Backlogged => {
                s.state = state;
                self.backlog.remove(op);
            }
            _ => {}
        }
    }
}

/// Copies a record into a receive buffer of `cap` bytes: done with its size, or
/// failed as a truncation.
///
/// # Safety
/// `buf` must be writable for `cap` bytes.
unsafe fn fill(buf: *mut u8, cap: usize, bytes: &[u8]) -> State {
    if bytes.len() > cap {
        return State::Failed(format!(
            "message truncated: {} bytes arrived for a receive of {cap} (in a bundle)",
            bytes.len()
        ));
    }
    if !bytes.is_empty() {
        // SAFETY: `bytes.len() <= cap`, and the caller vouches for `cap` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
    }
    State::Done(bytes.len())
}
