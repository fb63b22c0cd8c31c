//! The progress engine: one thread per communicator, like NCCL's proxy thread, that
//! also plays the GPU kernel's part on host memory.
//!
//! Each loop iteration (1) takes new work, (2) drives every connection's network
//! side (`isend`/`irecv`/`test`, see [`fifo`](super::fifo)), and (3) advances the
//! current batch's primitives slice by slice: a slice is processed when every
//! receive link has a ready slot and every send link a free one, exactly the
//! head/tail handshake NCCL's kernel and proxy do through `NCCL_STEPS` slots.
//! Operations of a batch (a group) run one after another per channel; channels run
//! side by side. A plugin error aborts the communicator: every waiting operation
//! fails with the plugin's message, nothing hangs.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::Protocol;
use cclkit_kernels::Reduction;

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

struct Done {
    result: Mutex<Option<Result<()>>>,
    cv: Condvar,
}

impl Done {
    fn set(&self, r: Result<()>) {
        let mut g = self.result.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(r);
        }
        self.cv.notify_all();
    }
}

enum Msg {
    Install(Vec<(Link, SendConn)>, Vec<(Link, RecvConn)>),
    Run(Batch, Arc<Done>),
    Stop,
}

/// Handle to a communicator's progress engine.
pub struct Proxy {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    abort: Arc<AtomicBool>,
    failed: Arc<Mutex<Option<Error>>>,
}

impl Proxy {
    /// Starts the engine thread `cclkit-proxy-<rank>`.
    pub fn start(rank: usize) -> Result<Self> {
        let (tx, rx) = channel();
        let abort = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(None));
        let engine = Engine {
            rank,
            rx,
            send: HashMap::new(),
            recv: HashMap::new(),
            queue: VecDeque::new(),
            abort: Arc::clone(&abort),
            failed: Arc::clone(&failed),
            scratch: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("cclkit-proxy-{rank}"))
            .spawn(move || engine.run())
            .map_err(|e| Error::system(format!("start proxy thread: {e}")))?;
        Ok(Self {
            tx,
            thread: Some(thread),
            abort,
            failed,
        })
    }

    fn send(&self, m: Msg) -> Result<()> {
        self.tx.send(m).map_err(|_| {
            self.error()
                .unwrap_or_else(|| Error::internal("proxy thread is gone"))
        })?;
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        Ok(())
    }

    /// The error that aborted the engine, if any.
    pub fn error(&self) -> Option<Error> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Hands new connections to the engine.
    pub fn install(&self, send: Vec<(Link, SendConn)>, recv: Vec<(Link, RecvConn)>) -> Result<()> {
        self.send(Msg::Install(send, recv))
    }

    /// Runs a batch and waits for it. After `timeout` the communicator is aborted; the
    /// call still waits until the engine has let go of the batch's buffers.
    pub fn run(&self, batch: Batch, timeout: Duration) -> Result<()> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        let done = Arc::new(Done {
            result: Mutex::new(None),
            cv: Condvar::new(),
        });
        self.send(Msg::Run(batch, Arc::clone(&done)))?;
        let deadline = Instant::now() + timeout;
        let mut g = done.result.lock().unwrap_or_else(|p| p.into_inner());
        let mut timed_out = false;
        while g.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() && !timed_out {
                timed_out = true;
                self.abort.store(true, Ordering::Release);
                if let Some(t) = &self.thread {
                    t.thread().unpark();
                }
            }
            let wait = if timed_out {
                Duration::from_millis(100)
            } else {
                left
            };
            g = done
                .cv
                .wait_timeout(g, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let r = g
            .take()
            .unwrap_or_else(|| Err(Error::internal("no result")));
        if timed_out && r.is_err() {
            return Err(Error::timeout(format!(
                "operation did not complete within {timeout:?} (CCLKIT_OP_TIMEOUT); communicator aborted"
            )));
        }
        r
    }

    /// Aborts: pending and future operations fail, connections are closed.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Release);
        let _ = self.send(Msg::Stop);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

