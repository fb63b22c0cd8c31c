//! One endpoint per device, shared by every comm on it: posting, progress, and
//! the bookkeeping of operations in flight.
//!
//! Each posted operation owns a [`Slot`] whose first field is the `fi_context2`
//! libfabric hands back in completions. Slots are boxed (stable addresses) and
//! recycled with a generation count, so a stale [`OpId`] is never confused with
//! a new operation. Posts that get `-FI_EAGAIN` wait in a FIFO backlog that every
//! progress call retries, so `isend`/`irecv` never spin and never lose order.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cclkit_abi::{Error, Result, nccl_warn};

use crate::fabric::{Av, Cq, Domain, Endpoint, FiError};
use crate::liveness::ProcId;
use crate::mr::MrCache;
use crate::sys;
use crate::tags::{Ctrl, TagLayout};

/// Identifies one posted operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpId {
    idx: u32,
    generation: u32,
}

/// What a caller learns about an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    /// Not complete yet.
    Pending,
    /// Complete; bytes transferred.
    Done(usize),
    /// Failed, with the message to report.
    Failed(String),
}

#[derive(Debug)]
enum State {
    Free,
    Backlogged,
    Posted,
    Done(usize),
    Failed(String),
}

/// Who handles the completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// A request or comm polls it.
    Caller,
    /// Its owner is gone: free on completion.
    Orphan,
    /// The device's ping sink: post again on completion.
    PingSink,
    /// A liveness ping of a connection.
    Ping,
}

/// Why an operation failed: the libfabric code and the message to report.
struct Failure {
    code: i32,
    msg: String,
}

