//! The engine state behind a [`Proxy`](super::Proxy): installed connections, the
//! active batch with its per-channel cursors, and one pass of progress.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use cclkit_abi::raw::common::Protocol;

use super::*;
use crate::device::compute::DevCompute;
use crate::error::{Error, Result};
use crate::fifo::{Expect, RecvConn, SendConn};
use crate::protocol::{decode, encode};
use crate::schedule::copies::{Site, add as count};
use crate::schedule::{Buffer, Combine, Link, LinkClass, combine};

mod ahead;
mod busy;
mod direct;

pub(super) use busy::Busy;
pub use busy::pass_visits;

pub(super) struct Active {
    batch: Batch,
    /// Per channel: (step index, slice index, slices of the next step already run
    /// ahead, see `ahead.rs`).
    cursor: Vec<(usize, usize, usize)>,
    /// Whether this batch may run steps ahead (decided once, at admission).
    ahead: bool,
}

/// Links to connections, hashed cheaply (a link is three small integers).
pub(super) type LinkMap<T> = HashMap<Link, T, BuildHasherDefault<LinkHasher>>;

/// Fx-style word hashing over the link's fields (three small integers): one
/// multiply per field, where SipHash costs tens of ns on every slice and byte-wise
/// FNV 24 multiplies.
#[derive(Default)]
pub(super) struct LinkHasher(u64);