struct Active {
    batch: Batch,
    done: Arc<Done>,
    /// (step index, slice index) per channel.
    cursor: Vec<(usize, usize)>,
}

struct Engine {
    rank: usize,
    rx: Receiver<Msg>,
    send: HashMap<Link, SendConn>,
    recv: HashMap<Link, RecvConn>,
    queue: VecDeque<Active>,
    abort: Arc<AtomicBool>,
    failed: Arc<Mutex<Option<Error>>>,
    scratch: Vec<Vec<u8>>,
}

fn slices(len: usize, slice: usize) -> usize {
    len.div_ceil(slice)
}

impl Engine {
    fn run(mut self) {
        let mut stop = false;
        let mut idle: u32 = 0;
        loop {
            loop {
                match self.rx.try_recv() {
                    Ok(Msg::Install(s, r)) => {
                        self.send.extend(s);
                        self.recv.extend(r);
                    }
                    Ok(Msg::Run(b, done)) => self.admit(b, done),
                    Ok(Msg::Stop) => stop = true,
                    Err(_) => break,
                }
            }
            if self.abort.load(Ordering::Acquire) && self.error().is_none() {
                self.fail(Error::invalid_usage(format!(
                    "rank {}: communicator aborted",
                    self.rank
                )));
            }
            if stop && (self.queue.is_empty() || self.error().is_some()) {
                break;
            }
            let moved = if self.error().is_none() {
                match self.progress() {
                    Ok(m) => m,
                    Err(e) => {
                        self.fail(e);
                        false
                    }
                }
            } else {
                false
            };
            let busy = !self.queue.is_empty() || self.send.values().any(|s| !s.idle());
            idle = if moved { 0 } else { idle.saturating_add(1) };
            match (busy, idle) {
                (_, 0) => {}
                (true, 1..=64) => std::hint::spin_loop(),
                (true, 65..=4000) => std::thread::yield_now(),
                (true, _) => std::thread::park_timeout(Duration::from_micros(50)),
                (false, _) => std::thread::park_timeout(Duration::from_millis(20)),
            }
        }
        // Closing order: receives and sends are dropped here (deregMr, then close).
        self.send.clear();
        self.recv.clear();
    }

    fn error(&self) -> Option<Error> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn fail(&mut self, e: Error) {
        tracing::warn!(target: "cclkit::proxy", "rank {}: {}", self.rank, e);
        {
            let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            if f.is_none() {
                *f = Some(e.clone());
            }
        }
        for a in self.queue.drain(..) {
            a.done.set(Err(e.clone()));
        }
    }

    fn admit(&mut self, batch: Batch, done: Arc<Done>) {
        if let Some(e) = self.error() {
            done.set(Err(e));
            return;
        }
        for ch in &batch.channels {
            for step in ch {
                for l in &step.prim.recv {
                    let group = if l.class == LinkClass::P2p {
                        batch.group
                    } else {
                        1
                    };
                    match self.recv.get_mut(l) {
                        Some(c) => c.expect(Expect {
                            params: batch.params,
                            count: slices(step.prim.len, batch.slice),
                            group,
                        }),
                        None => {
                            done.set(Err(Error::internal(format!(
                                "rank {}: no connection for {l:?}",
                                self.rank
                            ))));
                            return;
                        }
                    }
                }
                if let Some(l) = step.prim.send.iter().find(|l| !self.send.contains_key(l)) {
                    done.set(Err(Error::internal(format!(
                        "rank {}: no connection for {l:?}",
                        self.rank
                    ))));
                    return;
                }
            }
        }
        let cursor = vec![(0, 0); batch.channels.len()];
        self.queue.push_back(Active {
            batch,
            done,
            cursor,
        });
    }

