//! The [`Nic`] implementation of the fake NIC: the verbs checks made at call time.

use std::collections::VecDeque;
use std::sync::Arc;

use cclkit_abi::{Error, Result};

use super::engine::{CqEntry, CqRec, Pending, QpRec, QpState, completion};
use super::{FakeFabric, WR_FLUSH_ERR, drain_cq, register};
use crate::nic::{
    ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, Completion, CompletionKind, Ece,
    Link, Nic, PortAddr, QpCaps, SendWr, WriteOrder,
};
use crate::route::{LINK_ETHERNET, LocalPort, address_vector, flid, local_subnet};

const FULL_ACCESS: u32 = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;

/// A fake NIC port on one node of a [`FakeFabric`].
pub struct FakeNic {
    fabric: Arc<FakeFabric>,
    node: u32,
}

/// A fake registration with distinct lkey and rkey; unregistered on drop.
pub struct FakeMr {
    fabric: Arc<FakeFabric>,
    id: u32,
    lkey: u32,
    rkey: u32,
}

impl Drop for FakeMr {
    fn drop(&mut self) {
        self.fabric.lock().mrs.remove(&self.id);
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
    pub(super) fn new(fabric: Arc<FakeFabric>, node: u32) -> Self {
        Self { fabric, node }
    }

    /// Registers with explicit `IBV_ACCESS_*` flags (tests of access checks).
    ///
    /// # Safety
    /// As [`Nic::reg_mr`].
    pub unsafe fn reg_mr_access(&self, addr: usize, len: usize, access: u32) -> FakeMr {
        let mut f = self.fabric.lock();
        let (id, lkey, rkey) = register(&mut f, self.node, addr, len, WriteOrder::Relaxed, access);
        FakeMr {
            fabric: Arc::clone(&self.fabric),
            id,
            lkey,
            rkey,
        }
    }

    fn local(&self) -> LocalPort {
        LocalPort {
            addr: self.port_addr(),
            gid_index: 0,
            grh_required: self.fabric.node_cfg(self.node).grh_required,
        }
    }
}

fn einval(call: &str, why: String) -> Error {
    Error::system(format!("{call}: {why} (EINVAL)"))
}

impl Nic for FakeNic {
    type Mr = FakeMr;
    type Cq = FakeCq;
    type Qp = FakeQp;

    fn port_addr(&self) -> PortAddr {
        port_addr_of(&self.fabric.lock(), self.node)
    }

    fn adaptive_routing(&self) -> bool {
        self.fabric.node_cfg(self.node).ar
    }

    fn ooo_rq_size(&self) -> Option<u32> {
        self.fabric.node_cfg(self.node).ooo_rq
    }

    unsafe fn reg_mr(&self, addr: usize, len: usize, order: WriteOrder) -> Result<FakeMr> {
        let mut f = self.fabric.lock();
        let (id, lkey, rkey) = register(&mut f, self.node, addr, len, order, FULL_ACCESS);
        Ok(FakeMr {
            fabric: Arc::clone(&self.fabric),
            id,
            lkey,
            rkey,
        })
    }

    fn reg_mr_dmabuf(&self, addr: usize, len: usize, _offset: u64, fd: i32) -> Result<FakeMr> {
        if fd < 0 {
            return Err(Error::system(format!("ibv_reg_dmabuf_mr: bad fd {fd}")));
        }
        // SAFETY: a dma-buf keeps its pages itself; tests pass live memory anyway.
        unsafe { self.reg_mr(addr, len, WriteOrder::Relaxed) }
    }

