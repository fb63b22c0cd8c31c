//! One endpoint per device, shared by every comm on it: posting, progress, and
//! the bookkeeping of operations in flight.
//!
//! Each posted operation owns a `Slot` whose first field is the `fi_context2`
//! libfabric hands back in completions. Slots are boxed (stable addresses) and
//! recycled with a generation count, so a stale [`OpId`] is never confused with
//! a new operation. Posts that get `-FI_EAGAIN` wait in a FIFO backlog that every
//! progress call retries, so `isend`/`irecv` never spin and never lose order.
//! Sends, control receives and data receives have a backlog each: a full
//! receive queue must not hold up the sends that would empty it (or a liveness
//! ping), nor NCCL's waiting receives a connection being set up.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cclkit_abi::{Result, nccl_warn};

use crate::fabric::{Av, Cq, Domain, Endpoint, FiError};
use crate::liveness::ProcId;
use crate::mr::MrCache;
use crate::sys;
use crate::tags::TagLayout;

mod bundle;
mod conns;
mod ctrl;
mod progress;
mod slots;
mod write;

pub use bundle::{BundleCounts, bundle_counts, count_bundle_hold};
pub use conns::Conn;
use conns::Ids;
pub use progress::{cq_reads, receives_refused};
pub use slots::SLOT_SHARED;
pub use write::{WriteCounts, count_offer_wait, write_counts};

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
    /// A send copied into its connection's open bundle (`bundle.rs`).
    Queued,
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
    /// A bundle of sends (`bundle.rs`): its buffer goes back to the connection.
    BundleTx,
    /// A posted bundle receive: its records are delivered on completion.
    BundleRx,
    /// A posted clear-to-write receive (`write.rs`): its offer is kept.
    CtsRx,
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

/// Posts waiting for room in the provider's queues, oldest first, one FIFO per
/// kind of post, so that no kind waits behind another.
#[derive(Debug, Default)]
struct Backlog {
    lanes: [VecDeque<(OpId, Post)>; 3],
}

/// The kinds of post that wait apart (`Backlog`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Send = 0,
    /// Connect, accept and ping receives: few, and never behind data.
    CtrlRecv = 1,
    DataRecv = 2,
}

impl Backlog {
    /// The posts of one lane.
    fn queue(&mut self, lane: Lane) -> &mut VecDeque<(OpId, Post)> {
        &mut self.lanes[lane as usize]
    }

