//! Typed views of NCCL's event descriptors (every version decodes into these).

use crate::raw::profiler::event as bit;

/// One event NCCL started: who sent it and what it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event<'a> {
    /// Originating rank.
    pub rank: i32,
    /// The event itself.
    pub kind: EventKind<'a>,
}

/// Every event type of profiler ABI v1–v7. Strings are borrowed from NCCL for the
/// duration of the call (`None` when NULL or not UTF-8); buffers and streams are
/// addresses, never dereferenced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EventKind<'a> {
    /// `ncclProfileGroup`.
    Group,
    /// `ncclProfileGroupApi` (v5+).
    GroupApi(GroupApi),
    /// `ncclProfileCollApi` (v5+).
    CollApi(CollApi<'a>),
    /// `ncclProfileP2pApi` (v5+).
    P2pApi(P2pApi<'a>),
    /// `ncclProfileKernelLaunch` (v5+): the stream's address.
    KernelLaunch {
        /// CUDA stream (opaque).
        stream: usize,
    },
    /// `ncclProfileColl`.
    Coll(Coll<'a>),
    /// `ncclProfileP2p`.
    P2p(P2p<'a>),
    /// `ncclProfileProxyOp`.
    ProxyOp(ProxyOp),
    /// `ncclProfileProxyStep`.
    ProxyStep {
        /// Step number within the proxy operation.
        step: i32,
    },
    /// `ncclProfileProxyCtrl`.
    ProxyCtrl,
    /// `ncclProfileKernelCh` (v3+).
    KernelCh {
        /// Channel id.
        channel_id: u8,
        /// GPU start timestamp (v4+).
        ptimer: Option<u64>,
    },
    /// `ncclProfileNetPlugin` (v3+).
    NetPlugin(NetPlugin),
    /// `ncclProfileCeColl` (v6+).
    CeColl(CeColl<'a>),
    /// `ncclProfileCeSync` (v6+).
    CeSync {
        /// The synchronisation completed.
        is_complete: bool,
        /// Ranks synchronised.
        n_ranks: i32,
    },
    /// `ncclProfileCeBatch` (v6+).
    CeBatch {
        /// Operations in the batch.
        num_ops: i32,
        /// Bytes in the batch.
        total_bytes: usize,
        /// Intra-batch synchronisation used.
        use_intra_sync: bool,
    },
    /// `ncclProfileKernelPhase` (v7+).
    KernelPhase(KernelPhase<'a>),
    /// A type value this SDK does not know (kept so a profiler can count them).
    Unknown(u64),
}

impl EventKind<'_> {
    /// The `ncclProfile*` bit of this event (`Unknown` returns the raw value).
    pub const fn type_bit(&self) -> u64 {
        match self {
            EventKind::Group => bit::GROUP,
            EventKind::GroupApi(_) => bit::GROUP_API,
            EventKind::CollApi(_) => bit::COLL_API,
            EventKind::P2pApi(_) => bit::P2P_API,
            EventKind::KernelLaunch { .. } => bit::KERNEL_LAUNCH,
            EventKind::Coll(_) => bit::COLL,
            EventKind::P2p(_) => bit::P2P,
            EventKind::ProxyOp(_) => bit::PROXY_OP,
            EventKind::ProxyStep { .. } => bit::PROXY_STEP,
            EventKind::ProxyCtrl => bit::PROXY_CTRL,
            EventKind::KernelCh { .. } => bit::KERNEL_CH,
            EventKind::NetPlugin(_) => bit::NET_PLUGIN,
            EventKind::CeColl(_) => bit::CE_COLL,
            EventKind::CeSync { .. } => bit::CE_SYNC,
            EventKind::CeBatch { .. } => bit::CE_BATCH,
            EventKind::KernelPhase(_) => bit::KERNEL_PHASE,
            EventKind::Unknown(v) => *v,
        }
    }

    /// NCCL's name of the event type (`"Coll"`, `"ProxyStep"`, …; `"Unknown"`).
    pub const fn name(&self) -> &'static str {
        match bit::name(self.type_bit()) {
            Some(n) => n,
            None => "Unknown",
        }
    }
}

/// `groupApi` (v5+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupApi {
    /// Captured into a CUDA graph.
    pub graph_captured: bool,
    /// Nesting depth of `ncclGroupStart`.
    pub group_depth: i32,
}

/// `collApi` (v5+): the user's collective call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollApi<'a> {
    /// Function name (`"AllReduce"`).
    pub func: Option<&'a str>,
    /// Element count.
    pub count: usize,
    /// Datatype name.
    pub datatype: Option<&'a str>,
    /// Root rank.
    pub root: i32,
    /// CUDA stream (opaque).
    pub stream: usize,
    /// Captured into a CUDA graph.
    pub graph_captured: bool,
    /// Per-call user tag (v7+; 0 = untagged).
    pub user_tag: Option<u64>,
}

/// `p2pApi` (v5+): the user's send/recv call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2pApi<'a> {
    /// Function name (`"Send"`, `"Recv"`).
    pub func: Option<&'a str>,
    /// Element count.
    pub count: usize,
    /// Datatype name.
    pub datatype: Option<&'a str>,
    /// CUDA stream (opaque).
    pub stream: usize,
    /// Captured into a CUDA graph.
    pub graph_captured: bool,
    /// Per-call user tag (v7+).
    pub user_tag: Option<u64>,
}

