//! Decoding the v5–v7 descriptors (API events, copy-engine events, kernel phases).

use super::decode::{common_v4, net_plugin, proxy_op, text};
use super::event::*;
use crate::raw::profiler::{self as raw, event as bit};

/// The v5/v6 API and schedule members (identical in both unions).
macro_rules! members_v5 {
    ($ty:expr, $u:expr) => {
        match $ty {
            bit::GROUP_API => Some(EventKind::GroupApi(GroupApi {
                graph_captured: $u.groupApi.graphCaptured != 0,
                group_depth: $u.groupApi.groupDepth,
            })),
            bit::COLL_API => {
                let c = &$u.collApi;
                Some(EventKind::CollApi(CollApi {
                    func: text(c.func),
                    count: c.count,
                    datatype: text(c.datatype),
                    root: c.root,
                    stream: c.stream as usize,
                    graph_captured: c.graphCaptured != 0,
                    user_tag: None,
                }))
            }
            bit::P2P_API => {
                let p = &$u.p2pApi;
                Some(EventKind::P2pApi(P2pApi {
                    func: text(p.func),
                    count: p.count,
                    datatype: text(p.datatype),
                    stream: p.stream as usize,
                    graph_captured: p.graphCaptured != 0,
                    user_tag: None,
                }))
            }
            bit::KERNEL_LAUNCH => Some(EventKind::KernelLaunch {
                stream: $u.kernelLaunch.stream as usize,
            }),
            bit::COLL => {
                let c = &$u.coll;
                Some(EventKind::Coll(Coll {
                    seq_number: c.seqNumber,
                    func: text(c.func),
                    send_buff: c.sendBuff as usize,
                    recv_buff: c.recvBuff as usize,
                    count: c.count,
                    root: c.root,
                    datatype: text(c.datatype),
                    n_channels: c.nChannels,
                    n_warps: c.nWarps,
                    algo: text(c.algo),
                    proto: text(c.proto),
                    comm_name: None,
                    comm_hash: None,
                    traffic_bytes: None,
                    red_op: None,
                    kernel_variant: None,
                    is_sym_coll: None,
                    user_tag: None,
                }))
            }
            bit::P2P => {
                let p = &$u.p2p;
                Some(EventKind::P2p(P2p {
                    func: text(p.func),
                    buff: p.buff as usize,
                    datatype: text(p.datatype),
                    count: p.count,
                    peer: p.peer,
                    n_channels: Some(p.nChannels),
                    comm_name: None,
                    comm_hash: None,
                    user_tag: None,
                }))
            }
            _ => None,
        }
    };
}

/// The v6+ copy-engine sync and batch members.
macro_rules! ce_members {
    ($ty:expr, $u:expr) => {
        match $ty {
            bit::CE_SYNC => Some(EventKind::CeSync {
                is_complete: $u.ceCollSync.isComplete != 0,
                n_ranks: $u.ceCollSync.nRanks,
            }),
            bit::CE_BATCH => Some(EventKind::CeBatch {
                num_ops: $u.ceCollBatch.numOps,
                total_bytes: $u.ceCollBatch.totalBytes,
                use_intra_sync: $u.ceCollBatch.useIntraSync != 0,
            }),
            _ => None,
        }
    };
}

/// Decodes a v5 descriptor.
///
/// # Safety
/// The member `type_` selects must be initialised, its strings valid for the
/// borrow, and a NetPlugin member's `data` must match its id.
pub unsafe fn event_v5(d: &raw::v5::ncclProfilerEventDescr_v5_t) -> Event<'_> {
    let ty = d.type_;
    // SAFETY: `type_` selects the member NCCL wrote (caller's contract).
    let kind = unsafe { common_v4!(ty, d.u).or_else(|| members_v5!(ty, d.u)) };
    Event {
        rank: d.rank,
        kind: kind.unwrap_or(EventKind::Unknown(ty)),
    }
}

/// Decodes a v6 descriptor.
///
/// # Safety
/// As [`event_v5`].
pub unsafe fn event_v6(d: &raw::v6::ncclProfilerEventDescr_v6_t) -> Event<'_> {
    let ty = d.type_;
    // SAFETY: `type_` selects the member NCCL wrote (caller's contract).
    let kind = unsafe {
        common_v4!(ty, d.u)
            .or_else(|| members_v5!(ty, d.u))
            .or(ce_members!(ty, d.u))
            .or_else(|| {
                (ty == bit::CE_COLL).then(|| {
                    let c = &d.u.ceColl;
                    EventKind::CeColl(CeColl {
                        seq_number: c.seqNumber,
                        func: text(c.func),
                        count: c.count,
                        root: c.root,
                        datatype: text(c.datatype),
                        sync_strategy: text(c.syncStrategy),
                        intra_batch_sync: c.intraBatchSync != 0,
                        batch_size: c.batchSize,
                        num_batches: c.numBatches,
                        ce_seq_num: c.ceSeqNum,
                        user_tag: None,
                    })
                })
            })
    };
    Event {
        rank: d.rank,
        kind: kind.unwrap_or(EventKind::Unknown(ty)),
    }
}

