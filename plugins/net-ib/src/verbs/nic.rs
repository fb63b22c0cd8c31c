//! [`Nic`] over libibverbs: one HCA port with its protection domain.

use std::ffi::c_int;
use std::sync::Arc;

use cclkit_abi::{Error, Result, nccl_warn};

use super::events::Monitor;
use super::safe::{Context, Cq, Mr, Pd, Qp};
use super::sys::*;
use crate::config::Config;
use crate::fatal::FatalState;
use crate::nic::{
    Completion, CompletionKind, Ece, Link, Nic, Op, PortAddr, QpCaps, SendWr, WriteOrder,
};
use crate::route::{LocalPort, address_vector};

/// What discovery hands to [`VerbsNic::new`] for one active port.
pub struct VerbsPort {
    /// The device context.
    pub ctx: Context,
    /// Its protection domain (shared by the device's ports).
    pub pd: Pd,
    /// Port number.
    pub port: u8,
    /// `mlx5_0:1`, for logs.
    pub name: String,
    /// Our address and GID index.
    pub local: LocalPort,
    /// Adaptive routing (`NCCL_IB_ADAPTIVE_ROUTING`, default on for IB).
    pub ar: bool,
    /// Fatal async events of the device.
    pub fatal: Arc<FatalState>,
    /// The device's async-event monitor (kept alive by its NICs).
    pub monitor: Arc<Monitor>,
}

/// One active port of an HCA.
pub struct VerbsNic {
    p: VerbsPort,
    timeout: u8,
    retry_cnt: u8,
    pkey_index: u16,
    access: c_int,
    max_qp_wr: u32,
    max_cqe: u32,
}

/// A CQ that forgets its fatal state when destroyed (its address may be reused).
pub struct VerbsCq {
    cq: Cq,
    fatal: Arc<FatalState>,
}

impl Drop for VerbsCq {
    fn drop(&mut self) {
        self.fatal.forget_cq(self.cq.as_raw() as usize);
    }
}

impl VerbsNic {
    /// A NIC for one port, after discovery chose its GID.
    pub fn new(p: VerbsPort, dattr: &ibv_device_attr, cfg: &Config) -> Result<Self> {
        let mut access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        // Relaxed ordering lets PCIe reorder the NIC's writes (faster with GPUs behind
        // switches); 2 = "when the library can pass the flag", as NCCL.
        let ro = match cfg.relaxed_ordering {
            1 => true,
            2 => p.ctx.verbs().reg_mr_iova2.is_some(),
            _ => false,
        };
        if ro {
            access |= IBV_ACCESS_RELAXED_ORDERING;
        }
        let needed = crate::proto::DATA_QP_CAPS.max_send_wr;
        let max_qp_wr = u32::try_from(dattr.max_qp_wr).unwrap_or(0);
        if max_qp_wr < needed {
            return Err(Error::system(format!(
                "device allows {max_qp_wr} work requests per QP; cclkit-ib needs {needed}"
            )));
        }
        Ok(Self {
            p,
            timeout: cfg.timeout,
            retry_cnt: cfg.retry_cnt,
            pkey_index: cfg.pkey_index,
            access,
            max_qp_wr,
            max_cqe: u32::try_from(dattr.max_cqe).unwrap_or(0),
        })
    }

    /// NCCL's `ncclIbQpRtr`, with the address vector of [`address_vector`].
    fn to_rtr(&self, qp: &mut Qp, remote: &PortAddr, remote_qpn: u32, link: Link) -> Result<()> {
        let (av, warning) = address_vector(&self.p.local, remote, link);
        if let Some(w) = warning {
            nccl_warn!("{w}");
        }
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: u32::from(av.path_mtu),
            dest_qp_num: remote_qpn,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: ibv_gid { raw: av.dgid },
                    flow_label: 0,
                    sgid_index: av.sgid_index,
                    hop_limit: av.hop_limit,
                    traffic_class: av.traffic_class,
                },
                dlid: av.dlid,
                sl: av.sl,
                src_path_bits: 0,
                static_rate: 0,
                is_global: u8::from(av.is_global),
                port_num: self.p.port,
            },
            ..Default::default()
        };
        qp.modify(
            &mut attr,
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
        )
        .map_err(|e| Error::from(e).context("QP INIT→RTR"))
    }

    fn to_rts(&self, qp: &mut Qp) -> Result<()> {
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: 1,
            ..Default::default()
        };
        qp.modify(
            &mut attr,
            IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC,
        )
        .map_err(|e| Error::from(e).context("QP RTR→RTS"))
    }
}

