//! The fake fabric's state and the engine that executes posted work, within the
//! rules verbs give and no more:
//! * QPs progress in a random order each round, so completions of different QPs
//!   (sharing one CQ) arrive in any order;
//! * on one QP up to [`WINDOW`] work requests are in flight at once; a write into a
//!   relaxed-ordering registration lands in pieces in random order, one into a
//!   strictly ordered registration lands in address order and only at the window's
//!   head; a WR *retires* (completion, immediate delivered) only from the head, so
//!   a WRITE_WITH_IMM's receive completion still implies every earlier write on its
//!   QP has landed — the one ordering guarantee the protocol may rely on;
//! * send- and receive-queue slots are returned when the completion is polled
//!   (unsignaled WRs with the next polled signaled one);
//! * a peer that cannot be reached (dead node, port down, wrong address vector,
//!   MTU above the peer's) stalls the QP until the retry timeout, then
//!   RETRY_EXC_ERR; a CQ overrun raises an asynchronous CQ error.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{
    LOC_PROT_ERR, NodeCfg, OpRecord, REM_ACCESS_ERR, RETRY_EXC_ERR, WR_FLUSH_ERR, copy_atomic,
};
use crate::fatal::FatalState;
use crate::nic::{
    ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, Completion, CompletionKind, Ece,
    Op, QpCaps, SendWr, WriteOrder,
};
use crate::route::AddressVector;

/// Work requests of one QP in flight at once.
pub const WINDOW: usize = 4;

pub(super) struct MrRec {
    pub node: u32,
    pub addr: usize,
    pub len: usize,
    pub order: WriteOrder,
    pub access: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// QP states of verbs (RESET is folded into creation, as `create_qp` returns INIT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Created, not connected.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Failed: everything posted completes with WR_FLUSH_ERR.
    Error,
}

pub(super) struct Pending {
    pub wr: SendWr,
    /// Byte offsets not yet written (pieces), shuffled when relaxed.
    pub left: Vec<(usize, usize)>,
    /// Inline payload copied at post time.
    pub inline: Option<Vec<u8>>,
    /// Checked keys once (first touch).
    pub checked: bool,
    /// The status it fails with when it reaches the head (bad key or access).
    pub error: Option<u32>,
}

pub(super) struct QpRec {
    pub node: u32,
    pub cq: u32,
    pub caps: QpCaps,
    pub peer: Option<u32>,
    pub av: Option<AddressVector>,
    pub reachable: bool,
    pub state: QpState,
    pub sq: VecDeque<Pending>,
    pub rq: VecDeque<u64>,
    pub sq_used: usize,
    pub rq_used: usize,
    /// Unsignaled WRs retired (executed) since the last signaled one.
    pub unsignaled_done: usize,
    pub stalled_since: Option<Instant>,
    pub ece: Option<Ece>,
}

/// A CQ entry and the queue slots its polling returns.
pub(super) struct CqEntry {
    pub c: Completion,
    pub sq_slots: usize,
    pub rq_slots: usize,
}

pub(super) struct CqRec {
    pub node: u32,
    pub depth: usize,
    pub entries: VecDeque<CqEntry>,
    pub overrun: bool,
}

pub(super) struct NodeRec {
    pub cfg: NodeCfg,
    pub fatal: Arc<FatalState>,
    pub port_down: bool,
    pub dead: bool,
}

pub(super) struct Fabric {
    pub mrs: HashMap<u32, MrRec>,
    pub qps: BTreeMap<u32, QpRec>,
    pub cqs: HashMap<u32, CqRec>,
    pub nodes: HashMap<u32, NodeRec>,
    pub next_id: u32,
    pub bytes_per_step: usize,
    pub inject: HashMap<u32, u32>,
    pub log: Vec<OpRecord>,
    pub rng: StdRng,
    pub retry_timeout: Duration,
}

