//! The write path: a send of a size `ofi_rxm` would cut into segments through
//! bounce buffers goes as one RMA write straight into the posted receive.
//!
//! ```text
//! receiver                                   sender
//! irecv: post the tagged receive as always,
//!        CTS {token, seq, tag, cap, key, addr} ──▶ kept in the connection's offers
//!                                            isend of seq: an offer for (tag, seq)
//!                                            with len <= cap, len in the range?
//!        ◀── fi_writedata(data = comm id | token | generation | len)
//! remote CQ data: the receive is done with len,
//!        its tagged post is withdrawn                 else: tagged send as always
//! ```
//! A send whose receiver has been offering the sends before it waits for its
//! own offer a little (`isend` gives NCCL no request, `data::isend`): a
//! stream's sender runs ahead of its receiver, and without waiting nearly every
//! send found no offer on libfabric 2.x. Any other send that finds none (its
//! receive is never offered, its wait ran out, or its size is out of range) is
//! a tagged send that matches the posted receive as before, and the offer goes
//! stale (the sender drops offers for sequence numbers it has passed). Tokens
//! carry a generation, so a write naming a receive that already completed is
//! refused.
//!
//! On `tcp;ofi_rxm` a write of 32-96 KiB ran 1.1-1.6x a tagged send of the
//! same size (`docs/PERFORMANCE.md`): rxm sends those in 16 KiB segments through
//! bounce buffers on both sides, and a write goes from NCCL's buffer to NCCL's
//! buffer in one message.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use cclkit_abi::raw::common::subsys;
use cclkit_abi::{Result, nccl_info, nccl_warn};

use super::slots::{SLOT_TOKEN0, SlotsRx};
use super::{Engine, OpId, Owner, Post, State};
use crate::mr::RmaTarget;
use crate::proto::{CTS_LEN, Cts};
use crate::tags::Ctrl;

/// Clear-to-write receives a send comm keeps posted (NCCL has up to
/// `NCCL_STEPS` = 8 receives in flight per connection). All are posted at
/// connect, unlike bundle receives (`bundle/rx.rs`, `RX_FIRST`): a receiver
/// with bundle slots offers its 8 slots right after accept, and through one
/// offer receive those reached the sender one per progress call, so a new
/// connection's first receive offers came late and its first sends went
/// unwritten.
const CTS_BUFFERS: usize = 8;
/// Offers a send comm keeps at most; past that the oldest goes (each costs the
/// peer nothing: its receive completes by a tagged send instead).
const MAX_OFFERS: usize = 1024;
/// How far behind a send the latest offer of its tag may be for the send to
/// wait for its own (two windows of `NCCL_STEPS`).
const OFFER_LAG: u32 = 16;
/// Length bits in a write's CQ data.
const LEN_BITS: u32 = 28;
/// Token bits in a write's CQ data (receive offers below `SLOT_TOKEN0`, slots from it).
const TOKEN_BITS: u32 = 12;

mod counts;
use counts::{ARRIVED, LANDED, MISSED, OFFERS, WRITES};
pub use counts::{WriteCounts, count_offer_wait, write_counts};

/// The sending side of a connection that writes.
#[derive(Debug)]
pub struct WriteTx {
    /// The control id offers arrive on (this side's connect reply id).
    cts_id: u16,
    /// The receive comm's id, carried in every write's CQ data.
    comm_id: u16,
    /// Sizes sent as writes.
    range: (usize, usize),
    /// Offers not yet used, oldest first.
    offers: VecDeque<Cts>,
    /// Next sequence number per NCCL tag: offers behind it are stale.
    sent: Vec<(i32, u32)>,
    /// Latest sequence number per NCCL tag an offer arrived for (used, stale or
    /// not): a receiver that offered the sends just before one will offer it too.
    seen: Vec<(i32, u32)>,
}

