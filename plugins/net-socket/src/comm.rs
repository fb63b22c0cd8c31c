//! One connection's state shared by the proxy thread and the comm's helper threads,
//! and the comm object NCCL holds (which owns and joins those threads).
//!
//! Failure protocol: the first error (a peer that closed or reset, a protocol
//! violation) is recorded once with a message naming the peer, every helper thread
//! is woken, drops its queued work and reports itself quiesced. Only then does
//! `test` return the error for the comm's pending requests, so no helper thread can
//! touch a buffer or slot NCCL has taken back.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use cclkit_abi::{Error, Result};

use crate::recv::RecvCtl;
use crate::send::SendCtl;
use crate::slots::{Pool, SlotPtr};
use crate::sys::EventFd;
use crate::worker;

/// Which way data flows on a comm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Send comm: helper threads write.
    Send,
    /// Receive comm: helper threads read.
    Recv,
}

/// A piece of work for a data stream: write or read `len` bytes at `ptr`.
pub struct Task {
    /// Request to complete when done; `None` = discard the bytes (truncated message).
    pub slot: Option<SlotPtr>,
    /// Source (send) or destination (receive); unused for a discard.
    pub ptr: *mut u8,
    /// Bytes.
    pub len: usize,
}

// SAFETY: `ptr` is NCCL's buffer, valid and untouched by NCCL until the request
// completes; only the one helper thread owning the stream accesses it meanwhile.
unsafe impl Send for Task {}

/// A data stream: its socket and the chunks waiting for it, in message order.
pub struct Lane {
    /// The TCP connection (non-blocking).
    pub sock: TcpStream,
    /// Chunks not yet started by the helper thread.
    pub queue: Mutex<VecDeque<Task>>,
}

/// The proxy-thread side of a comm: control stream state machines.
pub enum Control {
    /// Send comm.
    Send(SendCtl),
    /// Receive comm.
    Recv(RecvCtl),
}

/// Everything a comm's threads share.
pub struct Core {
    /// Request slots.
    pub pool: Pool,
    /// Peer address for messages.
    pub peer: String,
    /// Data streams.
    pub lanes: Box<[Lane]>,
    /// One doorbell per helper thread.
    pub bells: Box<[EventFd]>,
    /// Direction.
    pub dir: Dir,
    control: Mutex<Control>,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    quiesced: AtomicUsize,
    stop: AtomicBool,
}

/// What the comm's health is.
pub enum Health {
    /// Working.
    Ok,
    /// Failed, helper threads still letting go of their work.
    Failing,
    /// Failed; every helper thread has dropped its work.
    Failed(String),
}

impl Core {
    /// The control state (only the proxy thread takes it; uncontended).
    pub fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the first failure and wakes every helper thread.
    pub fn fail(&self, message: String) {
        if let Ok(mut f) = self.failure.lock() {
            if f.is_none() {
                cclkit_abi::nccl_warn!("cclkit-socket: {message}");
                *f = Some(message);
            }
        }
        self.failed.store(true, Ordering::Release);
        for bell in self.bells.iter() {
            bell.signal();
        }
    }

    /// Current health.
    pub fn health(&self) -> Health {
        if !self.failed.load(Ordering::Acquire) {
            return Health::Ok;
        }
        if self.quiesced.load(Ordering::Acquire) < self.bells.len() {
            return Health::Failing;
        }
        let message = self
            .failure
            .lock()
            .ok()
            .and_then(|f| f.clone())
            .unwrap_or_else(|| "connection failed".to_owned());
        Health::Failed(message)
    }

    /// An error for new operations on a failed comm, `None` if it works.
    pub fn refuse(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        let message = self.failure.lock().ok().and_then(|f| f.clone());
        Some(Error::remote(format!(
            "connection with {} failed earlier: {}",
            self.peer,
            message.unwrap_or_default()
        )))
    }

    /// Whether helper threads should stop (comm closing).
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Whether the comm failed.
    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// A helper thread has dropped its work after a failure.
    pub(crate) fn mark_quiesced(&self) {
        self.quiesced.fetch_add(1, Ordering::AcqRel);
    }

    /// Queues a chunk on lane `lane`; returns the helper thread to wake.
    pub fn post(&self, lane: usize, task: Task) -> usize {
        let l = &self.lanes[lane];
        l.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(task);
        // `start` gives a comm with lanes at least one helper thread.
        lane % self.bells.len().max(1)
    }

    /// Rings the doorbells of the helper threads in `mask` (bit i = thread i).
    pub fn wake(&self, mut mask: u64) {
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if let Some(b) = self.bells.get(i) {
                b.signal();
            }
        }
    }

    /// Moves the control stream forward (called from isend/irecv/test).
    pub fn progress(&self) {
        if self.is_failed() {
            return;
        }
        let result = match &mut *self.control() {
            Control::Send(c) => c.progress(self),
            Control::Recv(c) => c.progress(self),
        };
        if let Err(message) = result {
            self.fail(message);
        }
    }
}

/// A send or receive comm as NCCL holds it.
pub struct Comm {
    core: Arc<Core>,
    threads: Vec<JoinHandle<()>>,
}

/// What a new comm is made of.
pub struct Parts {
    /// Direction.
    pub dir: Dir,
    /// Peer address for messages.
    pub peer: String,
    /// Control state (owns the control socket).
    pub control: Control,
    /// Data stream sockets.
    pub lanes: Vec<TcpStream>,
    /// Helper threads wanted (at most one per lane; at least one if any lane).
    pub threads: usize,
    /// Request slots.
    pub slots: usize,
}

impl Comm {
    /// Builds the comm and starts its helper threads.
    pub fn start(parts: Parts) -> Result<Self> {
        let nlanes = parts.lanes.len();
        let nthreads = if nlanes == 0 {
            0
        } else {
            parts.threads.clamp(1, nlanes)
        };
        let bells = (0..nthreads)
            .map(|_| EventFd::new().map_err(|e| Error::io("eventfd", e)))
            .collect::<Result<Vec<_>>>()?;
        let lanes = parts
            .lanes
            .into_iter()
            .map(|sock| Lane {
                sock,
                queue: Mutex::new(VecDeque::with_capacity(parts.slots * 2)),
            })
            .collect();
        let core = Arc::new_cyclic(|me| Core {
            pool: Pool::new(parts.slots, me.as_ptr()),
            peer: parts.peer,
            lanes,
            bells: bells.into_boxed_slice(),
            dir: parts.dir,
            control: Mutex::new(parts.control),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            quiesced: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let mut comm = Self {
            core,
            threads: Vec::with_capacity(nthreads),
        };
        let tag = match parts.dir {
            Dir::Send => 's',
            Dir::Recv => 'r',
        };
        for id in 0..nthreads {
            let core = Arc::clone(&comm.core);
            let handle = std::thread::Builder::new()
                .name(format!("cclkit-sock-{tag}{id}"))
                .spawn(move || worker::run(&core, id))
                .map_err(|e| Error::io("spawn helper thread", e))?;
            comm.threads.push(handle);
        }
        Ok(comm)
    }

    /// The shared state.
    pub fn core(&self) -> &Core {
        &self.core
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Helper threads never block outside poll(), which the doorbell interrupts,
        // so joining is prompt even with requests in flight.
        self.core.stop.store(true, Ordering::Release);
        for bell in self.core.bells.iter() {
            bell.signal();
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                cclkit_abi::nccl_warn!("cclkit-socket: a helper thread panicked");
            }
        }
    }
}
