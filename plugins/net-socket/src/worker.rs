//! Helper threads: each owns the data streams `id, id + nthreads, …` of its comm and
//! moves their chunks, in order, with non-blocking I/O.
//!
//! A thread with nothing to do sleeps in `poll()` on its doorbell only, so idle
//! comms cost no CPU. A stream whose socket is full (send) or empty (receive) is
//! added to the poll set; a stream that made progress is visited again at once.

use std::os::fd::AsRawFd;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::comm::{Core, Dir, Task};
use crate::sys;

/// Bytes a receiving thread reads per call when discarding a truncated message.
const DISCARD_CHUNK: usize = 64 * 1024;

/// The chunk a stream is working on and how far it got.
struct Current {
    task: Task,
    done: usize,
}

/// Thread body for helper `id` of `core`.
pub fn run(core: &Core, id: usize) {
    let outcome = catch_unwind(AssertUnwindSafe(|| Worker::new(core, id).run()));
    if outcome.is_err() {
        // A bug, not a peer problem; still fail the comm cleanly instead of hanging it.
        core.fail(format!("helper thread {id} panicked"));
        core.mark_quiesced();
    }
}

struct Worker<'a> {
    core: &'a Core,
    id: usize,
    /// Indices of the lanes this thread owns.
    lanes: Vec<usize>,
    current: Vec<Option<Current>>,
    fds: Vec<libc::pollfd>,
    scratch: Vec<u8>,
    quiesced: bool,
}

enum Step {
    /// Made progress; visit again.
    Progress,
    /// Socket not ready; poll it.
    Blocked,
    /// Nothing queued.
    Idle,
    /// The comm failed.
    Failed,
}

impl<'a> Worker<'a> {
    fn new(core: &'a Core, id: usize) -> Self {
        let nthreads = core.bells.len();
        let lanes: Vec<usize> = (id..core.lanes.len()).step_by(nthreads.max(1)).collect();
        let scratch = match core.dir {
            Dir::Recv => vec![0u8; DISCARD_CHUNK],
            Dir::Send => Vec::new(),
        };
        Self {
            core,
            id,
            current: lanes.iter().map(|_| None).collect(),
            fds: Vec::with_capacity(lanes.len() + 1),
            lanes,
            scratch,
            quiesced: false,
        }
    }

    fn run(&mut self) {
        let bell = self.core.bells[self.id].raw();
        loop {
            if self.core.stopping() {
                return;
            }
            if self.core.is_failed() {
                self.let_go();
                self.fds.clear();
                self.sleep(bell, -1);
                continue;
            }
            self.fds.clear();
            self.fds.push(sys::pollfd(bell, libc::POLLIN));
            let mut hot = false;
            for i in 0..self.lanes.len() {
                match self.step(i) {
                    Step::Progress => hot = true,
                    Step::Blocked => {
                        let fd = self.core.lanes[self.lanes[i]].sock.as_raw_fd();
                        let ev = match self.core.dir {
                            Dir::Send => libc::POLLOUT,
                            Dir::Recv => libc::POLLIN,
                        };
                        self.fds.push(sys::pollfd(fd, ev));
                    }
                    Step::Idle => {}
                    Step::Failed => break,
                }
            }
            if self.core.is_failed() {
                continue;
            }
            if hot {
                // Some stream moved data: go round again without a poll() call. New
                // work, a stop or a failure is seen at the top of the loop anyway.
                continue;
            }
            self.sleep(bell, -1);
        }
    }

    /// Waits for the doorbell or a polled socket, then clears the doorbell.
    fn sleep(&mut self, bell: i32, timeout_ms: i32) {
        if self.fds.is_empty() {
            self.fds.push(sys::pollfd(bell, libc::POLLIN));
        }
        match sys::poll(&mut self.fds, timeout_ms) {
            Ok(_) => {
                if self.fds[0].revents != 0 {
                    self.core.bells[self.id].drain();
                }
            }
            Err(e) => self
                .core
                .fail(format!("helper thread {}: poll failed: {e}", self.id)),
        }
        self.fds.clear();
    }

    /// After a failure: drop every chunk (NCCL takes the buffers back) and say so once.
    fn let_go(&mut self) {
        for c in &mut self.current {
            *c = None;
        }
        for &lane in &self.lanes {
            self.core.lanes[lane]
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
        if !self.quiesced {
            self.quiesced = true;
            self.core.mark_quiesced();
        }
    }

    /// One I/O call on lane `i`.
    fn step(&mut self, i: usize) -> Step {
        let lane_idx = self.lanes[i];
        let lane = &self.core.lanes[lane_idx];
        if self.current[i].is_none() {
            let next = lane
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            match next {
                Some(task) => self.current[i] = Some(Current { task, done: 0 }),
                None => return Step::Idle,
            }
        }
        let Some(cur) = self.current[i].as_mut() else {
            return Step::Idle;
        };
        let fd = lane.sock.as_raw_fd();
        let left = cur.task.len - cur.done;
        let result = match (self.core.dir, cur.task.slot.is_some()) {
            (Dir::Send, _) => {
                // SAFETY: the task's buffer is valid for `len` bytes until its request
                // completes, which needs this chunk to finish first.
                let src = unsafe { std::slice::from_raw_parts(cur.task.ptr.add(cur.done), left) };
                sys::send(fd, src)
            }
            (Dir::Recv, true) => {
                // SAFETY: as above; only this thread writes this chunk's bytes.
                unsafe { sys::recv_raw(fd, cur.task.ptr.add(cur.done), left) }
            }
            (Dir::Recv, false) => {
                let n = left.min(self.scratch.len());
                sys::recv(fd, &mut self.scratch[..n])
            }
        };
        match result {
            Ok(0) if left > 0 => {
                self.core.fail(format!(
                    "peer {} closed the connection (end of file on data stream {})",
                    self.core.peer,
                    lane_idx + 1
                ));
                Step::Failed
            }
            Ok(n) => {
                cur.done += n;
                if cur.done == cur.task.len {
                    if let Some(slot) = cur.task.slot {
                        slot.get().finish_part();
                    }
                    self.current[i] = None;
                }
                Step::Progress
            }
            Err(e) if sys::would_block(&e) => Step::Blocked,
            Err(e) => {
                let verb = match self.core.dir {
                    Dir::Send => "sending to",
                    Dir::Recv => "receiving from",
                };
                self.core.fail(format!(
                    "{verb} peer {} failed on data stream {}: {e}",
                    self.core.peer,
                    lane_idx + 1
                ));
                Step::Failed
            }
        }
    }
}
