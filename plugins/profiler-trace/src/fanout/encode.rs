//! Re-encodes a typed [`Event`] into the raw descriptor of a forwarded profiler's
//! version (v4–v7), so a profiler built for an older NCCL still receives events
//! when this plugin runs under a newer one (and the other way round).
//!
//! Strings are copied into NUL-terminated buffers owned by [`Strings`], which lives
//! until the forwarded `startEvent` returns (descriptor strings are only valid
//! during the call, as in NCCL). Fields an event does not carry are zero; `coll`
//! and `p2p` `parentGroup` is NULL (the typed view does not keep it).

use std::ffi::{CString, c_char, c_void};
use std::ptr::{null, null_mut};

use cclkit_abi::profiler::{Event, EventKind, StateArgs};
use cclkit_abi::raw::profiler::{self as raw, event as bit};

/// Owner of the C strings of one forwarded descriptor.
#[derive(Default)]
pub struct Strings(Vec<CString>);

impl Strings {
    fn c(&mut self, s: Option<&str>) -> *const c_char {
        let Some(s) = s else { return null() };
        let c = CString::new(s.replace('\0', "")).unwrap_or_default();
        let p = c.as_ptr();
        // Moving a CString does not move its heap buffer, so `p` stays valid.
        self.0.push(c);
        p
    }
}

