//! The progress engine: what NCCL's proxy thread and GPU kernel do, on host memory.
//!
//! Each pass (1) drives the network side (`isend`/`irecv`/`test`, see
//! [`fifo`](super::fifo)) of every connection with work (`engine/busy.rs`), and
//! (2) advances the active batch's primitives slice by slice: a slice is processed
//! when every receive link has a ready slot and every send link a free one, exactly
//! the head/tail handshake NCCL's kernel and proxy do through `NCCL_STEPS` slots.
//! Operations of a batch (a group) run one after another per channel; channels run
//! side by side.
//!
//! Operations block, so the thread that submits a batch runs the passes itself
//! until the batch is done (MPI libraries progress inside `MPI_Wait` the same way):
//! no wake-up of another thread on the way in and none on the way out, which is
//! most of a small operation's latency when ranks share cores. The background
//! thread `cclkit-proxy-<rank>` only completes sends a returning caller left in
//! flight. A plugin error aborts the communicator: the operation fails with the
//! plugin's message, and so does every later one; nothing hangs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::device::compute::DevCompute;
use super::error::{Error, Result};
use super::fifo::{RecvConn, SendConn};
use super::protocol::ProtoParams;
use super::schedule::{Link, Prim};
use crate::op::OpRef;

/// A primitive of one operation of a batch.
#[derive(Clone, Debug)]
pub struct Step {
    /// The primitive.
    pub prim: Prim,
    /// Index of its operation in [`Batch::ops`].
    pub op: usize,
}

/// One group of operations, run to completion by the engine.
pub struct Batch {
    /// Steps per channel.
    pub channels: Vec<Vec<Step>>,
    /// Operations referenced by the steps.
    pub ops: Vec<OpRef>,
    /// Protocol sizes.
    pub params: ProtoParams,
    /// Data bytes per slice (≤ the protocol's slice, a multiple of every op's element size).
    pub slice: usize,
    /// Group size of grouped receives on p2p links (1 = single receives).
    pub group: usize,
    /// Profiler events of the batch (`None`: no profiler).
    pub prof: Option<crate::profile::BatchEvents>,
}

/// Shared between the communicator's handle, the calling threads and the
/// background thread.
struct Shared {
    rank: usize,
    engine: Mutex<Engine>,
    abort: AtomicBool,
    stop: AtomicBool,
    failed: Mutex<Option<Error>>,
    /// Set once `failed` holds an error: the check every operation makes first
    /// costs a load, not a lock.
    has_failed: AtomicBool,
    /// ProxyCtrl events (nothing until a batch brings a profiler).
    ctrl: crate::profile::Ctrl,
}

impl Shared {
    fn error(&self) -> Option<Error> {
        if !self.has_failed.load(Ordering::Acquire) {
            return None;
        }
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn engine(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the first error; every later operation fails with it.
    fn fail(&self, e: Error) -> Error {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            tracing::warn!(target: "cclkit::proxy", "rank {}: {}", self.rank, e);
            *f = Some(e.clone());
            self.has_failed.store(true, Ordering::Release);
        }
        f.clone().unwrap_or(e)
    }
}

/// Handle to a communicator's progress engine.
///
/// Operations are blocking, so the thread that submits a batch drives the engine
/// itself until the batch is done (as an MPI library progresses inside `MPI_Wait`):
/// no hand-off to another thread and back on the latency path. A background thread
/// `cclkit-proxy-<rank>` finishes what a returning caller leaves in flight (sends
/// the peers still wait for) and sleeps otherwise.
pub struct Proxy {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts the engine and its background thread `cclkit-proxy-<rank>`; on a device
    /// communicator `dev` runs each slice's reductions and copies with the device
    /// kernels (`None`: on the host); `direct` allows NCCL's direct paths on host
    /// memory (`CCLKIT_DIRECT`, see `engine/direct.rs`); `run_ahead` lets a
    /// channel's next step send early (`CCLKIT_RUN_AHEAD`, see `engine/ahead.rs`).
    pub fn start_on(
        rank: usize,
        dev: Option<DevCompute>,
        direct: bool,
        run_ahead: Option<bool>,
    ) -> Result<Self> {
        let shared = Arc::new(Shared {
            rank,
            engine: Mutex::new(Engine {
                rank,
                send: LinkMap::default(),
                recv: LinkMap::default(),
                busy: engine::Busy::default(),
                active: None,
                finished: None,
                spare: None,
                scratch: Vec::new(),
                dev,
                direct,
                run_ahead,
            }),
            abort: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            failed: Mutex::new(None),
            has_failed: AtomicBool::new(false),
            ctrl: crate::profile::Ctrl::default(),
        });
        let bg = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("cclkit-proxy-{rank}"))
            .spawn(move || background(&bg))
            .map_err(|e| Error::system(format!("start proxy thread: {e}")))?;
        ENGINES.fetch_add(1, Ordering::Relaxed);
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The error that aborted the engine, if any.
    pub fn error(&self) -> Option<Error> {
        self.shared.error()
    }

