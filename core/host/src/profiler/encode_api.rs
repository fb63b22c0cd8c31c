//! Typed [`Event`]s → v5–v7 descriptors (API events, `parentGroup`, v7 user tags).

use std::ffi::c_void;

use cclkit_abi::profiler::{Coll, Event, EventKind, P2p};
use cclkit_abi::raw::profiler::{self as raw, v5, v6, v7};

use super::encode::{Parents, Scratch, proxy_members, zeroed};

fn coll_v5(c: &Coll<'_>, p: Parents, sc: &mut Scratch) -> v5::ncclProfilerCollDescr_v5_t {
    v5::ncclProfilerCollDescr_v5_t {
        seqNumber: c.seq_number,
        func: sc.c(c.func),
        sendBuff: c.send_buff as *const c_void,
        recvBuff: c.recv_buff as *mut c_void,
        count: c.count,
        root: c.root,
        datatype: sc.c(c.datatype),
        nChannels: c.n_channels,
        nWarps: c.n_warps,
        algo: sc.c(c.algo),
        proto: sc.c(c.proto),
        parentGroup: p.group as *mut c_void,
    }
}

fn p2p_v5(x: &P2p<'_>, p: Parents, sc: &mut Scratch) -> v5::ncclProfilerP2pDescr_v5_t {
    v5::ncclProfilerP2pDescr_v5_t {
        func: sc.c(x.func),
        buff: x.buff as *mut c_void,
        datatype: sc.c(x.datatype),
        count: x.count,
        peer: x.peer,
        nChannels: x.n_channels.unwrap_or(0),
        parentGroup: p.group as *mut c_void,
    }
}

/// The members v5 and v6 share (their unions agree on every member both have).
macro_rules! api_members {
    ($d:expr, $ev:expr, $p:expr, $sc:expr) => {
        match &$ev.kind {
            EventKind::GroupApi(g) => {
                $d.u.groupApi = v5::ncclProfilerGroupApiDescr_v5_t {
                    graphCaptured: u8::from(g.graph_captured),
                    groupDepth: g.group_depth,
                }
            }
            EventKind::KernelLaunch { stream } => $d.u.kernelLaunch.stream = *stream as *mut c_void,
            EventKind::KernelCh { channel_id, ptimer } => {
                $d.u.kernelCh = raw::ncclProfilerKernelChDescr_v4_t {
                    channelId: *channel_id,
                    pTimer: ptimer.unwrap_or(0),
                }
            }
            k => proxy_members!($d.u, k)?,
        }
    };
}

/// The v6+ copy-engine sync and batch members (one layout in v6 and v7).
macro_rules! ce_members {
    ($d:expr, $ev:expr, $p:expr, $sc:expr) => {
        match &$ev.kind {
            EventKind::CeSync {
                is_complete,
                n_ranks,
            } => {
                $d.u.ceCollSync = v6::ncclProfilerCeSyncDescr_v6_t {
                    isComplete: u8::from(*is_complete),
                    nRanks: *n_ranks,
                }
            }
            EventKind::CeBatch {
                num_ops,
                total_bytes,
                use_intra_sync,
            } => {
                $d.u.ceCollBatch = v6::ncclProfilerCeBatchDescr_v6_t {
                    numOps: *num_ops,
                    totalBytes: *total_bytes,
                    useIntraSync: u8::from(*use_intra_sync),
                }
            }
            _ => api_members!($d, $ev, $p, $sc),
        }
    };
}

/// v5: GroupApi, CollApi, P2pApi, KernelLaunch; `parentGroup`.
pub fn v5(ev: &Event<'_>, p: Parents, sc: &mut Scratch) -> Option<v5::ncclProfilerEventDescr_v5_t> {
    let mut d: v5::ncclProfilerEventDescr_v5_t = zeroed();
    d.type_ = ev.kind.type_bit();
    d.parentObj = p.parent as *mut c_void;
    d.rank = ev.rank;
    match &ev.kind {
        EventKind::CollApi(a) => {
            d.u.collApi = v5::ncclProfilerCollApiDescr_v5_t {
                func: sc.c(a.func),
                count: a.count,
                datatype: sc.c(a.datatype),
                root: a.root,
                stream: a.stream as *mut c_void,
                graphCaptured: u8::from(a.graph_captured),
            }
        }
        EventKind::P2pApi(a) => {
            d.u.p2pApi = v5::ncclProfilerP2pApiDescr_v5_t {
                func: sc.c(a.func),
                count: a.count,
                datatype: sc.c(a.datatype),
                stream: a.stream as *mut c_void,
                graphCaptured: u8::from(a.graph_captured),
            }
        }
        EventKind::Coll(c) => d.u.coll = coll_v5(c, p, sc),
        EventKind::P2p(x) => d.u.p2p = p2p_v5(x, p, sc),
        _ => api_members!(d, ev, p, sc),
    }
    Some(d)
}

