//! The receiving side: posts receives, writes clear-to-send entries into the
//! sender's FIFO, completes on the immediates; flushes GPU receives.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cclkit_abi::{Error, Result};

use super::endpoint::Endpoint;
use super::fifo::{ELEM_BYTES, FifoElem, SIZES_SLOT_BYTES, SLOT_BYTES, slot_of};
use super::imm::Imm;
use super::plan::qps_for;
use super::prof::{QpWork, ReqEvents};
use super::request::ReqCell;
use super::{
    CTS_SIGNAL_EVERY, Keys, MAX_MESSAGE, MAX_RECVS, MAX_REQUESTS, Registered, RemoteBuf,
    completion_error, fail_cells,
};
use crate::nic::{Completion, CompletionKind, Nic, Op, SendWr, Sge};
use crate::verbs::sys::IBV_WR_RDMA_WRITE_WITH_IMM;
use cclkit_abi::profiler::net::RequestProfiler;

/// One buffer of a (grouped) receive, with the rkeys of its registrations.
#[derive(Debug, Clone, Copy)]
pub struct RecvTarget {
    /// Start address.
    pub addr: u64,
    /// Posted size.
    pub len: usize,
    /// Remote keys the sender writes with, per device of our virtual device.
    pub rkeys: Keys,
    /// Tag of the matching send.
    pub tag: i32,
}

/// A posted receive, until every QP's immediate arrived.
struct Posted {
    idx: u64,
    sizes: [u64; MAX_RECVS],
    n: usize,
    events_left: usize,
    single: Option<u32>,
    cell: Arc<ReqCell>,
    /// Profiler QP events, stopped per QP as its immediate arrives.
    events: ReqEvents,
}

/// How the receiver posts (from its settings and the sender's metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecvOpts {
    /// The sender's `NCCL_IB_SPLIT_DATA_ON_QPS`: which QPs a message arrives on.
    pub split: bool,
    /// `NCCL_IB_USE_INLINE`: CTS entries are posted inline.
    pub inline: bool,
    /// Out-of-order receive queues: a completion's `wr_id` does not name the
    /// message; its immediate (the sequence number) does ([`super::ooo`]).
    pub ooo: bool,
}

/// The loopback QPs (one per device) that flush GPU receives with a 1-byte RDMA
/// READ each.
pub struct Flush<N: Nic> {
    qps: Vec<N::Qp>,
    scratch: Registered<N>,
    /// (sequence number, reads still to complete, request).
    pending: VecDeque<(u64, usize, Arc<ReqCell>)>,
    seq: u64,
}

impl<N: Nic> Flush<N> {
    pub(super) fn new(qps: Vec<N::Qp>, scratch: Registered<N>) -> Self {
        Self {
            qps,
            scratch,
            pending: VecDeque::new(),
            seq: 0,
        }
    }
}

/// The receiving half of a connected comm.
pub struct Receiver<N: Nic> {
    // The flush QP before the endpoint, whose CQ it completes on.
    flush: Option<Flush<N>>,
    ep: Endpoint<N>,
    cts: Registered<N>,
    sizes: Registered<N>,
    remote_fifo: RemoteBuf,
    opts: RecvOpts,
    /// Sequence number of the last receive posted.
    tail: u64,
    slots: Vec<Option<Posted>>,
    fatal: Option<Error>,
    completions: Vec<(usize, Completion)>,
}

impl<N: Nic> Receiver<N> {
    pub(super) fn new(
        ep: Endpoint<N>,
        cts: Registered<N>,
        sizes: Registered<N>,
        flush: Option<Flush<N>>,
        remote_fifo: RemoteBuf,
        opts: RecvOpts,
    ) -> Self {
        Self {
            flush,
            ep,
            cts,
            sizes,
            remote_fifo,
            opts,
            tail: 0,
            slots: (0..MAX_REQUESTS).map(|_| None).collect(),
            fatal: None,
            completions: Vec::new(),
        }
    }

    /// The connection's first fatal error, if any.
    pub fn fatal(&self) -> Option<&Error> {
        self.fatal.as_ref()
    }

    /// Whether GPU receives can be flushed.
    pub fn can_flush(&self) -> bool {
        self.flush.is_some()
    }

    /// Posts a receive of `bufs` (1 … 8) and tells the sender; `Ok(None)` when all
    /// `MAX_REQUESTS` receives are still in flight (NCCL retries).
    pub fn irecv(&mut self, bufs: &[RecvTarget]) -> Result<Option<Arc<ReqCell>>> {
        self.irecv_profiled(bufs, RequestProfiler::none())
    }

