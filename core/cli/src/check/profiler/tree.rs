//! Drives a profiler as NCCL does: one collective's and one p2p's event tree with
//! NCCL's parents, state sequences and stop order, and a report of what the
//! profiler accepted. Every call is watched: a call that returns an error fails the
//! check and names the call, the event type and the state.

use std::collections::BTreeMap;
use std::ffi::c_void;

use cclkit_abi::profiler::{
    CeColl, Coll, CollApi, Event, EventKind, EventState, GroupApi, KernelPhase, P2p, P2pApi,
    ProxyOp, StateArgs,
};
use cclkit_abi::raw::profiler::ProfilerEventState as S;
use cclkit_abi::raw::profiler::{
    NCCL_PROFILE_QP, NCCL_PROFILE_SOCKET, ncclProfilerNetIbDescr_v1_t,
    ncclProfilerNetIbQpDescr_v1_t, ncclProfilerNetSockDescr_v1_t,
    ncclProfilerNetSockSockDescr_v1_t,
};
use cclkit_host::profiler::{EventHandle, Parents, ProfilerContext};

use super::super::{Stop, fail};
use cclkit_abi::profiler::net::NetDescriptor;

/// What a run of the driver saw, per event type: (accepted, declined with NULL).
pub(crate) type Tally = BTreeMap<&'static str, (usize, usize)>;

/// The driver of one profiler context.
pub(crate) struct Driver<'a> {
    ctx: &'a ProfilerContext,
    rank: i32,
    /// Parents are withheld (NULL) everywhere: what a profiler sees when NCCL's
    /// parent event was declined or masked out.
    orphan: bool,
    pub(crate) tally: Tally,
}

/// The send and receive step states of v4+ (NCCL 2.26+ `src/transport/net.cc`).
const SEND_STEP: [S; 3] = [
    S::PROXY_STEP_SEND_GPU_WAIT,
    S::PROXY_STEP_SEND_PEER_WAIT,
    S::PROXY_STEP_SEND_WAIT,
];
const RECV_STEP: [S; 3] = [
    S::PROXY_STEP_RECV_WAIT,
    S::PROXY_STEP_RECV_FLUSH_WAIT,
    S::PROXY_STEP_RECV_GPU_WAIT,
];
/// ProxyOp states of v1–v3 (retired in v4 for `ProxyOpInProgress`).
const SEND_OP_V1: [S; 4] = [
    S::PROXY_OP_SEND_POSTED,
    S::PROXY_OP_SEND_REM_FIFO_WAIT,
    S::PROXY_OP_SEND_TRANSMITTED,
    S::PROXY_OP_SEND_DONE,
];
const RECV_OP_V1: [S; 4] = [
    S::PROXY_OP_RECV_POSTED,
    S::PROXY_OP_RECV_RECEIVED,
    S::PROXY_OP_RECV_TRANSMITTED,
    S::PROXY_OP_RECV_DONE,
];

impl<'a> Driver<'a> {
    /// A driver of `ctx`; `orphan` withholds every parent.
    pub(crate) fn new(ctx: &'a ProfilerContext, orphan: bool) -> Self {
        Self {
            ctx,
            rank: ctx.rank(),
            orphan,
            tally: Tally::new(),
        }
    }

    fn watch(&self, before: u64, what: impl FnOnce() -> String) -> Result<(), Stop> {
        if self.ctx.errors() > before {
            return fail!("{} returned an error (NCCL drops the event)", what());
        }
        Ok(())
    }

    fn parents(&self, parent: EventHandle, group: EventHandle) -> Parents {
        if self.orphan {
            Parents {
                parent: 0,
                group: 0,
            }
        } else {
            Parents {
                parent: parent.0,
                group: group.0,
            }
        }
    }