impl Default for Fabric {
    fn default() -> Self {
        Self {
            mrs: HashMap::new(),
            qps: BTreeMap::new(),
            cqs: HashMap::new(),
            nodes: HashMap::new(),
            next_id: 0x100,
            bytes_per_step: 0,
            inject: HashMap::new(),
            log: Vec::new(),
            rng: StdRng::seed_from_u64(rand::rng().random()),
            retry_timeout: Duration::from_millis(20),
        }
    }
}

pub(super) fn completion(wr_id: u64, status: u32, kind: CompletionKind, qp_num: u32) -> Completion {
    Completion {
        wr_id,
        status,
        kind,
        qp_num,
        vendor_err: 0,
    }
}

impl Fabric {
    pub fn id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    pub fn node(&mut self, node: u32) -> &mut NodeRec {
        self.nodes.entry(node).or_insert_with(|| NodeRec {
            cfg: NodeCfg::default(),
            fatal: Arc::new(FatalState::new(true)),
            port_down: false,
            dead: false,
        })
    }

    /// Queues a completion; a full CQ overruns: asynchronous CQ error, and the
    /// completion is lost (as on hardware).
    pub fn push_cq(&mut self, cq: u32, e: CqEntry) {
        let Some(rec) = self.cqs.get_mut(&cq) else {
            return;
        };
        if rec.entries.len() >= rec.depth {
            if !rec.overrun {
                rec.overrun = true;
                let node = rec.node;
                let fatal = Arc::clone(&self.node(node).fatal);
                fatal.record(&format!("fake{node}"), 0, Some(cq as usize));
            }
        } else {
            rec.entries.push_back(e);
        }
    }

    /// Moves QP `qpn` to the error state and flushes its queues.
    pub fn error_qp(&mut self, qpn: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        q.state = QpState::Error;
        let cq = q.cq;
        let flushed: Vec<u64> = q.sq.drain(..).map(|p| p.wr.wr_id).collect();
        let recvs: Vec<u64> = q.rq.drain(..).collect();
        for wr_id in &flushed {
            let e = CqEntry {
                c: completion(*wr_id, WR_FLUSH_ERR, CompletionKind::Other(0), qpn),
                sq_slots: 1,
                rq_slots: 0,
            };
            self.push_cq(cq, e);
        }
        for wr_id in recvs {
            let e = CqEntry {
                c: completion(wr_id, WR_FLUSH_ERR, CompletionKind::Other(0), qpn),
                sq_slots: 0,
                rq_slots: 1,
            };
            self.push_cq(cq, e);
        }
    }

    fn fail_head(&mut self, qpn: u32, status: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let Some(p) = q.sq.pop_front() else { return };
        let slots = q.unsignaled_done + 1;
        q.unsignaled_done = 0;
        let cq = q.cq;
        let e = CqEntry {
            c: completion(p.wr.wr_id, status, CompletionKind::Other(0), qpn),
            sq_slots: slots,
            rq_slots: 0,
        };
        self.push_cq(cq, e);
        self.error_qp(qpn);
    }

    /// One round: every QP in a random order.
    pub fn progress(&mut self) {
        let mut qpns: Vec<u32> = self.qps.keys().copied().collect();
        for i in (1..qpns.len()).rev() {
            let j = self.rng.random_range(0..=i);
            qpns.swap(i, j);
        }
        for qpn in qpns {
            self.step(qpn);
        }
    }

    fn mr_by(&self, key: u32, remote: bool) -> Option<&MrRec> {
        self.mrs
            .values()
            .find(|m| if remote { m.rkey == key } else { m.lkey == key })
    }

    fn covers(m: &MrRec, node: u32, addr: u64, len: usize) -> bool {
        m.node == node
            && addr as usize >= m.addr
            && (addr as usize).saturating_add(len) <= m.addr + m.len
    }

    /// Whether the peer of QP `qpn` can be reached now.
    fn reachable(&self, q: &QpRec) -> Option<(u32, u32)> {
        let peer = q.peer?;
        let p = self.qps.get(&peer)?;
        let ok = q.reachable
            && matches!(p.state, QpState::Rtr | QpState::Rts)
            && [q.node, p.node]
                .iter()
                .all(|n| self.nodes.get(n).is_none_or(|r| !r.dead && !r.port_down));
        ok.then_some((peer, p.node))
    }

