//! Connections and their FIFOs: what NCCL's proxy thread does for one net connection.
//!
//! Each direction of a connection has, per protocol in use, a registered buffer of
//! `NCCL_STEPS` steps cut into slice slots. Sequence numbers play the role of NCCL's
//! head/tail counters:
//!
//! * send side: the kernel *fills* slot `fill % slots`, the proxy *posts* `isend` for
//!   filled slots in order and *completes* them with `test`, freeing the slot;
//! * receive side: the proxy *posts* `irecv` into free slots for slices it expects,
//!   *completes* them with `test`, and the kernel *consumes* ready slots in order.
//!
//! A grouped receive (`maxRecvs > 1`) covers consecutive slices of one primitive; the
//! sender tags each slice with its index in the group so it lands in the right buffer.
//! `*request == NULL` from `isend`/`irecv` means "not now": the same post is retried.

use std::collections::VecDeque;

use cclkit_abi::raw::common::Protocol;

use super::device::{self, Placement};
use super::error::{Error, Result, net_err};

use super::protocol::ProtoParams;
use cclkit_host::net::{Mr, RecvBuffer, RecvComm, Request, RequestId, SendComm};

mod size;
mod slots;
mod step;
mod user;
use size::strict_from_env;
use slots::Slots;
pub(crate) use step::SlotStep;
use user::UserMrs;
pub use user::{DirectRecv, user_registrations};

/// Buffers of one grouped receive kept on the stack (larger groups allocate).
const INLINE_RECVS: usize = 8;

/// Protocol index into per-connection FIFO arrays.
pub fn proto_index(p: Protocol) -> usize {
    p.0.clamp(0, 2) as usize
}

/// What one expected slice looks like to the receiver.
#[derive(Clone, Debug)]
pub struct Expect {
    /// Protocol sizes of the slices.
    pub params: ProtoParams,
    /// Slices in this run (one primitive's slices on this link).
    pub count: usize,
    /// Group size for grouped receives (1 = single receives).
    pub group: usize,
    /// The slices' receive steps (profiler runs; `None`: no events).
    pub(crate) prof: Option<crate::profile::RecvRun>,
    /// Where the slices land when they skip the FIFO slots (a user buffer
    /// registered on this comm with [`RecvConn::register_user`]; single receives).
    pub direct: Option<DirectRecv>,
}

/// The sending direction of one connection.
pub struct SendConn {
    comm: SendComm,
    fifos: [Option<SendFifo>; 3],
    label: String,
    tag: i32,
    place: Placement,
    /// User buffers registered for sends straight from them.
    user: UserMrs,
    /// Sends from user buffers filled and not completed yet.
    user_inflight: usize,
}

struct SendFifo {
    params: ProtoParams,
    slots: Slots,
    mr: Option<Mr>,
    /// Wire length and group tag of filled slots, by slot.
    filled: Vec<(usize, i32)>,
    /// A slot sent from a user buffer instead of its own memory: the address and
    /// the index of its registration, by slot.
    from_user: Vec<Option<(usize, usize)>>,
    /// Profiler step of each slot; a boxed slice so handles never move while the
    /// net plugin may hold them.
    steps: Box<[Option<SlotStep>]>,
    posted: VecDeque<Request>,
    fill: u64,
    post: u64,
    done: u64,
}

impl SendConn {
    /// Wraps a connected send comm; `tag` is this rank (NCCL's convention).
    pub fn new(comm: SendComm, label: String, tag: i32) -> Self {
        Self {
            comm,
            fifos: [None, None, None],
            label,
            tag,
            place: Placement::host(),
            user: UserMrs::default(),
            user_inflight: 0,
        }
    }

    /// Keeps the FIFO slots where `place` says (device communicators).
    pub fn placed(mut self, place: Placement) -> Self {
        self.place = place;
        self
    }

