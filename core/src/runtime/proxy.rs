//! The progress engine: what NCCL's proxy thread and GPU kernel do, on host memory.
//!
//! Each pass (1) drives every connection's network side (`isend`/`irecv`/`test`,
//! see [`fifo`](super::fifo)), and (2) advances the active batch's primitives slice
//! by slice: a slice is processed when every receive link has a ready slot and every
//! send link a free one, exactly the head/tail handshake NCCL's kernel and proxy do
//! through `NCCL_STEPS` slots. Operations of a batch (a group) run one after another
//! per channel; channels run side by side.
//!
//! Operations block, so the thread that submits a batch runs the passes itself
//! until the batch is done (MPI libraries progress inside `MPI_Wait` the same way):
//! no wake-up of another thread on the way in and none on the way out, which is
//! most of a small operation's latency when ranks share cores. The background
//! thread `cclkit-proxy-<rank>` only completes sends a returning caller left in
//! flight. A plugin error aborts the communicator: the operation fails with the
//! plugin's message, and so does every later one; nothing hangs.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::Protocol;
use cclkit_kernels::Reduction;

use super::device::compute::DevCompute;
use super::error::{Error, Result};
use super::fifo::{Expect, RecvConn, SendConn};
use super::protocol::{ProtoParams, decode, encode};
use super::schedule::{Buffer, Combine, Link, LinkClass, Prim, combine};

/// One operation's user buffers. The submitting thread blocks until the batch is
/// finished, so the pointers stay valid for as long as the engine uses them.
#[derive(Clone, Copy, Debug)]
pub struct UserBufs {
    /// Send buffer start.
    pub send: *const u8,
    /// Send buffer bytes.
    pub send_len: usize,
    /// Receive buffer start.
    pub recv: *mut u8,
    /// Receive buffer bytes.
    pub recv_len: usize,
}

// SAFETY: the buffers are only touched by the engine thread while the submitting
// thread waits for the batch (see `Proxy::run`).
unsafe impl Send for UserBufs {}

/// A primitive of one operation of a batch.
#[derive(Clone, Debug)]
pub struct Step {
    /// The primitive.
    pub prim: Prim,
    /// Index of its operation in [`Batch::ops`].
    pub op: usize,
}

/// An operation's buffers and reduction.
#[derive(Clone, Copy, Debug)]
pub struct OpRef {
    /// User buffers.
    pub bufs: UserBufs,
    /// The reduction (data type, op, ranks).
    pub red: Reduction,
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
}

/// Shared between the communicator's handle, the calling threads and the
/// background thread.
struct Shared {
    rank: usize,
    engine: Mutex<Engine>,
    abort: AtomicBool,
    stop: AtomicBool,
    failed: Mutex<Option<Error>>,
}

