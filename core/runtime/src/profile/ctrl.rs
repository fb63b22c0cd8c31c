//! ProxyCtrl events: what the proxy itself is doing, with no parent, as NCCL's
//! progress thread reports it (`src/proxy.cc`).
//!
//! | NCCL                                   | here                                          |
//! |----------------------------------------|-----------------------------------------------|
//! | `Append` … `AppendEnd(appended)` while new ops are taken from the pool | a batch is admitted (`appended`: its ProxyOps) |
//! | `Idle` / `Active`: a progress pass moved nothing / something after the opposite | the same, on the passes of the thread running a batch; a pass that ends a batch turns it `Idle` |
//! | `Sleep` … `Wakeup`: the thread waits for new ops | the background thread sleeps while no send is left in flight; one event spans the whole sleep |
//!
//! Each transition is its own short event (start, one state, stop), as in NCCL;
//! a sleep is one event from `Sleep` to `Wakeup`. Events start only once the proxy
//! has seen the communicator's profiler (its first batch), and only when the
//! profiler's mask asks for `ProxyCtrl`.

use std::sync::{Arc, OnceLock};

use cclkit_abi::profiler::{Event, EventKind, EventState, StateArgs};
use cclkit_abi::raw::profiler::ProfilerEventState as S;
use cclkit_host::profiler::{EventHandle, Parents, ProfilerContext};

use super::BatchEvents;

/// The ProxyCtrl side of one communicator's proxy.
#[derive(Default)]
pub(crate) struct Ctrl {
    ctx: OnceLock<Arc<ProfilerContext>>,
}

impl std::fmt::Debug for Ctrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ctrl(profiled: {})", self.ctx.get().is_some())
    }
}

/// An open ProxyCtrl event; stopped when dropped.
pub(crate) struct Open {
    ctx: Arc<ProfilerContext>,
    handle: EventHandle,
}

impl Open {
    fn start(ctx: &Arc<ProfilerContext>, first: S) -> Self {
        let handle = ctx.start(
            &Event {
                rank: ctx.rank(),
                kind: EventKind::ProxyCtrl,
            },
            Parents {
                parent: 0,
                group: 0,
            },
        );
        let o = Self {
            ctx: Arc::clone(ctx),
            handle,
        };
        o.record(first, StateArgs::None);
        o
    }

    fn record(&self, state: S, args: StateArgs) {
        self.ctx.record(self.handle, &EventState { state, args });
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.ctx.stop(self.handle);
    }
}

/// An `Append` in progress (a batch being admitted).
pub(crate) struct Append(Option<Open>);

impl Append {
    /// The batch is admitted with `appended` ProxyOps: `AppendEnd`, then stop.
    pub(crate) fn end(self, appended: usize) {
        if let Some(o) = &self.0 {
            let appended_proxy_ops = i32::try_from(appended).unwrap_or(i32::MAX);
            o.record(
                S::PROXY_CTRL_APPEND_END,
                StateArgs::ProxyCtrl { appended_proxy_ops },
            );
        }
    }
}

/// A sleep of the background thread: `Wakeup` and stop when dropped.
pub(crate) struct Sleep(Open);

impl Drop for Sleep {
    fn drop(&mut self) {
        self.0.record(S::PROXY_CTRL_WAKEUP, StateArgs::None);
    }
}

impl Ctrl {
    /// A batch is about to be admitted: learns the profiler from its events (the
    /// first time) and opens an `Append` event.
    pub(crate) fn append(&self, batch: Option<&BatchEvents>) -> Append {
        if let Some(b) = batch {
            let _ = self.ctx.get_or_init(|| b.ctx());
        }
        Append(self.ctx.get().map(|c| Open::start(c, S::PROXY_CTRL_APPEND)))
    }

    /// A progress pass changed the thread from active to idle (`idle`) or back.
    #[inline]
    pub(crate) fn transition(&self, idle: bool) {
        if let Some(c) = self.ctx.get() {
            let s = if idle {
                S::PROXY_CTRL_IDLE
            } else {
                S::PROXY_CTRL_ACTIVE
            };
            drop(Open::start(c, s));
        }
    }

    /// The background thread goes to sleep; `None` before the profiler is known.
    pub(crate) fn sleep(&self) -> Option<Sleep> {
        self.ctx
            .get()
            .map(|c| Sleep(Open::start(c, S::PROXY_CTRL_SLEEP)))
    }
}