/// The receiving side of a connection that takes writes.
#[derive(Debug)]
pub struct WriteRx {
    /// The send comm's control id for offers.
    pub(in crate::engine) peer_id: u16,
    /// Receive sizes offered: from the sender's smallest write to this device's
    /// largest. A receive outside could take a write only of a send much smaller
    /// than itself; offering every large receive cost latency-bound runs through
    /// the runtime 10-15 % (one more message per receive, nearly all unused).
    min: usize,
    max: usize,
    tokens: Vec<Token>,
    free: Vec<u16>,
    /// Standing bundle slots (`slots.rs`), when the sender takes them.
    pub(in crate::engine) slots: Option<SlotsRx>,
}

#[derive(Debug, Default)]
struct Token {
    generation: u8,
    op: Option<OpId>,
    cap: usize,
}

/// A write's CQ data: comm id (16) | token (12) | generation (8) | length (28).
pub(in crate::engine) fn cq_data(comm_id: u16, token: u16, generation: u8, len: usize) -> u64 {
    (u64::from(comm_id) << 48)
        | ((u64::from(token) & ((1 << TOKEN_BITS) - 1)) << (LEN_BITS + 8))
        | (u64::from(generation) << LEN_BITS)
        | (len as u64 & ((1 << LEN_BITS) - 1))
}

/// The fields of [`cq_data`].
fn parse_cq_data(data: u64) -> (u16, u16, u8, usize) {
    (
        (data >> 48) as u16,
        ((data >> (LEN_BITS + 8)) & ((1 << TOKEN_BITS) - 1)) as u16,
        (data >> LEN_BITS) as u8,
        (data & ((1 << LEN_BITS) - 1)) as usize,
    )
}

/// Whether sequence number `a` comes before `b` (wrapping, as `Seqs` counts).
fn before(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) > 0
}

impl Engine {
    /// Whether this endpoint has room for a send comm's standing offer receives
    /// (the same budget as bundle receives, `bundle/rx.rs`) with a receive
    /// comm's bundle buffers still fitting after them: where the budget is that
    /// tight, bundles (small sends, most of NCCL's messages) come first.
    pub fn write_offers_fit(&self) -> bool {
        self.bundle_rx_standing + CTS_BUFFERS + super::bundle::RX_BUFFERS <= self.bundle_rx_budget
    }

    /// Makes send connection `conn` write sends of `range` bytes into receives its
    /// peer (receive comm `comm_id`) offers on control id `cts_id`, which the
    /// connection now owns (freed when it retires). Posts the offer receives.
    pub fn enable_write_tx(
        &mut self,
        conn: u64,
        cts_id: u16,
        comm_id: u16,
        range: (usize, usize),
    ) -> Result<()> {
        let c = self.conn(conn)?;
        c.wtx = Some(WriteTx {
            cts_id,
            comm_id,
            range,
            offers: VecDeque::new(),
            sent: Vec::new(),
            seen: Vec::new(),
        });
        self.bundle_rx_standing += CTS_BUFFERS;
        for _ in 0..CTS_BUFFERS {
            self.post_cts_recv(conn, vec![0u8; CTS_LEN].into_boxed_slice())?;
        }
        Ok(())
    }

    /// Makes receive connection `conn` (receive comm `comm_id`) offer its
    /// receives of `min..=max` bytes as write targets to the sender's control
    /// id `peer_id`.
    pub fn enable_write_rx(
        &mut self,
        conn: u64,
        comm_id: u16,
        peer_id: u16,
        (min, max): (usize, usize),
    ) -> Result<()> {
        let c = self.conn(conn)?;
        c.wrx = Some(WriteRx {
            peer_id,
            min,
            max,
            tokens: Vec::new(),
            free: Vec::new(),
            slots: None,
        });
        self.write_rx_conns.insert(comm_id, conn);
        Ok(())
    }

    /// A retiring connection gives back its offer receives' budget and control
    /// id, and closes its slots' registration (before the slots' memory goes
    /// with the connection).
    pub(in crate::engine) fn write_retired(&mut self, conn: &super::Conn) {
        if let Some(s) = conn.wrx.as_ref().and_then(|w| w.slots.as_ref()) {
            self.mrs.release(s.mr());
        }
        if let Some(w) = &conn.wtx {
            self.bundle_rx_standing = self.bundle_rx_standing.saturating_sub(CTS_BUFFERS);
            self.ctrl_ids.free(w.cts_id);
        }
        if conn.wrx.is_some()
            && let Some(id) = conn.data_id
        {
            self.write_rx_conns.remove(&id);
        }
    }

