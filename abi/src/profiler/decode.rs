//! Decoding every descriptor version into [`Event`]: the one place the profiler SDK
//! reads NCCL's unions. The `type` field selects the member, as in NCCL's headers.

use std::ffi::{CStr, c_char};

use super::event::*;
use crate::raw::common::{Algorithm, DataType, Func, Protocol};
use crate::raw::profiler::{self as raw, event as bit};

/// Borrows a NUL-terminated string from NCCL; `None` for NULL or non-UTF-8.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string valid for `'a`.
pub(super) unsafe fn text<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

pub(super) fn proxy_op(p: &raw::ncclProfilerProxyOpDescr_v1_t) -> EventKind<'static> {
    EventKind::ProxyOp(ProxyOp {
        pid: p.pid,
        channel_id: p.channelId,
        peer: p.peer,
        n_steps: p.nSteps,
        chunk_size: p.chunkSize,
        is_send: p.isSend != 0,
    })
}

/// Decodes a net plugin's descriptor from its plugin id.
///
/// # Safety
/// `data` must be NULL or point to the descriptor the id names.
pub(super) unsafe fn net_plugin(p: &raw::ncclProfilerNetPluginDescr_v3_t) -> EventKind<'static> {
    let id = p.id as u32;
    let (kind, version) = (
        id & raw::NCCL_PROFILER_NET_TYPE_MASK,
        id & raw::NCCL_PROFILER_NET_VER_MASK,
    );
    let detail = if p.data.is_null() || version != 1 {
        None
    } else if kind == raw::NCCL_PROFILER_NET_TYPE_SOCK {
        // SAFETY: caller's contract: a socket v1 id names a socket v1 descriptor.
        let d = unsafe { &*p.data.cast::<raw::ncclProfilerNetSockDescr_v1_t>() };
        Some(NetDetail::Socket {
            fd: d.sock.fd,
            op: d.sock.op,
            length: d.sock.length,
        })
    } else if kind == raw::NCCL_PROFILER_NET_TYPE_IB {
        // SAFETY: as above for IB.
        let d = unsafe { &*p.data.cast::<raw::ncclProfilerNetIbDescr_v1_t>() };
        Some(NetDetail::IbQp {
            device: d.qp.device,
            wr_id: d.qp.wr_id,
            opcode: d.qp.opcode,
            qp_num: d.qp.qpNum,
            length: d.qp.length,
        })
    } else {
        None
    };
    EventKind::NetPlugin(NetPlugin { id: p.id, detail })
}

/// Decodes a v1 descriptor.
///
/// # Safety
/// The member `type_` selects must be initialised; its strings valid for `'a`.
pub unsafe fn event_v1(d: &raw::v1::ncclProfilerEventDescr_v1_t) -> Event<'_> {
    // SAFETY: `type_` selects the member NCCL wrote (caller's contract).
    let kind = unsafe {
        match u64::from(d.type_) {
            bit::GROUP => EventKind::Group,
            bit::COLL => {
                let c = &d.u.coll;
                EventKind::Coll(Coll {
                    seq_number: c.seqNumber,
                    func: Func(i32::from(c.func)).name(),
                    send_buff: c.sendBuff as usize,
                    recv_buff: c.recvBuff as usize,
                    count: c.count,
                    root: c.root,
                    datatype: DataType(i32::from(c.datatype)).name(),
                    n_channels: c.nMaxChannels,
                    n_warps: c.nWarps,
                    algo: Algorithm(i32::from(c.algo)).name(),
                    proto: Protocol(i32::from(c.proto)).name(),
                    comm_name: text(c.name),
                    comm_hash: Some(c.commHash),
                    traffic_bytes: Some(c.trafficBytes),
                    red_op: Some(c.op),
                    kernel_variant: None,
                    is_sym_coll: None,
                    user_tag: None,
                })
            }
            bit::P2P => {
                let p = &d.u.p2p;
                EventKind::P2p(P2p {
                    func: Func(i32::from(p.func)).name(),
                    buff: p.buff as usize,
                    datatype: DataType(i32::from(p.datatype)).name(),
                    count: p.count,
                    peer: p.peer,
                    n_channels: None,
                    comm_name: text(p.name),
                    comm_hash: Some(p.commHash),
                    user_tag: None,
                })
            }
            bit::PROXY_OP => proxy_op(&d.u.proxyOp),
            bit::PROXY_STEP => EventKind::ProxyStep {
                step: d.u.proxyStep.step,
            },
            bit::PROXY_CTRL => EventKind::ProxyCtrl,
            other => EventKind::Unknown(other),
        }
    };
    Event { rank: d.rank, kind }
}

/// The v2/v3 p2p member.
///
/// # Safety
/// Strings valid for `'a`.
unsafe fn p2p_v2(p: &raw::v2::ncclProfilerP2pDescr_v2_t) -> EventKind<'_> {
    // SAFETY: caller's contract.
    unsafe {
        EventKind::P2p(P2p {
            func: text(p.func),
            buff: p.buff as usize,
            datatype: text(p.datatype),
            count: p.count,
            peer: p.peer,
            n_channels: None,
            comm_name: text(p.name),
            comm_hash: Some(p.commHash),
            user_tag: None,
        })
    }
}

