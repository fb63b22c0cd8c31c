//! `FakeNic`: an in-memory **test double** of an RDMA NIC. Compiled only for unit
//! tests (`#[cfg(test)]`); never part of the shipped plugin and never a transport.
//!
//! A [`FakeFabric`] holds registrations, QPs and CQs of any number of fake nodes in
//! one process. Posted work runs when some node polls a CQ (as if the NICs ran
//! meanwhile), one step per QP per round, in posting order per QP:
//! * RDMA WRITE / WRITE_WITH_IMM / READ copy between registered buffers after the
//!   same checks a NIC makes (lkey/rkey live, on the right node, range inside);
//! * with `bytes_per_step`, a write lands in pieces in increasing address order, so
//!   readers can observe a half-written CTS entry;
//! * WRITE_WITH_IMM consumes a posted receive at the peer (waits, like RNR retry,
//!   if none is posted) and completes it with the immediate;
//! * send-queue, receive-queue and CQ capacities are enforced (a CQ overrun is an
//!   error), and unsignaled WRs retire only with a later signaled one;
//! * errors: an injected status on a QP, a dead node (every op toward it ends in
//!   RETRY_EXC_ERR), a bad key (LOC_PROT_ERR / REM_ACCESS_ERR); the QP then enters the
//!   error state and flushes its remaining work with WR_FLUSH_ERR.
//!
//! Memory is copied with atomic stores/loads because the protocol reads its FIFO
//! with atomics while another thread may be polling.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cclkit_abi::{Error, Result};

use crate::nic::{Completion, CompletionKind, Link, Nic, Op, PortAddr, QpCaps, SendWr, WriteOrder};

/// `ibv_wc_status` values the fake produces.
pub const LOC_PROT_ERR: u32 = 4;
/// Flushed because the QP is in the error state.
pub const WR_FLUSH_ERR: u32 = 5;
/// Remote key or range invalid.
pub const REM_ACCESS_ERR: u32 = 10;
/// The peer never answered.
pub const RETRY_EXC_ERR: u32 = 12;

/// An operation that completed successfully (for assertions on splitting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpRecord {
    /// Node that posted it.
    pub node: u32,
    /// QP it ran on.
    pub qpn: u32,
    /// The operation.
    pub op: Op,
    /// Bytes moved.
    pub len: usize,
    /// Remote address.
    pub remote_addr: u64,
}

struct MrRec {
    node: u32,
    addr: usize,
    len: usize,
    order: WriteOrder,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum QpState {
    Init,
    Rts,
    Error,
}

struct Pending {
    wr: SendWr,
    done: usize,
}

struct QpRec {
    node: u32,
    cq: u32,
    caps: QpCaps,
    peer: Option<u32>,
    state: QpState,
    sq: VecDeque<Pending>,
    rq: VecDeque<u64>,
    /// Posted WRs whose send-queue slot is not yet retired.
    sq_used: usize,
    /// Completed unsignaled WRs waiting for a signaled one to retire them.
    sq_done_unsignaled: usize,
}

struct CqRec {
    depth: usize,
    entries: VecDeque<Completion>,
    overrun: bool,
}

#[derive(Default)]
struct Fabric {
    mrs: HashMap<u32, MrRec>,
    qps: BTreeMap<u32, QpRec>,
    cqs: HashMap<u32, CqRec>,
    next_id: u32,
    bytes_per_step: usize,
    dead: HashSet<u32>,
    inject: HashMap<u32, u32>,
    log: Vec<OpRecord>,
}

/// The shared in-memory "network" of fake NICs.
#[derive(Default)]
pub struct FakeFabric {
    inner: Mutex<Fabric>,
}

impl FakeFabric {
    /// An empty fabric.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, Fabric> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A NIC on node `node`.
    pub fn nic(self: &Arc<Self>, node: u32) -> Arc<FakeNic> {
        Arc::new(self.port(node))
    }

    /// A NIC on node `node`, by value.
    pub fn port(self: &Arc<Self>, node: u32) -> FakeNic {
        FakeNic {
            fabric: Arc::clone(self),
            node,
        }
    }

    /// Makes writes land `n` bytes per step (0 = whole operations).
    pub fn set_bytes_per_step(&self, n: usize) {
        self.lock().bytes_per_step = n;
    }

    /// The next operation executed on QP `qpn` fails with `status`.
    pub fn inject_error(&self, qpn: u32, status: u32) {
        self.lock().inject.insert(qpn, status);
    }

    /// Node `node` dies: it stops executing work and never answers again.
    pub fn kill_node(&self, node: u32) {
        self.lock().dead.insert(node);
    }