    fn post_cts_recv(&mut self, conn: u64, buf: Box<[u8]>) -> Result<()> {
        let Some(cts_id) = self
            .conns
            .get(&conn)
            .filter(|c| !c.closing)
            .and_then(|c| c.wtx.as_ref())
            .map(|w| w.cts_id)
        else {
            return Ok(());
        };
        let tag = self.layout.ctrl(Ctrl::Cts, cts_id);
        self.recv_owned(Owner::CtsRx, Some(conn), buf, tag, 0)
            .map(drop)
    }

    /// An offer receive completed: keeps the offer unless its send already went,
    /// and posts the buffer again.
    pub(in crate::engine) fn cts_arrived(
        &mut self,
        idx: u32,
        got: std::result::Result<usize, String>,
    ) {
        let Some((conn, buf)) = self.take_owned(idx) else {
            return;
        };
        let n = match got {
            Ok(n) => n,
            // Cancelled by close, or the connection failed (its requests say so).
            Err(_) => return,
        };
        let Some(w) = self
            .conns
            .get_mut(&conn)
            .filter(|c| !c.closing)
            .and_then(|c| c.wtx.as_mut())
        else {
            return;
        };
        match Cts::decode(&buf[..n.min(buf.len())]) {
            // The write's CQ data could not name it (no receiver of ours sends one).
            Some(cts) if u32::from(cts.token) >= 1 << TOKEN_BITS => nccl_warn!(
                "NET/OFI: ignored a clear-to-write naming token {:#x} (tokens have {TOKEN_BITS} bits)",
                cts.token
            ),
            Some(cts) if cts.slot => {
                ARRIVED.fetch_add(1, Ordering::Relaxed);
                self.slot_offered(conn, cts);
            }
            Some(cts) => {
                ARRIVED.fetch_add(1, Ordering::Relaxed);
                match w.seen.iter_mut().find(|(t, _)| *t == cts.tag) {
                    Some((_, s)) if before(*s, cts.seq) => *s = cts.seq,
                    Some(_) => {}
                    None => w.seen.push((cts.tag, cts.seq)),
                }
                let stale = w
                    .sent
                    .iter()
                    .find(|(t, _)| *t == cts.tag)
                    .is_some_and(|&(_, next)| before(cts.seq, next));
                if !stale {
                    if w.offers.len() >= MAX_OFFERS {
                        w.offers.pop_front();
                    }
                    w.offers.push_back(cts);
                }
            }
            None => nccl_warn!("NET/OFI: ignored a malformed clear-to-write message ({n} bytes)"),
        }
        if let Err(e) = self.post_cts_recv(conn, buf) {
            self.fail_conn(
                conn,
                format!("re-posting a clear-to-write receive failed: {e}"),
            );
        }
    }

    /// Whether the send of sequence number `seq` for NCCL tag `tag` (`len` bytes)
    /// is in the write range and its receive's offer has not been read yet:
    /// `isend` then reads the completion queue once more, and may wait for it
    /// ([`Engine::offer_expected`]).
    pub fn offer_missing(&self, conn: u64, tag: i32, seq: u32, len: usize) -> bool {
        self.offer_read(conn, tag, seq, len) == Some(false)
    }

    /// Whether that send is in the write range and its offer has been read: it
    /// will be written.
    pub fn offer_in_hand(&self, conn: u64, tag: i32, seq: u32, len: usize) -> bool {
        self.offer_read(conn, tag, seq, len) == Some(true)
    }

    /// For a send in the write range, whether its offer has been read.
    fn offer_read(&self, conn: u64, tag: i32, seq: u32, len: usize) -> Option<bool> {
        let w = self.conns.get(&conn)?.wtx.as_ref()?;
        (w.range.0..=w.range.1)
            .contains(&len)
            .then(|| w.offers.iter().any(|o| o.tag == tag && o.seq == seq))
    }