fn zeroed<T>() -> T {
    // SAFETY: only used for the raw descriptor structs, plain C data for which all
    // zero bytes (NULL pointers, 0 integers) is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Fills the members every v4+ union shares; `false` if the event is another kind.
macro_rules! common_members {
    ($u:expr, $kind:expr) => {
        match $kind {
            EventKind::Group | EventKind::ProxyCtrl => true,
            EventKind::ProxyOp(p) => {
                $u.proxyOp = raw::ncclProfilerProxyOpDescr_v1_t {
                    pid: p.pid,
                    channelId: p.channel_id,
                    peer: p.peer,
                    nSteps: p.n_steps,
                    chunkSize: p.chunk_size,
                    isSend: i32::from(p.is_send),
                };
                true
            }
            EventKind::ProxyStep { step } => {
                $u.proxyStep.step = *step;
                true
            }
            EventKind::KernelCh { channel_id, ptimer } => {
                $u.kernelCh = raw::ncclProfilerKernelChDescr_v4_t {
                    channelId: *channel_id,
                    pTimer: ptimer.unwrap_or(0),
                };
                true
            }
            EventKind::NetPlugin(_) => false, // needs the original data pointer: see callers
            _ => false,
        }
    };
}

/// The net event's original descriptor pointer cannot be recovered from the typed
/// view, so forwarded NetPlugin events carry the plugin id and a re-encoded copy.
pub struct NetCopy {
    sock: raw::ncclProfilerNetSockDescr_v1_t,
    ib: raw::ncclProfilerNetIbDescr_v1_t,
}

impl NetCopy {
    fn new() -> Box<Self> {
        Box::new(Self {
            sock: Default::default(),
            ib: Default::default(),
        })
    }

    fn fill(
        &mut self,
        n: &cclkit_abi::profiler::NetPlugin,
    ) -> raw::ncclProfilerNetPluginDescr_v3_t {
        use cclkit_abi::profiler::NetDetail;
        let data: *mut c_void = match n.detail {
            Some(NetDetail::Socket { fd, op, length }) => {
                self.sock = raw::ncclProfilerNetSockDescr_v1_t {
                    type_: raw::NCCL_PROFILE_SOCKET,
                    sock: raw::ncclProfilerNetSockSockDescr_v1_t { fd, op, length },
                };
                (&mut self.sock as *mut raw::ncclProfilerNetSockDescr_v1_t).cast()
            }
            Some(NetDetail::IbQp {
                device,
                wr_id,
                opcode,
                qp_num,
                length,
            }) => {
                self.ib = raw::ncclProfilerNetIbDescr_v1_t {
                    type_: raw::NCCL_PROFILE_QP,
                    qp: raw::ncclProfilerNetIbQpDescr_v1_t {
                        device,
                        wr_id,
                        opcode,
                        qpNum: qp_num,
                        length,
                    },
                };
                (&mut self.ib as *mut raw::ncclProfilerNetIbDescr_v1_t).cast()
            }
            None => null_mut(),
        };
        raw::ncclProfilerNetPluginDescr_v3_t { id: n.id, data }
    }
}

/// Everything a forwarded `startEvent` call needs kept alive.
pub struct Scratch {
    /// String copies.
    pub strings: Strings,
    net: Box<NetCopy>,
}

impl Scratch {
    /// Empty scratch.
    pub fn new() -> Self {
        Self {
            strings: Strings::default(),
            net: NetCopy::new(),
        }
    }
}

/// A v4 descriptor for `event`, or `None` if v4 has no such event type.
pub fn v4(
    event: &Event<'_>,
    parent: *mut c_void,
    sc: &mut Scratch,
) -> Option<raw::v4::ncclProfilerEventDescr_v4_t> {
    let mut d: raw::v4::ncclProfilerEventDescr_v4_t = zeroed();
    d.type_ = u8::try_from(event.kind.type_bit()).ok()?;
    d.parentObj = parent;
    d.rank = event.rank;
    if !common_members!(d.u, &event.kind) {
        match &event.kind {
            EventKind::NetPlugin(n) => d.u.netPlugin = sc.net.fill(n),
            EventKind::Coll(c) => {
                d.u.coll = raw::v4::ncclProfilerCollDescr_v4_t {
                    seqNumber: c.seq_number,
                    func: sc.strings.c(c.func),
                    sendBuff: c.send_buff as *const c_void,
                    recvBuff: c.recv_buff as *mut c_void,
                    count: c.count,
                    root: c.root,
                    datatype: sc.strings.c(c.datatype),
                    nChannels: c.n_channels,
                    nWarps: c.n_warps,
                    algo: sc.strings.c(c.algo),
                    proto: sc.strings.c(c.proto),
                }
            }
            EventKind::P2p(p) => {
                d.u.p2p = raw::v4::ncclProfilerP2pDescr_v4_t {
                    func: sc.strings.c(p.func),
                    buff: p.buff as *mut c_void,
                    datatype: sc.strings.c(p.datatype),
                    count: p.count,
                    peer: p.peer,
                    nChannels: p.n_channels.unwrap_or(0),
                }
            }
            _ => return None,
        }
    }
    (event.kind.type_bit() & bit::known(4) != 0).then_some(d)
}

/// Defines the v5/v6/v7 encoders (identical but for the CE and v7 members).
macro_rules! encoder {
    ($name:ident, $v:literal, $descr:ty, $collapi:ident, $p2papi:ident, $coll:ident, $p2p:ident, |$d:ident, $ev:ident, $sc:ident| $extra:expr) => {
        /// A descriptor of this version for `event`, or `None` if it has no such type.
        // v7 structs have fields v5/v6 lack; one body serves all three.
        #[allow(clippy::needless_update)]
        pub fn $name(event: &Event<'_>, parent: *mut c_void, sc: &mut Scratch) -> Option<$descr> {
            let mut d: $descr = zeroed();
            d.type_ = event.kind.type_bit();
            d.parentObj = parent;
            d.rank = event.rank;
            if event.kind.type_bit() & bit::known($v) == 0 {
                return None;
            }
            if !common_members!(d.u, &event.kind) {
                match &event.kind {
                    EventKind::NetPlugin(n) => d.u.netPlugin = sc.net.fill(n),
                    EventKind::GroupApi(g) => {
                        d.u.groupApi = raw::v5::ncclProfilerGroupApiDescr_v5_t {
                            graphCaptured: u8::from(g.graph_captured),
                            groupDepth: g.group_depth,
                        }
                    }
                    EventKind::KernelLaunch { stream } => {
                        d.u.kernelLaunch.stream = *stream as *mut c_void
                    }
                    EventKind::CollApi(a) => {
                        d.u.collApi = $collapi {
                            func: sc.strings.c(a.func),
                            count: a.count,
                            datatype: sc.strings.c(a.datatype),
                            root: a.root,
                            stream: a.stream as *mut c_void,
                            graphCaptured: u8::from(a.graph_captured),
                            ..zeroed()
                        }
                    }
                    EventKind::P2pApi(a) => {
                        d.u.p2pApi = $p2papi {
                            func: sc.strings.c(a.func),
                            count: a.count,
                            datatype: sc.strings.c(a.datatype),
                            stream: a.stream as *mut c_void,
                            graphCaptured: u8::from(a.graph_captured),
                            ..zeroed()
                        }
                    }
                    EventKind::Coll(c) => {
                        d.u.coll = $coll {
                            seqNumber: c.seq_number,
                            func: sc.strings.c(c.func),
                            sendBuff: c.send_buff as *const c_void,
                            recvBuff: c.recv_buff as *mut c_void,
                            count: c.count,
                            root: c.root,
                            datatype: sc.strings.c(c.datatype),
                            nChannels: c.n_channels,
                            nWarps: c.n_warps,
                            algo: sc.strings.c(c.algo),
                            proto: sc.strings.c(c.proto),
                            ..zeroed()
                        }
                    }
                    EventKind::P2p(p) => {
                        d.u.p2p = $p2p {
                            func: sc.strings.c(p.func),
                            buff: p.buff as *mut c_void,
                            datatype: sc.strings.c(p.datatype),
                            count: p.count,
                            peer: p.peer,
                            nChannels: p.n_channels.unwrap_or(0),
                            ..zeroed()
                        }
                    }
                    _ => {
                        let ($d, $ev, $sc) = (&mut d, event, sc);
                        if !$extra {
                            return None;
                        }
                    }
                }
            }
            Some(d)
        }
    };
}

use raw::v5::{
    ncclProfilerCollApiDescr_v5_t, ncclProfilerCollDescr_v5_t, ncclProfilerP2pApiDescr_v5_t,
    ncclProfilerP2pDescr_v5_t,
};
use raw::v7::{
    ncclProfilerCollApiDescr_v7_t, ncclProfilerCollDescr_v7_t, ncclProfilerP2pApiDescr_v7_t,
    ncclProfilerP2pDescr_v7_t,
};

encoder!(
    v5,
    5,
    raw::v5::ncclProfilerEventDescr_v5_t,
    ncclProfilerCollApiDescr_v5_t,
    ncclProfilerP2pApiDescr_v5_t,
    ncclProfilerCollDescr_v5_t,
    ncclProfilerP2pDescr_v5_t,
    |_d, _e, _s| false
);
encoder!(
    v6,
    6,
    raw::v6::ncclProfilerEventDescr_v6_t,
    ncclProfilerCollApiDescr_v5_t,
    ncclProfilerP2pApiDescr_v5_t,
    ncclProfilerCollDescr_v5_t,
    ncclProfilerP2pDescr_v5_t,
    |d, e, s| {
        match &e.kind {
            EventKind::CeSync {
                is_complete,
                n_ranks,
            } => {
                d.u.ceCollSync = raw::v6::ncclProfilerCeSyncDescr_v6_t {
                    isComplete: u8::from(*is_complete),
                    nRanks: *n_ranks,
                };
                true
            }
            EventKind::CeBatch {
                num_ops,
                total_bytes,
                use_intra_sync,
            } => {
                d.u.ceCollBatch = raw::v6::ncclProfilerCeBatchDescr_v6_t {
                    numOps: *num_ops,
                    totalBytes: *total_bytes,
                    useIntraSync: u8::from(*use_intra_sync),
                };
                true
            }
            EventKind::CeColl(c) => {
                d.u.ceColl = raw::v6::ncclProfilerCeCollDescr_v6_t {
                    seqNumber: c.seq_number,
                    func: s.strings.c(c.func),
                    count: c.count,
                    root: c.root,
                    datatype: s.strings.c(c.datatype),
                    syncStrategy: s.strings.c(c.sync_strategy),
                    intraBatchSync: u8::from(c.intra_batch_sync),
                    batchSize: c.batch_size,
                    numBatches: c.num_batches,
                    ceSeqNum: c.ce_seq_num,
                    ..zeroed()
                };
                true
            }
            _ => false,
        }
    }
);
encoder!(
    v7,
    7,
    raw::v7::ncclProfilerEventDescr_v7_t,
    ncclProfilerCollApiDescr_v7_t,
    ncclProfilerP2pApiDescr_v7_t,
    ncclProfilerCollDescr_v7_t,
    ncclProfilerP2pDescr_v7_t,
    |d, e, s| {
        match &e.kind {
            EventKind::CeSync {
                is_complete,
                n_ranks,
            } => {
                d.u.ceCollSync = raw::v6::ncclProfilerCeSyncDescr_v6_t {
                    isComplete: u8::from(*is_complete),
                    nRanks: *n_ranks,
                };
                true
            }
            EventKind::CeBatch {
                num_ops,
                total_bytes,
                use_intra_sync,
            } => {
                d.u.ceCollBatch = raw::v6::ncclProfilerCeBatchDescr_v6_t {
                    numOps: *num_ops,
                    totalBytes: *total_bytes,
                    useIntraSync: u8::from(*use_intra_sync),
                };
                true
            }
            EventKind::CeColl(c) => {
                d.u.ceColl = raw::v7::ncclProfilerCeCollDescr_v7_t {
                    seqNumber: c.seq_number,
                    func: s.strings.c(c.func),
                    count: c.count,
                    root: c.root,
                    datatype: s.strings.c(c.datatype),
                    syncStrategy: s.strings.c(c.sync_strategy),
                    intraBatchSync: u8::from(c.intra_batch_sync),
                    batchSize: c.batch_size,
                    numBatches: c.num_batches,
                    ceSeqNum: c.ce_seq_num,
                    userTag: c.user_tag.unwrap_or(0),
                    ..zeroed()
                };
                true
            }
            EventKind::KernelPhase(k) => {
                d.u.kernelPhase = raw::v7::ncclProfilerKernelPhaseDescr_v7_t {
                    channelId: k.channel_id,
                    phaseId: k.phase_id,
                    phaseName: s.strings.c(k.phase_name),
                    pTimer: k.ptimer,
                };
                true
            }
            _ => false,
        }
    }
);

/// v7 user tags and kernel variant, which the shared encoder leaves zero.
pub fn v7_tags(d: &mut raw::v7::ncclProfilerEventDescr_v7_t, event: &Event<'_>, sc: &mut Scratch) {
    // Writing a union member is safe; `type_` was set from the event, so the member
    // written is the one NCCL's readers select.
    {
        match &event.kind {
            EventKind::Coll(c) => {
                d.u.coll.userTag = c.user_tag.unwrap_or(0);
                d.u.coll.isSymColl = u8::from(c.is_sym_coll.unwrap_or(false));
                d.u.coll.kernelVariant = sc.strings.c(c.kernel_variant);
            }
            EventKind::P2p(p) => d.u.p2p.userTag = p.user_tag.unwrap_or(0),
            EventKind::CollApi(a) => d.u.collApi.userTag = a.user_tag.unwrap_or(0),
            EventKind::P2pApi(a) => d.u.p2pApi.userTag = a.user_tag.unwrap_or(0),
            _ => {}
        }
    }
}

/// The v4+ state arguments for a typed state.
pub fn state_args(args: &StateArgs) -> Option<raw::ncclProfilerEventStateArgs_v4_t> {
    Some(match *args {
        StateArgs::None => return None,
        StateArgs::ProxyOp { trans_size, .. } | StateArgs::ProxyStep { trans_size } => {
            raw::ncclProfilerEventStateArgs_v4_t {
                proxyStep: raw::ncclProfilerProxyStepStateArgs_v4_t {
                    transSize: trans_size,
                },
            }
        }
        StateArgs::ProxyCtrl { appended_proxy_ops } => raw::ncclProfilerEventStateArgs_v4_t {
            proxyCtrl: raw::ncclProfilerProxyCtrlStateArgs_v1_t {
                appendedProxyOps: appended_proxy_ops,
            },
        },
        StateArgs::NetPlugin { data } => raw::ncclProfilerEventStateArgs_v4_t {
            netPlugin: raw::ncclProfilerNetPluginStateArgs_v4_t {
                data: data as *mut c_void,
            },
        },
        StateArgs::Timer { ptimer } => raw::ncclProfilerEventStateArgs_v4_t {
            kernelCh: raw::ncclProfilerKernelChStateArgs_v4_t { pTimer: ptimer },
        },
    })
}