impl LinkHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for LinkHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.mix(u64::from(*b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.mix(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }
    fn write_isize(&mut self, i: isize) {
        self.mix(i as u64);
    }
}

/// Most links one primitive receives from or sends to (tree: parent + 2 children).
pub(super) const MAX_LINKS: usize = 8;

pub(super) struct Engine {
    pub(super) rank: usize,
    pub(super) send: LinkMap<SendConn>,
    pub(super) recv: LinkMap<RecvConn>,
    /// The links whose connections may have network work (see `busy.rs`): a pass
    /// drives these, not every installed connection.
    pub(super) busy: Busy,
    /// Boxed: a pass takes it out and puts it back (a pointer, not the batch).
    pub(super) active: Option<Box<Active>>,
    /// The steps of the batch that finished last and its emptied operation list,
    /// handed back to the caller to run again (see `Comm`'s step cache).
    pub(super) finished: Option<(Vec<Vec<Step>>, Vec<OpRef>)>,
    /// The last batch's box, emptied, with its cursors: the next batch moves in (no
    /// allocation per batch).
    pub(super) spare: Option<Box<Active>>,
    pub(super) scratch: Vec<Vec<u8>>,
    /// The device's work queue on a device communicator.
    pub(super) dev: Option<DevCompute>,
    /// NCCL's direct paths allowed (`Config::direct`, `CCLKIT_DIRECT`).
    pub(super) direct: bool,
    /// `Config::run_ahead` (`None`: when ranks do not share cores).
    pub(super) run_ahead: Option<bool>,
}

pub(super) fn slices(len: usize, slice: usize) -> usize {
    len.div_ceil(slice)
}

/// Slice calls a step takes: a step of no bytes still gets its one call, as in the
/// channel loop of `slices`.
fn step_slices(step: &Step, slice: usize) -> usize {
    slices(step.prim.len, slice).max(1)
}

/// Slices run ahead of their step (process-wide), see `ahead.rs` and
/// [`ahead_slices`].
static AHEAD_SLICES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Slices this process ran while the step before them on the channel was still
/// waiting for data (for tests and benchmarks; see `proxy/engine/ahead.rs`).
pub fn ahead_slices() -> u64 {
    AHEAD_SLICES.load(std::sync::atomic::Ordering::Relaxed)
}

impl Engine {
    pub(super) fn sends_idle(&self) -> bool {
        self.busy
            .sends
            .iter()
            .all(|l| self.send.get(l).is_none_or(SendConn::idle))
    }

    /// Posts and completes sends only (no batch is touched).
    pub(super) fn progress_sends(&mut self) -> Result<bool> {
        let b = &mut self.busy;
        busy::drive(
            &mut b.sends,
            &mut self.send,
            &mut b.visits,
            SendConn::progress,
            SendConn::idle,
        )
    }

    /// Posts receives and completes them on the links with receive work.
    fn progress_recvs(&mut self) -> Result<bool> {
        let b = &mut self.busy;
        busy::drive(
            &mut b.recvs,
            &mut self.recv,
            &mut b.visits,
            RecvConn::progress,
            RecvConn::net_idle,
        )
    }

    /// Makes `batch` the active one: checks every link has a connection, then tells
    /// each receive connection which slices to expect.
    pub(super) fn admit(&mut self, batch: Batch) -> Result<()> {
        let missing = batch.channels.iter().flatten().find_map(|step| {
            step.prim
                .recv
                .iter()
                .find(|l| !self.recv.contains_key(l))
                .or_else(|| step.prim.send.iter().find(|l| !self.send.contains_key(l)))
        });
        if let Some(l) = missing {
            return Err(Error::internal(format!(
                "rank {}: no connection for {l:?}",
                self.rank
            )));
        }
        self.register_direct_sends(&batch);
        let steps = batch.channels.iter().enumerate();
        for (ch, pi, step) in
            steps.flat_map(|(ch, s)| s.iter().enumerate().map(move |(pi, st)| (ch, pi, st)))
        {
            for (k, l) in step.prim.recv.iter().enumerate() {
                let group = if l.class == LinkClass::P2p {
                    batch.group
                } else {
                    1
                };
                let direct = self.direct_recv(&batch, &batch.ops[step.op], &step.prim, l, group);
                if let Some(c) = self.recv.get_mut(l) {
                    Busy::mark(&mut self.busy.recvs, l);
                    c.expect(Expect {
                        params: batch.params,
                        count: slices(step.prim.len, batch.slice),
                        group,
                        prof: batch.prof.as_ref().and_then(|ev| ev.recv_run(ch, pi, k)),
                        direct,
                    });
                }
            }
        }
        let channels = batch.channels.len();
        // Running ahead fills a link direction that would idle; when ranks share
        // cores the CPU is the bottleneck instead, and data sent early only waits
        // in the socket and leaves the cache (4 ranks on 2 CPUs measured 10-25 %
        // slower at 4-8 MiB with it).
        let ahead = self.dev.is_none()
            && batch.prof.is_none()
            && self
                .run_ahead
                .unwrap_or_else(|| !super::wait::cores_shared());
        let mut a = match self.spare.take() {
            Some(mut a) => {
                a.batch = batch;
                a
            }
            None => Box::new(Active {
                batch,
                cursor: Vec::new(),
                ahead,
            }),
        };
        a.ahead = ahead;
        a.cursor.clear();
        a.cursor.resize(channels, (0, 0, 0));
        self.active = Some(a);
        Ok(())
    }

    /// One pass: complete sends, run the slices that need no new data (a send of
    /// this rank's own input goes out before any receive is polled), poll the
    /// receives, run the slices they unblocked, and post what was filled, so a hop
    /// costs no extra pass. Once done the batch is dropped (`active = None`) but for
    /// its steps, kept in `finished`.
    pub(super) fn progress(&mut self) -> Result<bool> {
        let mut moved = self.progress_sends()?;
        if self.slices()? {
            moved = true;
            self.progress_sends()?;
        }
        if self.progress_recvs()? {
            moved = true;
            if self.slices()? {
                self.progress_sends()?;
            }
        }
        self.busy.count_pass();
        Ok(moved)
    }

    /// As many slices of the active batch as the FIFOs allow; whether any ran.
    fn slices(&mut self) -> Result<bool> {
        let Some(mut a) = self.active.take() else {
            return Ok(false);
        };
        let mut finished = true;
        let mut sliced = false;
        let ahead_allowed = a.ahead;
        for ch in 0..a.batch.channels.len() {
            while let Some(step) = a.batch.channels[ch].get(a.cursor[ch].0) {
                let (pi, si, ahead) = a.cursor[ch];
                match self.slice(&a.batch, ch, step, si) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        self.active = Some(a);
                        return Err(e);
                    }
                }
                sliced = true;
                if let Some(ev) = &a.batch.prof {
                    ev.slice_done(ch, pi, si);
                }
                a.cursor[ch] = if si + 1 >= slices(step.prim.len, a.batch.slice) {
                    // The next step starts where running ahead left it.
                    let next_done = a.batch.channels[ch]
                        .get(pi + 1)
                        .is_some_and(|n| ahead >= step_slices(n, a.batch.slice));
                    if next_done {
                        (pi + 2, 0, 0)
                    } else {
                        (pi + 1, ahead, 0)
                    }
                } else {
                    (pi, si + 1, ahead)
                };
            }
            let (pi, _, ahead) = a.cursor[ch];
            if ahead_allowed
                && let (Some(cur), Some(next)) = (
                    a.batch.channels[ch].get(pi),
                    a.batch.channels[ch].get(pi + 1),
                )
                && ahead < step_slices(next, a.batch.slice)
                && ahead::may_run_ahead(&a.batch, cur, next)
            {
                let mut si = ahead;
                while si < step_slices(next, a.batch.slice) {
                    match self.slice(&a.batch, ch, next, si) {
                        Ok(true) => si += 1,
                        Ok(false) => break,
                        Err(e) => {
                            self.active = Some(a);
                            return Err(e);
                        }
                    }
                    sliced = true;
                    AHEAD_SLICES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                a.cursor[ch].2 = si;
            }
            finished &= a.cursor[ch].0 >= a.batch.channels[ch].len();
        }
        // A batch ends once its sends from user buffers completed too: the caller may
        // reuse the buffers as soon as it returns.
        if !finished || !self.direct_idle() {
            self.active = Some(a);
        } else {
            self.release_direct();
            let mut ops = std::mem::take(&mut a.batch.ops);
            ops.clear();
            self.finished = Some((std::mem::take(&mut a.batch.channels), ops));
            a.batch.prof = None;
            self.spare = Some(a);
        }
        Ok(sliced)
    }

    /// Processes slice `si` of `step` (channel `ch`) if every receive slot is ready and
    /// every send slot free; returns whether it did.
    fn slice(&mut self, b: &Batch, ch: usize, step: &Step, si: usize) -> Result<bool> {
        let prim = &step.prim;
        let p = &b.params;
        let op = &b.ops[step.op];
        let off = si * b.slice;
        let len = b.slice.min(prim.len - off);
        let wire = p.wire_for(len);
        let (nr, ns) = (prim.recv.len(), prim.send.len());
        if nr > MAX_LINKS || ns > MAX_LINKS {
            return Err(Error::internal(format!(
                "a primitive with {nr} receive and {ns} send links (at most {MAX_LINKS})"
            )));
        }
        // Resources first: nothing is consumed unless the whole slice can proceed.
        // Fixed arrays: this runs for every slice, so it must not allocate.
        let mut ins: [(*const u8, usize); MAX_LINKS] = [(std::ptr::null(), 0); MAX_LINKS];
        for (k, l) in prim.recv.iter().enumerate() {
            let c = self
                .recv
                .get_mut(l)
                .ok_or_else(|| Error::internal(format!("no connection {l:?}")))?;
            match c.slot_to_consume(p)? {
                Some(s) => ins[k] = s,
                None => return Ok(false),
            }
        }
        let mut outs: [*mut u8; MAX_LINKS] = [std::ptr::null_mut(); MAX_LINKS];
        for (k, l) in prim.send.iter().enumerate() {
            let c = self
                .send
                .get_mut(l)
                .ok_or_else(|| Error::internal(format!("no connection {l:?}")))?;
            match c.slot_to_fill(p)? {
                Some((ptr, cap)) if cap >= wire => outs[k] = ptr,
                Some((_, cap)) => {
                    return Err(Error::internal(format!(
                        "slice of {wire} wire bytes exceeds a {cap}-byte slot"
                    )));
                }
                None => return Ok(false),
            }
        }
        // Slices are consumed by the size both sides agreed on, as NCCL's kernel does;
        // what the plugin reported is only judged (see `RecvConn::reported_size`).
        for ((_, got), l) in ins[..nr].iter_mut().zip(&prim.recv) {
            if *got != wire {
                self.recv
                    .get_mut(l)
                    .ok_or_else(|| Error::internal("recv connection vanished"))?
                    .reported_size(p, *got, wire)?;
                *got = wire;
            }
        }
        let (ins, outs) = (&ins[..nr], &outs[..ns]);
        if let Some(dc) = self.dev.as_mut() {
            // Device communicator: user buffers and slots are device (or
            // GPU-mapped) memory, never read here; the device kernels compute.
            // SAFETY: this slice's ready receive and free send slots; the op's
            // buffers were checked against the device when it was submitted.
            unsafe { dc.proxy_step(prim, op, off, len, p.proto, ins, outs) }?;
            for (k, l) in prim.send.iter().enumerate() {
                let tag =
                    (l.class == LinkClass::P2p && b.group > 1).then_some((si % b.group) as i32);
                let ps = b.prof.as_ref().and_then(|ev| ev.hand_over_send(ch, k));
                self.send
                    .get_mut(l)
                    .ok_or_else(|| Error::internal("send connection vanished"))?
                    .filled(p, wire, tag, ps)?;
                Busy::mark(&mut self.busy.sends, l);
            }
            for l in &prim.recv {
                self.recv
                    .get_mut(l)
                    .ok_or_else(|| Error::internal("recv connection vanished"))?
                    .consumed(p)?;
            }
            return Ok(true);
        }
        // Inputs as data bytes (LL lines are decoded and their flags checked).
        while self.scratch.len() < nr + 1 {
            self.scratch.push(Vec::new());
        }
        let mut data_ins: [&[u8]; MAX_LINKS] = [&[]; MAX_LINKS];
        let (scratch_in, scratch_out) = self.scratch.split_at_mut(nr);
        for (i, ((ptr, _), l)) in ins.iter().zip(&prim.recv).enumerate() {
            // SAFETY: a ready slot of `wire` bytes; the proxy does not touch it until
            // it is consumed below.
            let w = unsafe { std::slice::from_raw_parts(*ptr, wire) };
            if p.proto != Protocol::SIMPLE {
                let flag = self.recv.get(l).map_or(0, |c| c.sequence(p.proto)) as u32;
                let buf = &mut scratch_in[i];
                buf.resize(len, 0);
                decode(p.proto, w, buf, flag)
                    .map_err(|e| e.context(format!("rank {}: from rank {}", self.rank, l.peer)))?;
                count(Site::Decode, len);
            } else {
                data_ins[i] = w;
            }
        }
        if p.proto != Protocol::SIMPLE {
            for (d, b) in data_ins.iter_mut().zip(scratch_in.iter()) {
                *d = b.as_slice();
            }
        }
        let data_ins = &data_ins[..nr];
        let user = |span: crate::schedule::Span| -> Result<*mut u8> {
            let (base, cap) = match span.buf {
                Buffer::Send => (op.bufs.send.cast_mut(), op.bufs.send_len),
                Buffer::Recv => (op.bufs.recv, op.bufs.recv_len),
            };
            if span.offset + off + len > cap {
                return Err(Error::internal(format!(
                    "span {span:?} + {len} exceeds a {cap}-byte buffer"
                )));
            }
            // SAFETY: bounds checked against the buffer length just above.
            Ok(unsafe { base.add(span.offset + off) })
        };
        let src = prim.src.map(user).transpose()?;
        let dst = prim.dst.map(user).transpose()?;
        // SAFETY: `src` points to `len` readable bytes of a user buffer.
        let src_slice = src.map(|s| unsafe { std::slice::from_raw_parts(s.cast_const(), len) });
        let overlaps = |a: *const u8, b: *const u8| {
            (a as usize) < b as usize + len && (b as usize) < a as usize + len
        };
        let trivial_copy = direct::plain_copy(prim, op);
        // Direct paths (see `direct`): the receive already landed in `dst`, and/or the
        // sends leave from the user buffer holding the result (`dst`, or the input of
        // a plain copy) when every send connection has it registered.
        let landed = nr == 1 && dst.is_some_and(|d| std::ptr::eq(ins[0].0, d));
        // (A device communicator returned above: this is the host path.)
        let send_from: Option<*const u8> = (ns > 0 && direct::eligible(self.direct, b, prim))
            .then(|| dst.or(src.filter(|_| direct::sends_from_input(prim, op))))
            .flatten()
            .map(|f| f.cast_const())
            .filter(|&f| {
                prim.send
                    .iter()
                    .all(|l| self.send.get(l).is_some_and(|c| c.covers(f, len)))
            });
        // Where the result is computed: straight into the destination or the one send
        // slot when that is safe (Simple, no overlap with the input), else scratch.
        let target: Option<*mut u8> = match (p.proto, dst, outs) {
            (Protocol::SIMPLE, Some(d), _) if src.is_none_or(|s| !overlaps(s, d)) => Some(d),
            (Protocol::SIMPLE, None, [o]) if send_from.is_none() => Some(*o),
            _ => None,
        };
        let out_ptr: *const u8 = match (target, src) {
            // The received bytes are the result and already in place.
            _ if landed => {
                if !matches!(prim.combine, Combine::Copy { .. }) {
                    return Err(Error::internal(
                        "a direct receive into a reducing primitive",
                    ));
                }
                count(Site::DirectRecv, len);
                ins[0].0
            }
            // A plain copy onto itself (in place), or sent from its input: the input
            // is the result.
            (_, Some(s))
                if trivial_copy && (dst == Some(s) || send_from == Some(s.cast_const())) =>
            {
                s
            }
            (Some(d), _) => {
                // SAFETY: `d` is `len` writable bytes disjoint from every input (checked).
                let out = unsafe { std::slice::from_raw_parts_mut(d, len) };
                combine(prim.combine, &op.red, src_slice, data_ins, out)?;
                count(compute_site(prim), len);
                d
            }
            (None, _) => {
                let out = &mut scratch_out[0];
                out.resize(len, 0);
                combine(prim.combine, &op.red, src_slice, data_ins, out)?;
                count(compute_site(prim), len);
                out.as_ptr()
            }
        };
        if let Some(d) = dst
            && !std::ptr::eq(d, out_ptr)
        {
            // SAFETY: `d` is `len` writable user bytes; `out_ptr` holds the `len`
            // result bytes elsewhere (slot or scratch).
            unsafe { std::ptr::copy(out_ptr, d, len) };
            count(Site::ToDst, len);
        }
        // SAFETY: `out_ptr` holds `len` result bytes (destination, slot or scratch).
        let result = unsafe { std::slice::from_raw_parts(out_ptr, len) };
        for (k, (o, l)) in outs.iter().zip(&prim.send).enumerate() {
            Busy::mark(&mut self.busy.sends, l);
            let c = self
                .send
                .get_mut(l)
                .ok_or_else(|| Error::internal("send connection vanished"))?;
            let tag = (l.class == LinkClass::P2p && b.group > 1).then_some((si % b.group) as i32);
            // The slice's send step follows its data into the slot (one branch
            // without a profiler).
            let ps = b.prof.as_ref().and_then(|ev| ev.hand_over_send(ch, k));
            if let Some(from) = send_from {
                // Simple: the wire bytes are the data bytes, in the user buffer.
                c.filled_from(p, from, wire, tag, ps)?;
                count(Site::DirectSend, len);
                continue;
            }
            let used = if std::ptr::eq(*o, out_ptr) {
                wire
            } else {
                let flag = c.sequence(p.proto) as u32;
                // SAFETY: a free slot of at least `wire` bytes (checked above).
                let slot = unsafe { std::slice::from_raw_parts_mut(*o, wire) };
                count(Site::SendSlot, len);
                encode(p.proto, result, slot, flag)
            };
            c.filled(p, used, tag, ps)?;
        }
        for l in &prim.recv {
            self.recv
                .get_mut(l)
                .ok_or_else(|| Error::internal("recv connection vanished"))?
                .consumed(p)?;
        }
        Ok(true)
    }
}

/// The copy site of a primitive's computation.
fn compute_site(prim: &crate::schedule::Prim) -> Site {
    match prim.combine {
        Combine::Reduce { .. } => Site::Reduce,
        Combine::Copy { .. } if prim.recv.is_empty() => Site::SrcCopy,
        Combine::Copy { .. } => Site::RecvCopy,
    }
}
