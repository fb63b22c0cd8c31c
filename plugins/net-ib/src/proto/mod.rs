//! The receiver-driven data path, written once over the [`Nic`] trait.
//!
//! Per connection (NCCL_ABI.md §5.2 describes NCCL's own IB transport; this follows
//! its ideas, not its code):
//!
//! 1. `irecv` posts one receive on each QP the message will use (one QP, round-robin,
//!    by default; all with `NCCL_IB_SPLIT_DATA_ON_QPS=1`), fills one
//!    [`fifo::FifoElem`] per buffer (address, size, rkey, tag, count, sequence
//!    number) and RDMA-writes them into the sender's FIFO slot.
//! 2. `isend` reads its next FIFO slot; until the receiver's entries are there it
//!    returns no request (NCCL retries). It takes the entry whose tag matches, and
//!    once every buffer of a grouped receive has its send, posts the work requests
//!    [`plan`] lays out (data writes, then one WRITE_WITH_IMM per QP used, see
//!    [`imm`]), as soon as those QPs have send-queue credit.
//! 3. The receive completes when every used QP's immediate has arrived; the send when
//!    every used QP's signaled write has completed.
//!
//! Fatal asynchronous events ([`crate::fatal`]) are checked on every call.
//!
//! Any completion error is fatal to the connection: every pending request fails with
//! the error, which names the status, the QP and the side.

use std::sync::Arc;

use cclkit_abi::{Error, Result};

use crate::nic::{
    ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, Completion, Nic, QpCaps,
    WriteOrder,
};
use crate::verbs::sys::wc_status_name;

pub mod endpoint;
pub mod fifo;
pub mod imm;
#[cfg(test)]
mod item_tests;
pub mod mr_cache;
pub mod ooo;
#[cfg(test)]
mod ooo_tests;
pub mod plan;
pub mod prof;
pub mod recv;
pub mod request;
pub mod send;
pub mod split;
#[cfg(test)]
mod tests;

/// Requests in flight per comm (`NCCL_NET_MAX_REQUESTS`): receives posted at once,
/// and slots of the CTS FIFO.
pub const MAX_REQUESTS: usize = 32;
/// Buffers per grouped receive (`NCCL_NET_IB_MAX_RECVS`).
pub const MAX_RECVS: usize = 8;
/// Slots a sender may have posted and not yet seen complete.
pub const MAX_INFLIGHT: usize = 2 * MAX_REQUESTS;
/// Largest message: NCCL's `NCCL_MAX_NET_SIZE_BYTES` (1 TiB), reported as
/// `maxP2pBytes`. Sizes of 2 GiB and more travel in the size records; NCCL's
/// `test()` takes `int` sizes, so completing one is reported as an error there.
pub const MAX_MESSAGE: usize = 1 << 40;
/// Most QPs per device of a connection (`NCCL_IB_QPS_PER_CONNECTION`).
pub const MAX_QPS: usize = 16;
/// Most physical devices fused into one virtual device (NCCL's
/// `NCCL_IB_MAX_DEVS_PER_NIC`, = `NCCL_NET_MAX_DEVS_PER_NIC`).
pub const MAX_DEVS: usize = 8;
/// Most QPs of one connection: [`MAX_QPS`] on each of [`MAX_DEVS`] devices.
pub const MAX_CONN_QPS: usize = MAX_QPS * MAX_DEVS;

/// One key per physical device of a virtual device (index = device index; unused
/// entries 0), as NCCL's `lkeys[]` / `rkeys[]`.
pub type Keys = [u32; MAX_DEVS];
/// A receiver's CTS writes are unsignaled except one in this many (so its send queue
/// drains without a completion per write).
pub const CTS_SIGNAL_EVERY: u64 = 16;

/// Queue sizes of a data QP: a sender slot needs up to `MAX_RECVS` data writes and
/// one WRITE_WITH_IMM per QP (more only for chunks over 2 GiB, posted when credit
/// allows). Sender QPs are written by the receiver's CTS: REMOTE_WRITE (NCCL's
/// `ncclIbSenderQpsCreate`).
pub const DATA_QP_CAPS: QpCaps = QpCaps {
    max_send_wr: (MAX_INFLIGHT * (MAX_RECVS + 2)) as u32,
    max_recv_wr: (2 * MAX_REQUESTS) as u32,
    max_inline: 0,
    access: ACCESS_REMOTE_WRITE,
    ooo_rq: false,
};

