//! Group, API and task events (GroupApi, CollApi, P2pApi, Group, Coll, P2p) of one
//! group call, stopped in reverse order when the group is dropped (on every path,
//! errors included, so starts and stops always pair).

use cclkit_abi::profiler::{Coll, CollApi, Event, EventKind, GroupApi, P2p, P2pApi};
use cclkit_abi::profiler::{EventState, StateArgs};
use cclkit_abi::raw::common::{DataType, Func};
use cclkit_abi::raw::profiler::ProfilerEventState;
use cclkit_host::profiler::{EventHandle, Parents, ProfilerContext};

/// What a Coll event says about how the collective runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CollInfo {
    pub seq: u64,
    pub send: usize,
    pub recv: usize,
    pub root: i32,
    pub channels: u8,
    pub algo: Option<&'static str>,
    pub proto: Option<&'static str>,
}

impl CollInfo {
    /// The Coll description of a planned collective (takes its sequence number).
    pub(crate) fn of(
        comm: &crate::Comm,
        func: Func,
        bufs: &crate::op::UserBufs,
        root: usize,
        dec: &crate::tune::Decision,
    ) -> Self {
        Self {
            seq: comm.profile().next_seq(func.0),
            send: bufs.send as usize,
            recv: bufs.recv as usize,
            root: i32::try_from(root).unwrap_or(-1),
            channels: u8::try_from(dec.channels).unwrap_or(u8::MAX),
            algo: dec.algo.name(),
            proto: dec.proto.name(),
        }
    }
}

struct Task {
    func: Func,
    count: usize,
    dtype: DataType,
    api: EventHandle,
    task: EventHandle,
}

/// The events of one group (`ncclGroupStart` … `ncclGroupEnd`, or one implicit call).
pub(crate) struct GroupEvents<'p> {
    ctx: &'p ProfilerContext,
    rank: i32,
    group_api: EventHandle,
    group: EventHandle,
    tasks: Vec<Task>,
}

fn name_of_func(f: Func) -> Option<&'static str> {
    f.name()
}

impl<'p> GroupEvents<'p> {
    /// Starts the GroupApi event (the user's outermost group).
    pub(crate) fn begin(ctx: &'p ProfilerContext, rank: usize) -> Self {
        let rank = i32::try_from(rank).unwrap_or(-1);
        let kind = EventKind::GroupApi(GroupApi {
            graph_captured: false,
            group_depth: 1,
        });
        let group_api = ctx.start(&Event { rank, kind }, Parents::default());
        Self {
            ctx,
            rank,
            group_api,
            group: EventHandle::NULL,
            tasks: Vec::new(),
        }
    }

