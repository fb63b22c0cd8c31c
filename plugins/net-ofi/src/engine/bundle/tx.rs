//! The sending side of bundles: the open bundle, what is in flight, and when a
//! bundle goes out (see `super`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cclkit_abi::{Error, Result, nccl_warn};

use super::super::slots::SLOT_BYTES;
use super::super::write::cq_data;
use super::super::{Engine, OpId, Owner, Post, State};
use super::{BUNDLES, OVERDUE, RECORDS, SINGLES};
use crate::bundle::{self, Writer};
use crate::proto::Cts;
use crate::tags::Ctrl;

/// Bundles a connection may have in flight; beyond that a small send that does
/// not fit the open bundle waits for it a little, then goes out on its own (so
/// bundles never pile up behind a slow receiver; `admit.rs`).
const MAX_TX_BUNDLES: u32 = 4;
/// Largest send copied into a tagged bundle. Larger ones cost more in the
/// two copies (into the bundle, out of it) than the message they save: on
/// `tcp` alone (libfabric 2.6, 128 KiB bundles) 32 KiB sends three to a
/// bundle ran 1.02-1.14x raw libfabric, 48 KiB ones two to a bundle
/// 0.81-0.93x, against 0.94-0.98x sent alone.
const MAX_COPIED: usize = 32 << 10;
/// Longest an open bundle waits for the sends in flight to complete. They
/// complete without the receiver's help, but its provider may hold them back
/// while it is short of buffers; this bounds what that can cost.
const MAX_OPEN: Duration = Duration::from_micros(200);
/// Longest a bundle that outgrew a tagged one waits for a slot.
const MAX_SLOT_WAIT: Duration = Duration::from_micros(50);
/// Emptied bundle buffers a connection keeps for its next bundles.
const SPARE_BUFFERS: usize = 4;
/// The sending side of a connection that bundles.
#[derive(Default)]
pub struct Tx {
    /// Bundle capacity in bytes (the smaller of both sides' settings).
    max: usize,
    /// The receive comm's id: bundles go to its bundle tag.
    comm_id: u16,
    /// Sends of at most `max` bytes (single messages and bundles) posted whose
    /// completion is unread: the open bundle goes out once there are none.
    inflight: u32,
    /// Bundles among them.
    bundles: u32,
    /// The bundle being filled, when it was opened, and the queued sends it
    /// carries (op, bytes, data tag).
    open: Option<Writer>,
    opened: Option<Instant>,
    waiting: Vec<(OpId, usize, u64)>,
    spare: Vec<Box<[u8]>>,
    /// Largest send a bundle bound for a slot takes (`engine/slots.rs`): half a
    /// slot. 0 = this connection takes no slots.
    slot_record: usize,
    /// Slots on offer, and the one the open bundle will be written into.
    slots: Vec<Cts>,
    slot: Option<Cts>,
    /// The receiver has offered a slot (so it has them).
    slot_offered: bool,
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx")
            .field("max", &self.max)
            .field("inflight", &self.inflight)
            .field("bundles", &self.bundles)
            .field("queued", &self.waiting.len())
            .finish()
    }
}

impl Tx {
    /// Largest send a tagged bundle takes: two must fit, or bundling saves
    /// nothing; and at most [`MAX_COPIED`].
    fn max_record(&self) -> usize {
        ((self.max - bundle::HEADER) / 2 - bundle::RECORD).min(MAX_COPIED)
    }

    /// Slots are on: this connection asked for them and its receiver offered
    /// some (a receiver without them must not make sends wait for one).
    fn slots_on(&self) -> bool {
        self.slot_record > 0 && self.slot_offered
    }

    /// Largest send queued: with slots on, half a slot.
    fn max_queued(&self) -> usize {
        if self.slots_on() {
            self.slot_record.max(self.max_record())
        } else {
            self.max_record()
        }
    }

    /// Whether the open bundle outgrew a tagged bundle and has no slot yet.
    fn slot_missing(&self) -> bool {
        self.slot.is_none() && self.open.as_ref().is_some_and(|w| w.used() > self.max)
    }

    /// Whether the open bundle needs a slot it does not have yet (it outgrew a
    /// tagged bundle); takes one if one is on offer.
    fn wants_slot(&mut self) -> bool {
        if self.slot_missing() {
            self.slot = self.slots.pop();
        }
        self.slot_missing()
    }