/// Decodes a v7 descriptor: the v6 members plus user tags, kernel variant and phases.
///
/// # Safety
/// As [`event_v5`].
pub unsafe fn event_v7(d: &raw::v7::ncclProfilerEventDescr_v7_t) -> Event<'_> {
    let ty = d.type_;
    // SAFETY: `type_` selects the member NCCL wrote (caller's contract).
    let kind = unsafe {
        let u = &d.u;
        common_v4!(ty, u).or(ce_members!(ty, u)).or_else(|| {
            Some(match ty {
                bit::GROUP_API => EventKind::GroupApi(GroupApi {
                    graph_captured: u.groupApi.graphCaptured != 0,
                    group_depth: u.groupApi.groupDepth,
                }),
                bit::COLL_API => EventKind::CollApi(CollApi {
                    func: text(u.collApi.func),
                    count: u.collApi.count,
                    datatype: text(u.collApi.datatype),
                    root: u.collApi.root,
                    stream: u.collApi.stream as usize,
                    graph_captured: u.collApi.graphCaptured != 0,
                    user_tag: Some(u.collApi.userTag),
                }),
                bit::P2P_API => EventKind::P2pApi(P2pApi {
                    func: text(u.p2pApi.func),
                    count: u.p2pApi.count,
                    datatype: text(u.p2pApi.datatype),
                    stream: u.p2pApi.stream as usize,
                    graph_captured: u.p2pApi.graphCaptured != 0,
                    user_tag: Some(u.p2pApi.userTag),
                }),
                bit::KERNEL_LAUNCH => EventKind::KernelLaunch {
                    stream: u.kernelLaunch.stream as usize,
                },
                bit::COLL => {
                    let c = &u.coll;
                    EventKind::Coll(Coll {
                        seq_number: c.seqNumber,
                        func: text(c.func),
                        send_buff: c.sendBuff as usize,
                        recv_buff: c.recvBuff as usize,
                        count: c.count,
                        root: c.root,
                        datatype: text(c.datatype),
                        n_channels: c.nChannels,
                        n_warps: c.nWarps,
                        algo: text(c.algo),
                        proto: text(c.proto),
                        comm_name: None,
                        comm_hash: None,
                        traffic_bytes: None,
                        red_op: None,
                        kernel_variant: text(c.kernelVariant),
                        is_sym_coll: Some(c.isSymColl != 0),
                        user_tag: Some(c.userTag),
                    })
                }
                bit::P2P => {
                    let p = &u.p2p;
                    EventKind::P2p(P2p {
                        func: text(p.func),
                        buff: p.buff as usize,
                        datatype: text(p.datatype),
                        count: p.count,
                        peer: p.peer,
                        n_channels: Some(p.nChannels),
                        comm_name: None,
                        comm_hash: None,
                        user_tag: Some(p.userTag),
                    })
                }
                bit::CE_COLL => {
                    let c = &u.ceColl;
                    EventKind::CeColl(CeColl {
                        seq_number: c.seqNumber,
                        func: text(c.func),
                        count: c.count,
                        root: c.root,
                        datatype: text(c.datatype),
                        sync_strategy: text(c.syncStrategy),
                        intra_batch_sync: c.intraBatchSync != 0,
                        batch_size: c.batchSize,
                        num_batches: c.numBatches,
                        ce_seq_num: c.ceSeqNum,
                        user_tag: Some(c.userTag),
                    })
                }
                bit::KERNEL_PHASE => EventKind::KernelPhase(KernelPhase {
                    channel_id: u.kernelPhase.channelId,
                    phase_id: u.kernelPhase.phaseId,
                    phase_name: text(u.kernelPhase.phaseName),
                    ptimer: u.kernelPhase.pTimer,
                }),
                other => EventKind::Unknown(other),
            })
        })
    };
    Event {
        rank: d.rank,
        kind: kind.unwrap_or(EventKind::Unknown(ty)),
    }
}
