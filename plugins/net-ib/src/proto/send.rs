//! The sending side: waits for clear-to-send entries, matches tags, writes the data.

use std::collections::VecDeque;
use std::sync::Arc;

use cclkit_abi::{Error, Result};

use super::endpoint::Endpoint;
use super::fifo::{FifoElem, SIZES_SLOT_BYTES, slot_of};
use super::plan::{QpLayout, Records, SendOpts, imm_on_data, plan_on, uses_records};
use super::prof::{QpWork, ReqEvents};
use super::request::ReqCell;
use super::split::chunk;
use super::{
    DATA_QP_CAPS, Keys, MAX_INFLIGHT, MAX_RECVS, Registered, RemoteBuf, completion_error,
    fail_cells,
};
use crate::nic::{Completion, CompletionKind, Nic, SendWr};
use crate::verbs::sys::{IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM};
use cclkit_abi::profiler::net::RequestProfiler;

/// A buffer to send and the local keys of the registrations covering it, per
/// device of the virtual device.
#[derive(Debug, Clone, Copy)]
pub struct SendBuf {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
    /// Local keys (NCCL's `send.lkeys[]`).
    pub lkeys: Keys,
}

/// The slot at the FIFO head while its sends arrive.
struct Matching {
    idx: u64,
    elems: Vec<FifoElem>,
    sends: [Option<(SendBuf, Arc<ReqCell>, RequestProfiler)>; MAX_RECVS],
    matched: usize,
}

/// A fully matched slot whose work requests wait for send-queue credit.
struct Ready {
    idx: u64,
    wrs: Vec<(usize, Vec<SendWr>)>,
    cells: Vec<(Arc<ReqCell>, u64)>,
    /// Per request: its profiler and length; whether the immediate rides on data.
    profs: Vec<(RequestProfiler, usize)>,
    imm_on_data: bool,
}

/// A slot whose writes are posted; done when every QP's signaled write completed.
struct Inflight {
    idx: u64,
    /// (QP index, WRs posted there): credit returned when its completion is polled.
    qps: Vec<(usize, usize)>,
    cells: Vec<(Arc<ReqCell>, u64)>,
    /// Profiler QP events of the slot's requests, stopped per QP as it completes.
    events: ReqEvents,
}

/// The sending half of a connected comm.
pub struct Sender<N: Nic> {
    ep: Endpoint<N>,
    fifo: Registered<N>,
    sizes_out: Registered<N>,
    remote_sizes: RemoteBuf,
    opts: SendOpts,
    /// Sequence number of the last slot matched (the next is `head + 1`).
    head: u64,
    matching: Option<Matching>,
    ready: VecDeque<Ready>,
    inflight: VecDeque<Inflight>,
    /// Send-queue slots free per QP: a WR's slot is free again only once the
    /// completion of it (or of a later signaled WR) is polled, as in verbs.
    credit: Vec<usize>,
    fatal: Option<Error>,
    completions: Vec<(usize, Completion)>,
}

impl<N: Nic> Sender<N> {
    pub(super) fn new(
        ep: Endpoint<N>,
        fifo: Registered<N>,
        sizes_out: Registered<N>,
        remote_sizes: RemoteBuf,
        opts: SendOpts,
    ) -> Self {
        let credit = vec![DATA_QP_CAPS.max_send_wr as usize; ep.qps.len()];
        Self {
            ep,
            fifo,
            sizes_out,
            remote_sizes,
            opts,
            head: 0,
            matching: None,
            ready: VecDeque::new(),
            inflight: VecDeque::new(),
            credit,
            fatal: None,
            completions: Vec::new(),
        }
    }

    /// The connection's first fatal error, if any.
    pub fn fatal(&self) -> Option<&Error> {
        self.fatal.as_ref()
    }

    /// Number of QPs.
    pub fn nqps(&self) -> usize {
        self.ep.qps.len()
    }

    /// Posts a send with `tag`; `Ok(None)` until the receiver's matching CTS entry
    /// is there (NCCL retries). A send larger than the posted receive is an error.
    pub fn isend(&mut self, buf: SendBuf, tag: i32) -> Result<Option<Arc<ReqCell>>> {
        self.isend_profiled(buf, tag, RequestProfiler::none())
    }