    /// [`Tx::wants_slot`] without taking one: the open bundle waits for a slot
    /// and none is on offer.
    fn waits_for_slot(&self) -> bool {
        self.slot_missing() && self.slots.is_empty()
    }

    /// Keeps a slot offer; `false` when this connection asked for none. Offers
    /// past `max` are dropped (the receiver offers each slot once at a time).
    pub(in crate::engine) fn take_slot_offer(&mut self, cts: Cts, max: usize) -> bool {
        if self.slot_record == 0 {
            return false;
        }
        self.slot_offered = true;
        if self.slots.len() < max {
            self.slots.push(cts);
        }
        true
    }

    /// Bytes of a bundle buffer: room for a slot's bundle once slots are on.
    fn buf_len(&self) -> usize {
        if self.slots_on() {
            self.max.max(SLOT_BYTES)
        } else {
            self.max
        }
    }
}

impl Engine {
    /// Makes connection `conn` bundle its small sends to receive comm `comm_id`,
    /// in bundles of at most `max` bytes.
    pub fn enable_bundle_tx(&mut self, conn: u64, comm_id: u16, max: usize) {
        if max < bundle::HEADER + 2 * (bundle::RECORD + 8) {
            return;
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.tx = Some(Tx {
                max,
                comm_id,
                ..Tx::default()
            });
        }
    }

    /// Lets connection `conn`, which bundles and writes, bundle into the slots
    /// its receiver offers: sends of up to half a slot then queue behind sends
    /// in flight, and those above a tagged bundle go into a slot on an idle
    /// connection too.
    pub fn enable_slot_tx(&mut self, conn: u64) {
        if let Some(tx) = self.tx(conn) {
            tx.slot_record = SLOT_BYTES / 2 - bundle::HEADER - bundle::RECORD;
        }
    }

    /// Posts a tagged send of NCCL memory, or copies it into the open bundle (a
    /// small send while the connection has sends in flight, or one for a slot);
    /// the operation then completes when the bundle is posted, or, as its last,
    /// when the bundle's send does. Only connections of devices that offer host
    /// memory alone bundle (`OfiNet::device`), so the copy reads host memory.
    ///
    /// # Safety
    /// `buf` must stay valid for `len` bytes until the operation completes or is
    /// abandoned; `desc` must be NULL or a live registration covering it.
    pub unsafe fn send_data(
        &mut self,
        conn: u64,
        buf: *const u8,
        len: usize,
        desc: usize,
        tag: u64,
    ) -> Result<OpId> {
        if self.joins_bundle(conn, len) {
            // SAFETY: NCCL's buffer holds `len` bytes (caller's contract).
            let payload = unsafe { std::slice::from_raw_parts(buf, len) };
            if let Some(op) = self.queue_send(conn, tag, payload)? {
                return Ok(op);
            }
        }
        let counted = self.completes_alone(conn, len, false);
        let dest = self.conn(conn)?.peer;
        let op = self.alloc(Owner::Caller, false, Some(conn), None);
        let post = Post::Send {
            buf: buf as usize,
            len,
            desc,
            dest,
            tag,
        };
        // `buf` stays valid until the operation completes (caller's contract).
        let op = self.submit(op, post)?;
        if counted {
            self.count_send(op);
        }
        Ok(op)
    }

    /// Whether a send of `len` bytes on `conn` (an RMA write into a slot when
    /// `write`) completes without the receiver's help: only those count in
    /// `Tx::inflight`, which an open bundle waits to drain. A tagged send larger
    /// than an eager message (`ofi_rxm` segments it, or makes it a rendezvous)
    /// completes only as its receiver takes it; waiting for it cost every
    /// bundle behind it the 200 µs bound when ranks shared cores (3 ranks on 2
    /// CPUs, 32 KiB `sendrecv`: 250 µs an operation instead of 45).
    fn completes_alone(&self, conn: u64, len: usize, write: bool) -> bool {
        self.tx_ref(conn).is_some_and(|tx| write || len <= tx.max)
    }