    /// [`irecv`](Self::irecv) reporting QP events to `prof` ([`super::prof`]): one
    /// per buffer and QP the receive is posted on, each under that buffer's handle
    /// (NCCL's `phandles[r]`) with that buffer's posted bytes.
    pub fn irecv_profiled(
        &mut self,
        bufs: &[RecvTarget],
        prof: RequestProfiler,
    ) -> Result<Option<Arc<ReqCell>>> {
        self.check()?;
        if let Err(e) = self.ep.check_fatal() {
            return Err(self.fail(e));
        }
        let n = bufs.len();
        if !(1..=MAX_RECVS).contains(&n) {
            return Err(Error::invalid_argument(format!(
                "irecv of {n} buffers; this plugin takes 1..={MAX_RECVS}"
            )));
        }
        if let Some(b) = bufs.iter().find(|b| b.len > MAX_MESSAGE) {
            return Err(Error::invalid_argument(format!(
                "irecv buffer of {} bytes exceeds maxP2pBytes ({MAX_MESSAGE})",
                b.len
            )));
        }
        let idx = self.tail + 1;
        let slot = slot_of(idx);
        if self.slots[slot].is_some() {
            self.progress()?;
            if self.slots[slot].is_some() {
                return Ok(None);
            }
        }
        if let Err(e) = self.post(idx, bufs) {
            return Err(self.fail(e));
        }
        let cell = Arc::new(ReqCell::new(n));
        let mut sizes = [0u64; MAX_RECVS];
        for (s, b) in sizes.iter_mut().zip(bufs) {
            *s = b.len as u64;
        }
        let mut events = ReqEvents::default();
        if prof.is_enabled() {
            for q in qps_for(idx, self.ep.qps.len(), self.opts.split) {
                for (r, b) in bufs.iter().enumerate() {
                    events.start(
                        prof.for_buffer(r),
                        QpWork {
                            q,
                            device: self.ep.dev_of(q),
                            wr_id: idx,
                            opcode: IBV_WR_RDMA_WRITE_WITH_IMM,
                            qp_num: N::qp_num(&self.ep.qps[q]),
                            length: b.len,
                        },
                    );
                }
            }
        }
        self.slots[slot] = Some(Posted {
            idx,
            sizes,
            n,
            events_left: qps_for(idx, self.ep.qps.len(), self.opts.split).count(),
            single: None,
            cell: Arc::clone(&cell),
            events,
        });
        self.tail = idx;
        Ok(Some(cell))
    }

    /// One receive on each QP the message will use (NCCL's `ncclIbIrecv` with
    /// `ncclIbCommBaseGetQpForRequest`), then the CTS write into the sender's FIFO on
    /// the first QP (`ncclIbPostFifo` / `ncclIbRecvCommGetQpForCts`).
    fn post(&mut self, idx: u64, bufs: &[RecvTarget]) -> Result<()> {
        for q in qps_for(idx, self.ep.qps.len(), self.opts.split) {
            let nic = Arc::clone(&self.ep.nics[self.ep.dev_of(q)]);
            nic.post_recv(&mut self.ep.qps[q], idx)?;
        }
        let slot = slot_of(idx);
        for (r, b) in bufs.iter().enumerate() {
            self.cts.mem().write_elem(
                slot,
                r,
                FifoElem {
                    addr: b.addr,
                    size: b.len as u64,
                    rkeys: b.rkeys,
                    tag: b.tag,
                    nreqs: bufs.len() as u32,
                    idx,
                },
            );
        }
        let wr = SendWr {
            wr_id: idx,
            op: Op::Write,
            local: Some(Sge {
                addr: (self.cts.mem().addr() + slot * SLOT_BYTES) as u64,
                len: (bufs.len() * ELEM_BYTES) as u32,
                lkey: self.cts.lkey(self.ep.dev_of(0)),
            }),
            remote_addr: self.remote_fifo.addr + (slot * SLOT_BYTES) as u64,
            rkey: self.remote_fifo.rkeys[self.ep.remote_dev_of(0)],
            signaled: idx % CTS_SIGNAL_EVERY == 0,
            inline: self.opts.inline,
        };
        let nic = Arc::clone(&self.ep.nics[self.ep.dev_of(0)]);
        nic.post_send(&mut self.ep.qps[0], &[wr])
    }

    /// Flushes a GPU receive that ended in `target` (address, rkeys): a 1-byte RDMA
    /// READ through each device's loopback QP, which PCIe orders after that device's
    /// data writes. `Ok(None)` when there is nothing to flush.
    pub fn iflush(&mut self, target: Option<(u64, Keys)>) -> Result<Option<Arc<ReqCell>>> {
        self.check()?;
        let (Some((addr, rkeys)), Some(flush)) = (target, self.flush.as_mut()) else {
            return Ok(None);
        };
        flush.seq += 1;
        let cell = Arc::new(ReqCell::new(1));
        flush
            .pending
            .push_back((flush.seq, flush.qps.len(), Arc::clone(&cell)));
        for (d, qp) in flush.qps.iter_mut().enumerate() {
            let wr = SendWr {
                wr_id: flush.seq,
                op: Op::Read,
                local: Some(Sge {
                    addr: flush.scratch.mem().addr() as u64,
                    len: 1,
                    lkey: flush.scratch.lkey(d),
                }),
                remote_addr: addr,
                rkey: rkeys[d],
                signaled: true,
                inline: false,
            };
            if let Err(e) = self.ep.nics[d].post_send(qp, &[wr]) {
                return Err(self.fail(e));
            }
        }
        Ok(Some(cell))
    }