    /// Drops `op` from whichever lane holds it.
    fn remove(&mut self, op: OpId) {
        for q in &mut self.lanes {
            q.retain(|(o, _)| *o != op);
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
    /// An RMA write with CQ data (`write.rs`).
    Write {
        buf: usize,
        len: usize,
        desc: usize,
        dest: u64,
        addr: u64,
        key: u64,
        data: u64,
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
    /// Counted in its connection's in-flight sends until it completes.
    data_send: bool,
    /// A posted receive already filled from a bundle and withdrawn: its
    /// completion (the cancellation) only frees the slot.
    cancelling: bool,
    /// A receive other than a bundle receive, in the provider's queue until its
    /// completion is read: counted in `Engine::rx_posted`.
    in_rx_queue: bool,
    /// The queued send (op, bytes, data tag) a bundle holds back: the last it
    /// carries completes with it, not when it is posted, so a request stays
    /// pending, and NCCL keeps calling `test` (which drives the provider), until
    /// the provider has the bundle out of its hands (`bundle/tx.rs`).
    carried: Vec<(OpId, usize, u64)>,
}

/// Hasher for connection keys: the engine hands them out itself (a counter), so
/// no caller can choose colliding keys, and the data path looks a connection up
/// several times per request (SipHash showed in its profile).
#[derive(Default)]
struct ConnKeyHasher(u64);

impl Hasher for ConnKeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, v: u64) {
        // Fibonacci hashing: consecutive keys spread over the table's top bits.
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
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
    backlog: Backlog,
    /// Connections with an open bundle (`bundle.rs`).
    open_tx: Vec<u64>,
    /// Connections with bundle receives waiting for room in the receive queue.
    rx_unposted: Vec<u64>,
    /// Receive comms that take writes, by comm id (`write.rs`).
    write_rx_conns: HashMap<u16, u64>,
    /// Standing bundle and clear-to-write receives allowed, and taken, on this endpoint.
    bundle_rx_budget: usize,
    bundle_rx_standing: usize,
    /// The provider's receive queue (posts), and the receives other than bundle
    /// receives in it now: those leave room for every bundle buffer (`bundle/rx.rs`).
    rx_queue: usize,
    rx_posted: usize,
    /// Posts that had to wait in a backlog, for `-FI_EAGAIN` or the entries kept for
    /// bundle receives (reported when the device closes).
    pub backlogged: u64,
    peers: HashMap<Vec<u8>, u64>,
    conns: HashMap<u64, Conn, BuildHasherDefault<ConnKeyHasher>>,
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
            backlog: Backlog::default(),
            open_tx: Vec::new(),
            rx_unposted: Vec::new(),
            write_rx_conns: HashMap::new(),
            bundle_rx_budget: 0,
            bundle_rx_standing: 0,
            rx_queue: 0,
            rx_posted: 0,
            backlogged: 0,
            peers: HashMap::new(),
            conns: HashMap::default(),
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
                    data_send: false,
                    cancelling: false,
                    in_rx_queue: false,
                    carried: Vec::new(),
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
        s.data_send = false;
        s.cancelling = false;
        s.in_rx_queue = false;
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
        if matches!(self.slots[idx as usize].state, State::Free) {
            return;
        }
        self.end_send(idx);
        self.left_rx_queue(idx);
        let carried = std::mem::take(&mut self.slots[idx as usize].carried);
        if !carried.is_empty() {
            self.settle_queued(
                carried,
                Some("the send comm was closed before this send went out"),
            );
        }
        let s = &mut self.slots[idx as usize];
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

    /// Tries one post. `Ok(false)` = `-FI_EAGAIN`, or a data receive that must
    /// leave the rest of the receive queue to the bundle buffers and control
    /// receives. Control receives (connect, accept, pings) never wait for that:
    /// they are few, and setting up a connection must not wait for data.
    fn try_post(&mut self, op: OpId, post: Post) -> std::result::Result<bool, FiError> {
        let lane = self.lane(post);
        let counted = lane != Lane::Send
            && !matches!(
                self.slots[op.idx as usize].owner,
                Owner::BundleRx | Owner::CtsRx
            );
        if lane == Lane::DataRecv && counted && self.rx_reserved_for_bundles() {
            return Ok(false);
        }
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
                Post::Write {
                    buf,
                    len,
                    desc,
                    dest,
                    addr,
                    key,
                    data,
                } => self.ep.writedata(
                    buf as *const c_void,
                    len,
                    desc as *mut c_void,
                    data,
                    dest,
                    addr,
                    key,
                    ctx,
                ),
            }
        };
        match r {
            Ok(()) => {
                let s = &mut self.slots[op.idx as usize];
                s.state = State::Posted;
                s.in_rx_queue = counted;
                self.rx_posted += usize::from(counted);
                Ok(true)
            }
            Err(e) if e.is_again() => {
                if matches!(post, Post::Recv { .. }) {
                    progress::RECVS_REFUSED.fetch_add(1, Ordering::Relaxed);
                }
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Posts now, or queues behind earlier posts: on `-FI_EAGAIN` the operation
    /// waits in the backlog, which every `progress` (each `test`) retries after
    /// reading completions. Never reads the CQ itself, so it is safe to call while
    /// completions are being handled (the ping sink re-posts from there).
    fn submit(&mut self, op: OpId, post: Post) -> Result<OpId> {
        let lane = self.lane(post);
        if self.backlog.queue(lane).is_empty() {
            match self.try_post(op, post) {
                Ok(true) => return Ok(op),
                Ok(false) => {}
                Err(e) => {
                    self.release(op.idx);
                    return Err(e.into());
                }
            }
        }
        self.backlogged += 1;
        self.backlog.queue(lane).push_back((op, post));
        Ok(op)
    }

    /// Which backlog `post` waits in.
    fn lane(&self, post: Post) -> Lane {
        match post {
            Post::Send { .. } | Post::Write { .. } => Lane::Send,
            Post::Recv { tag, .. } if self.layout.comm_of(tag).is_some() => Lane::DataRecv,
            Post::Recv { .. } => Lane::CtrlRecv,
        }
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

    /// Whether `op` waits in the backlog (`-FI_EAGAIN`) rather than being posted.
    pub fn backlogged(&self, op: OpId) -> bool {
        matches!(self.slot(op).map(|s| &s.state), Some(State::Backlogged))
    }

    /// Takes the owned buffer of a completed control operation.
    pub fn take_buf(&mut self, op: OpId) -> Option<Box<[u8]>> {
        self.slot_mut(op).and_then(|s| s.buf.take())
    }

    /// Releases a completed operation, or gives up on one still in flight
    /// (a posted receive is cancelled; a send completes unobserved).
    pub fn finish(&mut self, op: OpId) {
        let Some(s) = self.slot_mut(op) else { return };
        let conn = s.conn;
        if s.recv {
            self.forget_waiter(conn, op);
        }
        let Some(s) = self.slot_mut(op) else { return };
        match s.state {
            // Withdrawn from the provider: the slot waits for the cancellation.
            State::Done(_) | State::Failed(_) if s.cancelling => s.owner = Owner::Orphan,
            State::Done(_) | State::Failed(_) => self.release(op.idx),
            // Its bytes are in the open bundle, which still goes out (the receiver
            // may wait for them); the slot is freed then.
            State::Queued => s.owner = Owner::Orphan,
            State::Backlogged => {
                self.backlog.remove(op);
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
}