    /// Counts a posted data send in its connection's in-flight sends (and a
    /// bundle's among its bundles in flight).
    fn count_send(&mut self, op: OpId) {
        let Some(s) = self.slot_mut(op) else { return };
        if matches!(s.state, State::Done(_) | State::Failed(_)) {
            return;
        }
        s.data_send = true;
        let (conn, bundle) = (s.conn, s.owner == Owner::BundleTx);
        if let Some(tx) = conn
            .and_then(|k| self.conns.get_mut(&k))
            .and_then(|c| c.tx.as_mut())
        {
            tx.inflight += 1;
            if bundle {
                tx.bundles += 1;
            }
        }
    }

    /// Copies one send into the open bundle; `None` when it must go on its own
    /// (the open bundle is full and the connection has its bundles in flight).
    fn queue_send(&mut self, conn: u64, tag: u64, payload: &[u8]) -> Result<Option<OpId>> {
        let full = {
            let Some(tx) = self.conns.get_mut(&conn).and_then(|c| c.tx.as_mut()) else {
                return Ok(None);
            };
            tx.open.as_ref().is_some_and(|w| !w.fits(payload.len()))
        };
        if full {
            // A full bundle still waiting for a slot keeps waiting (the time
            // bound sends it on): this send goes on its own, which costs no
            // more than the bundle's sends going alone would.
            if self
                .tx(conn)
                .is_some_and(|tx| tx.bundles >= MAX_TX_BUNDLES || tx.wants_slot())
            {
                return Ok(None);
            }
            self.post_bundle(conn)?;
        }
        let op = self.alloc(Owner::Caller, false, Some(conn), None);
        self.slots[op.idx as usize].state = State::Queued;
        let Some(tx) = self.tx(conn) else {
            self.release(op.idx);
            return Ok(None);
        };
        let w = match tx.open.as_mut() {
            Some(w) => w,
            None => {
                let len = tx.buf_len();
                let buf = tx
                    .spare
                    .pop()
                    .filter(|b| b.len() >= len)
                    .unwrap_or_else(|| vec![0u8; len].into_boxed_slice());
                // With slots on, a bundle may outgrow one eager message: it is
                // then written into a slot (taken now if one is on offer, else
                // when one comes back, see `flush_bundles`).
                tx.slot = tx.slots.pop();
                let limit = match tx.slot {
                    Some(s) => (s.cap as usize).min(SLOT_BYTES).max(tx.max),
                    None if tx.slots_on() => SLOT_BYTES,
                    None => tx.max,
                };
                tx.opened = Some(Instant::now());
                tx.open.insert(Writer::with_limit(buf, limit))
            }
        };
        if !w.fits(payload.len()) {
            // A send larger than a tagged bundle's half, with no slot left
            // for the new bundle: it goes on its own.
            if let Some(w) = tx.open.take() {
                tx.spare.push(w.finish().0);
            }
            tx.opened = None;
            if let Some(slot) = tx.slot.take() {
                tx.slots.push(slot);
            }
            self.release(op.idx);
            return Ok(None);
        }
        w.push(tag, payload);
        tx.waiting.push((op, payload.len(), tag));
        if !self.open_tx.contains(&conn) {
            self.open_tx.push(conn);
        }
        Ok(Some(op))
    }

    fn tx(&mut self, conn: u64) -> Option<&mut Tx> {
        self.conns.get_mut(&conn).and_then(|c| c.tx.as_mut())
    }

    fn tx_ref(&self, conn: u64) -> Option<&Tx> {
        self.conns.get(&conn).and_then(|c| c.tx.as_ref())
    }