    /// `startEvent`; a NULL handle (declined on purpose) is counted, not an error.
    pub(crate) fn start(
        &mut self,
        kind: EventKind<'_>,
        parent: EventHandle,
        group: EventHandle,
    ) -> Result<EventHandle, Stop> {
        let name = kind.name();
        super::super::child::step(format!("startEvent({name})"));
        let before = self.ctx.errors();
        let ev = Event {
            rank: self.rank,
            kind,
        };
        let h = self.ctx.start(&ev, self.parents(parent, group));
        self.watch(before, || format!("startEvent({name})"))?;
        let e = self.tally.entry(name).or_default();
        if h.is_null() {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
        Ok(h)
    }

    /// `recordEventState` (nothing on a NULL handle, as NCCL).
    pub(crate) fn record(
        &mut self,
        h: EventHandle,
        what: &str,
        state: S,
        args: StateArgs,
    ) -> Result<(), Stop> {
        if h.is_null() {
            return Ok(());
        }
        super::super::child::step(format!("recordEventState({what}, {state})"));
        let before = self.ctx.errors();
        self.ctx.record(h, &EventState { state, args });
        self.watch(before, || format!("recordEventState({what}, {state})"))
    }

    /// `stopEvent` (nothing on a NULL handle, as NCCL).
    pub(crate) fn stop(&mut self, h: EventHandle, what: &str) -> Result<(), Stop> {
        if h.is_null() {
            return Ok(());
        }
        super::super::child::step(format!("stopEvent({what})"));
        let before = self.ctx.errors();
        self.ctx.stop(h);
        self.watch(before, || format!("stopEvent({what})"))
    }

    /// A net plugin's event under `step` through NCCL's callback path: start with
    /// the descriptor, an update, a stop (v3+; NULL parent when `step` was declined).
    fn net<D: NetDescriptor>(&mut self, step: EventHandle, descr: &mut D) -> Result<(), Stop> {
        super::super::child::step("startEvent(NetPlugin)");
        let before = self.ctx.errors();
        let parent = if self.orphan { EventHandle::NULL } else { step };
        let h = self
            .ctx
            .start_net(parent, D::PLUGIN_ID, (descr as *mut D).cast::<c_void>());
        self.watch(before, || "startEvent(NetPlugin)".to_owned())?;
        let e = self.tally.entry("NetPlugin").or_default();
        if h.is_null() {
            e.1 += 1;
            return Ok(());
        }
        e.0 += 1;
        let data = (descr as *mut D).cast::<c_void>();
        self.record(
            h,
            "NetPlugin",
            S::NET_PLUGIN_UPDATE,
            StateArgs::NetPlugin {
                data: data as usize,
            },
        )?;
        self.stop(h, "NetPlugin")
    }

    /// One ProxyOp with `steps` steps, each with its states and a net event.
    fn proxy_op(
        &mut self,
        version: u32,
        task: EventHandle,
        peer: i32,
        is_send: bool,
        steps: i32,
        bytes: usize,
    ) -> Result<(), Stop> {
        let op = self.start(
            EventKind::ProxyOp(ProxyOp {
                pid: i32::try_from(std::process::id()).unwrap_or(0),
                channel_id: 0,
                peer,
                n_steps: steps,
                chunk_size: i32::try_from(bytes).unwrap_or(i32::MAX),
                is_send,
            }),
            task,
            EventHandle::NULL,
        )?;
        if version <= 3 {
            let states = if is_send { SEND_OP_V1 } else { RECV_OP_V1 };
            for (i, s) in states.into_iter().enumerate() {
                let args = StateArgs::ProxyOp {
                    trans_size: bytes * i / 3,
                    steps: i32::try_from(i).unwrap_or(0),
                };
                self.record(op, "ProxyOp", s, args)?;
            }
        } else {
            self.record(op, "ProxyOp", S::PROXY_OP_IN_PROGRESS, StateArgs::None)?;
        }
        for n in 0..steps {
            let step = self.start(EventKind::ProxyStep { step: n }, op, EventHandle::NULL)?;
            let states = if is_send { SEND_STEP } else { RECV_STEP };
            for s in states {
                let args = StateArgs::ProxyStep { trans_size: bytes };
                self.record(step, "ProxyStep", s, args)?;
            }
            if version >= 3 {
                let mut sock = ncclProfilerNetSockDescr_v1_t {
                    type_: NCCL_PROFILE_SOCKET,
                    sock: ncclProfilerNetSockSockDescr_v1_t {
                        fd: 7,
                        op: i32::from(!is_send),
                        length: bytes,
                    },
                };
                self.net(step, &mut sock)?;
                let mut ib = ncclProfilerNetIbDescr_v1_t {
                    type_: NCCL_PROFILE_QP,
                    qp: ncclProfilerNetIbQpDescr_v1_t {
                        device: 0,
                        wr_id: u64::try_from(n).unwrap_or(0),
                        opcode: if is_send { 0 } else { 128 },
                        qpNum: 0x11,
                        length: bytes,
                    },
                };
                self.net(step, &mut ib)?;
            }
            self.stop(step, "ProxyStep")?;
        }
        self.stop(op, "ProxyOp")
    }

    /// ProxyCtrl events as NCCL's progress thread emits them (`src/proxy.cc`).
    pub(crate) fn proxy_ctrl(&mut self) -> Result<(), Stop> {
        let none = EventHandle::NULL;
        let h = self.start(EventKind::ProxyCtrl, none, none)?;
        self.record(h, "ProxyCtrl", S::PROXY_CTRL_APPEND, StateArgs::None)?;
        let appended = StateArgs::ProxyCtrl {
            appended_proxy_ops: 2,
        };
        self.record(h, "ProxyCtrl", S::PROXY_CTRL_APPEND_END, appended)?;
        self.stop(h, "ProxyCtrl")?;
        for s in [S::PROXY_CTRL_ACTIVE, S::PROXY_CTRL_IDLE] {
            let h = self.start(EventKind::ProxyCtrl, none, none)?;
            self.record(h, "ProxyCtrl", s, StateArgs::None)?;
            self.stop(h, "ProxyCtrl")?;
        }
        let h = self.start(EventKind::ProxyCtrl, none, none)?;
        self.record(h, "ProxyCtrl", S::PROXY_CTRL_SLEEP, StateArgs::None)?;
        self.record(h, "ProxyCtrl", S::PROXY_CTRL_WAKEUP, StateArgs::None)?;
        self.stop(h, "ProxyCtrl")
    }

    /// One grouped AllReduce plus a Send, with NCCL's event tree for `version`:
    /// API events (v5+) stop when the calls return, before the tasks they parent;
    /// tasks stop after their proxy ops; children always name their parent.
    pub(crate) fn collective(&mut self, version: u32, seq: u64, bytes: usize) -> Result<(), Stop> {
        let none = EventHandle::NULL;
        let count = bytes / 4;
        let group_api = self.start(
            EventKind::GroupApi(GroupApi {
                graph_captured: false,
                group_depth: 1,
            }),
            none,
            none,
        )?;
        self.record(
            group_api,
            "GroupApi",
            S::GROUP_START_API_STOP,
            StateArgs::None,
        )?;
        let coll_api = self.start(
            EventKind::CollApi(CollApi {
                func: Some("AllReduce"),
                count,
                datatype: Some("ncclFloat32"),
                root: -1,
                stream: 0x1000,
                graph_captured: false,
                user_tag: Some(seq),
            }),
            group_api,
            none,
        )?;
        self.stop(coll_api, "CollApi")?;
        let p2p_api = self.start(
            EventKind::P2pApi(P2pApi {
                func: Some("Send"),
                count,
                datatype: Some("ncclFloat32"),
                stream: 0x1000,
                graph_captured: false,
                user_tag: None,
            }),
            group_api,
            none,
        )?;
        self.stop(p2p_api, "P2pApi")?;
        self.record(
            group_api,
            "GroupApi",
            S::GROUP_END_API_START,
            StateArgs::None,
        )?;
        let launch = self.start(EventKind::KernelLaunch { stream: 0x1000 }, group_api, none)?;
        self.stop(launch, "KernelLaunch")?;
        self.stop(group_api, "GroupApi")?;

        let group = self.start(EventKind::Group, none, none)?;
        // v5+: a task's parent is its API event, the Group its parentGroup.
        let (coll_parent, p2p_parent) = if version >= 5 {
            (coll_api, p2p_api)
        } else {
            (group, group)
        };
        let coll = self.start(EventKind::Coll(coll_desc(seq, count)), coll_parent, group)?;
        let p2p = self.start(EventKind::P2p(p2p_desc(count)), p2p_parent, group)?;
        let ch = self.start(
            EventKind::KernelCh {
                channel_id: 0,
                ptimer: Some(1_000),
            },
            coll,
            none,
        )?;
        self.proxy_op(version, coll, 1, true, 2, bytes / 2)?;
        self.proxy_op(version, coll, 1, false, 2, bytes / 2)?;
        self.proxy_op(version, p2p, 1, true, 1, bytes)?;
        if version >= 7 {
            self.kernel_phases(ch, 0, 1_000)?;
        }
        let end = StateArgs::Timer { ptimer: 4_000 };
        self.record(ch, "KernelCh", S::KERNEL_CH_STOP, end)?;
        self.stop(ch, "KernelCh")?;
        self.stop(p2p, "P2p")?;
        self.stop(coll, "Coll")?;
        self.stop(group, "Group")?;
        if version >= 6 {
            self.ce_collective(seq, count)?;
        }
        Ok(())
    }

    /// v7: the phases of one channel's kernel, as NCCL's profiler thread fires them
    /// once the kernel completed, before `KernelChStop` (`src/misc/profiler.cc`):
    /// each starts with its first GPU timestamp, records `KernelPhaseStop` with the
    /// next one and stops; the parent is the KernelCh (NULL when it was declined).
    fn kernel_phases(&mut self, ch: EventHandle, channel_id: u8, t0: u64) -> Result<(), Stop> {
        for (i, name) in ["initial_sync", "compute", "final_sync"]
            .into_iter()
            .enumerate()
        {
            let id = u8::try_from(i).unwrap_or(0);
            let ptimer = t0 + 1_000 * u64::from(id);
            let phase = self.start(
                EventKind::KernelPhase(KernelPhase {
                    channel_id,
                    phase_id: id,
                    phase_name: Some(name),
                    ptimer,
                }),
                ch,
                EventHandle::NULL,
            )?;
            let end = StateArgs::Timer {
                ptimer: ptimer + 1_000,
            };
            self.record(phase, "KernelPhase", S::KERNEL_PHASE_STOP, end)?;
            self.stop(phase, "KernelPhase")?;
        }
        Ok(())
    }

    /// v6+: a copy-engine AllGather in its own group, as `src/misc/profiler.cc`
    /// emits it: the CeColl's parent is the CollApi event; CeSync and CeBatch are
    /// children of the CeColl and only sent when it was accepted (never with a NULL
    /// parent); no CE event records a state; children stop before the CeColl.
    fn ce_collective(&mut self, seq: u64, count: usize) -> Result<(), Stop> {
        let none = EventHandle::NULL;
        let group_api = self.start(
            EventKind::GroupApi(GroupApi {
                graph_captured: false,
                group_depth: 1,
            }),
            none,
            none,
        )?;
        let coll_api = self.start(
            EventKind::CollApi(CollApi {
                func: Some("AllGather"),
                count,
                datatype: Some("ncclBfloat16"),
                root: 0,
                stream: 0x2000,
                graph_captured: false,
                user_tag: Some(seq + 100),
            }),
            group_api,
            none,
        )?;
        self.stop(coll_api, "CollApi")?;
        self.record(
            group_api,
            "GroupApi",
            S::GROUP_END_API_START,
            StateArgs::None,
        )?;
        let ce = self.start(
            EventKind::CeColl(CeColl {
                seq_number: seq,
                func: Some("AllGather"),
                count,
                root: 0,
                datatype: Some("ncclBfloat16"),
                sync_strategy: Some("UC"),
                intra_batch_sync: false,
                batch_size: 0,
                num_batches: 0,
                ce_seq_num: u32::try_from(seq).unwrap_or(u32::MAX),
                user_tag: Some(seq + 100),
            }),
            coll_api,
            none,
        )?;
        // NCCL checks `ceCollProfHandle` before each child; an orphan run withholds
        // parents, and NCCL never sends a CE child without one.
        if !ce.is_null() && !self.orphan {
            let sync = EventKind::CeSync {
                is_complete: false,
                n_ranks: 2,
            };
            let h = self.start(sync, ce, none)?;
            self.stop(h, "CeSync")?;
            let batch = EventKind::CeBatch {
                num_ops: 2,
                total_bytes: count * 2,
                use_intra_sync: false,
            };
            let h = self.start(batch, ce, none)?;
            self.stop(h, "CeBatch")?;
            let h = self.start(sync, ce, none)?;
            self.stop(h, "CeSync")?;
        }
        self.stop(ce, "CeColl")?;
        self.stop(group_api, "GroupApi")
    }
}

fn coll_desc(seq: u64, count: usize) -> Coll<'static> {
    Coll {
        seq_number: seq,
        func: Some("AllReduce"),
        send_buff: 0x7f00_0000_1000,
        recv_buff: 0x7f00_0000_9000,
        count,
        root: -1,
        datatype: Some("ncclFloat32"),
        n_channels: 1,
        n_warps: 16,
        algo: Some("RING"),
        proto: Some("SIMPLE"),
        comm_name: Some("cclkit-check"),
        comm_hash: Some(0x5eed),
        traffic_bytes: Some(count * 8),
        red_op: Some(0),
        kernel_variant: None,
        is_sym_coll: Some(false),
        user_tag: Some(seq),
    }
}

fn p2p_desc(count: usize) -> P2p<'static> {
    P2p {
        func: Some("Send"),
        buff: 0x7f00_0001_0000,
        datatype: Some("ncclFloat32"),
        count,
        peer: 1,
        n_channels: Some(1),
        comm_name: Some("cclkit-check"),
        comm_hash: Some(0x5eed),
        user_tag: None,
    }
}

/// "Coll 3, ProxyStep 10 (2 declined)" for a check's message.
pub(crate) fn summary(t: &Tally) -> String {
    let parts: Vec<String> = t
        .iter()
        .map(|(k, (ok, null))| {
            if *null > 0 {
                format!("{k} {ok} ({null} NULL)")
            } else {
                format!("{k} {ok}")
            }
        })
        .collect();
    if parts.is_empty() {
        "no event started".into()
    } else {
        parts.join(", ")
    }
}