impl From<FiError> for Failure {
    fn from(e: FiError) -> Self {
        Self {
            code: e.code,
            msg: e.to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Post {
    Send {
        buf: usize,
        len: usize,
        desc: usize,
        dest: u64,
        tag: u64,
    },
    Recv {
        buf: usize,
        len: usize,
        desc: usize,
        tag: u64,
        ignore: u64,
    },
}

/// Per-operation state; `ctx` must stay the first field (completions return its address).
#[repr(C)]
struct Slot {
    ctx: sys::fi_context2,
    idx: u32,
    generation: u32,
    state: State,
    owner: Owner,
    recv: bool,
    conn: Option<u64>,
    /// Buffer owned by the operation itself (control messages).
    buf: Option<Box<[u8]>>,
    /// Registration of `buf` (0 = none), released with the slot.
    mr: u64,
}

/// One side of a connection, as the engine tracks it.
#[derive(Debug)]
pub struct Conn {
    /// Peer's address in the AV.
    pub peer: u64,
    /// Peer's process identity.
    pub peer_proc: ProcId,
    /// Data comm id to return to the pool when retired (receive side).
    data_id: Option<u16>,
    /// First fatal error seen on this connection.
    pub failed: Option<String>,
    /// Receives still posted (the comm id stays reserved until they are gone).
    recvs: usize,
    /// Requests in flight (capped per comm).
    pub requests: usize,
    closing: bool,
    ping: Option<OpId>,
    ping_sent: Instant,
    last_progress: Instant,
    next_check: Instant,
}

/// A pool of 16-bit ids handed out round-robin, so a freed id is reused last.
#[derive(Default)]
struct Ids {
    used: std::collections::HashSet<u16>,
    next: u16,
}

impl Ids {
    fn alloc(&mut self, what: &str) -> Result<u16> {
        for _ in 0..=u16::MAX as u32 {
            let id = self.next;
            self.next = self.next.wrapping_add(1);
            if self.used.insert(id) {
                return Ok(id);
            }
        }
        Err(Error::internal(format!(
            "NET/OFI: all 65536 {what} ids of this endpoint are in use"
        )))
    }

    fn free(&mut self, id: u16) {
        self.used.remove(&id);
    }
}

/// How waiting comms check their peer (see `liveness.rs`).
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    /// Time without completions before a check; `None` = never check.
    pub interval: Option<Duration>,
    /// Look same-host peers up in `/proc`.
    pub proc_check: bool,
}

/// Everything behind a device's lock. Field order is drop order: the endpoint
/// closes first, while the slots its operations point to still exist.
pub struct Engine {
    /// The endpoint (also keeps the CQ, AV and domain open).
    pub ep: Endpoint,
    cq: Arc<Cq>,
    av: Arc<Av>,
    /// The domain, for registrations.
    pub domain: Arc<Domain>,
    /// Registrations of this domain.
    pub mrs: MrCache,
    /// Boxed: libfabric holds each slot's address while the Vec may grow.
    #[allow(clippy::vec_box)]
    slots: Vec<Box<Slot>>,
    free: Vec<u32>,
    backlog: VecDeque<(OpId, Post)>,
    peers: HashMap<Vec<u8>, u64>,
    conns: HashMap<u64, Conn>,
    next_conn: u64,
    ctrl_ids: Ids,
    data_ids: Ids,
    layout: TagLayout,
    me: ProcId,
    liveness: Option<Duration>,
    liveness_proc: bool,
}

// SAFETY: the raw pointers inside (libfabric's scratch in `fi_context2`, buffer
// addresses kept as integers for deferred posts) are never dereferenced by Rust;
// the libfabric objects were opened FI_THREAD_SAFE. All access goes through the
// device's Mutex.
unsafe impl Send for Engine {}

const CQ_BATCH: usize = 16;
/// Bounds one progress call so a flood of completions cannot stall the caller.
const MAX_BATCHES: usize = 64;
const PING_SINK_LEN: usize = 8;
/// Liveness intervals a ping may stay incomplete before the peer counts as gone.
const PING_PATIENCE: u32 = 10;

impl Engine {
    /// An engine over an opened endpoint; posts the device's ping sink.
    pub fn new(
        ep: Endpoint,
        cq: Arc<Cq>,
        av: Arc<Av>,
        domain: Arc<Domain>,
        mrs: MrCache,
        layout: TagLayout,
        liveness: Liveness,
    ) -> Result<Self> {
        let mut e = Self {
            ep,
            cq,
            av,
            domain,
            mrs,
            slots: Vec::new(),
            free: Vec::new(),
            backlog: VecDeque::new(),
            peers: HashMap::new(),
            conns: HashMap::new(),
            next_conn: 1,
            ctrl_ids: Ids::default(),
            data_ids: Ids::default(),
            layout,
            me: ProcId::current(),
            liveness: liveness.interval,
            liveness_proc: liveness.proc_check,
        };
        e.post_ping_sink()?;
        Ok(e)
    }

    /// The tag layout of this endpoint.
    pub fn layout(&self) -> TagLayout {
        self.layout
    }

    /// This process's identity.
    pub fn me(&self) -> ProcId {
        self.me
    }

    fn alloc(
        &mut self,
        owner: Owner,
        recv: bool,
        conn: Option<u64>,
        buf: Option<Box<[u8]>>,
    ) -> OpId {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32;
                self.slots.push(Box::new(Slot {
                    ctx: sys::fi_context2::default(),
                    idx: i,
                    generation: 0,
                    state: State::Free,
                    owner: Owner::Orphan,
                    recv: false,
                    conn: None,
                    buf: None,
                    mr: 0,
                }));
                i
            }
        };
        let s = &mut self.slots[idx as usize];
        s.ctx = sys::fi_context2::default();
        s.state = State::Backlogged;
        s.owner = owner;
        s.recv = recv;
        s.conn = conn;
        s.buf = buf;
        s.mr = 0;
        if let (true, Some(c)) = (recv, conn.and_then(|k| self.conns.get_mut(&k))) {
            c.recvs += 1;
        }
        OpId {
            idx,
            generation: s.generation,
        }
    }

    fn slot(&self, op: OpId) -> Option<&Slot> {
        self.slots
            .get(op.idx as usize)
            .map(|s| &**s)
            .filter(|s| s.generation == op.generation && !matches!(s.state, State::Free))
    }

    fn slot_mut(&mut self, op: OpId) -> Option<&mut Slot> {
        self.slots
            .get_mut(op.idx as usize)
            .map(|s| &mut **s)
            .filter(|s| s.generation == op.generation && !matches!(s.state, State::Free))
    }

    fn release(&mut self, idx: u32) {
        let s = &mut self.slots[idx as usize];
        if matches!(s.state, State::Free) {
            return;
        }
        let (recv, conn, mr) = (s.recv, s.conn, s.mr);
        s.state = State::Free;
        s.buf = None;
        s.mr = 0;
        self.mrs.release(mr);
        s.generation = s.generation.wrapping_add(1);
        self.free.push(idx);
        if recv {
            if let Some(key) = conn {
                let retire = match self.conns.get_mut(&key) {
                    Some(c) => {
                        c.recvs = c.recvs.saturating_sub(1);
                        c.closing && c.recvs == 0
                    }
                    None => false,
                };
                if retire {
                    self.retire(key);
                }
            }
        }
    }