    fn ev<'a>(&self, kind: EventKind<'a>) -> Event<'a> {
        Event {
            rank: self.rank,
            kind,
        }
    }

    /// One collective call (CollApi, started and stopped: the call returned);
    /// returns its task index.
    pub(crate) fn coll_api(
        &mut self,
        func: Func,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> usize {
        let kind = EventKind::CollApi(CollApi {
            func: name_of_func(func),
            count,
            datatype: dtype.name(),
            root: i32::try_from(root).unwrap_or(-1),
            stream: 0,
            graph_captured: false,
            user_tag: None,
        });
        let api = self.ctx.start(&self.ev(kind), self.under_api());
        self.ctx.stop(api);
        self.push(func, count, dtype, api)
    }

    /// One send or receive call (P2pApi); returns its task index.
    pub(crate) fn p2p_api(&mut self, func: Func, count: usize) -> usize {
        let kind = EventKind::P2pApi(P2pApi {
            func: name_of_func(func),
            count,
            datatype: DataType::INT8.name(),
            stream: 0,
            graph_captured: false,
            user_tag: None,
        });
        let api = self.ctx.start(&self.ev(kind), self.under_api());
        self.ctx.stop(api);
        self.push(func, count, DataType::INT8, api)
    }

    fn under_api(&self) -> Parents {
        Parents {
            parent: self.group_api.0,
            group: 0,
        }
    }

    fn push(&mut self, func: Func, count: usize, dtype: DataType, api: EventHandle) -> usize {
        self.tasks.push(Task {
            func,
            count,
            dtype,
            api,
            task: EventHandle::NULL,
        });
        self.tasks.len() - 1
    }

    /// `ncclGroupEnd`: the API part is over and the work starts (Group event).
    pub(crate) fn enqueue(&mut self) {
        for s in [
            ProfilerEventState::GROUP_START_API_STOP,
            ProfilerEventState::GROUP_END_API_START,
        ] {
            let st = EventState {
                state: s,
                args: StateArgs::None,
            };
            self.ctx.record(self.group_api, &st);
        }
        self.group = self
            .ctx
            .start(&self.ev(EventKind::Group), Parents::default());
    }

    /// A kernel launch (v5+ `KernelLaunch`, under the GroupApi): NCCL starts it
    /// before `cuLaunchKernel` and stops it right after, once per plan it launches,
    /// after the plan's task events started. Here the "kernel" is the batch handed to
    /// the engine; the stream is the default stream (0).
    pub(crate) fn launch(&self) {
        let h = self.ctx.start(
            &self.ev(EventKind::KernelLaunch { stream: 0 }),
            self.under_api(),
        );
        self.ctx.stop(h);
    }

    /// The parents of a task: its API event from v5 (NCCL's hierarchy), the Group
    /// before; `parentGroup` is the Group either way.
    fn task_parents(&self, api: EventHandle) -> Parents {
        let parent = if self.ctx.plugin().version() >= 5 {
            api
        } else {
            self.group
        };
        Parents {
            parent: parent.0,
            group: self.group.0,
        }
    }

    /// Starts the Coll event of task `i`; its handle parents the ProxyOps.
    pub(crate) fn coll(&mut self, i: usize, info: CollInfo) -> EventHandle {
        let Some(t) = self.tasks.get(i) else {
            return EventHandle::NULL;
        };
        let kind = EventKind::Coll(Coll {
            seq_number: info.seq,
            func: name_of_func(t.func),
            send_buff: info.send,
            recv_buff: info.recv,
            count: t.count,
            root: info.root,
            datatype: t.dtype.name(),
            n_channels: info.channels,
            n_warps: 0,
            algo: info.algo,
            proto: info.proto,
            comm_name: None,
            comm_hash: Some(self.ctx.comm_id()),
            traffic_bytes: None,
            red_op: None,
            kernel_variant: None,
            is_sym_coll: None,
            user_tag: None,
        });
        let h = self.ctx.start(&self.ev(kind), self.task_parents(t.api));
        self.tasks[i].task = h;
        h
    }

    /// Starts the P2p event of task `i`.
    pub(crate) fn p2p(&mut self, i: usize, peer: usize, buff: usize) -> EventHandle {
        let Some(t) = self.tasks.get(i) else {
            return EventHandle::NULL;
        };
        let kind = EventKind::P2p(P2p {
            func: name_of_func(t.func),
            buff,
            datatype: t.dtype.name(),
            count: t.count,
            peer: i32::try_from(peer).unwrap_or(-1),
            n_channels: Some(1),
            comm_name: None,
            comm_hash: Some(self.ctx.comm_id()),
            user_tag: None,
        });
        let h = self.ctx.start(&self.ev(kind), self.task_parents(t.api));
        self.tasks[i].task = h;
        h
    }
}

impl Drop for GroupEvents<'_> {
    fn drop(&mut self) {
        for t in &self.tasks {
            self.ctx.stop(t.task);
        }
        self.ctx.stop(self.group);
        self.ctx.stop(self.group_api);
    }
}

/// The events of a point-to-point group: `items` are the calls in order as
/// (is_send, peer, bytes, buffer address). Returns the group and each plan's P2p
/// event in the order `p2p::Group::run` builds plans: pairs of a send to self and a
/// receive from self first (one local copy each, under the send's event), then the
/// other calls in order.
pub(crate) fn p2p_events<'p>(
    ctx: &'p ProfilerContext,
    me: usize,
    items: &[(bool, usize, usize, usize)],
) -> (GroupEvents<'p>, Vec<EventHandle>) {
    let mut g = GroupEvents::begin(ctx, me);
    let idx: Vec<usize> = items
        .iter()
        .map(|&(send, _, bytes, _)| g.p2p_api(if send { Func::SEND } else { Func::RECV }, bytes))
        .collect();
    g.enqueue();
    let task: Vec<EventHandle> = items
        .iter()
        .zip(&idx)
        .map(|(&(_, peer, _, buff), &i)| g.p2p(i, peer, buff))
        .collect();
    let self_sends = items.iter().enumerate().filter(|(_, x)| x.0 && x.1 == me);
    let mut tasks: Vec<EventHandle> = self_sends.map(|(i, _)| task[i]).collect();
    tasks.extend(
        items
            .iter()
            .enumerate()
            .filter(|(_, x)| x.1 != me)
            .map(|(i, _)| task[i]),
    );
    (g, tasks)
}