impl Shared {
    fn error(&self) -> Option<Error> {
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
    /// Starts the engine and its background thread `cclkit-proxy-<rank>`.
    pub fn start(rank: usize) -> Result<Self> {
        Self::start_on(rank, None)
    }

    /// [`start`](Self::start) for a device communicator: `dev` runs each slice's
    /// reductions and copies with the device kernels (`None`: on the host).
    pub fn start_on(rank: usize, dev: Option<DevCompute>) -> Result<Self> {
        let shared = Arc::new(Shared {
            rank,
            engine: Mutex::new(Engine {
                rank,
                send: LinkMap::default(),
                recv: LinkMap::default(),
                active: None,
                scratch: Vec::new(),
                dev,
            }),
            abort: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            failed: Mutex::new(None),
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

    /// Runs a batch to completion on the calling thread. After `timeout` the
    /// communicator is aborted and the call fails; the engine never keeps a pointer to
    /// the batch's buffers after this returns.
    pub fn run(&self, batch: Batch, timeout: Duration) -> Result<()> {
        let sh = &self.shared;
        if let Some(e) = sh.error() {
            return Err(e);
        }
        let start = Instant::now();
        let mut eng = sh.engine();
        eng.admit(batch)?;
        let mut wait = Backoff::new();
        let result = loop {
            if sh.abort.load(Ordering::Acquire) {
                break Err(sh.fail(Error::invalid_usage(format!(
                    "rank {}: communicator aborted",
                    sh.rank
                ))));
            }
            match eng.progress() {
                Ok(moved) => {
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
            if wait.idle % 32 == 0 && start.elapsed() >= timeout {
                sh.abort.store(true, Ordering::Release);
                break Err(sh.fail(Error::timeout(format!(
                    "operation did not complete within {timeout:?} (CCLKIT_OP_TIMEOUT); communicator aborted"
                ))));
            }
            wait.pause();
        };
        // The batch's buffers are not referenced past this point (sends were copied
        // into FIFO slots); drop it before anything else can fail.
        eng.active = None;
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
        Ok(())
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
            wait.pause();
        } else {
            wait.reset();
            std::thread::park_timeout(Duration::from_millis(20));
        }
    }
}

#[path = "proxy_wait.rs"]
mod wait;
use wait::{Backoff, ENGINES};

struct Active {
    batch: Batch,
    /// (step index, slice index) per channel.
    cursor: Vec<(usize, usize)>,
}

/// Links to connections, hashed cheaply (a link is three small integers).
type LinkMap<T> = HashMap<Link, T, BuildHasherDefault<LinkHasher>>;

/// FNV-1a over the link's fields: a few cycles, where SipHash costs tens of ns on
/// every slice.
#[derive(Default)]
struct LinkHasher(u64);

impl Hasher for LinkHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// Most links one primitive receives from or sends to (tree: parent + 2 children).
const MAX_LINKS: usize = 8;

struct Engine {
    rank: usize,
    send: LinkMap<SendConn>,
    recv: LinkMap<RecvConn>,
    active: Option<Active>,
    scratch: Vec<Vec<u8>>,
    /// The device's work queue on a device communicator.
    dev: Option<DevCompute>,
}

fn slices(len: usize, slice: usize) -> usize {
    len.div_ceil(slice)
}

impl Engine {
    fn sends_idle(&self) -> bool {
        self.send.values().all(SendConn::idle)
    }

    /// Posts and completes sends only (no batch is touched).
    fn progress_sends(&mut self) -> Result<bool> {
        let mut moved = false;
        for c in self.send.values_mut() {
            moved |= c.progress()?;
        }
        Ok(moved)
    }

    /// Makes `batch` the active one: checks every link has a connection, then tells
    /// each receive connection which slices to expect.
    fn admit(&mut self, batch: Batch) -> Result<()> {
        let missing = batch.channels.iter().flatten().find_map(|step| {
            step.prim
                .recv
                .iter()
                .find(|l| !self.recv.contains_key(l))
                .or_else(|| step.prim.send.iter().find(|l| !self.send.contains_key(l)))
        });
        if let Some(l) = missing {
            return Err(Error::internal(format!(
                "rank {}: no connection for {l:?}",
                self.rank
            )));
        }
        for step in batch.channels.iter().flatten() {
            for l in &step.prim.recv {
                let group = if l.class == LinkClass::P2p {
                    batch.group
                } else {
                    1
                };
                if let Some(c) = self.recv.get_mut(l) {
                    c.expect(Expect {
                        params: batch.params,
                        count: slices(step.prim.len, batch.slice),
                        group,
                    });
                }
            }
        }
        let cursor = vec![(0, 0); batch.channels.len()];
        self.active = Some(Active { batch, cursor });
        Ok(())
    }

    /// One pass: complete sends, run the slices that need no new data (a send of
    /// this rank's own input goes out before any receive is polled), poll the
    /// receives, run the slices they unblocked, and post what was filled, so a hop
    /// costs no extra pass. The batch is dropped (`active = None`) once done.
    fn progress(&mut self) -> Result<bool> {
        let mut moved = self.progress_sends()?;
        if self.slices()? {
            moved = true;
            self.progress_sends()?;
        }
        let mut received = false;
        for c in self.recv.values_mut() {
            received |= c.progress()?;
        }
        if received {
            moved = true;
            if self.slices()? {
                self.progress_sends()?;
            }
        }
        Ok(moved)
    }

    /// As many slices of the active batch as the FIFOs allow; whether any ran.
    fn slices(&mut self) -> Result<bool> {
        let Some(mut a) = self.active.take() else {
            return Ok(false);
        };
        let mut finished = true;
        let mut sliced = false;
        for ch in 0..a.batch.channels.len() {
            while let Some(step) = a.batch.channels[ch].get(a.cursor[ch].0) {
                let (pi, si) = a.cursor[ch];
                match self.slice(&a.batch, step, si) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        self.active = Some(a);
                        return Err(e);
                    }
                }
                sliced = true;
                let n = slices(step.prim.len, a.batch.slice);
                a.cursor[ch] = if si + 1 >= n {
                    (pi + 1, 0)
                } else {
                    (pi, si + 1)
                };
            }
            finished &= a.cursor[ch].0 >= a.batch.channels[ch].len();
        }
        if !finished {
            self.active = Some(a);
        }
        Ok(sliced)
    }

    /// Processes slice `si` of `step` if every receive slot is ready and every send
    /// slot free; returns whether it did.
    fn slice(&mut self, b: &Batch, step: &Step, si: usize) -> Result<bool> {
        let prim = &step.prim;
        let p = &b.params;
        let op = &b.ops[step.op];
        let off = si * b.slice;
        let len = b.slice.min(prim.len - off);
        let wire = p.wire_for(len);
        let (nr, ns) = (prim.recv.len(), prim.send.len());
        if nr > MAX_LINKS || ns > MAX_LINKS {
            return Err(Error::internal(format!(
                "a primitive with {nr} receive and {ns} send links (at most {MAX_LINKS})"
            )));
        }
        // Resources first: nothing is consumed unless the whole slice can proceed.
        // Fixed arrays: this runs for every slice, so it must not allocate.
        let mut ins: [(*const u8, usize); MAX_LINKS] = [(std::ptr::null(), 0); MAX_LINKS];
        for (k, l) in prim.recv.iter().enumerate() {
            let c = self
                .recv
                .get_mut(l)
                .ok_or_else(|| Error::internal(format!("no connection {l:?}")))?;
            match c.slot_to_consume(p)? {
                Some(s) => ins[k] = s,
                None => return Ok(false),
            }
        }
        let mut outs: [*mut u8; MAX_LINKS] = [std::ptr::null_mut(); MAX_LINKS];
        for (k, l) in prim.send.iter().enumerate() {
            let c = self
                .send
                .get_mut(l)
                .ok_or_else(|| Error::internal(format!("no connection {l:?}")))?;
            match c.slot_to_fill(p)? {
                Some((ptr, cap)) if cap >= wire => outs[k] = ptr,
                Some((_, cap)) => {
                    return Err(Error::internal(format!(
                        "slice of {wire} wire bytes exceeds a {cap}-byte slot"
                    )));
                }
                None => return Ok(false),
            }
        }
        let (ins, outs) = (&ins[..nr], &outs[..ns]);
        for ((_, got), l) in ins.iter().zip(&prim.recv) {
            if *got != wire {
                return Err(Error::invalid_usage(format!(
                    "rank {}: received {got} bytes from rank {} where {wire} were expected \
                     (ranks called different operations, counts or protocols)",
                    self.rank, l.peer
                )));
            }
        }
        if let Some(dc) = self.dev.as_mut() {
            // Device communicator: user buffers and slots are device (or
            // GPU-mapped) memory, never read here; the device kernels compute.
            // SAFETY: this slice's ready receive and free send slots; the op's
            // buffers were checked against the device when it was submitted.
            unsafe { dc.proxy_step(prim, op, off, len, p.proto, ins, outs) }?;
            for l in &prim.send {
                let tag =
                    (l.class == LinkClass::P2p && b.group > 1).then_some((si % b.group) as i32);
                self.send
                    .get_mut(l)
                    .ok_or_else(|| Error::internal("send connection vanished"))?
                    .filled(p, wire, tag)?;
            }
            for l in &prim.recv {
                self.recv
                    .get_mut(l)
                    .ok_or_else(|| Error::internal("recv connection vanished"))?
                    .consumed(p)?;
            }
            return Ok(true);
        }
        // Inputs as data bytes (LL lines are decoded and their flags checked).
        while self.scratch.len() < nr + 1 {
            self.scratch.push(Vec::new());
        }
        let mut data_ins: [&[u8]; MAX_LINKS] = [&[]; MAX_LINKS];
        let (scratch_in, scratch_out) = self.scratch.split_at_mut(nr);
        for (i, ((ptr, _), l)) in ins.iter().zip(&prim.recv).enumerate() {
            // SAFETY: a ready slot of `wire` bytes; the proxy does not touch it until
            // it is consumed below.
            let w = unsafe { std::slice::from_raw_parts(*ptr, wire) };
            if p.proto != Protocol::SIMPLE {
                let flag = self.recv.get(l).map_or(0, |c| c.sequence(p.proto)) as u32;
                let buf = &mut scratch_in[i];
                buf.resize(len, 0);
                decode(p.proto, w, buf, flag)
                    .map_err(|e| e.context(format!("rank {}: from rank {}", self.rank, l.peer)))?;
            } else {
                data_ins[i] = w;
            }
        }
        if p.proto != Protocol::SIMPLE {
            for (d, b) in data_ins.iter_mut().zip(scratch_in.iter()) {
                *d = b.as_slice();
            }
        }
        let data_ins = &data_ins[..nr];
        let user = |span: super::schedule::Span| -> Result<*mut u8> {
            let (base, cap) = match span.buf {
                Buffer::Send => (op.bufs.send.cast_mut(), op.bufs.send_len),
                Buffer::Recv => (op.bufs.recv, op.bufs.recv_len),
            };
            if span.offset + off + len > cap {
                return Err(Error::internal(format!(
                    "span {span:?} + {len} exceeds a {cap}-byte buffer"
                )));
            }
            // SAFETY: bounds checked against the buffer length just above.
            Ok(unsafe { base.add(span.offset + off) })
        };
        let src = prim.src.map(user).transpose()?;
        let dst = prim.dst.map(user).transpose()?;
        // SAFETY: `src` points to `len` readable bytes of a user buffer.
        let src_slice = src.map(|s| unsafe { std::slice::from_raw_parts(s.cast_const(), len) });
        let overlaps = |a: *const u8, b: *const u8| {
            (a as usize) < b as usize + len && (b as usize) < a as usize + len
        };
        // Where the result is computed: straight into the destination or the one send
        // slot when that is safe (Simple, no overlap with the input), else scratch.
        let direct: Option<*mut u8> = match (p.proto, dst, outs) {
            (Protocol::SIMPLE, Some(d), _) if src.is_none_or(|s| !overlaps(s, d)) => Some(d),
            (Protocol::SIMPLE, None, [o]) => Some(*o),
            _ => None,
        };
        let trivial_copy =
            matches!(prim.combine, Combine::Copy { pre: false }) && prim.recv.is_empty();
        let out_ptr: *const u8 = match direct {
            Some(d) if !(trivial_copy && src == Some(d)) => {
                // SAFETY: `d` is `len` writable bytes disjoint from every input (checked).
                let out = unsafe { std::slice::from_raw_parts_mut(d, len) };
                combine(prim.combine, &op.red, src_slice, data_ins, out)?;
                d
            }
            Some(d) => d, // in-place copy onto itself
            None => {
                let out = &mut scratch_out[0];
                out.resize(len, 0);
                combine(prim.combine, &op.red, src_slice, data_ins, out)?;
                out.as_ptr()
            }
        };
        // SAFETY: `out_ptr` holds `len` result bytes (destination, slot or scratch).
        let result = unsafe { std::slice::from_raw_parts(out_ptr, len) };
        for (o, l) in outs.iter().zip(&prim.send) {
            let c = self
                .send
                .get_mut(l)
                .ok_or_else(|| Error::internal("send connection vanished"))?;
            let used = if std::ptr::eq(*o, out_ptr) {
                wire
            } else {
                let flag = c.sequence(p.proto) as u32;
                // SAFETY: a free slot of at least `wire` bytes (checked above).
                let slot = unsafe { std::slice::from_raw_parts_mut(*o, wire) };
                encode(p.proto, result, slot, flag)
            };
            let tag = (l.class == LinkClass::P2p && b.group > 1).then_some((si % b.group) as i32);
            c.filled(p, used, tag)?;
        }
        if let Some(d) = dst
            && !std::ptr::eq(d, out_ptr)
        {
            // SAFETY: `d` is `len` writable user bytes; `result` is elsewhere.
            unsafe { std::ptr::copy(out_ptr, d, len) };
        }
        for l in &prim.recv {
            self.recv
                .get_mut(l)
                .ok_or_else(|| Error::internal("recv connection vanished"))?
                .consumed(p)?;
        }
        Ok(true)
    }
}
