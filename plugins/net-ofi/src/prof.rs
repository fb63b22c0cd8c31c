//! Per-request network events for NCCL's profiler (net v10+): one NetPlugin event
//! per `isend`/`irecv`, nested under the proxy step whose `phandle` came with it.
//!
//! NCCL's headers define descriptors for IB and sockets only; a libfabric request
//! is one tagged message on a connection, which is what the socket descriptor v1
//! (`fd`, `op` 0 = send / 1 = receive, `length`) says, so that layout is used, with
//! `fd` holding the plugin's connection id (what identifies the peer link here).
//! Every profiler that understands NCCL's socket events reads them unchanged.
//!
//! The protocol's states, in order:
//!
//! ```text
//! start(length posted) ─┬─ [backlogged: the provider said -FI_EAGAIN]
//!                       │     update(length) when the post reaches the provider
//!                       └─ update(bytes moved) at completion, then stop
//! ```
//!
//! A request released unfinished (comm closed) ends with 0 bytes moved. Without a
//! profiler nothing is stored and the completion path tests one `Option`.

use cclkit_abi::profiler::net::{NetEvent, RequestProfiler};
use cclkit_abi::raw::profiler::{
    NCCL_PROFILE_SOCKET, ncclProfilerNetSockDescr_v1_t, ncclProfilerNetSockSockDescr_v1_t,
};

/// `op` of a send in the descriptor.
pub const OP_SEND: i32 = 0;
/// `op` of a receive.
pub const OP_RECV: i32 = 1;

struct Open {
    prof: RequestProfiler,
    event: NetEvent,
    descr: ncclProfilerNetSockDescr_v1_t,
    /// The post still waits in the engine's backlog.
    backlogged: bool,
}

/// The open event of one request, if any (owned by the request).
#[derive(Default)]
pub struct ReqEvent(Option<Open>);

impl ReqEvent {
    /// Starts the event of a request just posted on connection `conn`: `length`
    /// bytes, `backlogged` when the provider could not take it yet. A no-op when the
    /// request has no profiler or the profiler declined (NULL handle).
    pub fn start(
        prof: RequestProfiler,
        conn: u64,
        op: i32,
        length: usize,
        backlogged: bool,
    ) -> Self {
        if !prof.is_enabled() {
            return Self(None);
        }
        let mut descr = ncclProfilerNetSockDescr_v1_t {
            type_: NCCL_PROFILE_SOCKET,
            sock: ncclProfilerNetSockSockDescr_v1_t {
                fd: i32::try_from(conn).unwrap_or(i32::MAX),
                op,
                length,
            },
        };
        // A failing profiler must not fail the transfer: the event is just dropped.
        match prof.start(&mut descr) {
            Ok(event) if event.is_active() => Self(Some(Open {
                prof,
                event,
                descr,
                backlogged,
            })),
            Ok(_) | Err(_) => Self(None),
        }
    }

    /// Whether the event waits for its post to leave the backlog (the caller then
    /// looks at the engine and calls [`posted`](Self::posted)).
    pub fn waits_in_backlog(&self) -> bool {
        self.0.as_ref().is_some_and(|o| o.backlogged)
    }

    /// The backlogged post reached the provider: an update with the posted length.
    pub fn posted(&mut self) {
        if let Some(o) = self.0.as_mut().filter(|o| o.backlogged) {
            o.backlogged = false;
            let _ = o.prof.update(&mut o.event, &mut o.descr);
        }
    }

    /// Closes the event: an update with `length` bytes moved, then a stop.
    pub fn end(&mut self, length: usize) {
        if let Some(mut o) = self.0.take() {
            o.descr.sock.length = length;
            let _ = o.prof.update(&mut o.event, &mut o.descr);
            let _ = o.prof.stop(o.event);
        }
    }
}

impl Drop for ReqEvent {
    fn drop(&mut self) {
        self.end(0);
    }
}