    /// Successful operations so far.
    pub fn log(&self) -> Vec<OpRecord> {
        self.lock().log.clone()
    }

    /// Live registrations.
    pub fn live_mrs(&self) -> usize {
        self.lock().mrs.len()
    }

    /// Live registrations of node `node` with write order `order`.
    pub fn mrs_of(&self, node: u32, order: WriteOrder) -> usize {
        self.lock()
            .mrs
            .values()
            .filter(|m| m.node == node && m.order == order)
            .count()
    }

    /// QP numbers of node `node`.
    pub fn qps_of(&self, node: u32) -> Vec<u32> {
        self.lock()
            .qps
            .iter()
            .filter(|(_, q)| q.node == node)
            .map(|(n, _)| *n)
            .collect()
    }
}

impl Fabric {
    fn id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    fn push_cq(&mut self, cq: u32, c: Completion) {
        if let Some(cq) = self.cqs.get_mut(&cq) {
            if cq.entries.len() >= cq.depth {
                cq.overrun = true;
            } else {
                cq.entries.push_back(c);
            }
        }
    }

    fn progress(&mut self) {
        let qpns: Vec<u32> = self.qps.keys().copied().collect();
        for qpn in qpns {
            self.step(qpn);
        }
    }

    /// Moves QP `qpn` to the error state and flushes its queues.
    fn error_qp(&mut self, qpn: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        q.state = QpState::Error;
        let cq = q.cq;
        let flushed: Vec<u64> = q.sq.drain(..).map(|p| p.wr.wr_id).collect();
        let recvs: Vec<u64> = q.rq.drain(..).collect();
        q.sq_used = 0;
        for wr_id in flushed.into_iter().chain(recvs) {
            self.push_cq(
                cq,
                completion(wr_id, WR_FLUSH_ERR, CompletionKind::Other(0), qpn),
            );
        }
    }

    fn fail_head(&mut self, qpn: u32, status: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let Some(p) = q.sq.pop_front() else { return };
        let cq = q.cq;
        self.push_cq(
            cq,
            completion(p.wr.wr_id, status, CompletionKind::Other(0), qpn),
        );
        self.error_qp(qpn);
    }

    fn step(&mut self, qpn: u32) {
        let bytes_per_step = self.bytes_per_step;
        let Some(q) = self.qps.get(&qpn) else { return };
        if q.state != QpState::Rts || self.dead.contains(&q.node) {
            return;
        }
        let Some(head) = q.sq.front() else { return };
        let (node, wr, done) = (q.node, head.wr, head.done);
        if let Some(status) = self.inject.remove(&qpn) {
            return self.fail_head(qpn, status);
        }
        let peer = q.peer.and_then(|p| self.qps.get(&p).map(|r| (p, r)));
        let Some((peer_qpn, peer_node, peer_ok, peer_has_recv)) =
            peer.map(|(p, r)| (p, r.node, r.state == QpState::Rts, !r.rq.is_empty()))
        else {
            return self.fail_head(qpn, RETRY_EXC_ERR);
        };
        if self.dead.contains(&peer_node) || !peer_ok {
            return self.fail_head(qpn, RETRY_EXC_ERR);
        }
        let len = wr.local.map_or(0, |s| s.len as usize);
        if done == 0 {
            if let Some(s) = wr.local {
                if !self.valid(s.lkey, node, s.addr, len) {
                    return self.fail_head(qpn, LOC_PROT_ERR);
                }
            }
            if len > 0 && !self.valid(wr.rkey, peer_node, wr.remote_addr, len) {
                self.fail_head(qpn, REM_ACCESS_ERR);
                return self.error_qp(peer_qpn);
            }
        }
        let local = wr.local.map_or(0, |s| s.addr);
        let n = if bytes_per_step == 0 {
            len - done
        } else {
            (len - done).min(bytes_per_step)
        };
        let last = done + n == len;
        if last && matches!(wr.op, Op::WriteImm(_)) && !peer_has_recv {
            return; // RNR: wait for the peer to post a receive.
        }
        // SAFETY: both ranges were checked against live registrations of the right
        // nodes, and registered memory stays allocated while registered (`reg_mr`'s
        // contract); the fabric lock serialises fake-NIC accesses.
        unsafe {
            match wr.op {
                Op::Write | Op::WriteImm(_) => {
                    copy(local + done as u64, wr.remote_addr + done as u64, n)
                }
                Op::Read => copy(wr.remote_addr + done as u64, local + done as u64, n),
            }
        }
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        if !last {
            if let Some(h) = q.sq.front_mut() {
                h.done += n;
            }
            return;
        }
        q.sq.pop_front();
        q.sq_done_unsignaled += 1;
        let cq = q.cq;
        if wr.signaled {
            q.sq_used = q.sq_used.saturating_sub(q.sq_done_unsignaled);
            q.sq_done_unsignaled = 0;
        }
        self.log.push(OpRecord {
            node,
            qpn,
            op: wr.op,
            len,
            remote_addr: wr.remote_addr,
        });
        if let Op::WriteImm(imm) = wr.op {
            if let Some(p) = self.qps.get_mut(&peer_qpn) {
                let recv_id = p.rq.pop_front().unwrap_or(u64::MAX);
                let pcq = p.cq;
                self.push_cq(
                    pcq,
                    completion(recv_id, 0, CompletionKind::RecvImm(imm), peer_qpn),
                );
            }
        }
        if wr.signaled {
            let kind = if wr.op == Op::Read {
                CompletionKind::Read
            } else {
                CompletionKind::Write
            };
            self.push_cq(cq, completion(wr.wr_id, 0, kind, qpn));
        }
    }

