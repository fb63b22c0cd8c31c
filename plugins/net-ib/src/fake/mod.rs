//! `FakeNic`: an in-memory **test double** of an RDMA NIC, strict enough to catch
//! what real verbs would reject. Compiled only for unit tests (`#[cfg(test)]`);
//! never part of the shipped plugin and never a transport.
//!
//! A [`FakeFabric`] holds registrations, QPs and CQs of any number of fake nodes in
//! one process; posted work runs when some node polls a CQ (as if the NICs ran
//! meanwhile). What it enforces, like hardware:
//! * a QP state machine (INIT → RTR → RTS, error): posting sends before RTS,
//!   connecting twice, setting ECE after INIT, a path MTU above the port's: EINVAL;
//! * the address vector from [`crate::route`]: RoCE needs a GRH, IB across subnets
//!   needs a GRH and the peer's FLID as DLID; a wrong one is not rejected at RTR
//!   but never reaches the peer (retries, then RETRY_EXC_ERR);
//! * distinct lkey and rkey per registration, registration and QP access flags;
//! * queue slots returned only when completions are polled; CQ capacity, whose
//!   overrun is an asynchronous CQ error (not a poll error);
//! * reordering within verbs' rules (see `engine`), retry timeouts, and injected
//!   asynchronous events (port down/up, CQ error, QP fatal, device fatal).
//!
//! Memory is copied with atomic stores/loads because the protocol reads its FIFO
//! with atomics while another thread may be polling.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cclkit_abi::{Error, Result};

use crate::fatal::FatalState;
use crate::nic::{Completion, Ece, Op, WriteOrder};
use crate::route::{AddressVector, LINK_INFINIBAND};

mod engine;
mod nic;
#[cfg(test)]
mod ooo_tests;
#[cfg(test)]
mod tests;

pub use engine::QpState;
use engine::{Fabric, MrRec};
pub use nic::{FakeCq, FakeMr, FakeNic, FakeQp};

/// `ibv_wc_status` values the fake produces.
pub const LOC_PROT_ERR: u32 = 4;
/// Flushed because the QP is in the error state.
pub const WR_FLUSH_ERR: u32 = 5;
/// Remote key, range or access flags invalid.
pub const REM_ACCESS_ERR: u32 = 10;
/// The peer never answered within the retry timeout.
pub const RETRY_EXC_ERR: u32 = 12;

/// An operation that completed successfully (for assertions on work-request shapes).
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

/// A fake node's port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCfg {
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// Low 16 bits of the IB subnet prefix (GID bytes 6..8).
    pub subnet: u16,
    /// FLID (GID bytes 4..6); 0 = none.
    pub flid: u16,
    /// Active MTU (`ibv_mtu`).
    pub mtu: u8,
    /// The device's ECE, `None` = no ECE support.
    pub ece: Option<Ece>,
    /// Adaptive routing on the port.
    pub ar: bool,
    /// `IBV_QPF_GRH_REQUIRED`.
    pub grh_required: bool,
    /// Out-of-order receive queues: `None` = a provider without them (what the
    /// verbs NIC reports), `Some(n)` = an mlx5-like device whose OOO receive queues
    /// hold up to `n` receives (0 = none).
    pub ooo_rq: Option<u32>,
}

impl Default for NodeCfg {
    fn default() -> Self {
        Self {
            link_layer: LINK_INFINIBAND,
            subnet: 1,
            flid: 0,
            mtu: 5,
            ece: None,
            ar: false,
            grh_required: false,
            ooo_rq: None,
        }
    }
}

/// An asynchronous event to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeEvent {
    /// `IBV_EVENT_PORT_ERR`: the port stops passing traffic (non-fatal in NCCL).
    PortDown,
    /// `IBV_EVENT_PORT_ACTIVE`.
    PortUp,
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal,
    /// `IBV_EVENT_QP_FATAL` on a QP.
    QpFatal(u32),
}