/// Receiver data QPs: written by the sender's data, and REMOTE_READ as NCCL's
/// `ncclIbReceiverQpsCreateToRts` gives them; inline CTS when `inline`.
pub fn recv_qp_caps(inline: bool) -> QpCaps {
    QpCaps {
        max_inline: if inline { fifo::SLOT_BYTES as u32 } else { 0 },
        access: ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ,
        ..DATA_QP_CAPS
    }
}

/// Queue sizes of the loopback flush QP (LOCAL_WRITE | REMOTE_READ: it reads from
/// itself into local memory).
pub const FLUSH_QP_CAPS: QpCaps = QpCaps {
    max_send_wr: (2 * MAX_REQUESTS) as u32,
    max_recv_wr: 1,
    max_inline: 0,
    access: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ,
    ooo_rq: false,
};

/// CQ depth for `nqps` data QPs of one device (plus a flush QP): every WR can
/// complete, even when an error flushes them all.
pub fn cq_depth(nqps: usize) -> u32 {
    let per_qp = DATA_QP_CAPS.max_send_wr + DATA_QP_CAPS.max_recv_wr;
    (nqps as u32) * per_qp + FLUSH_QP_CAPS.max_send_wr
}

pub use send::SendBuf;

/// Where the peer may write: address and its rkey on each of its devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteBuf {
    /// Address in the peer's memory.
    pub addr: u64,
    /// The peer's remote keys, per device of its virtual device.
    pub rkeys: Keys,
}

/// Host memory registered with every physical NIC of a (virtual) device: the FIFO,
/// staging, size records (NCCL registers them per `commDev`).
pub struct Registered<N: Nic> {
    // Declared first: deregistered before the memory is freed.
    mrs: Vec<N::Mr>,
    mem: fifo::HostMem,
}

impl<N: Nic> Registered<N> {
    /// `len` zeroed bytes registered on each of `nics`.
    pub fn new(nics: &[Arc<N>], len: usize) -> Result<Self> {
        let mem = fifo::HostMem::new(len)
            .ok_or_else(|| Error::system(format!("cannot allocate {len} bytes")))?;
        let mrs = nics
            .iter()
            // SAFETY: `mem` is owned by the returned value and outlives `mrs` (field
            // order). Strict: the peer's NIC writes CTS entries here that are polled
            // in place.
            .map(|nic| unsafe { nic.reg_mr(mem.addr(), mem.len(), WriteOrder::Strict) })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { mrs, mem })
    }

    /// The memory.
    pub fn mem(&self) -> &fifo::HostMem {
        &self.mem
    }

    /// Local key on device `dev` (0 for a device it is not registered with, which
    /// the NIC then rejects).
    pub fn lkey(&self, dev: usize) -> u32 {
        self.mrs.get(dev).map_or(0, |m| N::keys(m).0)
    }

    /// Local keys, per device.
    pub fn lkeys(&self) -> Keys {
        let mut k = [0; MAX_DEVS];
        for (d, m) in self.mrs.iter().enumerate() {
            k[d] = N::keys(m).0;
        }
        k
    }

    /// What a peer needs to write here.
    pub fn remote(&self) -> RemoteBuf {
        let mut rkeys = [0; MAX_DEVS];
        for (d, m) in self.mrs.iter().enumerate() {
            rkeys[d] = N::keys(m).1;
        }
        RemoteBuf {
            addr: self.mem.addr() as u64,
            rkeys,
        }
    }
}

/// The error a failed completion makes fatal for its connection.
pub fn completion_error(side: &str, c: &Completion) -> Error {
    Error::remote(format!(
        "NET/cclkit-ib: {side} got completion error {} ({}) on QP {:#x}, wr_id {}, vendor error {:#x}; \
         the peer died or the fabric failed (check `ibv_devinfo`, cables, NCCL_IB_TIMEOUT)",
        wc_status_name(c.status),
        c.status,
        c.qp_num,
        c.wr_id,
        c.vendor_err
    ))
}

/// Shared by both sides: every pending request fails with the first fatal error.
pub(crate) fn fail_cells<'a>(cells: impl Iterator<Item = &'a Arc<request::ReqCell>>) {
    for c in cells {
        c.fail();
    }
}