    /// [`isend`](Self::isend) reporting QP events to `prof` ([`super::prof`]).
    pub fn isend_profiled(
        &mut self,
        buf: SendBuf,
        tag: i32,
        prof: RequestProfiler,
    ) -> Result<Option<Arc<ReqCell>>> {
        self.check()?;
        if let Err(e) = self.ep.check_fatal() {
            return Err(self.fail(e));
        }
        if self.matching.is_none() {
            if self.inflight.len() + self.ready.len() >= MAX_INFLIGHT {
                self.progress()?;
                if self.inflight.len() + self.ready.len() >= MAX_INFLIGHT {
                    return Ok(None);
                }
            }
            let slot = match self.read_slot()? {
                Some(m) => m,
                None => {
                    // Drive completions (and, for a NIC that needs it, progress)
                    // before telling NCCL to retry.
                    self.progress()?;
                    match self.read_slot()? {
                        Some(m) => m,
                        None => return Ok(None),
                    }
                }
            };
            self.matching = Some(slot);
        }
        let Some(m) = self.matching.as_mut() else {
            return Ok(None);
        };
        let Some(r) = (0..m.elems.len()).find(|&r| m.sends[r].is_none() && m.elems[r].tag == tag)
        else {
            // No buffer of this receive waits for `tag` (yet): NCCL retries.
            return Ok(None);
        };
        let posted = m.elems[r].size as usize;
        if buf.len > posted {
            return Err(Error::invalid_usage(format!(
                "NET/cclkit-ib: send of {} bytes (tag {tag}) is larger than the {posted}-byte \
                 buffer the peer posted for it (receive {}, buffer {r} of {}): collective size \
                 mismatch between ranks",
                buf.len,
                m.idx,
                m.elems.len()
            )));
        }
        let cell = Arc::new(ReqCell::new(1));
        m.sends[r] = Some((buf, Arc::clone(&cell), prof));
        m.matched += 1;
        if m.matched == m.elems.len() {
            if let Some(m) = self.matching.take() {
                let r = self.prepare(m).and_then(|()| self.post_ready());
                if let Err(e) = r {
                    return Err(self.fail(e));
                }
            }
        }
        Ok(Some(cell))
    }

    /// The slot at `head + 1` once every element of it has landed.
    fn read_slot(&mut self) -> Result<Option<Matching>> {
        let idx = self.head + 1;
        let slot = slot_of(idx);
        let mem = self.fifo.mem();
        if mem.elem_idx(slot, 0) != idx {
            return Ok(None);
        }
        let first = mem.read_elem(slot, 0);
        let n = first.nreqs as usize;
        if !(1..=MAX_RECVS).contains(&n) {
            return Err(self.fail(Error::remote(format!(
                "NET/cclkit-ib: CTS entry {idx} announces {n} buffers (max {MAX_RECVS}); \
                 peer is not a compatible cclkit-ib"
            ))));
        }
        if (1..n).any(|r| mem.elem_idx(slot, r) != idx) {
            return Ok(None);
        }
        let elems: Vec<FifoElem> = (0..n).map(|r| mem.read_elem(slot, r)).collect();
        if let Some(bad) = elems.iter().find(|e| e.nreqs as usize != n) {
            return Err(self.fail(Error::remote(format!(
                "NET/cclkit-ib: CTS entry {idx} is inconsistent ({} vs {n} buffers)",
                bad.nreqs
            ))));
        }
        Ok(Some(Matching {
            idx,
            elems,
            sends: Default::default(),
            matched: 0,
        }))
    }

