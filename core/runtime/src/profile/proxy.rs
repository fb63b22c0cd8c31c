//! ProxyOp and ProxyStep events of one batch.
//!
//! A ProxyOp is one operation's work on one channel (lane) towards one peer in one
//! direction, as NCCL's proxy sub-args; its steps are the slices that cross that
//! link (FIFO steps). A send step event opens when the slice becomes the channel's
//! next one (`SendGPUWait` — waiting for the data to be produced), is handed to its
//! FIFO slot when the engine processes the slice (`SendWait`, the data is handed to
//! the network; [`BatchEvents::hand_over_send`]), and the slot stops it when the send
//! completes. A receive step opens when its `irecv` is posted, as NCCL's does: the
//! batch only announces which op and step number each expected slice belongs to
//! ([`BatchEvents::recv_run`]); the receive FIFO does the rest ([`super::recv`]).
//! Either way the net plugin's events for the request nest under its step.
//!
//! Next to its ProxyOps, each operation's work on a channel is one `KernelCh` event
//! under the operation's Coll/P2p (v3+): NCCL's proxy starts it with the kernel's
//! start time on that channel and records `KernelChStop` with its end time before
//! stopping it. Here the "kernel" on a channel is the engine working through that
//! operation's primitives there, and the timer is the host's clock in nanoseconds.

use std::cell::RefCell;
use std::sync::Arc;

use cclkit_abi::profiler::{Event, EventKind, EventState, ProxyOp, StateArgs};
use cclkit_abi::raw::profiler::ProfilerEventState as S;
use cclkit_host::profiler::{EventHandle, Parents, ProfilerContext};

use super::recv::{RecvOp, RecvRun};
use crate::fifo::SlotStep;
use crate::proxy::Step;

struct Op {
    /// The send op's event (receive ops hand theirs to `recv`).
    handle: EventHandle,
    is_send: bool,
    left: usize,
    next_step: i32,
    recv: Option<Arc<RecvOp>>,
}

/// Links of one primitive: (index into `ops`) per link, send links first.
struct PrimLinks {
    len: usize,
    ops: Vec<usize>,
    /// Per receive link: its op and the step number of the primitive's first slice.
    recv_first: Vec<(usize, i32)>,
}

/// One operation's consecutive primitives on one channel: one KernelCh event.
struct KernelRun {
    /// The operation's Coll/P2p event (the KernelCh's parent).
    task: EventHandle,
    first: usize,
    last: usize,
}

struct Inner {
    ctx: Arc<ProfilerContext>,
    rank: i32,
    slice: usize,
    ops: Vec<Op>,
    prims: Vec<Vec<PrimLinks>>,
    /// Open step events per channel: (handle, op index, bytes).
    open: Vec<Vec<(EventHandle, usize, usize)>>,
    /// Per channel: the operations' runs of primitives, in order.
    runs: Vec<Vec<KernelRun>>,
    /// Per channel: the open KernelCh event and its run.
    kernel: Vec<Option<(EventHandle, usize)>>,
}

/// The "GPU timer" of KernelCh events: the host's clock, in ns since the epoch
/// (NCCL's `globaltimer` counts ns too).
fn timer_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The runs of consecutive primitives of one operation on a channel.
fn kernel_runs(steps: &[Step], tasks: &[EventHandle]) -> Vec<KernelRun> {
    let mut runs: Vec<(usize, KernelRun)> = Vec::new();
    for (pi, st) in steps.iter().enumerate() {
        match runs.last_mut() {
            Some((op, run)) if *op == st.op => run.last = pi,
            _ => runs.push((
                st.op,
                KernelRun {
                    task: tasks.get(st.op).copied().unwrap_or(EventHandle::NULL),
                    first: pi,
                    last: pi,
                },
            )),
        }
    }
    runs.into_iter().map(|(_, r)| r).collect()
}

/// The proxy events of one batch; stops whatever is still open when dropped.
pub(crate) struct BatchEvents {
    inner: RefCell<Inner>,
}

impl std::fmt::Debug for BatchEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BatchEvents")
    }
}

fn state(s: S, bytes: usize) -> EventState {
    EventState {
        state: s,
        args: StateArgs::ProxyStep { trans_size: bytes },
    }
}

