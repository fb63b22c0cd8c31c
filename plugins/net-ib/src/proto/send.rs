//! The sending side: waits for clear-to-send entries, matches tags, writes the data.

use std::collections::VecDeque;
use std::sync::Arc;

use cclkit_abi::{Error, Result};

use super::endpoint::Endpoint;
use super::fifo::{FifoElem, SIZES_SLOT_BYTES, slot_of};
use super::imm::Imm;
use super::request::ReqCell;
use super::split::chunk;
use super::{MAX_INFLIGHT, MAX_RECVS, Registered, RemoteBuf, completion_error, fail_cells};
use crate::nic::{Completion, CompletionKind, Nic, Op, SendWr, Sge};

/// A buffer to send and the local key of the registration covering it.
#[derive(Debug, Clone, Copy)]
pub struct SendBuf {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
    /// Local key.
    pub lkey: u32,
}

/// The slot at the FIFO head while its sends arrive.
struct Matching {
    idx: u64,
    elems: Vec<FifoElem>,
    sends: [Option<(SendBuf, Arc<ReqCell>)>; MAX_RECVS],
    matched: usize,
}

/// A slot whose writes are posted; done when every QP's signaled write completed.
struct Inflight {
    idx: u64,
    events_left: usize,
    cells: Vec<(Arc<ReqCell>, u32)>,
}

/// The sending half of a connected comm.
pub struct Sender<N: Nic> {
    ep: Endpoint<N>,
    fifo: Registered<N>,
    sizes_out: Registered<N>,
    remote_sizes: RemoteBuf,
    /// Sequence number of the last slot posted (the next is `head + 1`).
    head: u64,
    matching: Option<Matching>,
    inflight: VecDeque<Inflight>,
    fatal: Option<Error>,
    completions: Vec<Completion>,
    wrs: Vec<SendWr>,
}

impl<N: Nic> Sender<N> {
    pub(super) fn new(
        ep: Endpoint<N>,
        fifo: Registered<N>,
        sizes_out: Registered<N>,
        remote_sizes: RemoteBuf,
    ) -> Self {
        Self {
            ep,
            fifo,
            sizes_out,
            remote_sizes,
            head: 0,
            matching: None,
            inflight: VecDeque::new(),
            fatal: None,
            completions: Vec::new(),
            wrs: Vec::new(),
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
        self.check()?;
        if self.matching.is_none() {
            if self.inflight.len() >= MAX_INFLIGHT {
                self.progress()?;
                if self.inflight.len() >= MAX_INFLIGHT {
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
        m.sends[r] = Some((buf, Arc::clone(&cell)));
        m.matched += 1;
        if m.matched == m.elems.len() {
            if let Some(m) = self.matching.take() {
                if let Err(e) = self.post(m) {
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

    /// Writes every buffer of a fully matched slot, split over the QPs.
    fn post(&mut self, m: Matching) -> Result<()> {
        let n = m.elems.len();
        let nqps = self.ep.qps.len();
        let slot = slot_of(m.idx);
        let mut sends = Vec::with_capacity(n);
        for s in m.sends.into_iter().take(n) {
            sends.push(s.ok_or_else(|| Error::internal("posting a partly matched slot"))?);
        }
        let imm = if n == 1 {
            Imm::single(sends[0].0.len)?
        } else {
            for (r, (b, _)) in sends.iter().enumerate() {
                self.sizes_out.mem().store(
                    slot * SIZES_SLOT_BYTES + 8 * r,
                    b.len as u64,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            Imm::multi(m.idx)
        }
        .encode();
        // Tracked before posting, so a failure below fails these requests too.
        self.inflight.push_back(Inflight {
            idx: m.idx,
            events_left: nqps,
            cells: sends
                .iter()
                .map(|(b, c)| (Arc::clone(c), b.len as u32))
                .collect(),
        });
        self.head = m.idx;
        for q in 0..nqps {
            self.wrs.clear();
            if q == 0 && n > 1 {
                self.wrs.push(SendWr {
                    wr_id: m.idx,
                    op: Op::Write,
                    local: Some(Sge {
                        addr: (self.sizes_out.mem().addr() + slot * SIZES_SLOT_BYTES) as u64,
                        len: (8 * n) as u32,
                        lkey: self.sizes_out.lkey(),
                    }),
                    remote_addr: self.remote_sizes.addr + (slot * SIZES_SLOT_BYTES) as u64,
                    rkey: self.remote_sizes.rkey,
                    signaled: false,
                });
            }
            let mut last_is_data = false;
            for ((b, _), e) in sends.iter().zip(&m.elems) {
                let c = chunk(b.len, nqps, q);
                if c.is_empty() {
                    continue;
                }
                self.wrs.push(SendWr {
                    wr_id: m.idx,
                    op: Op::Write,
                    local: Some(Sge {
                        addr: b.addr + c.start as u64,
                        len: c.len() as u32,
                        lkey: b.lkey,
                    }),
                    remote_addr: e.addr + c.start as u64,
                    rkey: e.rkey,
                    signaled: false,
                });
                last_is_data = true;
            }
            match self.wrs.last_mut() {
                // The QP's last data write carries the immediate (one WR less).
                Some(last) if last_is_data => {
                    last.op = Op::WriteImm(imm);
                    last.signaled = true;
                }
                _ => self.wrs.push(SendWr {
                    wr_id: m.idx,
                    op: Op::WriteImm(imm),
                    local: None,
                    remote_addr: m.elems[0].addr,
                    rkey: m.elems[0].rkey,
                    signaled: true,
                }),
            }
            self.ep.nic.post_send(&mut self.ep.qps[q], &self.wrs)?;
        }
        Ok(())
    }

    /// Polls the CQ and completes finished sends.
    pub fn progress(&mut self) -> Result<()> {
        self.check()?;
        self.completions.clear();
        if let Err(e) = self
            .ep
            .nic
            .poll_cq(&mut self.ep.cq, &mut self.completions, 64)
        {
            return Err(self.fail(e));
        }
        for i in 0..self.completions.len() {
            let c = self.completions[i];
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
            let f = &mut self.inflight[pos];
            f.events_left -= 1;
            if f.events_left == 0 {
                if let Some(done) = self.inflight.remove(pos) {
                    for (cell, size) in &done.cells {
                        cell.complete(&[*size]);
                    }
                }
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<()> {
        match &self.fatal {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Records the first fatal error and fails every pending send.
    fn fail(&mut self, e: Error) -> Error {
        let e = self.fatal.get_or_insert(e).clone();
        fail_cells(
            self.inflight
                .iter()
                .flat_map(|f| f.cells.iter().map(|(c, _)| c)),
        );
        if let Some(m) = &self.matching {
            fail_cells(m.sends.iter().flatten().map(|(_, c)| c));
        }
        e
    }
}