/// Work requests posted per `ibv_post_send` call (chains are built on the stack).
const CHAIN: usize = 16;

impl Nic for VerbsNic {
    type Mr = Mr;
    type Cq = VerbsCq;
    type Qp = Qp;

    fn port_addr(&self) -> PortAddr {
        self.p.local.addr
    }

    fn adaptive_routing(&self) -> bool {
        self.p.ar
    }

    unsafe fn reg_mr(&self, addr: usize, len: usize, order: WriteOrder) -> Result<Mr> {
        let access = match order {
            WriteOrder::Relaxed => self.access,
            WriteOrder::Strict => self.access & !IBV_ACCESS_RELAXED_ORDERING,
        };
        // SAFETY: forwarded contract (memory outlives the registration).
        match unsafe { self.p.pd.reg_mr(addr, len, access) } {
            Ok(mr) => Ok(mr),
            // Some kernels reject relaxed ordering for some memory: retry without.
            Err(_) if access & IBV_ACCESS_RELAXED_ORDERING != 0 => {
                let plain = access & !IBV_ACCESS_RELAXED_ORDERING;
                // SAFETY: as above.
                Ok(unsafe { self.p.pd.reg_mr(addr, len, plain) }?)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn reg_mr_dmabuf(&self, addr: usize, len: usize, offset: u64, fd: i32) -> Result<Mr> {
        Ok(self
            .p
            .pd
            .reg_dmabuf_mr(offset, len, addr as u64, fd, self.access)?)
    }

    fn keys(mr: &Mr) -> (u32, u32) {
        (mr.lkey(), mr.rkey())
    }

    fn dereg_mr(&self, mr: Mr) -> Result<()> {
        Ok(mr.dereg()?)
    }

    fn create_cq(&self, depth: u32) -> Result<VerbsCq> {
        let depth = depth.min(self.max_cqe.max(1));
        Ok(VerbsCq {
            cq: self.p.ctx.create_cq(depth as c_int)?,
            fatal: Arc::clone(&self.p.fatal),
        })
    }

    fn create_qp(&self, cq: &VerbsCq, caps: QpCaps) -> Result<Qp> {
        if caps.ooo_rq {
            // ooo_rq_size() is None here, so connection setup never asks for it.
            return Err(Error::internal(
                "NET/cclkit-ib: an out-of-order receive queue needs mlx5dv_create_qp, \
                 which cclkit-ib does not bind",
            ));
        }
        let cap = ibv_qp_cap {
            max_send_wr: caps.max_send_wr.min(self.max_qp_wr),
            max_recv_wr: caps.max_recv_wr.min(self.max_qp_wr),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: caps.max_inline,
        };
        let mut qp = self.p.pd.create_rc_qp(&cq.cq, cap)?;
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            pkey_index: self.pkey_index,
            port_num: self.p.port,
            qp_access_flags: caps.access,
            ..Default::default()
        };
        qp.modify(
            &mut attr,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        )
        .map_err(|e| Error::from(e).context("QP RESET→INIT"))?;
        Ok(qp)
    }

    fn qp_num(qp: &Qp) -> u32 {
        qp.num()
    }

    fn connect_qp(
        &self,
        qp: &mut Qp,
        remote: &PortAddr,
        remote_qpn: u32,
        link: Link,
    ) -> Result<()> {
        self.to_rtr(qp, remote, remote_qpn, link)?;
        self.to_rts(qp)
    }

    fn post_send(&self, qp: &mut Qp, wrs: &[SendWr]) -> Result<()> {
        for part in wrs.chunks(CHAIN) {
            let mut sges = [ibv_sge::default(); CHAIN];
            // SAFETY: all-zero is a valid `ibv_send_wr` (NULL pointers, zero fields).
            let mut chain: [ibv_send_wr; CHAIN] = unsafe { std::mem::zeroed() };
            for (i, wr) in part.iter().enumerate() {
                let (opcode, imm) = match wr.op {
                    Op::Write => (IBV_WR_RDMA_WRITE, 0),
                    Op::WriteImm(imm) => (IBV_WR_RDMA_WRITE_WITH_IMM, imm.to_be()),
                    Op::Read => (IBV_WR_RDMA_READ, 0),
                };
                let c = &mut chain[i];
                c.wr_id = wr.wr_id;
                c.opcode = opcode;
                c.imm_data = imm;
                c.send_flags = if wr.signaled { IBV_SEND_SIGNALED } else { 0 }
                    | if wr.inline { IBV_SEND_INLINE } else { 0 };
                c.rdma.remote_addr = wr.remote_addr;
                c.rdma.rkey = wr.rkey;
                if let Some(s) = wr.local {
                    sges[i] = ibv_sge {
                        addr: s.addr,
                        length: s.len,
                        lkey: s.lkey,
                    };
                    c.num_sge = 1;
                }
            }
            let base = chain.as_mut_ptr();
            for i in 0..part.len() {
                // SAFETY: indices are below CHAIN; the pointers stay valid for the call.
                unsafe {
                    let c = base.add(i);
                    if (*c).num_sge == 1 {
                        (*c).sg_list = sges.as_mut_ptr().add(i);
                    }
                    if i + 1 < part.len() {
                        (*c).next = base.add(i + 1);
                    }
                }
            }
            // SAFETY: a well-formed chain over stack arrays that outlive the call;
            // the SGEs name registered memory (the protocol's contract) and the NIC
            // validates every key and range.
            unsafe { qp.post_send(base) }?;
        }
        Ok(())
    }

    fn post_recv(&self, qp: &mut Qp, wr_id: u64) -> Result<()> {
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        // SAFETY: a single zero-length receive, valid for the call.
        Ok(unsafe { qp.post_recv(&mut wr) }?)
    }

    fn poll_cq(&self, cq: &mut VerbsCq, out: &mut Vec<Completion>, max: usize) -> Result<()> {
        let mut wcs = [ibv_wc::default(); 64];
        let n = cq.cq.poll(&mut wcs[..max.clamp(1, 64)])?;
        out.extend(wcs[..n].iter().map(|wc| Completion {
            wr_id: wc.wr_id,
            status: wc.status,
            kind: match wc.opcode {
                _ if wc.status != IBV_WC_SUCCESS => CompletionKind::Other(wc.opcode),
                IBV_WC_RDMA_WRITE => CompletionKind::Write,
                IBV_WC_RDMA_READ => CompletionKind::Read,
                IBV_WC_RECV_RDMA_WITH_IMM => CompletionKind::RecvImm(u32::from_be(wc.imm_data)),
                other => CompletionKind::Other(other),
            },
            qp_num: wc.qp_num,
            vendor_err: wc.vendor_err,
        }));
        Ok(())
    }

    fn query_ece(&self, qp: &Qp) -> Result<Option<Ece>> {
        let Some(query) = self.p.ctx.verbs().query_ece else {
            return Ok(None);
        };
        let mut e = ibv_ece::default();
        // SAFETY: live QP, valid out-pointer.
        let r = unsafe { query(qp.as_raw(), &mut e) };
        match r {
            0 => Ok(Some(Ece {
                vendor_id: e.vendor_id,
                options: e.options,
                comp_mask: e.comp_mask,
            })),
            // NCCL's wrap_ibv_query_ece: EOPNOTSUPP means "not supported", not an error.
            r if r == libc::EOPNOTSUPP || r == -libc::EOPNOTSUPP => Ok(None),
            r => Err(Error::system(format!(
                "ibv_query_ece: {}",
                std::io::Error::from_raw_os_error(r.abs())
            ))),
        }
    }

    fn set_ece(&self, qp: &mut Qp, ece: &Ece) -> Result<bool> {
        let Some(set) = self.p.ctx.verbs().set_ece else {
            return Ok(false);
        };
        let mut e = ibv_ece {
            vendor_id: ece.vendor_id,
            options: ece.options,
            comp_mask: ece.comp_mask,
        };
        // SAFETY: live QP in INIT state, valid pointer.
        let r = unsafe { set(qp.as_raw(), &mut e) };
        match r {
            0 => Ok(true),
            r if r == libc::EOPNOTSUPP || r == -libc::EOPNOTSUPP => Ok(false),
            r => Err(Error::system(format!(
                "ibv_set_ece: {}",
                std::io::Error::from_raw_os_error(r.abs())
            ))),
        }
    }

    fn check_fatal(&self, cq: &VerbsCq) -> Result<()> {
        self.p
            .fatal
            .check(cq.cq.as_raw() as usize)
            .map_err(|e| e.context(&self.p.name))
    }
}
