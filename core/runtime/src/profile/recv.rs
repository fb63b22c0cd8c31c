//! Receive-side ProxyStep events, which live in the receive FIFO's slots.
//!
//! NCCL (`src/transport/net.cc`, receive proxy) starts a receive step right before
//! the `irecv` that covers it, so the net plugin's events for that receive have a
//! parent, and walks it through its states as the FIFO does:
//!
//! ```text
//! start ── irecv posted ── test() done ── flushed ── consumed by the kernel ── stop
//!          RecvWait        RecvFlushWait  RecvGPUWait
//! ```
//!
//! `RecvFlushWait` is recorded even when no flush is needed (NCCL does too), so the
//! state sequence of a receive step is always the same three states. Each state
//! carries the slice's data bytes, as send steps do (NCCL puts the size `test()`
//! reported there; the net plugin's own event carries that). A receive
//! ProxyOp ends when its last step ends; the steps decide, not the batch, because a
//! slot may still hold a step when the batch is torn down on an error.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cclkit_abi::profiler::{Event, EventKind, EventState, StateArgs};
use cclkit_abi::raw::profiler::ProfilerEventState as S;
use cclkit_host::profiler::callback::StepHandle;
use cclkit_host::profiler::{EventHandle, Parents, ProfilerContext};

/// One receive ProxyOp, shared by the batch (until every step started) and by the
/// FIFO slots holding its steps.
pub(crate) struct RecvOp {
    ctx: Arc<ProfilerContext>,
    rank: i32,
    /// The op's event (a raw handle; 0 once stopped).
    handle: AtomicUsize,
    /// Steps not started yet plus steps started and not stopped: the op stops when
    /// this reaches zero.
    pending: AtomicUsize,
    /// Steps not started yet.
    unstarted: AtomicUsize,
}

impl RecvOp {
    /// Takes over ProxyOp `handle`, which has `steps` receive steps.
    pub(crate) fn new(
        ctx: &Arc<ProfilerContext>,
        rank: i32,
        handle: EventHandle,
        steps: usize,
    ) -> Arc<Self> {
        let op = Arc::new(Self {
            ctx: Arc::clone(ctx),
            rank,
            handle: AtomicUsize::new(handle.0),
            pending: AtomicUsize::new(steps),
            unstarted: AtomicUsize::new(steps),
        });
        if steps == 0 {
            op.stop();
        }
        op
    }

    fn stop(&self) {
        let h = self.handle.swap(0, Ordering::AcqRel);
        self.ctx.stop(EventHandle(h));
    }

    fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        let before = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                Some(p.saturating_sub(n))
            })
            .unwrap_or(0);
        if before <= n {
            self.stop();
        }
    }

    /// The batch is gone: steps that never started will not, so they no longer
    /// hold the op open.
    pub(crate) fn abandon(&self) {
        let n = self.unstarted.swap(0, Ordering::AcqRel);
        self.release(n);
    }
}

/// The receive steps of one primitive's slices on one link, announced with the
/// slices the receive FIFO is to expect.
#[derive(Clone)]
pub(crate) struct RecvRun {
    op: Arc<RecvOp>,
    /// Step number of the primitive's first slice within its op.
    first: i32,
    /// The primitive's data bytes and the data bytes per slice.
    len: usize,
    slice: usize,
}

impl std::fmt::Debug for RecvRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecvRun(first step {})", self.first)
    }
}

impl RecvRun {
    /// The steps of a primitive of `len` data bytes cut into `slice`-byte slices,
    /// the first being step `first` of `op`.
    pub(crate) fn new(op: &Arc<RecvOp>, first: i32, len: usize, slice: usize) -> Self {
        Self {
            op: Arc::clone(op),
            first,
            len,
            slice: slice.max(1),
        }
    }

    /// Data bytes of slice `j`.
    fn bytes(&self, j: usize) -> usize {
        self.slice
            .min(self.len.saturating_sub(j.saturating_mul(self.slice)))
    }
}

/// A receive step held by the FIFO slot its data lands in. Its [`StepHandle`] is the
/// `phandle` of the slot's `irecv`, so the slot must not be reused (and this must not
/// move) until the request completed; dropping it stops the step.
pub(crate) struct SlotRecv {
    handle: StepHandle,
    op: Arc<RecvOp>,
    /// Whether this step counts in the op's `pending` (false for a step that
    /// started after its batch was torn down: it has no event).
    counted: bool,
    /// The slice's data bytes.
    bytes: usize,
}