/// Decodes a v2 descriptor.
///
/// # Safety
/// As [`event_v1`].
pub unsafe fn event_v2(d: &raw::v2::ncclProfilerEventDescr_v2_t) -> Event<'_> {
    // SAFETY: `type_` selects the member NCCL wrote (caller's contract).
    let kind = unsafe {
        match u64::from(d.type_) {
            bit::GROUP => EventKind::Group,
            bit::COLL => {
                let c = &d.u.coll;
                EventKind::Coll(Coll {
                    seq_number: c.seqNumber,
                    func: text(c.func),
                    send_buff: c.sendBuff as usize,
                    recv_buff: c.recvBuff as usize,
                    count: c.count,
                    root: c.root,
                    datatype: text(c.datatype),
                    n_channels: c.nMaxChannels,
                    n_warps: c.nWarps,
                    algo: text(c.algo),
                    proto: text(c.proto),
                    comm_name: text(c.name),
                    comm_hash: Some(c.commHash),
                    traffic_bytes: Some(c.trafficBytes),
                    red_op: None,
                    kernel_variant: None,
                    is_sym_coll: None,
                    user_tag: None,
                })
            }
            bit::P2P => p2p_v2(&d.u.p2p),
            bit::PROXY_OP => proxy_op(&d.u.proxyOp),
            bit::PROXY_STEP => EventKind::ProxyStep {
                step: d.u.proxyStep.step,
            },
            bit::PROXY_CTRL => EventKind::ProxyCtrl,
            other => EventKind::Unknown(other),
        }
    };
    Event { rank: d.rank, kind }
}

/// Decodes a v3 descriptor.
///
/// # Safety
/// As [`event_v1`]; a NetPlugin member's `data` must match its id.
pub unsafe fn event_v3(d: &raw::v3::ncclProfilerEventDescr_v3_t) -> Event<'_> {
    // SAFETY: `type_` selects the member NCCL wrote (caller's contract).
    let kind = unsafe {
        match u64::from(d.type_) {
            bit::GROUP => EventKind::Group,
            bit::COLL => {
                let c = &d.u.coll;
                EventKind::Coll(Coll {
                    seq_number: c.seqNumber,
                    func: text(c.func),
                    send_buff: c.sendBuff as usize,
                    recv_buff: c.recvBuff as usize,
                    count: c.count,
                    root: c.root,
                    datatype: text(c.datatype),
                    n_channels: c.nMaxChannels,
                    n_warps: c.nWarps,
                    algo: text(c.algo),
                    proto: text(c.proto),
                    comm_name: text(c.name),
                    comm_hash: Some(c.commHash),
                    traffic_bytes: None,
                    red_op: None,
                    kernel_variant: None,
                    is_sym_coll: None,
                    user_tag: None,
                })
            }
            bit::P2P => p2p_v2(&d.u.p2p),
            bit::PROXY_OP => proxy_op(&d.u.proxyOp),
            bit::PROXY_STEP => EventKind::ProxyStep {
                step: d.u.proxyStep.step,
            },
            bit::PROXY_CTRL => EventKind::ProxyCtrl,
            bit::KERNEL_CH => EventKind::KernelCh {
                channel_id: d.u.kernelCh.channelId,
                ptimer: None,
            },
            bit::NET_PLUGIN => net_plugin(&d.u.netPlugin),
            other => EventKind::Unknown(other),
        }
    };
    Event { rank: d.rank, kind }
}

/// The members shared by v4 and later: proxy, kernel channel and net events. Used
/// inside `unsafe`: `$u` must be the union of a descriptor whose type is `$ty`.
macro_rules! common_v4 {
    ($ty:expr, $u:expr) => {
        match $ty {
            bit::GROUP => Some(EventKind::Group),
            bit::PROXY_OP => Some(proxy_op(&$u.proxyOp)),
            bit::PROXY_STEP => Some(EventKind::ProxyStep {
                step: $u.proxyStep.step,
            }),
            bit::PROXY_CTRL => Some(EventKind::ProxyCtrl),
            bit::KERNEL_CH => Some(EventKind::KernelCh {
                channel_id: $u.kernelCh.channelId,
                ptimer: Some($u.kernelCh.pTimer),
            }),
            bit::NET_PLUGIN => Some(net_plugin(&$u.netPlugin)),
            _ => None,
        }
    };
}
pub(super) use common_v4;

/// Decodes a v4 descriptor.
///
/// # Safety
/// As [`event_v3`].
pub unsafe fn event_v4(d: &raw::v4::ncclProfilerEventDescr_v4_t) -> Event<'_> {
    let ty = u64::from(d.type_);
    // SAFETY: `type_` selects the member NCCL wrote (caller's contract).
    let kind = unsafe {
        common_v4!(ty, d.u).unwrap_or_else(|| match ty {
            bit::COLL => {
                let c = &d.u.coll;
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
                    kernel_variant: None,
                    is_sym_coll: None,
                    user_tag: None,
                })
            }
            bit::P2P => {
                let p = &d.u.p2p;
                EventKind::P2p(P2p {
                    func: text(p.func),
                    buff: p.buff as usize,
                    datatype: text(p.datatype),
                    count: p.count,
                    peer: p.peer,
                    n_channels: Some(p.nChannels),
                    comm_name: None,
                    comm_hash: None,
                    user_tag: None,
                })
            }
            other => EventKind::Unknown(other),
        })
    };
    Event { rank: d.rank, kind }
}