    fn progress(&mut self) -> Result<bool> {
        let mut moved = false;
        for c in self.send.values_mut() {
            moved |= c.progress()?;
        }
        for c in self.recv.values_mut() {
            moved |= c.progress()?;
        }
        let Some(mut a) = self.queue.pop_front() else {
            return Ok(moved);
        };
        let mut finished = true;
        let r = (|| {
            for ch in 0..a.batch.channels.len() {
                // Process as many slices of this channel as resources allow.
                while let Some(step) = a.batch.channels[ch].get(a.cursor[ch].0) {
                    let (pi, si) = a.cursor[ch];
                    if !self.slice(&a.batch, step, si)? {
                        break;
                    }
                    moved = true;
                    let n = slices(step.prim.len, a.batch.slice);
                    a.cursor[ch] = if si + 1 >= n {
                        (pi + 1, 0)
                    } else {
                        (pi, si + 1)
                    };
                }
                finished &= a.cursor[ch].0 >= a.batch.channels[ch].len();
            }
            Ok::<(), Error>(())
        })();
        match r {
            Ok(()) if finished => a.done.set(Ok(())),
            Ok(()) => self.queue.push_front(a),
            Err(e) => {
                a.done.set(Err(e.clone()));
                return Err(e);
            }
        }
        Ok(moved)
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
        // Resources first: nothing is consumed unless the whole slice can proceed.
        let mut ins: Vec<(*const u8, usize)> = Vec::with_capacity(prim.recv.len());
        for l in &prim.recv {
            let c = self
                .recv
                .get_mut(l)
                .ok_or_else(|| Error::internal(format!("no connection {l:?}")))?;
            match c.slot_to_consume(p)? {
                Some(s) => ins.push(s),
                None => return Ok(false),
            }
        }
        let mut outs: Vec<*mut u8> = Vec::with_capacity(prim.send.len());
        for l in &prim.send {
            let c = self
                .send
                .get_mut(l)
                .ok_or_else(|| Error::internal(format!("no connection {l:?}")))?;
            match c.slot_to_fill(p)? {
                Some((ptr, cap)) if cap >= wire => outs.push(ptr),
                Some((_, cap)) => {
                    return Err(Error::internal(format!(
                        "slice of {wire} wire bytes exceeds a {cap}-byte slot"
                    )));
                }
                None => return Ok(false),
            }
        }
        for ((ptr, got), l) in ins.iter().zip(&prim.recv) {
            if *got != wire {
                let _ = ptr;
                return Err(Error::invalid_usage(format!(
                    "rank {}: received {got} bytes from rank {} where {wire} were expected \
                     (ranks called different operations, counts or protocols)",
                    self.rank, l.peer
                )));
            }
        }
        // Inputs as data bytes (LL lines are decoded and their flags checked).
        while self.scratch.len() < prim.recv.len() + 1 {
            self.scratch.push(Vec::new());
        }
        let mut data_ins: Vec<&[u8]> = Vec::with_capacity(ins.len());
        let (scratch_in, scratch_out) = self.scratch.split_at_mut(prim.recv.len());
        for (i, ((ptr, _), l)) in ins.iter().zip(&prim.recv).enumerate() {
            // SAFETY: a ready slot of `wire` bytes; the proxy does not touch it until
            // it is consumed below.
            let w = unsafe { std::slice::from_raw_parts(*ptr, wire) };
            if p.proto == Protocol::SIMPLE {
                data_ins.push(w);
            } else {
                let flag = self.recv.get(l).map_or(0, |c| c.sequence(p.proto)) as u32;
                let buf = &mut scratch_in[i];
                buf.resize(len, 0);
                decode(p.proto, w, buf, flag)
                    .map_err(|e| e.context(format!("rank {}: from rank {}", self.rank, l.peer)))?;
            }
        }
        if p.proto != Protocol::SIMPLE {
            data_ins = scratch_in[..prim.recv.len()]
                .iter()
                .map(Vec::as_slice)
                .collect();
        }
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
        let direct: Option<*mut u8> = match (p.proto, dst, outs.as_slice()) {
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
                combine(prim.combine, &op.red, src_slice, &data_ins, out)?;
                d
            }
            Some(d) => d, // in-place copy onto itself
            None => {
                let out = &mut scratch_out[0];
                out.resize(len, 0);
                combine(prim.combine, &op.red, src_slice, &data_ins, out)?;
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