impl SlotRecv {
    /// Starts slice `j`'s step of `run` (before its `irecv` is posted).
    pub(crate) fn start(run: &RecvRun, j: usize) -> Self {
        let op = &run.op;
        let counted = op
            .unstarted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_sub(1))
            .is_ok();
        let step = if counted {
            let parent = op.handle.load(Ordering::Acquire);
            let n = run
                .first
                .saturating_add(i32::try_from(j).unwrap_or(i32::MAX));
            op.ctx.start(
                &Event {
                    rank: op.rank,
                    kind: EventKind::ProxyStep { step: n },
                },
                Parents { parent, group: 0 },
            )
        } else {
            EventHandle::NULL
        };
        Self {
            handle: StepHandle::new(&op.ctx, step),
            op: Arc::clone(op),
            counted,
            bytes: run.bytes(j),
        }
    }

    /// The `phandle` for the slot's `irecv` (NULL when the step has no event).
    pub(crate) fn phandle(&mut self) -> *mut c_void {
        self.handle.as_phandle()
    }

    fn record(&self, s: S) {
        let st = EventState {
            state: s,
            args: StateArgs::ProxyStep {
                trans_size: self.bytes,
            },
        };
        self.op.ctx.record(self.handle.step(), &st);
    }
}

impl Drop for SlotRecv {
    fn drop(&mut self) {
        self.op.ctx.stop(self.handle.step());
        if self.counted {
            self.op.release(1);
        }
    }
}

/// The receive steps of one receive FIFO, by slot (slot = sequence % slots).
pub(crate) struct RecvSlots(Box<[Option<SlotRecv>]>);

impl RecvSlots {
    /// `slots` empty slots.
    pub(crate) fn new(slots: usize) -> Self {
        Self((0..slots).map(|_| None).collect())
    }

    fn at(&mut self, seq: u64) -> Option<&mut Option<SlotRecv>> {
        let n = self.0.len() as u64;
        if n == 0 {
            return None;
        }
        self.0.get_mut((seq % n) as usize)
    }

    fn each(&self, seq: u64, k: usize, f: impl Fn(&SlotRecv)) {
        let n = self.0.len() as u64;
        for j in 0..k as u64 {
            if let Some(Some(s)) = self.0.get(((seq + j) % n.max(1)) as usize) {
                f(s);
            }
        }
    }

    /// Starts the steps of the `k` slices about to be posted into the slots from
    /// sequence `seq` (slice `first` of `run` onwards); a step already started by
    /// a post the plugin deferred (`*request == NULL`) is kept. Returns their
    /// `phandle`s, empty without a profiler (then `irecv` gets NULLs).
    pub(crate) fn start(
        &mut self,
        run: Option<&RecvRun>,
        seq: u64,
        first: usize,
        k: usize,
    ) -> Vec<*mut c_void> {
        let Some(run) = run else {
            return Vec::new();
        };
        let mut phs = Vec::with_capacity(k);
        for j in 0..k {
            if let Some(s) = self.at(seq + j as u64) {
                phs.push(
                    s.get_or_insert_with(|| SlotRecv::start(run, first + j))
                        .phandle(),
                );
            }
        }
        phs
    }

    /// The `irecv` for the `k` slots from `seq` was accepted: they wait for the
    /// peer's data (`RecvWait`).
    pub(crate) fn posted(&self, seq: u64, k: usize) {
        self.each(seq, k, |s| s.record(S::PROXY_STEP_RECV_WAIT));
    }

    /// `test()` reported slot `seq` received: a flush, if any, comes next
    /// (`RecvFlushWait`).
    pub(crate) fn received(&self, seq: u64) {
        self.each(seq, 1, |s| s.record(S::PROXY_STEP_RECV_FLUSH_WAIT));
    }

    /// Slot `seq`'s data is visible to the kernel, flushed if needed: it waits to be
    /// consumed (`RecvGPUWait`).
    pub(crate) fn flushed(&self, seq: u64) {
        self.each(seq, 1, |s| s.record(S::PROXY_STEP_RECV_GPU_WAIT));
    }

    /// The kernel consumed slot `seq`: its step ends.
    pub(crate) fn consumed(&mut self, seq: u64) {
        if let Some(s) = self.at(seq) {
            *s = None;
        }
    }
}