    /// Tries one post. `Ok(false)` = `-FI_EAGAIN`.
    fn try_post(&mut self, op: OpId, post: Post) -> std::result::Result<bool, FiError> {
        let ctx: *mut sys::fi_context2 = &mut self.slots[op.idx as usize].ctx;
        // SAFETY: `ctx` lives in a boxed slot that is not freed before its
        // completion is read (or the endpoint is closed, see field order). Data
        // buffers are NCCL's, valid until the request completes; control buffers
        // are owned by the slot. Descriptors come from live registrations.
        let r = unsafe {
            match post {
                Post::Send {
                    buf,
                    len,
                    desc,
                    dest,
                    tag,
                } => self.ep.tsend(
                    buf as *const c_void,
                    len,
                    desc as *mut c_void,
                    dest,
                    tag,
                    ctx,
                ),
                Post::Recv {
                    buf,
                    len,
                    desc,
                    tag,
                    ignore,
                } => self.ep.trecv(
                    buf as *mut c_void,
                    len,
                    desc as *mut c_void,
                    tag,
                    ignore,
                    ctx,
                ),
            }
        };
        match r {
            Ok(()) => {
                self.slots[op.idx as usize].state = State::Posted;
                Ok(true)
            }
            Err(e) if e.is_again() => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn submit(&mut self, op: OpId, post: Post) -> Result<OpId> {
        if self.backlog.is_empty() {
            let posted = match self.try_post(op, post) {
                Ok(false) => {
                    // The provider's queue is full: reap completions, retry once.
                    self.read_cq();
                    self.try_post(op, post)
                }
                other => other,
            };
            match posted {
                Ok(true) => return Ok(op),
                Ok(false) => {}
                Err(e) => {
                    self.release(op.idx);
                    return Err(e.into());
                }
            }
        }
        self.backlog.push_back((op, post));
        Ok(op)
    }

    /// Posts a tagged send of NCCL memory.
    ///
    /// # Safety
    /// `buf` must stay valid for `len` bytes until the operation completes or is
    /// abandoned; `desc` must be NULL or a live registration covering it.
    pub unsafe fn send(
        &mut self,
        conn: u64,
        buf: *const u8,
        len: usize,
        desc: usize,
        tag: u64,
    ) -> Result<OpId> {
        let dest = self.conn(conn)?.peer;
        let op = self.alloc(Owner::Caller, false, Some(conn), None);
        self.submit(
            op,
            Post::Send {
                buf: buf as usize,
                len,
                desc,
                dest,
                tag,
            },
        )
    }

    /// Posts a tagged receive into NCCL memory.
    ///
    /// # Safety
    /// As [`Engine::send`], for writes.
    pub unsafe fn recv(
        &mut self,
        conn: u64,
        buf: *mut u8,
        len: usize,
        desc: usize,
        tag: u64,
    ) -> Result<OpId> {
        let op = self.alloc(Owner::Caller, true, Some(conn), None);
        self.submit(
            op,
            Post::Recv {
                buf: buf as usize,
                len,
                desc,
                tag,
                ignore: 0,
            },
        )
    }

    /// Sends a control message (the engine owns `bytes`) whose completion the
    /// caller polls.
    pub fn send_ctrl(&mut self, dest: u64, kind: Ctrl, id: u16, bytes: Vec<u8>) -> Result<OpId> {
        self.send_owned(
            dest,
            self.layout.ctrl(kind, id),
            bytes.into_boxed_slice(),
            Owner::Caller,
            None,
        )
    }

    /// Sends a control message nobody waits for (released on completion).
    pub fn send_ctrl_detached(
        &mut self,
        dest: u64,
        kind: Ctrl,
        id: u16,
        bytes: Vec<u8>,
    ) -> Result<()> {
        self.send_owned(
            dest,
            self.layout.ctrl(kind, id),
            bytes.into_boxed_slice(),
            Owner::Orphan,
            None,
        )
        .map(drop)
    }

    fn send_owned(
        &mut self,
        dest: u64,
        tag: u64,
        bytes: Box<[u8]>,
        owner: Owner,
        conn: Option<u64>,
    ) -> Result<OpId> {
        let (buf, len) = (bytes.as_ptr() as usize, bytes.len());
        let op = self.alloc(owner, false, conn, Some(bytes));
        let desc = self.ctrl_desc(op, buf, len)?;
        self.submit(
            op,
            Post::Send {
                buf,
                len,
                desc,
                dest,
                tag,
            },
        )
    }

    /// Posts a receive for a control message of `kind` to `id` into an owned buffer.
    pub fn recv_ctrl(&mut self, kind: Ctrl, id: u16, len: usize) -> Result<OpId> {
        let bytes = vec![0u8; len].into_boxed_slice();
        let (buf, blen) = (bytes.as_ptr() as usize, bytes.len());
        let op = self.alloc(Owner::Caller, true, None, Some(bytes));
        let desc = self.ctrl_desc(op, buf, blen)?;
        let tag = self.layout.ctrl(kind, id);
        self.submit(
            op,
            Post::Recv {
                buf,
                len: blen,
                desc,
                tag,
                ignore: 0,
            },
        )
    }

    /// Descriptor for a control buffer owned by slot `op` (FI_MR_LOCAL providers
    /// need one); the registration is released with the slot.
    fn ctrl_desc(&mut self, op: OpId, buf: usize, len: usize) -> Result<usize> {
        if len == 0 || !self.mrs.host_needs_mr() {
            return Ok(0);
        }
        // SAFETY: the buffer is owned by the slot, which releases this
        // registration before dropping the buffer.
        let r = unsafe {
            self.mrs.acquire(
                &self.domain,
                &self.ep,
                buf,
                len,
                crate::fabric::MemIface::System,
            )
        };
        match r {
            Ok(r) => {
                self.slots[op.idx as usize].mr = r.id;
                Ok(r.desc)
            }
            Err(e) => {
                self.release(op.idx);
                Err(e)
            }
        }
    }

    fn post_ping_sink(&mut self) -> Result<()> {
        let bytes = vec![0u8; PING_SINK_LEN].into_boxed_slice();
        let (buf, len) = (bytes.as_ptr() as usize, bytes.len());
        let op = self.alloc(Owner::PingSink, true, None, Some(bytes));
        let desc = self.ctrl_desc(op, buf, len)?;
        let tag = self.layout.ctrl(Ctrl::Ping, 0);
        self.submit(
            op,
            Post::Recv {
                buf,
                len,
                desc,
                tag,
                ignore: TagLayout::any_id(),
            },
        )
        .map(drop)
    }

    /// State of `op` (an unknown id reads as failed).
    pub fn poll(&self, op: OpId) -> Poll {
        match self.slot(op).map(|s| &s.state) {
            Some(State::Done(n)) => Poll::Done(*n),
            Some(State::Failed(m)) => Poll::Failed(m.clone()),
            Some(_) => Poll::Pending,
            None => Poll::Failed("operation handle is stale".into()),
        }
    }

    /// Takes the owned buffer of a completed control operation.
    pub fn take_buf(&mut self, op: OpId) -> Option<Box<[u8]>> {
        self.slot_mut(op).and_then(|s| s.buf.take())
    }

    /// Releases a completed operation, or gives up on one still in flight
    /// (a posted receive is cancelled; a send completes unobserved).
    pub fn finish(&mut self, op: OpId) {
        let Some(s) = self.slot_mut(op) else { return };
        match s.state {
            State::Done(_) | State::Failed(_) => self.release(op.idx),
            State::Backlogged => {
                self.backlog.retain(|(o, _)| *o != op);
                self.release(op.idx);
            }
            State::Posted => {
                s.owner = Owner::Orphan;
                if s.recv {
                    let ctx: *mut sys::fi_context2 = &mut s.ctx;
                    // SAFETY: the operation is posted on this endpoint and not completed.
                    if let Err(e) = unsafe { self.ep.cancel(ctx) } {
                        nccl_warn!("NET/OFI: {e}");
                    }
                }
            }
            State::Free => {}
        }
    }

    /// Reads completions and retries backlogged posts.
    pub fn progress(&mut self) {
        self.read_cq();
        while let Some(&(op, post)) = self.backlog.front() {
            match self.try_post(op, post) {
                Ok(true) => {
                    self.backlog.pop_front();
                }
                Ok(false) => break,
                Err(e) => {
                    self.backlog.pop_front();
                    self.complete(op.idx, Err(e.into()));
                }
            }
        }
    }

    fn read_cq(&mut self) {
        let mut entries = [sys::fi_cq_tagged_entry::default(); CQ_BATCH];
        for _ in 0..MAX_BATCHES {
            match self.cq.read(&mut entries) {
                Ok(n) => {
                    for e in &entries[..n] {
                        if let Some(idx) = self.slot_of(e.op_context) {
                            self.complete(idx, Ok(e.len));
                        }
                    }
                    if n < CQ_BATCH {
                        return;
                    }
                }
                Err(e) if e.code == sys::FI_EAVAIL as i32 => self.read_errors(),
                Err(e) => {
                    nccl_warn!("NET/OFI: {e}");
                    return;
                }
            }
        }
    }

    fn read_errors(&mut self) {
        loop {
            match self.cq.read_err() {
                Ok(Some(err)) => {
                    let Some(idx) = self.slot_of(err.op_context) else {
                        nccl_warn!(
                            "NET/OFI: completion error without an operation: {}",
                            err.to_fi_error("fi_cq_readerr")
                        );
                        continue;
                    };
                    let recv = self.slots[idx as usize].recv;
                    let msg = if err.err == sys::FI_ETRUNC as i32 {
                        format!(
                            "message truncated: {} bytes arrived for a receive of {} ({})",
                            err.len + err.olen,
                            err.len,
                            err.to_fi_error("fi_trecv")
                        )
                    } else {
                        err.to_fi_error(if recv { "fi_trecv" } else { "fi_tsend" })
                            .to_string()
                    };
                    self.complete(idx, Err(Failure { code: err.err, msg }));
                }
                Ok(None) => return,
                Err(e) => {
                    nccl_warn!("NET/OFI: {e}");
                    return;
                }
            }
        }
    }

    /// Maps a completion's context back to its slot.
    fn slot_of(&self, ctx: *mut c_void) -> Option<u32> {
        if ctx.is_null() {
            return None;
        }
        // SAFETY: every context we post is the first field of a live boxed Slot;
        // the index is then checked against the slot table before use.
        let idx = unsafe { (*ctx.cast::<Slot>()).idx };
        let slot = self.slots.get(idx as usize)?;
        std::ptr::eq(&**slot as *const Slot as *const c_void, ctx).then_some(idx)
    }

    fn complete(&mut self, idx: u32, result: std::result::Result<usize, Failure>) {
        let s = &mut self.slots[idx as usize];
        let (owner, conn) = (s.owner, s.conn);
        s.state = match &result {
            Ok(n) => State::Done(*n),
            Err(f) => State::Failed(f.msg.clone()),
        };
        // Only failed sends and pings say something about the peer; a failed
        // receive (truncation, cancellation) concerns that request alone.
        let watched = matches!(owner, Owner::Caller | Owner::Ping);
        let peer_error = !s.recv;
        if let Some(c) = conn
            .and_then(|k| self.conns.get_mut(&k))
            .filter(|_| watched)
        {
            match &result {
                Ok(_) if owner == Owner::Caller => c.last_progress = Instant::now(),
                Err(f)
                    if peer_error && f.code != sys::FI_ECANCELED as i32 && c.failed.is_none() =>
                {
                    c.failed = Some(if owner == Owner::Ping {
                        format!("peer unreachable (liveness ping failed): {}", f.msg)
                    } else {
                        f.msg.clone()
                    });
                }
                _ => {}
            }
            if owner == Owner::Ping {
                c.ping = None;
            }
        }
        match owner {
            Owner::Caller => {}
            Owner::Orphan | Owner::Ping => self.release(idx),
            Owner::PingSink => {
                self.release(idx);
                if let Err(e) = self.post_ping_sink() {
                    nccl_warn!("NET/OFI: cannot re-post the ping receive: {e}");
                }
            }
        }
    }

    /// The AV address of a peer endpoint, inserting it on first use.
    pub fn peer(&mut self, addr: &[u8]) -> Result<u64> {
        if let Some(a) = self.peers.get(addr) {
            return Ok(*a);
        }
        let a = self.av.insert(addr)?;
        self.peers.insert(addr.to_vec(), a);
        Ok(a)
    }

    /// A control id (listen and connect replies).
    pub fn alloc_ctrl_id(&mut self) -> Result<u16> {
        self.ctrl_ids.alloc("control")
    }

    /// Returns a control id.
    pub fn free_ctrl_id(&mut self, id: u16) {
        self.ctrl_ids.free(id);
    }

    /// A receive comm id (data tag space).
    pub fn alloc_data_id(&mut self) -> Result<u16> {
        self.data_ids.alloc("receive comm")
    }

    /// Registers a connection; `data_id` is returned to the pool when it retires.
    pub fn add_conn(&mut self, peer: u64, peer_proc: ProcId, data_id: Option<u16>) -> u64 {
        let key = self.next_conn;
        self.next_conn += 1;
        let now = Instant::now();
        self.conns.insert(
            key,
            Conn {
                peer,
                peer_proc,
                data_id,
                failed: None,
                recvs: 0,
                requests: 0,
                closing: false,
                ping: None,
                ping_sent: now,
                last_progress: now,
                next_check: now,
            },
        );
        key
    }

    /// A connection, closed or not (requests may outlive their comm).
    pub fn conn_any(&mut self, key: u64) -> Option<&mut Conn> {
        self.conns.get_mut(&key)
    }

    /// A live connection.
    pub fn conn(&mut self, key: u64) -> Result<&mut Conn> {
        self.conns
            .get_mut(&key)
            .filter(|c| !c.closing)
            .ok_or_else(|| Error::invalid_usage("NET/OFI: comm already closed"))
    }

    /// Closes a connection: pending receives are cancelled and its comm id is
    /// reused only once they are gone.
    pub fn close_conn(&mut self, key: u64) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        c.closing = true;
        let posted: Vec<OpId> = self
            .slots
            .iter()
            .filter(|s| {
                s.recv
                    && s.conn == Some(key)
                    && matches!(s.state, State::Posted | State::Backlogged)
            })
            .map(|s| OpId {
                idx: s.idx,
                generation: s.generation,
            })
            .collect();
        for op in posted {
            self.finish(op);
        }
        if self.conns.get(&key).is_some_and(|c| c.recvs == 0) {
            self.retire(key);
        }
    }

    fn retire(&mut self, key: u64) {
        if let Some(c) = self.conns.remove(&key) {
            if let Some(id) = c.data_id {
                self.data_ids.free(id);
            }
        }
    }

    /// Liveness check of a connection whose request is still waiting: fails the
    /// connection when the peer process is known dead, else pings it (a failed
    /// ping fails the connection on completion). Cheap when not yet due.
    pub fn check_peer(&mut self, key: u64) -> Result<()> {
        let me = self.me;
        let liveness = self.liveness;
        let proc_check = self.liveness_proc;
        let c = self.conn(key)?;
        if let Some(f) = &c.failed {
            return Err(Error::remote(format!("NET/OFI: {f}")));
        }
        let Some(interval) = liveness else {
            return Ok(());
        };
        let now = Instant::now();
        if now < c.next_check || now.duration_since(c.last_progress) < interval {
            return Ok(());
        }
        c.next_check = now + interval;
        if proc_check && me.is_local(&c.peer_proc) {
            if let Some(reason) = c.peer_proc.exit_reason() {
                c.failed = Some(reason.clone());
                return Err(Error::remote(format!("NET/OFI: {reason}")));
            }
        }
        if c.ping.is_some() && now.duration_since(c.ping_sent) >= interval * PING_PATIENCE {
            // A ping completes locally once the provider has handed it to the
            // network (tcp: the socket; EFA: the device's acknowledgement), which
            // needs no work from the peer's application. `tcp;ofi_rxm` retries a
            // refused reconnect forever instead of failing the ping, so silence
            // this long means the connection is gone.
            let reason = format!(
                "peer unreachable: liveness ping not completed after {:?}",
                now.duration_since(c.ping_sent)
            );
            c.failed = Some(reason.clone());
            return Err(Error::remote(format!("NET/OFI: {reason}")));
        }
        if c.ping.is_none() {
            c.ping_sent = now;
            let dest = c.peer;
            let tag = self.layout.ctrl(Ctrl::Ping, 0);
            let op = self.send_owned(dest, tag, Box::new([]), Owner::Ping, Some(key))?;
            if let Some(c) = self.conns.get_mut(&key) {
                c.ping = Some(op);
            }
        }
        Ok(())
    }
}