    fn valid(&self, key: u32, node: u32, addr: u64, len: usize) -> bool {
        self.mrs.get(&key).is_some_and(|m| {
            m.node == node
                && addr as usize >= m.addr
                && (addr as usize).saturating_add(len) <= m.addr + m.len
        })
    }
}

fn completion(wr_id: u64, status: u32, kind: CompletionKind, qp_num: u32) -> Completion {
    Completion {
        wr_id,
        status,
        kind,
        qp_num,
        vendor_err: 0,
    }
}

/// Copies `n` bytes with atomic accesses (8 bytes at a time when aligned).
///
/// # Safety
/// Both ranges must be valid, allocated memory.
unsafe fn copy(src: u64, dst: u64, n: usize) {
    let (src, dst) = (src as usize, dst as usize);
    if src % 8 == 0 && dst % 8 == 0 && n % 8 == 0 {
        for i in (0..n).step_by(8) {
            // SAFETY: in range and 8-aligned (caller contract, checked alignment).
            unsafe {
                let v = AtomicU64::from_ptr((src + i) as *mut u64).load(Ordering::Relaxed);
                AtomicU64::from_ptr((dst + i) as *mut u64).store(v, Ordering::Relaxed);
            }
        }
    } else {
        for i in 0..n {
            // SAFETY: in range (caller contract).
            unsafe {
                let v = AtomicU8::from_ptr((src + i) as *mut u8).load(Ordering::Relaxed);
                AtomicU8::from_ptr((dst + i) as *mut u8).store(v, Ordering::Relaxed);
            }
        }
    }
}

/// A fake NIC port on one node of a [`FakeFabric`].
pub struct FakeNic {
    fabric: Arc<FakeFabric>,
    node: u32,
}

/// A fake registration (key = lkey = rkey); unregistered on drop.
pub struct FakeMr {
    fabric: Arc<FakeFabric>,
    key: u32,
}

impl Drop for FakeMr {
    fn drop(&mut self) {
        self.fabric.lock().mrs.remove(&self.key);
    }
}

/// A fake CQ.
pub struct FakeCq {
    id: u32,
    fabric: Arc<FakeFabric>,
}

impl Drop for FakeCq {
    fn drop(&mut self) {
        self.fabric.lock().cqs.remove(&self.id);
    }
}

/// A fake RC QP.
pub struct FakeQp {
    qpn: u32,
    fabric: Arc<FakeFabric>,
}

impl Drop for FakeQp {
    fn drop(&mut self) {
        self.fabric.lock().qps.remove(&self.qpn);
    }
}

impl FakeNic {
    fn register(&self, addr: usize, len: usize, order: WriteOrder) -> FakeMr {
        let mut f = self.fabric.lock();
        let key = f.id();
        f.mrs.insert(
            key,
            MrRec {
                node: self.node,
                addr,
                len,
                order,
            },
        );
        FakeMr {
            fabric: Arc::clone(&self.fabric),
            key,
        }
    }
}

impl Nic for FakeNic {
    type Mr = FakeMr;
    type Cq = FakeCq;
    type Qp = FakeQp;

    fn port_addr(&self) -> PortAddr {
        let mut gid = [0u8; 16];
        gid[..4].copy_from_slice(&self.node.to_be_bytes());
        PortAddr {
            lid: self.node as u16,
            gid,
            link_layer: 1,
            mtu: 5,
        }
    }

    unsafe fn reg_mr(&self, addr: usize, len: usize, order: WriteOrder) -> Result<FakeMr> {
        Ok(self.register(addr, len, order))
    }

