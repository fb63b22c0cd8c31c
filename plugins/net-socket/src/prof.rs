//! Per-request network events for NCCL's profiler (net v10+): one NetPlugin event
//! per `isend`/`irecv`, described with NCCL's socket descriptor v1 (`fd`, `op` 0 =
//! send / 1 = receive, `length`), started when the request is posted and closed with
//! an update carrying the bytes that moved, then a stop, when it completes (or when
//! the request is released unfinished). Without a profiler nothing is stored and the
//! completion path reads one flag.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cclkit_abi::profiler::net::{NetEvent, RequestProfiler};
use cclkit_abi::raw::profiler::{
    NCCL_PROFILE_SOCKET, ncclProfilerNetSockDescr_v1_t, ncclProfilerNetSockSockDescr_v1_t,
};

/// `op` of a send in the socket descriptor.
pub const OP_SEND: i32 = 0;
/// `op` of a receive.
pub const OP_RECV: i32 = 1;

struct Open {
    prof: RequestProfiler,
    event: NetEvent,
    descr: ncclProfilerNetSockDescr_v1_t,
}

/// The open event of one request slot, if any.
#[derive(Default)]
pub struct ReqEvent {
    open: AtomicBool,
    slot: Mutex<Option<Open>>,
}

impl ReqEvent {
    /// Starts the request's event (a no-op when the request has no profiler, or the
    /// profiler declined: NULL handle).
    pub fn start(&self, prof: RequestProfiler, fd: i32, op: i32, length: usize) {
        if !prof.is_enabled() {
            return;
        }
        let mut descr = ncclProfilerNetSockDescr_v1_t {
            type_: NCCL_PROFILE_SOCKET,
            sock: ncclProfilerNetSockSockDescr_v1_t { fd, op, length },
        };
        // A failing profiler must not fail the transfer: the event is just dropped.
        let Ok(event) = prof.start(&mut descr) else {
            return;
        };
        if !event.is_active() {
            return;
        }
        let mut g = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        *g = Some(Open { prof, event, descr });
        self.open.store(true, Ordering::Release);
    }

    /// Closes the event: an update with `length` bytes moved, then a stop.
    pub fn end(&self, length: usize) {
        // A plain load first: without a profiler this runs twice per request.
        if !self.open.load(Ordering::Acquire) || !self.open.swap(false, Ordering::AcqRel) {
            return;
        }
        let taken = self.slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut o) = taken {
            o.descr.sock.length = length;
            let _ = o.prof.update(&mut o.event, &mut o.descr);
            let _ = o.prof.stop(o.event);
        }
    }
}
