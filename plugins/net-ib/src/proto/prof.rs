//! Per-request QP events for NCCL's profiler (net v10+), as NCCL's IB transport
//! reports them under `NCCL_ENABLE_NET_PROFILING`: one NetPlugin event per request
//! and per QP it uses, described with the IB descriptor v1 (`ncclProfileQp`:
//! `device` = the port's index in the virtual device, `wr_id`, `opcode`, `qpNum`,
//! `length`), started when the work request is posted and stopped when that QP's
//! completion for it is polled (`ncclIbMultiSend` / `ncclIbIrecv` start them,
//! `ncclIbTest` stops them). Sends report `IBV_WR_RDMA_WRITE_WITH_IMM` when the
//! immediate rides on the request's own data, else `IBV_WR_RDMA_WRITE`, and the
//! bytes that QP carries for the request; receives report the WRITE_WITH_IMM they
//! wait for and the bytes posted, one event per buffer of a grouped receive under
//! that buffer's `phandle`. Without a profiler (or a NULL `phandle`) nothing is
//! started and nothing is stored.

use cclkit_abi::profiler::net::{NetEvent, RequestProfiler};
use cclkit_abi::raw::profiler::{
    NCCL_PROFILE_QP, ncclProfilerNetIbDescr_v1_t, ncclProfilerNetIbQpDescr_v1_t,
};

/// What one QP event describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpWork {
    /// QP index in the connection.
    pub q: usize,
    /// Port index in the virtual device.
    pub device: usize,
    /// Work request id (the message's sequence number).
    pub wr_id: u64,
    /// `ibv_wr_opcode`.
    pub opcode: u32,
    /// QP number.
    pub qp_num: u32,
    /// Bytes.
    pub length: usize,
}

/// A started QP event of one request.
pub struct QpEvent {
    q: usize,
    prof: RequestProfiler,
    event: NetEvent,
}

/// The open QP events of one request.
#[derive(Default)]
pub struct ReqEvents {
    open: Vec<QpEvent>,
}

impl ReqEvents {
    /// Starts an event for `w` (nothing without a profiler or when it declines; a
    /// failing profiler never fails the transfer).
    pub fn start(&mut self, prof: RequestProfiler, w: QpWork) {
        if !prof.is_enabled() {
            return;
        }
        let mut descr = ncclProfilerNetIbDescr_v1_t {
            type_: NCCL_PROFILE_QP,
            qp: ncclProfilerNetIbQpDescr_v1_t {
                device: w.device as i32,
                wr_id: w.wr_id,
                opcode: w.opcode as i32,
                qpNum: w.qp_num as i32,
                length: w.length,
            },
        };
        if let Ok(event) = prof.start(&mut descr) {
            if event.is_active() {
                self.open.push(QpEvent {
                    q: w.q,
                    prof,
                    event,
                });
            }
        }
    }

    /// Stops the events on QP `q` (its completion was polled).
    pub fn stop_qp(&mut self, q: usize) {
        let mut i = 0;
        while i < self.open.len() {
            if self.open[i].q == q {
                let e = self.open.swap_remove(i);
                let _ = e.prof.stop(e.event);
            } else {
                i += 1;
            }
        }
    }

    /// Stops every open event (request done, failed or dropped).
    pub fn stop_all(&mut self) {
        for e in self.open.drain(..) {
            let _ = e.prof.stop(e.event);
        }
    }

    /// Events still open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// No events open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

impl Drop for ReqEvents {
    fn drop(&mut self) {
        self.stop_all();
    }
}