    fn fifo(&mut self, p: &ProtoParams) -> Result<&mut SendFifo> {
        let i = proto_index(p.proto);
        if self.fifos[i].is_none() {
            let mut slots = Slots::new(p, &self.place)?;
            // SAFETY: the slot memory lives in this FIFO until the comm is closed
            // (connections are dropped comm-first, see Drop).
            let mr = unsafe { slots.register(&mut self.comm, &self.place) }
                .map_err(|e| e.context(&self.label))?;
            self.fifos[i] = Some(SendFifo {
                params: *p,
                filled: vec![(0, 0); p.slots()],
                from_user: vec![None; p.slots()],
                steps: (0..p.slots()).map(|_| None).collect(),
                slots,
                mr: Some(mr),
                posted: VecDeque::new(),
                fill: 0,
                post: 0,
                done: 0,
            });
        }
        self.fifos[i]
            .as_mut()
            .ok_or_else(|| Error::internal("fifo"))
    }

    /// The next free slot to fill (its pointer and wire capacity), or `None` if the
    /// FIFO is full.
    pub fn slot_to_fill(&mut self, p: &ProtoParams) -> Result<Option<(*mut u8, usize)>> {
        let f = self.fifo(p)?;
        let n = f.params.slots() as u64;
        if f.fill - f.done >= n {
            return Ok(None);
        }
        let i = (f.fill % n) as usize;
        Ok(Some((f.slots.slot(i), f.slots.slot_wire)))
    }

    /// Marks the slot from [`slot_to_fill`](Self::slot_to_fill) filled with `wire` bytes;
    /// `step` (profiler runs) is the slice's step event, stopped when the send completes.
    pub(crate) fn filled(
        &mut self,
        p: &ProtoParams,
        wire: usize,
        group_tag: Option<i32>,
        step: Option<SlotStep>,
    ) -> Result<()> {
        self.fill_slot(p, wire, group_tag, step, None)
    }

    fn fill_slot(
        &mut self,
        p: &ProtoParams,
        wire: usize,
        group_tag: Option<i32>,
        step: Option<SlotStep>,
        from_user: Option<(usize, usize)>,
    ) -> Result<()> {
        let tag = group_tag.unwrap_or(self.tag);
        self.user_inflight += usize::from(from_user.is_some());
        let f = self.fifo(p)?;
        let i = (f.fill % f.params.slots() as u64) as usize;
        f.filled[i] = (wire, tag);
        f.from_user[i] = from_user;
        // The slot is free (`slot_to_fill`), so its previous step already ended.
        f.steps[i] = step;
        f.fill += 1;
        Ok(())
    }

    /// Slices sent so far on this connection with protocol `p` (the LL flag).
    pub fn sequence(&self, p: Protocol) -> u64 {
        self.fifos[proto_index(p)].as_ref().map_or(0, |f| f.fill)
    }

    /// Posts and tests what it can; returns whether anything moved.
    pub fn progress(&mut self) -> Result<bool> {
        let mut moved = false;
        let Self {
            comm,
            fifos,
            label,
            user,
            user_inflight,
            ..
        } = self;
        for f in fifos.iter_mut().flatten() {
            let n = f.params.slots() as u64;
            while f.post < f.fill {
                let i = (f.post % n) as usize;
                let (wire, tag) = f.filled[i];
                let (data, mr) = match f.from_user[i] {
                    Some((addr, m)) => (addr as *mut u8, user.get(m)),
                    None => (f.slots.slot(i), f.mr.as_ref()),
                };
                let ph = f.steps[i]
                    .as_mut()
                    .map_or(std::ptr::null_mut(), |s| s.phandle());
                // SAFETY: the slot stays untouched until this request completes (the
                // kernel only refills slots after `done` passes them); so does its
                // step handle, inside the boxed `steps`.
                // A send from a user buffer: the batch that filled it does not end
                // before the send completes (`user_idle`).
                match unsafe { comm.isend_profiled(data, wire, tag, mr, ph) } {
                    Ok(Some(r)) => {
                        f.posted.push_back(r);
                        f.post += 1;
                        moved = true;
                    }
                    Ok(None) => break,
                    Err(e) => return Err(net_err(e, &format!("{label}: isend"))),
                }
            }
            while let Some(r) = f.posted.front_mut() {
                match comm.test(r) {
                    Ok(Some(_)) => {
                        f.posted.pop_front();
                        let i = (f.done % n) as usize;
                        if let Some(s) = f.steps[i].take() {
                            s.end();
                        }
                        if f.from_user[i].take().is_some() {
                            *user_inflight -= 1;
                        }
                        f.done += 1;
                        moved = true;
                    }
                    Ok(None) => break,
                    Err(e) => return Err(net_err(e, &format!("{label}: test(send)"))),
                }
            }
        }
        Ok(moved)
    }

