//! The seam between the protocol and the hardware: a small `Nic` trait.
//!
//! The receiver-driven protocol ([`crate::proto`]) needs only these operations of an
//! RDMA NIC: register memory, create a CQ and RC QPs, connect a QP to a remote one,
//! post RDMA WRITE / WRITE_WITH_IMM / READ, post a receive for an immediate, and poll
//! completions. [`crate::verbs::nic::VerbsNic`] implements them with libibverbs; the unit
//! tests implement them with an in-memory test double (`fake::FakeNic`, compiled only
//! for tests) that performs the RDMA operations between buffers of one process, so
//! the whole protocol is exercised without RDMA hardware.

use cclkit_abi::Result;

/// One local scatter/gather entry (`ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Start address (inside a registration).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the registration.
    pub lkey: u32,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// RDMA WRITE of the local SGE to `remote_addr`.
    Write,
    /// RDMA WRITE, then consume a receive at the peer and deliver this immediate.
    WriteImm(u32),
    /// RDMA READ from `remote_addr` into the local SGE.
    Read,
}

/// A send work request (`ibv_send_wr` with one SGE, RC only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: Op,
    /// Local memory; `None` for a zero-length write.
    pub local: Option<Sge>,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Ask for a completion on success (errors always complete).
    pub signaled: bool,
    /// `IBV_SEND_INLINE`: the local bytes are copied at post time (no lkey needed;
    /// at most the QP's `max_inline` bytes). Used for CTS entries with
    /// `NCCL_IB_USE_INLINE=1`, as NCCL's `ncclIbPostFifo`.
    pub inline: bool,
}

/// What a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionKind {
    /// A signaled (or failed) RDMA WRITE / WRITE_WITH_IMM of ours.
    Write,
    /// An RDMA READ of ours.
    Read,
    /// The peer's WRITE_WITH_IMM consumed one of our receives.
    RecvImm(u32),
    /// Any other opcode (raw `ibv_wc_opcode`), or a failed WR whose opcode the
    /// hardware does not report.
    Other(u32),
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// `ibv_wc_status` (0 = success).
    pub status: u32,
    /// What completed (valid only on success, as in verbs).
    pub kind: CompletionKind,
    /// QP number the work ran on.
    pub qp_num: u32,
    /// Vendor error syndrome (for logs).
    pub vendor_err: u32,
}

/// How a peer reaches one of our ports: exchanged at connection setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortAddr {
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID (RoCE; IB across subnets).
    pub gid: [u8; 16],
    /// `IBV_LINK_LAYER_*` (1 = InfiniBand, 2 = Ethernet/RoCE).
    pub link_layer: u8,
    /// Active MTU as an `ibv_mtu` value (1 = 256 B … 5 = 4096 B).
    pub mtu: u8,
}

/// Per-QP routing parameters given at RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Link {
    /// Traffic class of the GRH (RoCE only; NCCL leaves it 0 on InfiniBand).
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
}

/// Enhanced Connection Establishment options of a QP (`struct ibv_ece`), negotiated
/// as NCCL does (`ncclIbSenderQpsCreate` / `ncclIbReceiverQpsCreateToRts` /
/// `ncclIbSenderQpsToRts`): the sender sends its QP's ECE, the receiver sets it on its
/// QP before RTR and answers with the reduced ECE its device accepted, which the
/// sender sets before its own RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ece {
    /// IEEE OUI of the provider's vendor.
    pub vendor_id: u32,
    /// Vendor-specific options.
    pub options: u32,
    /// Which options are valid.
    pub comp_mask: u32,
}

/// How the NIC may order its PCIe writes into a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOrder {
    /// Data buffers, read only after a completion: relaxed ordering is allowed
    /// (`NCCL_IB_PCI_RELAXED_ORDERING`), which is faster behind some PCIe switches.
    Relaxed,
    /// Control memory polled in place (the CTS FIFO relies on a WRITE's bytes landing
    /// in address order): never relaxed.
    Strict,
}

/// Queue sizes of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send WRs.
    pub max_send_wr: u32,
    /// Outstanding receive WRs.
    pub max_recv_wr: u32,
    /// Bytes a send may carry inline (`max_inline_data`; 0 = no inline sends).
    pub max_inline: u32,
    /// `IBV_ACCESS_*` flags the peer may use on this QP (`qp_access_flags`): NCCL gives
    /// sender QPs REMOTE_WRITE, receiver QPs REMOTE_WRITE|REMOTE_READ, the flush QP
    /// LOCAL_WRITE|REMOTE_READ.
    pub access: u32,
    /// Out-of-order receive queue (`NCCL_IB_OOO_RQ`; mlx5's
    /// `MLX5DV_QP_CREATE_OOO_DP`): an incoming WRITE_WITH_IMM may consume any posted
    /// receive, not the oldest, so its completion's `wr_id` does not name the
    /// message; the protocol then matches by the immediate.
    pub ooo_rq: bool,
}