impl BatchEvents {
    /// Starts the ProxyOps of a batch: `tasks[i]` is the Coll/P2p event of
    /// operation `i` (NULL or missing: no parent).
    pub(crate) fn new(
        ctx: &Arc<ProfilerContext>,
        rank: usize,
        channels: &[Vec<Step>],
        tasks: &[EventHandle],
        slice: usize,
    ) -> Self {
        let rank = i32::try_from(rank).unwrap_or(-1);
        let pid = i32::try_from(std::process::id()).unwrap_or(0);
        let mut keys: Vec<(usize, usize, usize, bool)> = Vec::new();
        let mut ops: Vec<Op> = Vec::new();
        let mut prims = Vec::with_capacity(channels.len());
        for (ch, steps) in channels.iter().enumerate() {
            let mut lane = Vec::with_capacity(steps.len());
            for st in steps {
                let n = st.prim.len.div_ceil(slice.max(1));
                let mut idx = Vec::new();
                let mut recv_first = Vec::new();
                let links = st.prim.send.iter().map(|l| (l, true));
                for (l, is_send) in links.chain(st.prim.recv.iter().map(|l| (l, false))) {
                    let key = (ch, st.op, l.peer, is_send);
                    let i = keys.iter().position(|k| *k == key).unwrap_or_else(|| {
                        keys.push(key);
                        ops.push(Op {
                            handle: EventHandle::NULL,
                            is_send,
                            left: 0,
                            next_step: 0,
                            recv: None,
                        });
                        keys.len() - 1
                    });
                    if !is_send {
                        recv_first.push((i, i32::try_from(ops[i].left).unwrap_or(i32::MAX)));
                    }
                    ops[i].left += n;
                    idx.push(i);
                }
                lane.push(PrimLinks {
                    len: st.prim.len,
                    ops: idx,
                    recv_first,
                });
            }
            prims.push(lane);
        }
        for (op, &(ch, task, peer, is_send)) in ops.iter_mut().zip(&keys) {
            let kind = EventKind::ProxyOp(ProxyOp {
                pid,
                channel_id: u8::try_from(ch).unwrap_or(u8::MAX),
                peer: i32::try_from(peer).unwrap_or(-1),
                n_steps: i32::try_from(op.left).unwrap_or(i32::MAX),
                chunk_size: i32::try_from(slice).unwrap_or(i32::MAX),
                is_send,
            });
            let parent = tasks.get(task).copied().unwrap_or(EventHandle::NULL);
            op.handle = ctx.start(
                &Event { rank, kind },
                Parents {
                    parent: parent.0,
                    group: 0,
                },
            );
            let st = EventState {
                state: S::PROXY_OP_IN_PROGRESS,
                args: StateArgs::None,
            };
            ctx.record(op.handle, &st);
            if !is_send {
                let h = std::mem::replace(&mut op.handle, EventHandle::NULL);
                op.recv = Some(RecvOp::new(ctx, rank, h, op.left));
            }
        }
        let mut inner = Inner {
            ctx: Arc::clone(ctx),
            rank,
            slice: slice.max(1),
            ops,
            open: vec![Vec::new(); prims.len()],
            prims,
            runs: channels.iter().map(|c| kernel_runs(c, tasks)).collect(),
            kernel: (0..channels.len()).map(|_| None).collect(),
        };
        for ch in 0..inner.prims.len() {
            inner.follow_kernel(ch, 0);
            inner.open_steps(ch, 0, 0);
        }
        Self {
            inner: RefCell::new(inner),
        }
    }

    /// Hands the open step of send link `k` of channel `ch`'s current slice over to
    /// the FIFO slot its data was put in: the step now waits on the network
    /// (`SendWait`) and the slot stops it when the send completes, so the net
    /// plugin's events for that send nest under it. `None` when it has no event.
    pub(crate) fn hand_over_send(&self, ch: usize, k: usize) -> Option<SlotStep> {
        let mut g = self.inner.borrow_mut();
        let g = &mut *g;
        // Open steps list a primitive's send links first, in link order.
        let (h, i, bytes) = g.open.get_mut(ch)?.get_mut(k)?;
        let op = g.ops.get_mut(*i)?;
        if h.is_null() || !op.is_send {
            return None;
        }
        // Sends on one link complete in order, so the op's last step ends last: the
        // op goes with it (`close_steps` then stops a NULL handle).
        let op_h = if op.left == 1 {
            std::mem::replace(&mut op.handle, EventHandle::NULL)
        } else {
            EventHandle::NULL
        };
        let h = std::mem::replace(h, EventHandle::NULL);
        g.ctx.record(h, &state(S::PROXY_STEP_SEND_WAIT, *bytes));
        Some(SlotStep::new(Arc::clone(&g.ctx), h, op_h))
    }

    /// The communicator's profiler context.
    pub(crate) fn ctx(&self) -> Arc<ProfilerContext> {
        Arc::clone(&self.inner.borrow().ctx)
    }

    /// ProxyOps of the batch (what a ProxyCtrl `AppendEnd` reports).
    pub(crate) fn proxy_ops(&self) -> usize {
        self.inner.borrow().ops.len()
    }

