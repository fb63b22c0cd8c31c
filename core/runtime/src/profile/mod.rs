//! Profiler events from the reference runtime, with NCCL's nesting and mask rules.
//!
//! ```text
//! GroupApi ─┬─ CollApi / P2pApi          (the user's calls; stopped when they return)
//!           ├─ KernelLaunch              one per batch handed to the engine (v5+)
//!           └─ (states GroupStartApiStop, GroupEndApiStart)
//! Group ──── Coll / P2p  (parentObj = CollApi / P2pApi from v5, the Group before;
//!                         parentGroup = Group)
//!              ├─ KernelCh     one per channel the operation runs on, host-clock
//!              │               start and KernelChStop times (v3+; proxy.rs)
//!              └─ ProxyOp      one per channel, peer and direction of an operation
//!                   └─ ProxyStep   one per slice (a FIFO step) on that link, with
//!                                  its step states; net-plugin events nest here
//!                                  (send steps: proxy; receive steps: recv)
//! ProxyCtrl                     the proxy's own activity, no parent (ctrl)
//! ```
//!
//! The profiler is loaded once per process, as NCCL loads it
//! (`NCCL_PROFILER_PLUGIN`, [`cclkit_host::profiler`]), and initialised per
//! communicator with the activation mask it returns. Without a profiler every hook is
//! one `Option` test. A NULL handle (masked out, declined, pool full) is legal
//! everywhere: children then get a NULL parent and stopping it is a no-op.
//!
//! Event lifetimes differ from NCCL's in one way, because this runtime's operations
//! block: a Coll/P2p event ends when its work is complete, not when it is enqueued.
//! v7's KernelPhase events (a GPU kernel's sync and compute phases) are not sent:
//! the engine has no such phases to time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cclkit_host::profiler::{InitArgs, ProfilerContext, ProfilerPlugin};

mod api;
mod ctrl;
mod proxy;
mod recv;

pub(crate) use api::{CollInfo, GroupEvents, p2p_events};
pub(crate) use ctrl::Ctrl;
pub(crate) use proxy::BatchEvents;
pub(crate) use recv::{RecvRun, RecvSlots};

/// The process's profiler (NCCL loads one, once).
static PLUGIN: OnceLock<Option<ProfilerPlugin>> = OnceLock::new();

fn plugin() -> Option<&'static ProfilerPlugin> {
    PLUGIN
        .get_or_init(|| match ProfilerPlugin::from_env() {
            Ok(p) => {
                cclkit_host::profiler::callback::install(&p);
                Some(p)
            }
            Err(cclkit_host::profiler::LoadOutcome::NotFound(_))
                if cclkit_host::env::process_env()
                    .get(cclkit_host::profiler::ENV)
                    .is_none() =>
            {
                None
            }
            Err(e) => {
                tracing::warn!(target: "cclkit::profiler", "{e}; continuing without a profiler");
                None
            }
        })
        .as_ref()
}

/// Loads the process's profiler (once) so that net plugins initialised after this
/// get its callback (net `init` v10+), as NCCL loads the profiler before the network.
pub(crate) fn preload() {
    let _ = plugin();
}

/// One communicator's profiler state.
#[derive(Debug, Default)]
pub(crate) struct Profile {
    ctx: Option<Arc<ProfilerContext>>,
    /// Per-function sequence numbers (`Coll.seqNumber`), indexed by `ncclFunc_t`.
    seq: [AtomicU64; 16],
}

impl Profile {
    /// Loads (once per process) and initialises the profiler for a communicator; a
    /// profiler that fails `init` is reported and left out, as NCCL does.
    pub(crate) fn init(comm_id: u64, n_nodes: usize, n_ranks: usize, rank: usize) -> Self {
        let Some(p) = plugin() else {
            return Self::default();
        };
        let args = InitArgs {
            comm_id,
            comm_name: None,
            n_nodes: i32::try_from(n_nodes).unwrap_or(i32::MAX),
            n_ranks: i32::try_from(n_ranks).unwrap_or(i32::MAX),
            rank: i32::try_from(rank).unwrap_or(i32::MAX),
        };
        match ProfilerContext::init(p, &args) {
            Ok(c) => Self {
                ctx: Some(Arc::new(c)),
                ..Self::default()
            },
            Err(e) => {
                tracing::warn!(target: "cclkit::profiler", "rank {rank}: {e}; continuing without a profiler");
                Self::default()
            }
        }
    }

    /// The profiler context, `None` when none is loaded (the only test on hot paths).
    #[inline]
    pub(crate) fn ctx(&self) -> Option<&Arc<ProfilerContext>> {
        self.ctx.as_ref()
    }

    /// The next sequence number of function `func`.
    pub(crate) fn next_seq(&self, func: i32) -> u64 {
        let i = usize::try_from(func).unwrap_or(0).min(self.seq.len() - 1);
        self.seq[i].fetch_add(1, Ordering::Relaxed)
    }
}