    /// Posts the open bundle of `conn`; its queued sends complete now but the
    /// last, which completes with it (see `Slot::carried`), or all fail with
    /// the post.
    fn post_bundle(&mut self, conn: u64) -> Result<()> {
        self.open_tx.retain(|&k| k != conn);
        let Some(c) = self.conns.get_mut(&conn) else {
            return Ok(());
        };
        let dest = c.peer;
        let Some(tx) = c.tx.as_mut() else {
            return Ok(());
        };
        let Some(w) = tx.open.take() else {
            return Ok(());
        };
        tx.opened = None;
        let waiting = std::mem::take(&mut tx.waiting);
        let (buf, used) = w.finish();
        // A bundle larger than a tagged one (a lone record too: `ofi_rxm` would
        // segment it) is written into its slot; any other hands its slot back.
        let grown = used > tx.max;
        let slot = match tx.slot.take() {
            None if grown => tx.slots.pop(),
            s => s,
        };
        let write = match slot {
            Some(s) if grown => Some(s),
            Some(s) => {
                tx.slots.push(s);
                None
            }
            None if grown => return self.post_singles(conn, dest, buf, waiting),
            None => None,
        };
        // A lone record not written into a slot goes out as the message it
        // stands for, from the bundle buffer: its receive then completes as a
        // plain one (no copy, nothing to withdraw).
        let lone = waiting.len() == 1 && write.is_none();
        let (from, len, tag) = match waiting[..] {
            [(_, len, tag)] if lone => (
                buf.as_ptr() as usize + bundle::HEADER + bundle::RECORD,
                len,
                tag,
            ),
            _ => (
                buf.as_ptr() as usize,
                used,
                self.layout.ctrl(Ctrl::Bundle, tx.comm_id),
            ),
        };
        let comm_id = tx.comm_id;
        let op = self.alloc(Owner::BundleTx, false, Some(conn), Some(buf));
        let posted = self.ctrl_desc(op, from, len).and_then(|desc| {
            let post = match write {
                Some(s) => Post::Write {
                    buf: from,
                    len,
                    desc,
                    dest,
                    addr: s.addr,
                    key: s.key,
                    data: cq_data(comm_id, s.token, s.generation, len),
                },
                None => Post::Send {
                    buf: from,
                    len,
                    desc,
                    dest,
                    tag,
                },
            };
            self.submit(op, post)
        });
        match &posted {
            Ok(op) => {
                let records = waiting.len() as u64;
                if self.completes_alone(conn, len, write.is_some()) {
                    self.count_send(*op);
                }
                // All but the last complete now (their bytes are copied), so the
                // caller posts more while this bundle flies; the last completes
                // with it, so the caller keeps calling until it is out.
                let mut waiting = waiting;
                let last = waiting.split_off(waiting.len().saturating_sub(1));
                self.settle_queued(waiting, None);
                if let Some(s) = self.slot_mut(*op) {
                    s.carried = last;
                } else {
                    self.settle_queued(last, None);
                }
                if !lone {
                    BUNDLES.fetch_add(1, Ordering::Relaxed);
                    RECORDS.fetch_add(records, Ordering::Relaxed);
                }
                if write.is_some() {
                    self.count_slot_write();
                }
            }
            Err(e) => {
                let f = format!("posting a bundle of {} sends failed: {e}", waiting.len());
                self.settle_queued(waiting, Some(&f));
            }
        }
        posted.map(drop)
    }

    /// A grown bundle that found no slot before its time ran out: each send goes
    /// as the message it stands for, from its own copy (a slot is not coming back
    /// soon: its receiver keeps records for receives not posted yet). A send
    /// that cannot be posted fails with those after it; those before it went.
    fn post_singles(
        &mut self,
        conn: u64,
        dest: u64,
        buf: Box<[u8]>,
        mut waiting: Vec<(OpId, usize, u64)>,
    ) -> Result<()> {
        let mut at = bundle::HEADER;
        let mut posted = 0;
        let mut failure = None;
        for &(q, len, tag) in &waiting {
            let bytes: Box<[u8]> = buf[at + bundle::RECORD..at + bundle::RECORD + len].into();
            at += bundle::record_bytes(len);
            match self.send_owned(dest, tag, bytes, Owner::BundleTx, Some(conn)) {
                Ok(op) => {
                    if self.completes_alone(conn, len, false) {
                        self.count_send(op);
                    }
                    if let Some(s) = self.slot_mut(op) {
                        s.carried.push((q, len, tag));
                    } else {
                        self.settle_queued(vec![(q, len, tag)], None);
                    }
                    posted += 1;
                }
                Err(e) => {
                    failure = Some(format!("posting a send held for a bundle slot failed: {e}"));
                    break;
                }
            }
        }
        if let Some(tx) = self.tx(conn)
            && tx.spare.len() < SPARE_BUFFERS
        {
            tx.spare.push(buf);
        }
        SINGLES.fetch_add(posted as u64, Ordering::Relaxed);
        let unposted = waiting.split_off(posted);
        self.settle_queued(unposted, failure.as_deref());
        match failure {
            Some(m) => Err(Error::system(m)),
            None => Ok(()),
        }
    }