    fn step(&mut self, qpn: u32) {
        let Some(q) = self.qps.get(&qpn) else { return };
        if q.state != QpState::Rts || q.sq.is_empty() {
            return;
        }
        if self.nodes.get(&q.node).is_some_and(|n| n.dead) {
            return;
        }
        let node = q.node;
        if let Some(status) = self.inject.remove(&qpn) {
            return self.fail_head(qpn, status);
        }
        let Some((peer_qpn, peer_node)) = self.reachable(q) else {
            let timeout = self.retry_timeout;
            if let Some(q) = self.qps.get_mut(&qpn) {
                let since = *q.stalled_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= timeout {
                    self.fail_head(qpn, RETRY_EXC_ERR);
                }
            }
            return;
        };
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.stalled_since = None;
        }
        let n_window = self.qps.get(&qpn).map_or(0, |q| q.sq.len().min(WINDOW));
        let pick = self.rng.random_range(0..n_window);
        if let Err(status) = self.advance(qpn, pick, node, peer_qpn, peer_node) {
            if let Some(p) = self.qps.get_mut(&qpn).and_then(|q| q.sq.get_mut(pick)) {
                p.error = Some(status);
                p.checked = true;
                p.left.clear();
            }
        }
        self.retire(qpn, peer_qpn);
    }

    /// Writes one piece of WR `i` of the window (only the head for strict targets).
    fn advance(
        &mut self,
        qpn: u32,
        i: usize,
        node: u32,
        peer_qpn: u32,
        peer_node: u32,
    ) -> Result<(), u32> {
        let bytes_per_step = self.bytes_per_step;
        let Some(q) = self.qps.get(&qpn) else {
            return Ok(());
        };
        let Some(p) = q.sq.get(i) else { return Ok(()) };
        let wr = p.wr;
        let len = wr.local.map_or(0, |s| s.len as usize);
        if !p.checked {
            let peer_access = self.qps.get(&peer_qpn).map_or(0, |r| r.caps.access);
            let (need_qp, need_mr) = match wr.op {
                Op::Read => (ACCESS_REMOTE_READ, ACCESS_REMOTE_READ),
                _ => (ACCESS_REMOTE_WRITE, ACCESS_REMOTE_WRITE),
            };
            if let (Some(s), false) = (wr.local, wr.inline) {
                let ok = self.mr_by(s.lkey, false).is_some_and(|m| {
                    Self::covers(m, node, s.addr, len)
                        && (wr.op != Op::Read || m.access & ACCESS_LOCAL_WRITE != 0)
                });
                if !ok {
                    return Err(LOC_PROT_ERR);
                }
            }
            if len > 0 {
                let ok = peer_access & need_qp != 0
                    && self.mr_by(wr.rkey, true).is_some_and(|m| {
                        Self::covers(m, peer_node, wr.remote_addr, len) && m.access & need_mr != 0
                    });
                if !ok {
                    return Err(REM_ACCESS_ERR);
                }
            }
            let relaxed = wr.op != Op::Read
                && self
                    .mr_by(wr.rkey, true)
                    .is_some_and(|m| m.order == WriteOrder::Relaxed);
            let step = if bytes_per_step == 0 {
                len.max(1)
            } else {
                bytes_per_step
            };
            let mut pieces: Vec<(usize, usize)> = (0..len)
                .step_by(step)
                .map(|o| (o, (len - o).min(step)))
                .collect();
            if relaxed {
                for k in (1..pieces.len()).rev() {
                    let j = self.rng.random_range(0..=k);
                    pieces.swap(k, j);
                }
            }
            if let Some(p) = self.qps.get_mut(&qpn).and_then(|q| q.sq.get_mut(i)) {
                p.left = pieces;
                p.checked = true;
            }
        }
        let strict_target = self
            .mr_by(wr.rkey, true)
            .is_some_and(|m| m.order == WriteOrder::Strict);
        if i > 0 && (strict_target || wr.op == Op::Read) {
            return Ok(()); // in order: waits for the head
        }
        let Some(p) = self.qps.get_mut(&qpn).and_then(|q| q.sq.get_mut(i)) else {
            return Ok(());
        };
        let Some((off, n)) = (if p.left.is_empty() {
            None
        } else {
            Some(p.left.remove(0))
        }) else {
            return Ok(());
        };
        let local = wr.local.map_or(0, |s| s.addr) + off as u64;
        let remote = wr.remote_addr + off as u64;
        // SAFETY: both ranges were checked against live registrations of the right
        // nodes (inline data is owned by the pending WR), and registered memory stays
        // allocated while registered (`reg_mr`'s contract); the fabric lock
        // serialises fake-NIC accesses.
        unsafe {
            match (&p.inline, wr.op) {
                (Some(data), _) => copy_atomic(data.as_ptr() as u64 + off as u64, remote, n),
                (None, Op::Read) => copy_atomic(remote, local, n),
                (None, _) => copy_atomic(local, remote, n),
            }
        }
        Ok(())
    }

    /// Retires finished WRs from the head of QP `qpn`'s send queue.
    fn retire(&mut self, qpn: u32, peer_qpn: u32) {
        loop {
            let Some(q) = self.qps.get(&qpn) else { return };
            let Some(head) = q.sq.front() else { return };
            if !head.checked || !head.left.is_empty() {
                return;
            }
            let wr = head.wr;
            if let Some(status) = head.error {
                if status == REM_ACCESS_ERR {
                    self.error_qp(peer_qpn);
                }
                return self.fail_head(qpn, status);
            }
            if let Op::WriteImm(_) = wr.op {
                if self.qps.get(&peer_qpn).is_none_or(|p| p.rq.is_empty()) {
                    return; // RNR: wait for the peer to post a receive
                }
            }
            let Some(q) = self.qps.get_mut(&qpn) else {
                return;
            };
            q.sq.pop_front();
            let (node, cq) = (q.node, q.cq);
            let slots = q.unsignaled_done + 1;
            if wr.signaled {
                q.unsignaled_done = 0;
            } else {
                q.unsignaled_done += 1;
            }
            self.log.push(OpRecord {
                node,
                qpn,
                op: wr.op,
                len: wr.local.map_or(0, |s| s.len as usize),
                remote_addr: wr.remote_addr,
            });
            if let Op::WriteImm(imm) = wr.op {
                let pick = match self.qps.get(&peer_qpn) {
                    // An out-of-order receive queue may hand any posted receive
                    // to an arriving message.
                    Some(p) if p.caps.ooo_rq && !p.rq.is_empty() => {
                        self.rng.random_range(0..p.rq.len())
                    }
                    _ => 0,
                };
                if let Some(p) = self.qps.get_mut(&peer_qpn) {
                    let recv_id = p.rq.remove(pick).unwrap_or(u64::MAX);
                    let pcq = p.cq;
                    let e = CqEntry {
                        c: completion(recv_id, 0, CompletionKind::RecvImm(imm), peer_qpn),
                        sq_slots: 0,
                        rq_slots: 1,
                    };
                    self.push_cq(pcq, e);
                }
            }
            if wr.signaled {
                let kind = if wr.op == Op::Read {
                    CompletionKind::Read
                } else {
                    CompletionKind::Write
                };
                let e = CqEntry {
                    c: completion(wr.wr_id, 0, kind, qpn),
                    sq_slots: slots,
                    rq_slots: 0,
                };
                self.push_cq(cq, e);
            }
        }
    }

    /// Marks every QP of `node` failed (device fatal).
    pub fn fail_node_qps(&mut self, node: u32) {
        let qpns: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, q)| q.node == node)
            .map(|(n, _)| *n)
            .collect();
        for qpn in qpns {
            self.error_qp(qpn);
        }
    }
}