/// `coll`: one collective as NCCL schedules it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coll<'a> {
    /// Per-communicator sequence number.
    pub seq_number: u64,
    /// Function name (v1's numeric code is translated).
    pub func: Option<&'a str>,
    /// Send buffer address.
    pub send_buff: usize,
    /// Receive buffer address.
    pub recv_buff: usize,
    /// Element count.
    pub count: usize,
    /// Root rank.
    pub root: i32,
    /// Datatype name (v1's numeric code is translated).
    pub datatype: Option<&'a str>,
    /// Channels (v1–v3: at most).
    pub n_channels: u8,
    /// Warps per block.
    pub n_warps: u8,
    /// Algorithm name.
    pub algo: Option<&'a str>,
    /// Protocol name.
    pub proto: Option<&'a str>,
    /// Communicator name (v1–v3).
    pub comm_name: Option<&'a str>,
    /// Communicator hash (v1–v3).
    pub comm_hash: Option<u64>,
    /// Network bytes (v1–v2).
    pub traffic_bytes: Option<usize>,
    /// `ncclRedOp_t` (v1).
    pub red_op: Option<u32>,
    /// Kernel variant (v7+).
    pub kernel_variant: Option<&'a str>,
    /// Symmetric-memory collective (v7+).
    pub is_sym_coll: Option<bool>,
    /// Per-call user tag (v7+).
    pub user_tag: Option<u64>,
}

impl Coll<'_> {
    /// Bytes of the user's buffer: `count` × the datatype's size (0 if unknown).
    pub fn bytes(&self) -> usize {
        self.count.saturating_mul(datatype_size(self.datatype))
    }
}

/// `p2p`: one send or receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2p<'a> {
    /// Function name (`"Send"`, `"Recv"`).
    pub func: Option<&'a str>,
    /// User buffer address.
    pub buff: usize,
    /// Datatype name.
    pub datatype: Option<&'a str>,
    /// Element count.
    pub count: usize,
    /// Remote rank.
    pub peer: i32,
    /// Channels (v4+).
    pub n_channels: Option<u8>,
    /// Communicator name (v1–v3).
    pub comm_name: Option<&'a str>,
    /// Communicator hash (v1–v3).
    pub comm_hash: Option<u64>,
    /// Per-call user tag (v7+).
    pub user_tag: Option<u64>,
}

impl P2p<'_> {
    /// Bytes: `count` × the datatype's size (0 if unknown).
    pub fn bytes(&self) -> usize {
        self.count.saturating_mul(datatype_size(self.datatype))
    }
}

/// Element size of an NCCL datatype name (`"ncclFloat32"` → 4); 0 if unknown.
pub fn datatype_size(name: Option<&str>) -> usize {
    let Some(name) = name else { return 0 };
    let name = name.strip_prefix("nccl").unwrap_or(name);
    match name {
        "Int8" | "Char" | "Uint8" | "Float8e4m3" | "Float8e5m2" => 1,
        "Float16" | "Half" | "Bfloat16" => 2,
        "Int32" | "Int" | "Uint32" | "Float32" | "Float" => 4,
        "Int64" | "Uint64" | "Float64" | "Double" => 8,
        _ => 0,
    }
}

/// `proxyOp`: the proxy's work for one channel and peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyOp {
    /// Pid of the posting process.
    pub pid: i32,
    /// Channel id.
    pub channel_id: u8,
    /// Remote rank.
    pub peer: i32,
    /// Steps in the operation.
    pub n_steps: i32,
    /// Bytes per step.
    pub chunk_size: i32,
    /// A send (else a receive).
    pub is_send: bool,
}

/// `netPlugin` (v3+): an event a net plugin reported through NCCL's callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetPlugin {
    /// The plugin id (net type in the high 16 bits, descriptor version in the low 16).
    pub id: i64,
    /// The decoded descriptor, when the type and version are known and data non-NULL.
    pub detail: Option<NetDetail>,
}

/// A net plugin's descriptor, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetDetail {
    /// `ncclProfilerNetSockDescr_v1_t`.
    Socket {
        /// Socket descriptor.
        fd: i32,
        /// 0 = send, 1 = receive (NCCL's socket plugin).
        op: i32,
        /// Bytes.
        length: usize,
    },
    /// `ncclProfilerNetIbDescr_v1_t` (`qp` event).
    IbQp {
        /// Network device.
        device: i32,
        /// Work request id.
        wr_id: u64,
        /// `ibv_wr_opcode`.
        opcode: i32,
        /// QP number.
        qp_num: i32,
        /// Bytes.
        length: usize,
    },
}

impl NetDetail {
    /// Bytes the network event moves.
    pub const fn length(&self) -> usize {
        match self {
            NetDetail::Socket { length, .. } | NetDetail::IbQp { length, .. } => *length,
        }
    }
}

/// `ceColl` (v6+): a copy-engine collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CeColl<'a> {
    /// Sequence number.
    pub seq_number: u64,
    /// Function name.
    pub func: Option<&'a str>,
    /// Element count.
    pub count: usize,
    /// Root rank.
    pub root: i32,
    /// Datatype name.
    pub datatype: Option<&'a str>,
    /// Synchronisation strategy.
    pub sync_strategy: Option<&'a str>,
    /// Synchronise inside a batch.
    pub intra_batch_sync: bool,
    /// Operations per batch.
    pub batch_size: u32,
    /// Batches.
    pub num_batches: u32,
    /// Copy-engine sequence number.
    pub ce_seq_num: u32,
    /// Per-call user tag (v7+).
    pub user_tag: Option<u64>,
}

/// `kernelPhase` (v7+): a phase of a symmetric kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelPhase<'a> {
    /// Channel id.
    pub channel_id: u8,
    /// 0 = initial sync, 1 = compute, 2 = final sync.
    pub phase_id: u8,
    /// Phase name.
    pub phase_name: Option<&'a str>,
    /// GPU start timestamp.
    pub ptimer: u64,
}
