//! The `Profiler` trait plugin authors implement, with events as typed Rust values.
//!
//! One `impl Profiler` plus [`export_profiler!`](crate::export_profiler) publishes
//! `ncclProfiler_v1` … `_v7`. NCCL calls `init` once per communicator; each call
//! creates one `Self`. Events arrive as [`Event`] values decoded from whichever
//! descriptor version the host used (fields an older ABI lacks are `None`), and the
//! plugin answers with its own per-event value ([`Profiler::Event`]) or `None` to
//! decline the event: NCCL then gets a NULL handle, which it must (and does) tolerate.
//!
//! Handles given to NCCL are opaque tokens, never pointers: a stale, doubled or
//! foreign handle is reported as an error instead of touching freed memory, and the
//! number of events a context keeps is bounded by [`Profiler::MAX_EVENTS`].

use std::ffi::CStr;

use crate::error::Result;

mod decode;
mod decode_api;
mod event;
pub mod net;
mod state;

pub use event::*;
pub use state::*;

pub use decode::{event_v1, event_v2, event_v3, event_v4};
pub use decode_api::{event_v5, event_v6, event_v7};

/// A set of `ncclProfile*` event-type bits (see [`crate::raw::profiler::event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EventMask(pub u64);

impl EventMask {
    /// No events.
    pub const NONE: EventMask = EventMask(0);

    /// Whether every bit of `bits` is set.
    pub const fn contains(self, bits: u64) -> bool {
        self.0 & bits == bits
    }

    /// The mask with `bits` added.
    #[must_use]
    pub const fn with(self, bits: u64) -> Self {
        EventMask(self.0 | bits)
    }

    /// The bits a host of ABI `version` knows, keeping the rest out of NCCL's view.
    #[must_use]
    pub const fn for_version(self, version: u32) -> Self {
        EventMask(self.0 & crate::raw::profiler::event::known(version))
    }
}

impl std::ops::BitOr for EventMask {
    type Output = EventMask;
    fn bitor(self, rhs: Self) -> Self {
        EventMask(self.0 | rhs.0)
    }
}

/// What `init` receives; fields an older ABI lacks are `None`.
#[derive(Debug, Clone, Copy)]
pub struct ProfilerInit<'a> {
    /// Profiler ABI version the host called through (7 for NCCL 2.31).
    pub host_abi: u32,
    /// Communicator id (v5+) or hash (v4).
    pub comm_id: Option<u64>,
    /// User-assigned communicator name (v4+), `None` if unset or not UTF-8.
    pub comm_name: Option<&'a str>,
    /// Nodes in the communicator (v4+).
    pub n_nodes: Option<i32>,
    /// Ranks in the communicator (v4+).
    pub n_ranks: Option<i32>,
    /// This rank (v4+).
    pub rank: Option<i32>,
    /// The activation mask's value before this `init` (NCCL keeps one per process;
    /// the last `init` wins, so return the same mask every time).
    pub current_mask: EventMask,
}

/// A profiler, written once and exported as every profiler ABI version.
///
/// Every method may be called from several threads at once (NCCL's user threads,
/// proxy thread and net-plugin threads), hence `Sync`.
pub trait Profiler: Sized + Send + Sync + 'static {
    /// The profiler's name.
    const NAME: &'static CStr;
    /// Events one communicator keeps at most (live plus stopped-but-remembered, so a
    /// late child can still find its parent). When all are live, new events are
    /// declined (NULL handle) until some stop.
    const MAX_EVENTS: usize = 1 << 16;

    /// The plugin's record of one started event.
    type Event: Send + Sync + 'static;

    /// Creates the profiler of one communicator and says which events it wants.
    fn init(args: &ProfilerInit<'_>) -> Result<(Self, EventMask)>;

    /// Starts an event. `parent` is the parent's record when NCCL named a parent this
    /// profiler accepted and still remembers; `Ok(None)` declines the event.
    fn start_event(
        &self,
        event: &Event<'_>,
        parent: Option<&Self::Event>,
    ) -> Result<Option<Self::Event>>;

    /// Records a state transition of a started event.
    fn record_state(&self, event: &Self::Event, state: &EventState) -> Result<()> {
        let _ = (event, state);
        Ok(())
    }

    /// Stops an event. Its record stays reachable as a parent until the context
    /// needs the slot again.
    fn stop_event(&self, event: &Self::Event) -> Result<()> {
        let _ = event;
        Ok(())
    }

    /// Ends the communicator's profiling (flush output here).
    fn finalize(&self) -> Result<()> {
        Ok(())
    }
}