    /// True when every posted send completed.
    pub fn idle(&self) -> bool {
        self.fifos.iter().flatten().all(|f| f.done == f.fill)
    }
}

impl Drop for SendConn {
    fn drop(&mut self) {
        for f in self.fifos.iter_mut().flatten() {
            // In-flight requests are released by closing the comm; registrations first.
            // Their step events end now; the handles stay in place until the comm is
            // closed (the `comm` field drops before `fifos`).
            f.posted.clear();
            for s in f.steps.iter().flatten() {
                s.end();
            }
            if let Some(mr) = f.mr.take()
                && let Err(e) = self.comm.dereg_mr(mr)
            {
                tracing::warn!(target: "cclkit::proxy", "{}: deregMr: {e}", self.label);
            }
        }
        self.release_user();
    }
}

/// The receiving direction of one connection.
pub struct RecvConn {
    comm: RecvComm,
    fifos: [Option<RecvFifo>; 3],
    label: String,
    /// Slices announced by admitted operations, in the order the sender sends them.
    expect: VecDeque<Expect>,
    /// Slices of `expect.front()` already posted.
    expect_posted: usize,
    consumed_hook: bool,
    /// The sender's rank: the tag of single receives.
    peer: i32,
    place: Placement,
    /// `CCLKIT_STRICT=1`: a reported receive size that differs from the data sent is
    /// an error rather than a WARN.
    strict: bool,
    /// A size mismatch was reported on this connection (WARN once per connection).
    size_warned: bool,
    /// User buffers registered for receives straight into them.
    user: UserMrs,
}

struct RecvFifo {
    params: ProtoParams,
    slots: Slots,
    mr: Option<Mr>,
    /// Posted receives: the request, its first slot sequence and its slice count.
    posted: VecDeque<(Request, u64, usize)>,
    /// Wire sizes of ready slots and the request that filled them (for irecvConsumed).
    ready: Vec<(usize, Option<RequestId>, usize)>,
    /// The user memory a slot's receive landed in instead of the slot, by slot.
    landed: Vec<Option<usize>>,
    /// Receive step events by slot (the `phandle`s of posted receives live here).
    steps: crate::profile::RecvSlots,
    post: u64,
    done: u64,
    consume: u64,
}

impl RecvConn {
    /// Wraps an accepted receive comm from rank `peer`.
    pub fn new(comm: RecvComm, label: String, peer: i32) -> Self {
        Self {
            comm,
            fifos: [None, None, None],
            label,
            expect: VecDeque::new(),
            expect_posted: 0,
            consumed_hook: true,
            peer,
            place: Placement::host(),
            strict: strict_from_env(),
            size_warned: false,
            user: UserMrs::default(),
        }
    }

    /// Keeps the FIFO slots where `place` says, flushing GPU receives when its
    /// plan asks for it (device communicators).
    pub fn placed(mut self, place: Placement) -> Self {
        self.place = place;
        self
    }