/// v6: as v5, plus the copy-engine events (CeColl, CeSync, CeBatch). The typed
/// [`CeColl`](cclkit_abi::profiler::CeColl) carries no buffers or stream: NULL.
pub fn v6(ev: &Event<'_>, p: Parents, sc: &mut Scratch) -> Option<v6::ncclProfilerEventDescr_v6_t> {
    let mut d: v6::ncclProfilerEventDescr_v6_t = zeroed();
    d.type_ = ev.kind.type_bit();
    d.parentObj = p.parent as *mut c_void;
    d.rank = ev.rank;
    match &ev.kind {
        EventKind::CollApi(a) => {
            d.u.collApi = v5::ncclProfilerCollApiDescr_v5_t {
                func: sc.c(a.func),
                count: a.count,
                datatype: sc.c(a.datatype),
                root: a.root,
                stream: a.stream as *mut c_void,
                graphCaptured: u8::from(a.graph_captured),
            }
        }
        EventKind::P2pApi(a) => {
            d.u.p2pApi = v5::ncclProfilerP2pApiDescr_v5_t {
                func: sc.c(a.func),
                count: a.count,
                datatype: sc.c(a.datatype),
                stream: a.stream as *mut c_void,
                graphCaptured: u8::from(a.graph_captured),
            }
        }
        EventKind::Coll(c) => d.u.coll = coll_v5(c, p, sc),
        EventKind::P2p(x) => d.u.p2p = p2p_v5(x, p, sc),
        EventKind::CeColl(c) => {
            d.u.ceColl = v6::ncclProfilerCeCollDescr_v6_t {
                seqNumber: c.seq_number,
                func: sc.c(c.func),
                sendBuff: std::ptr::null(),
                recvBuff: std::ptr::null_mut(),
                count: c.count,
                root: c.root,
                datatype: sc.c(c.datatype),
                syncStrategy: sc.c(c.sync_strategy),
                intraBatchSync: u8::from(c.intra_batch_sync),
                batchSize: c.batch_size,
                numBatches: c.num_batches,
                ceSeqNum: c.ce_seq_num,
                stream: std::ptr::null_mut(),
            }
        }
        _ => ce_members!(d, ev, p, sc),
    }
    Some(d)
}

/// v7: per-call user tags, kernel variant and symmetric flag on Coll; KernelPhase.
pub fn v7(ev: &Event<'_>, p: Parents, sc: &mut Scratch) -> Option<v7::ncclProfilerEventDescr_v7_t> {
    let mut d: v7::ncclProfilerEventDescr_v7_t = zeroed();
    d.type_ = ev.kind.type_bit();
    d.parentObj = p.parent as *mut c_void;
    d.rank = ev.rank;
    match &ev.kind {
        EventKind::CollApi(a) => {
            d.u.collApi = v7::ncclProfilerCollApiDescr_v7_t {
                func: sc.c(a.func),
                count: a.count,
                datatype: sc.c(a.datatype),
                root: a.root,
                stream: a.stream as *mut c_void,
                graphCaptured: u8::from(a.graph_captured),
                userTag: a.user_tag.unwrap_or(0),
            }
        }
        EventKind::P2pApi(a) => {
            d.u.p2pApi = v7::ncclProfilerP2pApiDescr_v7_t {
                func: sc.c(a.func),
                count: a.count,
                datatype: sc.c(a.datatype),
                stream: a.stream as *mut c_void,
                graphCaptured: u8::from(a.graph_captured),
                userTag: a.user_tag.unwrap_or(0),
            }
        }
        EventKind::Coll(c) => {
            d.u.coll = v7::ncclProfilerCollDescr_v7_t {
                seqNumber: c.seq_number,
                func: sc.c(c.func),
                sendBuff: c.send_buff as *const c_void,
                recvBuff: c.recv_buff as *mut c_void,
                count: c.count,
                root: c.root,
                datatype: sc.c(c.datatype),
                nChannels: c.n_channels,
                nWarps: c.n_warps,
                algo: sc.c(c.algo),
                proto: sc.c(c.proto),
                parentGroup: p.group as *mut c_void,
                kernelVariant: sc.c(c.kernel_variant),
                isSymColl: u8::from(c.is_sym_coll.unwrap_or(false)),
                userTag: c.user_tag.unwrap_or(0),
            }
        }
        EventKind::P2p(x) => {
            d.u.p2p = v7::ncclProfilerP2pDescr_v7_t {
                func: sc.c(x.func),
                buff: x.buff as *mut c_void,
                datatype: sc.c(x.datatype),
                count: x.count,
                peer: x.peer,
                nChannels: x.n_channels.unwrap_or(0),
                parentGroup: p.group as *mut c_void,
                userTag: x.user_tag.unwrap_or(0),
            }
        }
        EventKind::CeColl(c) => {
            d.u.ceColl = v7::ncclProfilerCeCollDescr_v7_t {
                seqNumber: c.seq_number,
                func: sc.c(c.func),
                sendBuff: std::ptr::null(),
                recvBuff: std::ptr::null_mut(),
                count: c.count,
                root: c.root,
                datatype: sc.c(c.datatype),
                syncStrategy: sc.c(c.sync_strategy),
                intraBatchSync: u8::from(c.intra_batch_sync),
                batchSize: c.batch_size,
                numBatches: c.num_batches,
                ceSeqNum: c.ce_seq_num,
                stream: std::ptr::null_mut(),
                userTag: c.user_tag.unwrap_or(0),
            }
        }
        EventKind::KernelPhase(k) => {
            d.u.kernelPhase = v7::ncclProfilerKernelPhaseDescr_v7_t {
                channelId: k.channel_id,
                phaseId: k.phase_id,
                phaseName: sc.c(k.phase_name),
                pTimer: k.ptimer,
            }
        }
        _ => ce_members!(d, ev, p, sc),
    }
    Some(d)
}