    fn keys(mr: &FakeMr) -> (u32, u32) {
        (mr.lkey, mr.rkey)
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
                node: self.node,
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
        if f.cqs.get(&cq.id).is_none_or(|c| c.node != self.node) {
            return Err(einval("ibv_create_qp", "CQ of another device".into()));
        }
        let cfg = f.node(self.node).cfg;
        if caps.ooo_rq && cfg.ooo_rq.is_none_or(|n| n < caps.max_recv_wr) {
            // What mlx5dv_create_qp does with MLX5DV_QP_CREATE_OOO_DP on a device
            // without (large enough) OOO receive queues.
            return Err(einval(
                "mlx5dv_create_qp",
                format!(
                    "OOO_DP: device supports {:?} out-of-order receives, {} asked",
                    cfg.ooo_rq, caps.max_recv_wr
                ),
            ));
        }
        let ece = cfg.ece;
        let qpn = f.id();
        f.qps.insert(
            qpn,
            QpRec {
                node: self.node,
                cq: cq.id,
                caps,
                peer: None,
                av: None,
                reachable: false,
                state: QpState::Init,
                sq: VecDeque::new(),
                rq: VecDeque::new(),
                sq_used: 0,
                rq_used: 0,
                unsignaled_done: 0,
                stalled_since: None,
                ece,
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
        link: Link,
    ) -> Result<()> {
        let local = self.local();
        let (av, _) = address_vector(&local, remote, link);
        let mut f = self.fabric.lock();
        // Where the address vector actually leads: RoCE and global IB by GID; IB
        // without GRH only inside our subnet, by LID; across subnets the DLID must
        // be the destination's FLID.
        let target = f.nodes.keys().copied().find(|&n| {
            let addr = port_addr_of(&f, n);
            let same_subnet = local_subnet(&addr.gid) == local_subnet(&local.addr.gid);
            if addr.link_layer == LINK_ETHERNET {
                av.is_global && av.dgid == addr.gid
            } else if same_subnet {
                av.dlid == addr.lid && (!av.is_global || av.dgid == addr.gid)
            } else {
                av.is_global && av.dgid == addr.gid && av.dlid == flid(&addr.gid)
            }
        });
        let q = f
            .qps
            .get_mut(&qp.qpn)
            .ok_or_else(|| Error::system("ibv_modify_qp: QP destroyed"))?;
        if q.state != QpState::Init {
            return Err(einval(
                "ibv_modify_qp(RTR)",
                format!("invalid transition {:?} → RTR", q.state),
            ));
        }
        if av.path_mtu > local.addr.mtu {
            return Err(einval(
                "ibv_modify_qp(RTR)",
                format!(
                    "path MTU {} above the port's {}",
                    av.path_mtu, local.addr.mtu
                ),
            ));
        }
        if remote.link_layer == LINK_ETHERNET && !av.is_global {
            return Err(einval("ibv_modify_qp(RTR)", "RoCE without GRH".into()));
        }
        q.av = Some(av);
        q.peer = Some(remote_qpn);
        q.state = QpState::Rtr;
        let owner = f.qps.get(&remote_qpn).map(|r| (r.node, r.caps));
        let mtu_ok = target.is_some_and(|n| av.path_mtu <= port_addr_of(&f, n).mtu);
        let reachable = matches!((owner, target), (Some((o, _)), Some(t)) if o == t) && mtu_ok;
        if let Some(q) = f.qps.get_mut(&qp.qpn) {
            q.reachable = reachable;
            q.state = QpState::Rts;
        }
        Ok(())
    }

    fn post_send(&self, qp: &mut FakeQp, wrs: &[SendWr]) -> Result<()> {
        let mut f = self.fabric.lock();
        let q = f
            .qps
            .get_mut(&qp.qpn)
            .ok_or_else(|| Error::system("ibv_post_send: QP destroyed"))?;
        match q.state {
            QpState::Init | QpState::Rtr => {
                return Err(einval(
                    "ibv_post_send",
                    format!("QP {:#x} is in {:?}, not RTS", qp.qpn, q.state),
                ));
            }
            QpState::Error => {
                let cq = q.cq;
                q.sq_used += wrs.len();
                for wr in wrs {
                    let e = CqEntry {
                        c: completion(wr.wr_id, WR_FLUSH_ERR, CompletionKind::Other(0), qp.qpn),
                        sq_slots: 1,
                        rq_slots: 0,
                    };
                    f.push_cq(cq, e);
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
        let mut pend = Vec::with_capacity(wrs.len());
        for wr in wrs {
            let inline = match (wr.inline, wr.local) {
                (true, Some(s)) if s.len > q.caps.max_inline => {
                    return Err(einval(
                        "ibv_post_send",
                        format!("{} inline bytes, QP allows {}", s.len, q.caps.max_inline),
                    ));
                }
                (true, Some(s)) => {
                    let mut v = vec![0u8; s.len as usize];
                    // SAFETY: inline data is read at post time, from the caller's
                    // buffer, which the protocol keeps valid for the call.
                    unsafe { super::copy_atomic(s.addr, v.as_mut_ptr() as u64, v.len()) };
                    Some(v)
                }
                _ => None,
            };
            pend.push(Pending {
                wr: *wr,
                left: Vec::new(),
                inline,
                checked: false,
                error: None,
            });
        }
        q.sq_used += wrs.len();
        q.sq.extend(pend);
        Ok(())
    }

    fn post_recv(&self, qp: &mut FakeQp, wr_id: u64) -> Result<()> {
        let mut f = self.fabric.lock();
        let q = f
            .qps
            .get_mut(&qp.qpn)
            .ok_or_else(|| Error::system("ibv_post_recv: QP destroyed"))?;
        if q.rq_used >= q.caps.max_recv_wr as usize {
            return Err(Error::system("ibv_post_recv: receive queue full (ENOMEM)"));
        }
        q.rq_used += 1;
        if q.state == QpState::Error {
            let cq = q.cq;
            let e = CqEntry {
                c: completion(wr_id, WR_FLUSH_ERR, CompletionKind::Other(0), qp.qpn),
                sq_slots: 0,
                rq_slots: 1,
            };
            f.push_cq(cq, e);
        } else {
            q.rq.push_back(wr_id);
        }
        Ok(())
    }

    fn poll_cq(&self, cq: &mut FakeCq, out: &mut Vec<Completion>, max: usize) -> Result<()> {
        let mut f = self.fabric.lock();
        f.progress();
        drain_cq(&mut f, cq.id, out, max)
    }

    fn query_ece(&self, qp: &FakeQp) -> Result<Option<Ece>> {
        let f = self.fabric.lock();
        Ok(f.qps.get(&qp.qpn).and_then(|q| q.ece))
    }

    fn set_ece(&self, qp: &mut FakeQp, ece: &Ece) -> Result<bool> {
        let mut f = self.fabric.lock();
        let dev = f.node(self.node).cfg.ece;
        let q = f
            .qps
            .get_mut(&qp.qpn)
            .ok_or_else(|| Error::system("ibv_set_ece: QP destroyed"))?;
        if q.state != QpState::Init {
            return Err(einval(
                "ibv_set_ece",
                format!("QP in {:?}, not INIT", q.state),
            ));
        }
        let Some(dev) = dev else {
            return Ok(false);
        };
        if dev.vendor_id != ece.vendor_id {
            return Err(einval("ibv_set_ece", "another vendor's ECE".into()));
        }
        // The device accepts the options both sides know.
        q.ece = Some(Ece {
            vendor_id: dev.vendor_id,
            options: dev.options & ece.options,
            comp_mask: dev.comp_mask & ece.comp_mask,
        });
        Ok(true)
    }

    fn check_fatal(&self, cq: &FakeCq) -> Result<()> {
        let fatal = self.fabric.fatal_state(self.node);
        fatal.check(cq.id as usize)
    }
}

/// A node's port address without building a NIC (the fabric is locked).
fn port_addr_of(f: &super::engine::Fabric, node: u32) -> PortAddr {
    let cfg = f.nodes.get(&node).map(|n| n.cfg).unwrap_or_default();
    let mut gid = [0u8; 16];
    if cfg.link_layer == LINK_ETHERNET {
        gid[10] = 0xff;
        gid[11] = 0xff;
    } else {
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[4..6].copy_from_slice(&cfg.flid.to_be_bytes());
        gid[6..8].copy_from_slice(&cfg.subnet.to_be_bytes());
    }
    gid[12..].copy_from_slice(&node.to_be_bytes());
    PortAddr {
        lid: node as u16,
        gid,
        link_layer: cfg.link_layer,
        mtu: cfg.mtu,
    }
}