    /// Hands new connections to the engine.
    pub fn install(&self, send: Vec<(Link, SendConn)>, recv: Vec<(Link, RecvConn)>) -> Result<()> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        let mut eng = self.shared.engine();
        eng.send.extend(send);
        eng.recv.extend(recv);
        Ok(())
    }

    /// Runs a batch to completion on the calling thread and hands its steps and its
    /// emptied operation list back (for the next identical batch). Once the batch has
    /// waited `timeout` (counted from its first pass without progress) the
    /// communicator is aborted and the call fails; the engine never keeps a pointer
    /// to the batch's buffers after this returns.
    pub fn run(&self, batch: Batch, timeout: Duration) -> Result<(Vec<Vec<Step>>, Vec<OpRef>)> {
        let sh = &self.shared;
        if let Some(e) = sh.error() {
            return Err(e);
        }
        // The deadline counts from the first pass that found nothing to do: an
        // operation that never waits never reads the clock.
        let mut start: Option<Instant> = None;
        let mut eng = sh.engine();
        let append = sh.ctrl.append(batch.prof.as_ref());
        let appended = batch.prof.as_ref().map_or(0, |p| p.proxy_ops());
        eng.admit(batch)?;
        append.end(appended);
        let mut wait = Backoff::new();
        // ProxyCtrl Idle/Active: only the changes are reported, as NCCL does.
        let mut idle = true;
        let result = loop {
            if sh.abort.load(Ordering::Acquire) {
                break Err(sh.fail(Error::invalid_usage(format!(
                    "rank {}: communicator aborted",
                    sh.rank
                ))));
            }
            match eng.progress() {
                Ok(moved) => {
                    if moved == idle {
                        idle = !moved;
                        sh.ctrl.transition(idle);
                    }
                    if eng.active.is_none() {
                        break Ok(());
                    }
                    if moved {
                        wait.reset();
                        continue;
                    }
                }
                Err(e) => break Err(sh.fail(e)),
            }
            // Reading the clock costs more than a pass's bookkeeping: look at it once
            // every few idle passes.
            if wait.idle % 32 == 0 && start.get_or_insert_with(Instant::now).elapsed() >= timeout {
                sh.abort.store(true, Ordering::Release);
                break Err(sh.fail(Error::timeout(format!(
                    "operation did not complete within {timeout:?} (CCLKIT_OP_TIMEOUT); communicator aborted"
                ))));
            }
            wait.pause();
        };
        // The batch's buffers are not referenced past this point (sends were copied
        // into FIFO slots, or sent straight from them and completed before the batch
        // ended; a failed batch fails the communicator); drop it before anything else
        // can fail.
        eng.active = None;
        eng.busy.publish();
        let steps = eng.finished.take().unwrap_or_default();
        if !idle {
            sh.ctrl.transition(true);
        }
        result?;
        // Push out what the peers still wait for: post every filled slot now, and keep
        // completing sends while they complete quickly. A send that needs the peer to
        // act first (a rendezvous) is left to the background thread, so a send never
        // waits for the peer's next operation here.
        let mut quiet = 0u32;
        while !eng.sends_idle() && quiet < FLUSH_SPINS {
            match eng.progress_sends() {
                Ok(true) => quiet = 0,
                Ok(false) => {
                    quiet += 1;
                    std::hint::spin_loop();
                }
                Err(e) => return Err(sh.fail(e)),
            }
        }
        let handover = !eng.sends_idle();
        drop(eng);
        if handover && let Some(t) = &self.thread {
            t.thread().unpark();
        }
        Ok(steps)
    }

    /// Aborts: the current and future operations fail.
    pub fn abort(&self) {
        self.shared.abort.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        ENGINES.fetch_sub(1, Ordering::Relaxed);
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        // Closing order: receives and sends are released here (deregMr, then close),
        // before the plugin context the communicator drops next.
        let mut eng = self.shared.engine();
        eng.busy = engine::Busy::default();
        eng.send.clear();
        eng.recv.clear();
    }
}

/// Spins after the last batch while sends still complete without waiting for a peer.
const FLUSH_SPINS: u32 = 200;

/// The background thread: completes sends a returning caller left in flight, and
/// sleeps while callers drive the engine or nothing is pending.
fn background(sh: &Shared) {
    let mut wait = Backoff::new();
    // The open ProxyCtrl Sleep event (Wakeup when dropped).
    let mut sleep = None;
    while !sh.stop.load(Ordering::Acquire) {
        let busy = match sh.engine.try_lock() {
            Ok(mut eng) if sh.error().is_none() && !eng.sends_idle() => {
                match eng.progress_sends() {
                    Ok(true) => wait.reset(),
                    Ok(false) => {}
                    Err(e) => {
                        sh.fail(e);
                    }
                }
                !eng.sends_idle()
            }
            // Idle, failed, or a caller is driving (it wakes us when it hands over).
            _ => false,
        };
        if busy {
            sleep = None;
            wait.pause();
        } else {
            if sleep.is_none() {
                sleep = sh.ctrl.sleep();
            }
            wait.reset();
            std::thread::park_timeout(Duration::from_millis(20));
        }
    }
}

mod wait;
use wait::{Backoff, ENGINES};

mod engine;

use engine::{Engine, LinkMap};
pub use engine::{ahead_slices, pass_visits};
