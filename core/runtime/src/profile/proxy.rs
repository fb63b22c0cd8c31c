//! ProxyOp and ProxyStep events of one batch.
//!
//! A ProxyOp is one operation's work on one channel (lane) towards one peer in one
//! direction, as NCCL's proxy sub-args; its steps are the slices that cross that
//! link (FIFO steps). A step event opens when the slice becomes the channel's next
//! one (send: `SendGPUWait` — waiting for the data to be produced; receive:
//! `RecvWait` — waiting for the peer's data) and closes when the engine processes the
//! slice (send: `SendWait`, the data is handed to the network; receive:
//! `RecvGPUWait`, the data is consumed), carrying the slice's bytes. A send step is
//! then handed to its FIFO slot ([`BatchEvents::hand_over_send`]), which stops it when
//! the send completes; the net plugin's events for that send nest under it.

use std::cell::RefCell;
use std::sync::Arc;

use cclkit_abi::profiler::{Event, EventKind, EventState, ProxyOp, StateArgs};
use cclkit_abi::raw::profiler::ProfilerEventState as S;
use cclkit_host::profiler::{EventHandle, Parents, ProfilerContext};

use crate::fifo::SlotStep;
use crate::proxy::Step;

struct Op {
    handle: EventHandle,
    is_send: bool,
    left: usize,
    next_step: i32,
}

/// Links of one primitive: (index into `ops`) per link.
struct PrimLinks {
    len: usize,
    ops: Vec<usize>,
}

struct Inner {
    ctx: Arc<ProfilerContext>,
    rank: i32,
    slice: usize,
    ops: Vec<Op>,
    prims: Vec<Vec<PrimLinks>>,
    /// Open step events per channel: (handle, op index, bytes).
    open: Vec<Vec<(EventHandle, usize, usize)>>,
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
                        });
                        keys.len() - 1
                    });
                    ops[i].left += n;
                    idx.push(i);
                }
                lane.push(PrimLinks {
                    len: st.prim.len,
                    ops: idx,
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
        }
        let mut inner = Inner {
            ctx: Arc::clone(ctx),
            rank,
            slice: slice.max(1),
            ops,
            open: vec![Vec::new(); prims.len()],
            prims,
        };
        for ch in 0..inner.prims.len() {
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
        g.open_steps(ch, pi, si);
    }
}

impl Inner {
    fn open_steps(&mut self, ch: usize, pi: usize, si: usize) {
        let Some(p) = self.prims.get(ch).and_then(|l| l.get(pi)) else {
            return;
        };
        let bytes = self.slice.min(p.len.saturating_sub(si * self.slice));
        let mut opened = Vec::with_capacity(p.ops.len());
        for &i in &p.ops {
            let op = &mut self.ops[i];
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
            let first = if op.is_send {
                S::PROXY_STEP_SEND_GPU_WAIT
            } else {
                S::PROXY_STEP_RECV_WAIT
            };
            self.ctx.record(h, &state(first, bytes));
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
            let last = if op.is_send {
                S::PROXY_STEP_SEND_WAIT
            } else {
                S::PROXY_STEP_RECV_GPU_WAIT
            };
            self.ctx.record(h, &state(last, bytes));
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
        for ch in 0..g.open.len() {
            for (h, _, _) in std::mem::take(&mut g.open[ch]) {
                g.ctx.stop(h);
            }
        }
        for op in &mut g.ops {
            g.ctx.stop(op.handle);
            op.handle = EventHandle::NULL;
        }
    }
}