    /// Plans the work requests of a fully matched slot (NCCL's `ncclIbMultiSend`)
    /// and queues them for posting.
    fn prepare(&mut self, m: Matching) -> Result<()> {
        let n = m.elems.len();
        let slot = slot_of(m.idx);
        let mut sends = Vec::with_capacity(n);
        let mut cells = Vec::with_capacity(n);
        let mut profs = Vec::with_capacity(n);
        for s in m.sends.into_iter().take(n) {
            let (b, c, p) = s.ok_or_else(|| Error::internal("posting a partly matched slot"))?;
            sends.push(b);
            cells.push((c, b.len as u64));
            profs.push((p, b.len));
        }
        if self.opts.ooo || uses_records(&sends) {
            for (r, b) in sends.iter().enumerate() {
                self.sizes_out.mem().store(
                    slot * SIZES_SLOT_BYTES + 8 * r,
                    b.len as u64,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        }
        let records = Records {
            addr: (self.sizes_out.mem().addr() + slot * SIZES_SLOT_BYTES) as u64,
            len: (8 * n) as u32,
            lkeys: self.sizes_out.lkeys(),
            remote: RemoteBuf {
                addr: self.remote_sizes.addr + (slot * SIZES_SLOT_BYTES) as u64,
                rkeys: self.remote_sizes.rkeys,
            },
        };
        let layout = QpLayout {
            nqps: self.ep.qps.len(),
            local_devs: self.ep.ndevs(),
            remote_devs: self.ep.remote_devs,
        };
        let wrs = plan_on(m.idx, &sends, &m.elems, records, layout, self.opts);
        if let Some((q, w)) = wrs
            .iter()
            .find(|(_, w)| w.len() > DATA_QP_CAPS.max_send_wr as usize)
        {
            return Err(Error::invalid_usage(format!(
                "NET/cclkit-ib: message {} needs {} work requests on QP {q}, more than its \
                 send queue ({})",
                m.idx,
                w.len(),
                DATA_QP_CAPS.max_send_wr
            )));
        }
        self.head = m.idx;
        self.ready.push_back(Ready {
            idx: m.idx,
            wrs,
            cells,
            imm_on_data: imm_on_data(&sends, self.opts),
            profs,
        });
        Ok(())
    }

    /// Posts ready slots, in order, while every QP they use has send-queue credit.
    fn post_ready(&mut self) -> Result<()> {
        while let Some(r) = self.ready.front() {
            if r.wrs.iter().any(|(q, w)| self.credit[*q] < w.len()) {
                return Ok(());
            }
            let Some(r) = self.ready.pop_front() else {
                return Ok(());
            };
            let events = self.start_events(&r);
            // Tracked before posting, so a failure below fails these requests too.
            self.inflight.push_back(Inflight {
                idx: r.idx,
                qps: r.wrs.iter().map(|(q, w)| (*q, w.len())).collect(),
                cells: r.cells,
                events,
            });
            for (q, w) in &r.wrs {
                self.credit[*q] -= w.len();
                let nic = Arc::clone(&self.ep.nics[self.ep.dev_of(*q)]);
                nic.post_send(&mut self.ep.qps[*q], w)?;
            }
        }
        Ok(())
    }

    /// Polls the CQ and completes finished sends.
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
            if c.status != 0 {
                return Err(self.fail(completion_error("sender", &c)));
            }
            if c.kind != CompletionKind::Write {
                continue;
            }
            let Some(pos) = self.inflight.iter().position(|f| f.idx == c.wr_id) else {
                return Err(self.fail(Error::internal(format!(
                    "NET/cclkit-ib: send completion for unknown slot {}",
                    c.wr_id
                ))));
            };
            let q = self.ep.qp_index(dev, c.qp_num);
            let f = &mut self.inflight[pos];
            let Some(at) = q.and_then(|q| f.qps.iter().position(|(fq, _)| *fq == q)) else {
                return Err(self.fail(Error::internal(format!(
                    "NET/cclkit-ib: completion of slot {} on QP {:#x}, which it did not use",
                    c.wr_id, c.qp_num
                ))));
            };
            let (q, n) = f.qps.swap_remove(at);
            self.credit[q] += n;
            f.events.stop_qp(q);
            if f.qps.is_empty() {
                if let Some(done) = self.inflight.remove(pos) {
                    for (cell, size) in &done.cells {
                        cell.complete(&[*size]);
                    }
                }
            }
        }
        if let Err(e) = self.post_ready() {
            return Err(self.fail(e));
        }
        Ok(())
    }

    fn check(&self) -> Result<()> {
        match &self.fatal {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// One profiler event per request and QP of a slot about to be posted (NCCL's
    /// `ncclIbMultiSend` under `NCCL_ENABLE_NET_PROFILING`).
    fn start_events(&self, r: &Ready) -> ReqEvents {
        let mut events = ReqEvents::default();
        if r.profs.iter().all(|(p, _)| !p.is_enabled()) {
            return events;
        }
        let per = if self.opts.split {
            self.ep.qps.len()
        } else {
            1
        };
        for (i, (q, _)) in r.wrs.iter().enumerate() {
            for (p, len) in &r.profs {
                let opcode = if r.imm_on_data {
                    IBV_WR_RDMA_WRITE_WITH_IMM
                } else {
                    IBV_WR_RDMA_WRITE
                };
                events.start(
                    *p,
                    QpWork {
                        q: *q,
                        device: self.ep.dev_of(*q),
                        wr_id: r.idx,
                        opcode,
                        qp_num: N::qp_num(&self.ep.qps[*q]),
                        length: chunk(*len, per, i).len(),
                    },
                );
            }
        }
        events
    }

    /// Records the first fatal error and fails every pending send.
    fn fail(&mut self, e: Error) -> Error {
        let e = self.fatal.get_or_insert(e).clone();
        for f in &mut self.inflight {
            f.events.stop_all();
        }
        fail_cells(
            self.inflight
                .iter()
                .flat_map(|f| f.cells.iter().map(|(c, _)| c)),
        );
        fail_cells(
            self.ready
                .iter()
                .flat_map(|r| r.cells.iter().map(|(c, _)| c)),
        );
        if let Some(m) = &self.matching {
            fail_cells(m.sends.iter().flatten().map(|(_, c, _)| c));
        }
        e
    }
}