    /// Whether the offer for the send of sequence number `seq` of NCCL tag `tag`
    /// (`len` bytes, in the write range) is missing but on its way: the receiver
    /// offered one of the `OFFER_LAG` sends before it. A sender that runs ahead
    /// of its receiver then waits a little for the offer (`data::isend`).
    pub fn offer_expected(&self, conn: u64, tag: i32, seq: u32, len: usize) -> bool {
        self.offer_missing(conn, tag, seq, len)
            && self
                .conns
                .get(&conn)
                .and_then(|c| c.wtx.as_ref())
                .is_some_and(|w| {
                    w.seen
                        .iter()
                        .any(|&(t, s)| t == tag && (1..=OFFER_LAG).contains(&seq.wrapping_sub(s)))
                })
    }

    /// The send of sequence number `seq` for NCCL tag `tag` as a write, when the
    /// receiver offered that receive and `len` is in range; `Ok(None)`: send it
    /// as a tagged message. Called for every send of a connection, in order.
    ///
    /// # Safety
    /// As [`Engine::send_data`].
    pub unsafe fn write_data(
        &mut self,
        conn: u64,
        tag: i32,
        seq: u32,
        buf: *const u8,
        len: usize,
        desc: usize,
    ) -> Result<Option<OpId>> {
        let Some(c) = self.conns.get_mut(&conn) else {
            return Ok(None);
        };
        let dest = c.peer;
        let Some(w) = c.wtx.as_mut() else {
            return Ok(None);
        };
        match w.sent.iter_mut().find(|(t, _)| *t == tag) {
            Some((_, next)) => *next = seq.wrapping_add(1),
            None => w.sent.push((tag, seq.wrapping_add(1))),
        }
        // Offers for this tag up to this send are used now or never.
        let mut taken = None;
        w.offers.retain(|o| {
            if o.tag != tag || before(seq, o.seq) {
                return true;
            }
            if o.seq == seq {
                taken = Some(*o);
            }
            false
        });
        if !(w.range.0..=w.range.1).contains(&len) {
            return Ok(None);
        }
        let Some(o) = taken.filter(|o| len <= o.cap as usize) else {
            MISSED.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        let data = cq_data(w.comm_id, o.token, o.generation, len);
        let op = self.alloc(Owner::Caller, false, Some(conn), None);
        let post = Post::Write {
            buf: buf as usize,
            len,
            desc,
            dest,
            addr: o.addr,
            key: o.key,
            data,
        };
        WRITES.fetch_add(1, Ordering::Relaxed);
        // `buf` stays valid until the operation completes (caller's contract).
        self.submit(op, post).map(Some)
    }

    /// Offers posted receive `op` (sequence number `seq` of NCCL tag `tag`, `cap`
    /// bytes at `addr`, registered as `rma`) of receive connection `conn` as a
    /// write target, if the connection takes writes and the size is in range.
    pub fn offer_write(
        &mut self,
        conn: u64,
        op: OpId,
        (tag, seq): (i32, u32),
        addr: usize,
        cap: usize,
        rma: Option<RmaTarget>,
    ) -> Result<()> {
        let Some(rma) = rma else { return Ok(()) };
        // A receive already filled from a bundle needs no offer.
        if !self
            .slot(op)
            .is_some_and(|s| matches!(s.state, State::Posted | State::Backlogged))
        {
            return Ok(());
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return Ok(());
        };
        let dest = c.peer;
        let Some(w) = c.wrx.as_mut().filter(|w| (w.min..=w.max).contains(&cap)) else {
            return Ok(());
        };
        let token = match w.free.pop() {
            Some(t) => t,
            // Tokens from `SLOT_TOKEN0` up name bundle slots.
            None if w.tokens.len() < usize::from(SLOT_TOKEN0) => {
                w.tokens.push(Token::default());
                (w.tokens.len() - 1) as u16
            }
            None => return Ok(()),
        };
        let t = &mut w.tokens[usize::from(token)];
        t.op = Some(op);
        t.cap = cap;
        let cts = Cts {
            token,
            generation: t.generation,
            seq,
            tag,
            cap: cap as u32,
            key: rma.key,
            addr: rma.addr_of(addr),
            slot: false,
        };
        let peer_id = w.peer_id;
        OFFERS.fetch_add(1, Ordering::Relaxed);
        self.send_cts(conn, dest, peer_id, &cts)
    }

    /// Sends clear-to-write `cts` (a receive's offer or a bundle slot's) of
    /// receive connection `conn` to its sender's control id `peer_id`.
    pub(in crate::engine) fn send_cts(
        &mut self,
        conn: u64,
        dest: u64,
        peer_id: u16,
        cts: &Cts,
    ) -> Result<()> {
        let ctrl = self.layout.ctrl(Ctrl::Cts, peer_id);
        let bytes = cts.encode().into_boxed_slice();
        self.send_owned(dest, ctrl, bytes, Owner::Orphan, Some(conn))
            .map(drop)
    }

    /// A receive stopped waiting: its offer, if any, is withdrawn (a later write
    /// naming it is refused).
    pub(in crate::engine) fn forget_offer(&mut self, conn: Option<u64>, op: OpId) {
        let Some(w) = conn
            .and_then(|k| self.conns.get_mut(&k))
            .and_then(|c| c.wrx.as_mut())
        else {
            return;
        };
        if let Some(i) = w.tokens.iter().position(|t| t.op == Some(op)) {
            let t = &mut w.tokens[i];
            t.op = None;
            t.generation = t.generation.wrapping_add(1);
            w.free.push(i as u16);
        }
    }

    /// A write arrived (remote CQ data): its receive is done, and its tagged post
    /// is withdrawn.
    pub(in crate::engine) fn write_arrived(&mut self, data: u64) {
        let (comm_id, token, generation, len) = parse_cq_data(data);
        // A comm closed (or closing) with receives in flight drops their offers;
        // a write its peer had already started still lands (in memory NCCL
        // deregisters before freeing, which then refuses it) and is not news.
        let Some(&conn) = self.write_rx_conns.get(&comm_id) else {
            nccl_info!(
                subsys::NET,
                "NET/OFI: a write arrived for receive comm {comm_id}, closed since"
            );
            return;
        };
        let Some(c) = self.conns.get_mut(&conn).filter(|c| !c.closing) else {
            return;
        };
        if token >= SLOT_TOKEN0 {
            c.progressed = true;
            return self.slot_written(conn, token, generation, len);
        }
        let Some(w) = c.wrx.as_mut() else { return };
        let target = w
            .tokens
            .get_mut(usize::from(token))
            .filter(|t| t.generation == generation && t.op.is_some());
        let Some(t) = target else {
            // Its bytes already landed in a buffer NCCL may have moved on from.
            self.fail_conn(
                conn,
                format!(
                    "the peer wrote {len} bytes into a receive that was not offered (token \
                     {token}, generation {generation})"
                ),
            );
            return;
        };
        let (op, cap) = (t.op.take(), t.cap);
        t.generation = t.generation.wrapping_add(1);
        w.free.push(token);
        c.progressed = true;
        LANDED.fetch_add(1, Ordering::Relaxed);
        let Some(op) = op else { return };
        self.forget_waiter(Some(conn), op);
        let state = if len > cap {
            State::Failed(format!(
                "message truncated: the peer wrote {len} bytes into a receive of {cap}"
            ))
        } else {
            State::Done(len)
        };
        self.withdraw(op, state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cq_data_round_trips_every_field() {
        for (c, t, g, l) in [
            (0u16, 0u16, 0u8, 0usize),
            (0xffff, 0xfff, 0xff, (1 << 28) - 1),
            (0x8001, SLOT_TOKEN0, 1, 16 << 20),
            (513, 7, 200, 65_536 + 3),
        ] {
            assert_eq!(parse_cq_data(cq_data(c, t, g, l)), (c, t, g, l));
        }
    }

    #[test]
    fn sequence_order_wraps() {
        assert!(before(1, 2));
        assert!(!before(2, 2));
        assert!(!before(3, 2));
        assert!(before(u32::MAX, 0));
        assert!(!before(0, u32::MAX));
    }
}