/// `IBV_ACCESS_LOCAL_WRITE`.
pub const ACCESS_LOCAL_WRITE: u32 = 1;
/// `IBV_ACCESS_REMOTE_WRITE`.
pub const ACCESS_REMOTE_WRITE: u32 = 1 << 1;
/// `IBV_ACCESS_REMOTE_READ`.
pub const ACCESS_REMOTE_READ: u32 = 1 << 2;

/// An RDMA NIC port as the protocol sees it.
///
/// Registrations always allow local write, remote write and remote read (NCCL's IB
/// transport registers every buffer that way).
pub trait Nic: Send + Sync + 'static {
    /// A memory registration (deregistered when dropped).
    type Mr: Send + Sync + 'static;
    /// A completion queue.
    type Cq: Send + 'static;
    /// An RC queue pair (destroyed when dropped; it may keep its CQ alive).
    type Qp: Send + 'static;

    /// This port's address for peers.
    fn port_addr(&self) -> PortAddr;

    /// Adaptive routing is on for this port (`NCCL_IB_ADAPTIVE_ROUTING`; NCCL's
    /// default: on for InfiniBand, off for RoCE).
    fn adaptive_routing(&self) -> bool;

    /// Out-of-order receive queues (NCCL's `ncclIbQueryOooRqSize`): `None` when the
    /// provider interface that could enable them is not available (NCCL: a non-mlx5
    /// provider; here also: mlx5dv is not bound), else the device's largest OOO
    /// receive queue (`ooo_recv_wrs_caps.max_rc`; 0 = the device has none).
    fn ooo_rq_size(&self) -> Option<u32> {
        None
    }

    /// Registers `[addr, addr + len)`.
    ///
    /// # Safety
    /// The memory must stay allocated until the registration is dropped.
    unsafe fn reg_mr(&self, addr: usize, len: usize, order: WriteOrder) -> Result<Self::Mr>;

    /// Registers `len` bytes at `offset` of dma-buf `fd`, addressed as `addr`.
    fn reg_mr_dmabuf(&self, addr: usize, len: usize, offset: u64, fd: i32) -> Result<Self::Mr>;

    /// `(lkey, rkey)` of a registration.
    fn keys(mr: &Self::Mr) -> (u32, u32);

    /// Deregisters, reporting failure.
    fn dereg_mr(&self, mr: Self::Mr) -> Result<()>;

    /// A CQ of at least `depth` entries.
    fn create_cq(&self, depth: u32) -> Result<Self::Cq>;

    /// An RC QP in INIT state whose sends and receives complete on `cq`.
    fn create_qp(&self, cq: &Self::Cq, caps: QpCaps) -> Result<Self::Qp>;

    /// The QP's number.
    fn qp_num(qp: &Self::Qp) -> u32;

    /// Connects `qp` to `remote_qpn` at `remote` (INIT → RTR → RTS).
    fn connect_qp(
        &self,
        qp: &mut Self::Qp,
        remote: &PortAddr,
        remote_qpn: u32,
        link: Link,
    ) -> Result<()>;

    /// Posts `wrs` in order on `qp`. The SGEs must lie in live registrations.
    fn post_send(&self, qp: &mut Self::Qp, wrs: &[SendWr]) -> Result<()>;

    /// Posts one zero-length receive (it only catches an immediate).
    fn post_recv(&self, qp: &mut Self::Qp, wr_id: u64) -> Result<()>;

    /// Appends the available completions of `cq` to `out` (at most `max`).
    fn poll_cq(&self, cq: &mut Self::Cq, out: &mut Vec<Completion>, max: usize) -> Result<()>;

    /// The QP's current ECE, `None` when the device or library has no ECE
    /// (`ibv_query_ece` returning EOPNOTSUPP).
    fn query_ece(&self, qp: &Self::Qp) -> Result<Option<Ece>>;

    /// Sets the ECE of a QP in INIT state; `false` when unsupported.
    fn set_ece(&self, qp: &mut Self::Qp, ece: &Ece) -> Result<bool>;

    /// An error once a fatal asynchronous event hit this device, `cq` or a QP that
    /// completes on `cq` (NCCL's `ncclIbStatsCheckFatalCount` on the comm's and the
    /// device's counters, fed by `ncclIbAsyncThreadMain`).
    fn check_fatal(&self, cq: &Self::Cq) -> Result<()>;
}