    /// Polls the CQ and completes finished receives and flushes.
    pub fn progress(&mut self) -> Result<()> {
        self.check()?;
        if let Err(e) = self.ep.check_fatal() {
            return Err(self.fail(e));
        }
        self.completions.clear();
        if let Err(e) = self.ep.poll(&mut self.completions, 64) {
            return Err(self.fail(e));
        }
        for i in 0..self.completions.len() {
            let (dev, c) = self.completions[i];
            if let Err(e) = self.on_completion(dev, &c) {
                return Err(self.fail(e));
            }
        }
        Ok(())
    }

    fn on_completion(&mut self, dev: usize, c: &Completion) -> Result<()> {
        let q = self.ep.qp_index(dev, c.qp_num);
        if c.status != 0 {
            return Err(completion_error("receiver", c));
        }
        match c.kind {
            CompletionKind::RecvImm(raw) if self.opts.ooo => {
                // Match by id (NCCL's BY_ID): the immediate carries the sequence
                // number mod 2^31; at most MAX_REQUESTS receives are posted, so the
                // one with that number is unique.
                let Imm::Multi(seq) = Imm::decode(raw) else {
                    return Err(Error::remote(format!(
                        "NET/cclkit-ib: immediate {raw:#x} carries no sequence number, but \
                         the connection matches by id (out-of-order receive queues)"
                    )));
                };
                let idx = self
                    .slots
                    .iter()
                    .flatten()
                    .map(|p| p.idx)
                    .find(|&i| Imm::multi(i) == Imm::Multi(seq))
                    .ok_or_else(|| {
                        Error::remote(format!(
                            "NET/cclkit-ib: immediate for receive {seq} (mod 2^31), which is not posted"
                        ))
                    })?;
                self.on_imm(idx, raw, q)
            }
            CompletionKind::RecvImm(raw) => self.on_imm(c.wr_id, raw, q),
            CompletionKind::Read => {
                // Each device completes its reads in order; devices among themselves
                // in any order, so the flush is found by its sequence number.
                let Some(f) = self.flush.as_mut() else {
                    return Err(Error::internal(
                        "NET/cclkit-ib: read completion without flush QP",
                    ));
                };
                let Some(pos) = f.pending.iter().position(|p| p.0 == c.wr_id) else {
                    return Err(Error::internal(format!(
                        "NET/cclkit-ib: completion of flush {}, which is not pending",
                        c.wr_id
                    )));
                };
                f.pending[pos].1 -= 1;
                if f.pending[pos].1 == 0 {
                    if let Some((_, _, cell)) = f.pending.remove(pos) {
                        cell.complete(&[0]);
                    }
                }
                Ok(())
            }
            // Signaled CTS writes only retire send-queue entries.
            CompletionKind::Write | CompletionKind::Other(_) => Ok(()),
        }
    }

    fn on_imm(&mut self, idx: u64, raw: u32, q: Option<usize>) -> Result<()> {
        let slot = slot_of(idx);
        let Some(p) = self.slots[slot].as_mut().filter(|p| p.idx == idx) else {
            return Err(Error::internal(format!(
                "NET/cclkit-ib: immediate for receive {idx}, which is not posted"
            )));
        };
        let imm = Imm::decode(raw);
        if !imm.matches(idx, p.n) {
            return Err(Error::remote(format!(
                "NET/cclkit-ib: immediate {raw:#x} does not belong to receive {idx} of {} buffers",
                p.n
            )));
        }
        if let Imm::Single(size) = imm {
            if u64::from(size) > p.sizes[0] || p.single.is_some_and(|s| s != size) {
                return Err(Error::remote(format!(
                    "NET/cclkit-ib: peer sent {size} bytes into a {}-byte receive",
                    p.sizes[0]
                )));
            }
            p.single = Some(size);
        }
        if let Some(q) = q {
            p.events.stop_qp(q);
        }
        p.events_left -= 1;
        if p.events_left > 0 {
            return Ok(());
        }
        let mut got = [0u64; MAX_RECVS];
        if let Some(size) = p.single {
            got[0] = u64::from(size);
        } else {
            for (r, g) in got.iter_mut().enumerate().take(p.n) {
                let v = self
                    .sizes
                    .mem()
                    .load(slot * SIZES_SLOT_BYTES + 8 * r, Ordering::Relaxed);
                if v > p.sizes[r] {
                    return Err(Error::remote(format!(
                        "NET/cclkit-ib: peer sent {v} bytes into buffer {r} ({} bytes) of receive {idx}",
                        p.sizes[r]
                    )));
                }
                *g = v;
            }
        }
        p.cell.complete(&got[..p.n]);
        self.slots[slot] = None;
        Ok(())
    }

    fn check(&self) -> Result<()> {
        match &self.fatal {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Records the first fatal error and fails every pending receive and flush.
    fn fail(&mut self, e: Error) -> Error {
        let e = self.fatal.get_or_insert(e).clone();
        fail_cells(self.slots.iter().flatten().map(|p| &p.cell));
        for p in self.slots.iter_mut().flatten() {
            p.events.stop_all();
        }
        if let Some(f) = &self.flush {
            fail_cells(f.pending.iter().map(|(_, _, c)| c));
        }
        e
    }
}