    /// Ends the queued sends of a bundle that went out (`None`) or failed.
    pub(in crate::engine) fn settle_queued(
        &mut self,
        waiting: Vec<(OpId, usize, u64)>,
        failure: Option<&str>,
    ) {
        for (q, len, _) in waiting {
            let Some(s) = self.slot_mut(q) else { continue };
            if s.owner == Owner::Orphan {
                self.release(q.idx);
                continue;
            }
            s.state = match failure {
                None => State::Done(len),
                Some(m) => State::Failed(m.to_string()),
            };
        }
    }

    /// Posts the open bundles of connections with nothing else in flight (run by
    /// every progress call, after the completions were read). A bundle that
    /// outgrew a tagged one waits for a slot, up to its time bound.
    pub(in crate::engine) fn flush_bundles(&mut self) {
        let mut i = 0;
        while let Some(&conn) = self.open_tx.get(i) {
            // (idle, overdue); a connection without a sending side just drops out.
            let due = self.tx(conn).map_or((true, false), |tx| {
                let wants = tx.wants_slot();
                let bound = if wants { MAX_SLOT_WAIT } else { MAX_OPEN };
                let overdue = tx.opened.is_some_and(|t| t.elapsed() >= bound);
                (tx.inflight == 0 && !wants, overdue)
            });
            match due {
                (true, _) => {}
                (false, true) => {
                    OVERDUE.fetch_add(1, Ordering::Relaxed);
                }
                (false, false) => {
                    i += 1;
                    continue;
                }
            }
            if let Err(e) = self.post_bundle(conn) {
                nccl_warn!("NET/OFI: {e}");
            }
        }
    }

    /// A data send completed (or was dropped unposted): one less in flight.
    pub(in crate::engine) fn end_send(&mut self, idx: u32) {
        let s = &mut self.slots[idx as usize];
        if !std::mem::replace(&mut s.data_send, false) {
            return;
        }
        let bundle = s.owner == Owner::BundleTx;
        if let Some(tx) = s
            .conn
            .and_then(|k| self.conns.get_mut(&k))
            .and_then(|c| c.tx.as_mut())
        {
            tx.inflight = tx.inflight.saturating_sub(1);
            if bundle {
                tx.bundles = tx.bundles.saturating_sub(1);
            }
        }
    }

    /// A bundle's send completed (`failure`: why not, and whether it was
    /// cancelled): the sends it carries end with it, its buffer goes back to the
    /// connection; a failure other than a cancellation fails the connection
    /// (later requests report it).
    pub(in crate::engine) fn bundle_sent(&mut self, idx: u32, failure: Option<(String, bool)>) {
        let s = &mut self.slots[idx as usize];
        let (conn, buf, carried) = (s.conn, s.buf.take(), std::mem::take(&mut s.carried));
        self.release(idx);
        self.settle_queued(carried, failure.as_ref().map(|(m, _)| m.as_str()));
        let Some(c) = conn.and_then(|k| self.conns.get_mut(&k)) else {
            return;
        };
        if let Some((m, false)) = failure {
            c.failed.get_or_insert(m);
        }
        if let (Some(tx), Some(buf)) = (c.tx.as_mut(), buf)
            && tx.spare.len() < SPARE_BUFFERS
            && buf.len() >= tx.buf_len()
        {
            tx.spare.push(buf);
        }
    }

    /// Drops the open bundle of a closing connection; its queued sends fail.
    pub(in crate::engine) fn drop_bundle(&mut self, conn: u64) {
        self.open_tx.retain(|&k| k != conn);
        let Some(tx) = self.tx(conn) else { return };
        tx.open = None;
        tx.opened = None;
        tx.slot = None;
        for (q, _, _) in std::mem::take(&mut tx.waiting) {
            let Some(s) = self.slot_mut(q) else { continue };
            if s.owner == Owner::Orphan {
                self.release(q.idx);
            } else {
                s.state =
                    State::Failed("the send comm was closed before this send went out".into());
            }
        }
    }
}

mod admit;
#[cfg(test)]
mod tests;