/// What a test may inspect about a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// Node owning it.
    pub node: u32,
    /// State.
    pub state: QpState,
    /// The address vector given at RTR.
    pub av: Option<AddressVector>,
    /// Its ECE.
    pub ece: Option<Ece>,
    /// `qp_access_flags`.
    pub access: u32,
    /// Created with an out-of-order receive queue.
    pub ooo_rq: bool,
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
        self.lock().node(node);
        FakeNic::new(Arc::clone(self), node)
    }

    /// Configures node `node`'s port (before its NIC connects anything).
    pub fn configure(&self, node: u32, cfg: NodeCfg) {
        self.lock().node(node).cfg = cfg;
    }

    /// Node `node`'s port configuration.
    pub fn node_cfg(&self, node: u32) -> NodeCfg {
        self.lock().node(node).cfg
    }

    /// The fatal-event state of node `node`'s device.
    pub fn fatal_state(&self, node: u32) -> Arc<FatalState> {
        Arc::clone(&self.lock().node(node).fatal)
    }

    /// Makes writes land `n` bytes per step (0 = whole operations).
    pub fn set_bytes_per_step(&self, n: usize) {
        self.lock().bytes_per_step = n;
    }

    /// How long a QP retries an unreachable peer before RETRY_EXC_ERR
    /// (`NCCL_IB_TIMEOUT` × `NCCL_IB_RETRY_CNT` on hardware).
    pub fn set_retry_timeout(&self, t: Duration) {
        self.lock().retry_timeout = t;
    }

    /// The next operation executed on QP `qpn` fails with `status`.
    pub fn inject_error(&self, qpn: u32, status: u32) {
        self.lock().inject.insert(qpn, status);
    }

    /// Node `node` dies: it stops executing work and never answers again.
    pub fn kill_node(&self, node: u32) {
        self.lock().node(node).dead = true;
    }

    /// Delivers an asynchronous event on node `node`, as the device would.
    pub fn inject_async(&self, node: u32, ev: FakeEvent) {
        let mut f = self.lock();
        let fatal = Arc::clone(&f.node(node).fatal);
        let name = format!("fake{node}:1");
        match ev {
            FakeEvent::PortDown => {
                f.node(node).port_down = true;
                fatal.record(&name, crate::verbs::sys::IBV_EVENT_PORT_ERR, None);
            }
            FakeEvent::PortUp => {
                f.node(node).port_down = false;
                fatal.record(&name, crate::verbs::sys::IBV_EVENT_PORT_ACTIVE, None);
            }
            FakeEvent::DeviceFatal => {
                fatal.record(&name, crate::verbs::sys::IBV_EVENT_DEVICE_FATAL, None);
                f.fail_node_qps(node);
            }
            FakeEvent::QpFatal(qpn) => {
                let cq = f.qps.get(&qpn).map(|q| q.cq as usize);
                fatal.record(&name, crate::verbs::sys::IBV_EVENT_QP_FATAL, cq);
                f.error_qp(qpn);
            }
        }
    }

    /// Runs the NICs for `rounds` rounds without polling any CQ.
    pub fn run(&self, rounds: usize) {
        let mut f = self.lock();
        for _ in 0..rounds {
            f.progress();
        }
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

    /// A QP's state, address vector, ECE and access flags.
    pub fn qp_info(&self, qpn: u32) -> Option<QpInfo> {
        self.lock().qps.get(&qpn).map(|q| QpInfo {
            node: q.node,
            state: q.state,
            av: q.av,
            ece: q.ece,
            access: q.caps.access,
            ooo_rq: q.caps.ooo_rq,
        })
    }
}

/// Copies `n` bytes with atomic accesses (8 bytes at a time when aligned).
///
/// # Safety
/// Both ranges must be valid, allocated memory.
pub(crate) unsafe fn copy_atomic(src: u64, dst: u64, n: usize) {
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

/// Drains up to `max` entries of CQ `cq`, returning their queue slots.
fn drain_cq(f: &mut Fabric, cq: u32, out: &mut Vec<Completion>, max: usize) -> Result<()> {
    let c = f
        .cqs
        .get_mut(&cq)
        .ok_or_else(|| Error::system("ibv_poll_cq: CQ destroyed"))?;
    let n = c.entries.len().min(max);
    let taken: VecDeque<_> = c.entries.drain(..n).collect();
    for e in taken {
        if let Some(q) = f.qps.get_mut(&e.c.qp_num) {
            q.sq_used = q.sq_used.saturating_sub(e.sq_slots);
            q.rq_used = q.rq_used.saturating_sub(e.rq_slots);
        }
        out.push(e.c);
    }
    Ok(())
}

/// Registers `[addr, addr+len)` for `node` with `access` flags.
fn register(
    f: &mut Fabric,
    node: u32,
    addr: usize,
    len: usize,
    order: WriteOrder,
    access: u32,
) -> (u32, u32, u32) {
    let id = f.id();
    // Distinct keys, as hardware gives: mixing them up must fail.
    let (lkey, rkey) = (id << 8 | 0x11, id << 8 | 0x77);
    f.mrs.insert(
        id,
        MrRec {
            node,
            addr,
            len,
            order,
            access,
            lkey,
            rkey,
        },
    );
    (id, lkey, rkey)
}