    fn fifo<'a>(
        fifos: &'a mut [Option<RecvFifo>; 3],
        comm: &mut RecvComm,
        label: &str,
        place: &Placement,
        p: &ProtoParams,
    ) -> Result<&'a mut RecvFifo> {
        let i = proto_index(p.proto);
        if fifos[i].is_none() {
            let mut slots = Slots::new(p, place)?;
            // SAFETY: the slot memory lives in this FIFO until the comm is closed.
            let mr = unsafe { slots.register(comm, place) }.map_err(|e| e.context(label))?;
            fifos[i] = Some(RecvFifo {
                params: *p,
                ready: vec![(0, None, 0); p.slots()],
                landed: vec![None; p.slots()],
                steps: crate::profile::RecvSlots::new(p.slots()),
                slots,
                mr: Some(mr),
                posted: VecDeque::new(),
                post: 0,
                done: 0,
                consume: 0,
            });
        }
        fifos[i].as_mut().ok_or_else(|| Error::internal("fifo"))
    }

    /// Nothing to post and nothing in flight: a pass has no network work here
    /// (ready slots wait for the kernel, not the network).
    pub fn net_idle(&self) -> bool {
        self.expect.is_empty() && self.fifos.iter().flatten().all(|f| f.posted.is_empty())
    }

    /// Announces slices an admitted operation will receive on this connection.
    pub fn expect(&mut self, e: Expect) {
        if e.count > 0 {
            self.expect.push_back(e);
        }
    }

    /// The next ready slot (pointer, wire bytes), or `None`.
    pub fn slot_to_consume(&mut self, p: &ProtoParams) -> Result<Option<(*const u8, usize)>> {
        let f = Self::fifo(&mut self.fifos, &mut self.comm, &self.label, &self.place, p)?;
        if f.consume >= f.done {
            return Ok(None);
        }
        let i = (f.consume % f.params.slots() as u64) as usize;
        let data = f.landed[i].map_or(f.slots.slot(i).cast_const(), |a| a as *const u8);
        Ok(Some((data, f.ready[i].0)))
    }

    /// Frees the slot from [`slot_to_consume`](Self::slot_to_consume); tells the plugin
    /// (`irecvConsumed`) when the request's last buffer is consumed.
    pub fn consumed(&mut self, p: &ProtoParams) -> Result<()> {
        let Self {
            fifos,
            comm,
            label,
            consumed_hook,
            place,
            ..
        } = self;
        let f = Self::fifo(fifos, comm, label, place, p)?;
        let i = (f.consume % f.params.slots() as u64) as usize;
        let (_, id, n) = f.ready[i];
        f.landed[i] = None;
        f.steps.consumed(f.consume);
        f.consume += 1;
        if let Some(id) = id.filter(|_| *consumed_hook) {
            match comm.irecv_consumed(n, id) {
                Ok(has) => *consumed_hook = has,
                Err(e) => return Err(net_err(e, &format!("{label}: irecvConsumed"))),
            }
        }
        Ok(())
    }

    /// Slices consumed so far with protocol `p` (the LL flag to expect).
    pub fn sequence(&self, p: Protocol) -> u64 {
        self.fifos[proto_index(p)].as_ref().map_or(0, |f| f.consume)
    }

    /// Posts receives for expected slices into free slots and tests posted ones.
    pub fn progress(&mut self) -> Result<bool> {
        let mut moved = false;
        while let Some(e) = self.expect.front().cloned() {
            let p = e.params;
            let Self {
                fifos,
                comm,
                label,
                expect_posted,
                peer,
                place,
                user,
                ..
            } = self;
            let f = Self::fifo(fifos, comm, label, place, &p)?;
            let n = f.params.slots() as u64;
            let left = e.count - *expect_posted;
            // A group never crosses the end of its primitive's slices.
            let in_group = e.group - (*expect_posted % e.group);
            let k = left.min(in_group);
            if f.post + k as u64 - f.consume > n {
                break;
            }
            let wire = f.slots.slot_wire;
            // A direct receive lands in the user buffer: single receives only, and
            // only while the buffer is registered on this comm.
            let direct = e.direct.filter(|_| e.group == 1).and_then(|d| {
                let (addr, len) = d.slice(*expect_posted);
                user.find(addr, len).map(|m| (addr, len, m))
            });
            // On the stack up to a typical group (no allocation per receive).
            let empty = RecvBuffer {
                data: std::ptr::null_mut(),
                size: 0,
                tag: 0,
                mr: None,
            };
            let mut inline = [empty; INLINE_RECVS];
            let mut heap = Vec::new();
            let bufs: &mut [RecvBuffer<'_>] = if k <= INLINE_RECVS {
                &mut inline[..k]
            } else {
                heap.resize(k, empty);
                &mut heap
            };
            for (j, b) in bufs.iter_mut().enumerate() {
                let slot = ((f.post + j as u64) % n) as usize;
                let tag = if e.group > 1 { j as i32 } else { *peer };
                *b = match direct {
                    Some((addr, len, m)) => RecvBuffer {
                        data: addr as *mut u8,
                        size: len,
                        tag,
                        mr: user.get(m),
                    },
                    None => RecvBuffer {
                        data: f.slots.slot(slot),
                        size: wire,
                        tag,
                        mr: f.mr.as_ref(),
                    },
                };
            }
            let optional = p.proto != Protocol::SIMPLE && k == 1;
            let phs = f.steps.start(e.prof.as_ref(), f.post, *expect_posted, k);
            // SAFETY: the slots stay untouched until the request completes and the
            // kernel consumed them; so do their step handles (`phs`) in `f.steps`.
            match unsafe { comm.irecv_profiled(bufs, optional, &phs) } {
                Ok(Some(r)) => {
                    if let Some((addr, ..)) = direct {
                        f.landed[(f.post % n) as usize] = Some(addr);
                    }
                    f.steps.posted(f.post, k);
                    f.posted.push_back((r, f.post, k));
                    f.post += k as u64;
                    *expect_posted += k;
                    moved = true;
                    if *expect_posted == e.count {
                        self.expect.pop_front();
                        self.expect_posted = 0;
                    }
                }
                Ok(None) => break,
                Err(err) => return Err(net_err(err, &format!("{}: irecv", self.label))),
            }
        }
        let Self {
            fifos,
            comm,
            label,
            place,
            ..
        } = self;
        for f in fifos.iter_mut().flatten() {
            let n = f.params.slots() as u64;
            // NCCL flushes GPU receives of the Simple protocol (NCCL_ABI.md §2.11).
            let flush = place.plan.flush && f.params.proto == Protocol::SIMPLE;
            while let Some((r, first, k)) = f.posted.front_mut() {
                let (first, k) = (*first, *k);
                match comm.test(r) {
                    Ok(Some(sizes)) => {
                        let id = r.id();
                        let sizes = sizes.as_slice();
                        // The one use NCCL makes of reported sizes besides profiling:
                        // a request that reports 0 bytes in total is not flushed.
                        let reported: usize = sizes.iter().take(k).sum();
                        for j in 0..k {
                            let slot = ((first + j as u64) % n) as usize;
                            let got = sizes.get(j).copied().unwrap_or(0);
                            f.steps.received(first + j as u64);
                            if flush && reported > 0 {
                                // Never past the slot, whatever the plugin reported.
                                let got = got.min(f.slots.slot_wire);
                                let data = f.slots.slot(slot);
                                // SAFETY: the slot is registered as `f.mr` and holds
                                // the `got` bytes just received; the kernel reads it
                                // only after this returns.
                                unsafe {
                                    device::mem::flush(
                                        comm,
                                        data,
                                        got,
                                        f.mr.as_ref(),
                                        place.flush_timeout,
                                    )
                                }
                                .map_err(|e| e.context(&label))?;
                            }
                            f.steps.flushed(first + j as u64);
                            // The request's id travels with its last slot for irecvConsumed.
                            f.ready[slot] = (got, (j + 1 == k).then_some(id), k);
                        }
                        f.done += k as u64;
                        f.posted.pop_front();
                        moved = true;
                    }
                    Ok(None) => break,
                    Err(e) => return Err(net_err(e, &format!("{label}: test(recv)"))),
                }
            }
        }
        Ok(moved)
    }
}

impl Drop for RecvConn {
    fn drop(&mut self) {
        for f in self.fifos.iter_mut().flatten() {
            f.posted.clear();
            if let Some(mr) = f.mr.take()
                && let Err(e) = self.comm.dereg_mr(mr)
            {
                tracing::warn!(target: "cclkit::proxy", "{}: deregMr: {e}", self.label);
            }
        }
        self.release_user();
    }
}