    /// The receive steps of primitive `pi` of channel `ch` on its receive link `k`
    /// (in link order), for the receive FIFO to start as it posts their `irecv`s.
    pub(crate) fn recv_run(&self, ch: usize, pi: usize, k: usize) -> Option<RecvRun> {
        let g = self.inner.borrow();
        let p = g.prims.get(ch)?.get(pi)?;
        let &(i, first) = p.recv_first.get(k)?;
        Some(RecvRun::new(
            g.ops.get(i)?.recv.as_ref()?,
            first,
            p.len,
            g.slice,
        ))
    }

    /// The engine processed slice `si` of primitive `pi` on channel `ch`.
    pub(crate) fn slice_done(&self, ch: usize, pi: usize, si: usize) {
        let mut g = self.inner.borrow_mut();
        g.close_steps(ch);
        let n = g
            .prims
            .get(ch)
            .and_then(|l| l.get(pi))
            .map_or(0, |p| p.len.div_ceil(g.slice));
        let (pi, si) = if si + 1 >= n {
            (pi + 1, 0)
        } else {
            (pi, si + 1)
        };
        g.follow_kernel(ch, pi);
        g.open_steps(ch, pi, si);
    }
}

impl Inner {
    /// Channel `ch` is at primitive `pi`: stops the KernelCh of a run it left and
    /// starts the one of the run it entered.
    fn follow_kernel(&mut self, ch: usize, pi: usize) {
        let Some(runs) = self.runs.get(ch) else {
            return;
        };
        // Runs are in primitive order: the first one not ended before `pi`.
        let next = runs.partition_point(|r| r.last < pi);
        let here = runs.get(next).filter(|r| r.first <= pi).map(|_| next);
        let task = here.map_or(EventHandle::NULL, |r| runs[r].task);
        let open = self.kernel.get(ch).copied().flatten();
        if open.is_some_and(|(_, run)| Some(run) != here) {
            self.stop_kernel(ch);
        }
        let (Some(run), None) = (here, self.kernel[ch]) else {
            return;
        };
        let kind = EventKind::KernelCh {
            channel_id: u8::try_from(ch).unwrap_or(u8::MAX),
            ptimer: Some(timer_ns()),
        };
        let h = self.ctx.start(
            &Event {
                rank: self.rank,
                kind,
            },
            Parents {
                parent: task.0,
                group: 0,
            },
        );
        self.kernel[ch] = Some((h, run));
    }

    /// Records `KernelChStop` with the end time on channel `ch`'s open KernelCh and
    /// stops it.
    fn stop_kernel(&mut self, ch: usize) {
        let Some((h, _)) = self.kernel.get_mut(ch).and_then(Option::take) else {
            return;
        };
        let st = EventState {
            state: S::KERNEL_CH_STOP,
            args: StateArgs::Timer { ptimer: timer_ns() },
        };
        self.ctx.record(h, &st);
        self.ctx.stop(h);
    }

    fn open_steps(&mut self, ch: usize, pi: usize, si: usize) {
        let Some(p) = self.prims.get(ch).and_then(|l| l.get(pi)) else {
            return;
        };
        let bytes = self.slice.min(p.len.saturating_sub(si * self.slice));
        let mut opened = Vec::with_capacity(p.ops.len());
        for &i in &p.ops {
            let op = &mut self.ops[i];
            // Receive steps are started by the receive FIFO (`recv_run`).
            if !op.is_send {
                continue;
            }
            let kind = EventKind::ProxyStep { step: op.next_step };
            op.next_step += 1;
            let h = self.ctx.start(
                &Event {
                    rank: self.rank,
                    kind,
                },
                Parents {
                    parent: op.handle.0,
                    group: 0,
                },
            );
            self.ctx
                .record(h, &state(S::PROXY_STEP_SEND_GPU_WAIT, bytes));
            opened.push((h, i, bytes));
        }
        self.open[ch] = opened;
    }

    fn close_steps(&mut self, ch: usize) {
        let Some(open) = self.open.get_mut(ch) else {
            return;
        };
        for (h, i, bytes) in std::mem::take(open) {
            let op = &mut self.ops[i];
            // A step still here was not handed over (no event, or a failure).
            self.ctx.record(h, &state(S::PROXY_STEP_SEND_WAIT, bytes));
            self.ctx.stop(h);
            op.left = op.left.saturating_sub(1);
            if op.left == 0 {
                self.ctx.stop(op.handle);
                op.handle = EventHandle::NULL;
            }
        }
    }
}

impl Drop for BatchEvents {
    fn drop(&mut self) {
        let g = self.inner.get_mut();
        for ch in 0..g.kernel.len() {
            g.stop_kernel(ch);
        }
        for ch in 0..g.open.len() {
            for (h, _, _) in std::mem::take(&mut g.open[ch]) {
                g.ctx.stop(h);
            }
        }
        for op in &mut g.ops {
            g.ctx.stop(op.handle);
            op.handle = EventHandle::NULL;
            if let Some(r) = &op.recv {
                r.abandon();
            }
        }
    }
}