    fn reg_mr_dmabuf(&self, addr: usize, len: usize, _offset: u64, fd: i32) -> Result<FakeMr> {
        if fd < 0 {
            return Err(Error::system(format!("ibv_reg_dmabuf_mr: bad fd {fd}")));
        }
        Ok(self.register(addr, len, WriteOrder::Relaxed))
    }

    fn keys(mr: &FakeMr) -> (u32, u32) {
        (mr.key, mr.key)
    }

    fn dereg_mr(&self, mr: FakeMr) -> Result<()> {
        drop(mr);
        Ok(())
    }

    fn create_cq(&self, depth: u32) -> Result<FakeCq> {
        let mut f = self.fabric.lock();
        let id = f.id();
        f.cqs.insert(
            id,
            CqRec {
                depth: depth as usize,
                entries: VecDeque::new(),
                overrun: false,
            },
        );
        Ok(FakeCq {
            id,
            fabric: Arc::clone(&self.fabric),
        })
    }

    fn create_qp(&self, cq: &FakeCq, caps: QpCaps) -> Result<FakeQp> {
        let mut f = self.fabric.lock();
        let qpn = f.id();
        f.qps.insert(
            qpn,
            QpRec {
                node: self.node,
                cq: cq.id,
                caps,
                peer: None,
                state: QpState::Init,
                sq: VecDeque::new(),
                rq: VecDeque::new(),
                sq_used: 0,
                sq_done_unsignaled: 0,
            },
        );
        Ok(FakeQp {
            qpn,
            fabric: Arc::clone(&self.fabric),
        })
    }

    fn qp_num(qp: &FakeQp) -> u32 {
        qp.qpn
    }

    fn connect_qp(
        &self,
        qp: &mut FakeQp,
        remote: &PortAddr,
        remote_qpn: u32,
        _: Link,
    ) -> Result<()> {
        let mut f = self.fabric.lock();
        let node = u32::from_be_bytes([remote.gid[0], remote.gid[1], remote.gid[2], remote.gid[3]]);
        if f.qps.get(&remote_qpn).is_none_or(|r| r.node != node) {
            return Err(Error::system(format!(
                "ibv_modify_qp(RTR): no QP {remote_qpn} on node {node}"
            )));
        }
        let q = f
            .qps
            .get_mut(&qp.qpn)
            .ok_or_else(|| Error::system("ibv_modify_qp: QP destroyed"))?;
        q.peer = Some(remote_qpn);
        q.state = QpState::Rts;
        Ok(())
    }

    fn post_send(&self, qp: &mut FakeQp, wrs: &[SendWr]) -> Result<()> {
        let mut f = self.fabric.lock();
        let q = f
            .qps
            .get_mut(&qp.qpn)
            .ok_or_else(|| Error::system("ibv_post_send: QP destroyed"))?;
        match q.state {
            QpState::Init => return Err(Error::system("ibv_post_send: QP not connected (EINVAL)")),
            QpState::Error => {
                let cq = q.cq;
                for wr in wrs {
                    f.push_cq(
                        cq,
                        completion(wr.wr_id, WR_FLUSH_ERR, CompletionKind::Other(0), qp.qpn),
                    );
                }
                return Ok(());
            }
            QpState::Rts => {}
        }
        if q.sq_used + wrs.len() > q.caps.max_send_wr as usize {
            return Err(Error::system(format!(
                "ibv_post_send: send queue full ({} + {} > {}) (ENOMEM)",
                q.sq_used,
                wrs.len(),
                q.caps.max_send_wr
            )));
        }
        q.sq_used += wrs.len();
        q.sq.extend(wrs.iter().map(|&wr| Pending { wr, done: 0 }));
        Ok(())
    }

    fn post_recv(&self, qp: &mut FakeQp, wr_id: u64) -> Result<()> {
        let mut f = self.fabric.lock();
        let q = f
            .qps
            .get_mut(&qp.qpn)
            .ok_or_else(|| Error::system("ibv_post_recv: QP destroyed"))?;
        if q.rq.len() >= q.caps.max_recv_wr as usize {
            return Err(Error::system("ibv_post_recv: receive queue full (ENOMEM)"));
        }
        q.rq.push_back(wr_id);
        Ok(())
    }

    fn poll_cq(&self, cq: &mut FakeCq, out: &mut Vec<Completion>, max: usize) -> Result<()> {
        let mut f = self.fabric.lock();
        f.progress();
        let c = f
            .cqs
            .get_mut(&cq.id)
            .ok_or_else(|| Error::system("ibv_poll_cq: CQ destroyed"))?;
        if c.overrun {
            return Err(Error::system("ibv_poll_cq: CQ overrun"));
        }
        let n = c.entries.len().min(max);
        out.extend(c.entries.drain(..n));
        Ok(())
    }
}
