//! Requests: a fixed pool of slots per comm, handed to NCCL as plain pointers.
//!
//! A slot counts the parts of its operation still outstanding (the control-stream
//! part and one per striped chunk); whoever finishes the last part publishes DONE
//! or FAILED with a release store, so `test` is one acquire load. Nothing is
//! allocated per request, and the slots die with their comm, so a comm closed with
//! requests in flight leaves nothing behind.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use cclkit_abi::net::RawHandle;

use crate::comm::Core;
use crate::wire::MAX_RECVS;

const FREE: u32 = 0;
const PENDING: u32 = 1;
const DONE: u32 = 2;
const FAILED: u32 = 3;

/// One request's state.
pub struct Slot {
    state: AtomicU32,
    remaining: AtomicU32,
    /// Set when a part failed on its own (truncation); the request then ends FAILED.
    has_error: AtomicBool,
    error: Mutex<Option<String>>,
    /// Buffers of the request (1 for a send).
    nbufs: AtomicU32,
    sizes: [AtomicU64; MAX_RECVS],
    /// The comm that owns this slot (its pool lives inside it).
    core: *const Core,
    /// The request's profiler event (net v10+ hosts with a profiler).
    pub prof: crate::prof::ReqEvent,
}

// SAFETY: every field is an atomic or a mutex except `core`, a pointer to the
// owning comm that is only read; the comm outlives its slots (they live inside it).
unsafe impl Send for Slot {}
// SAFETY: as above.
unsafe impl Sync for Slot {}

impl Slot {
    /// Records `size` bytes for buffer `index`.
    pub fn set_size(&self, index: usize, size: usize) {
        if let Some(s) = self.sizes.get(index) {
            s.store(size as u64, Ordering::Relaxed);
        }
    }

    /// Adds `n` outstanding parts (chunks handed to helper threads).
    pub fn add_parts(&self, n: usize) {
        self.remaining.fetch_add(n as u32, Ordering::Relaxed);
    }

    /// Marks the request failed once its outstanding parts finish.
    pub fn set_error(&self, message: String) {
        if let Ok(mut e) = self.error.lock() {
            e.get_or_insert(message);
        }
        self.has_error.store(true, Ordering::Relaxed);
    }

    /// One part finished; the last one publishes the outcome.
    pub fn finish_part(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let outcome = if self.has_error.load(Ordering::Relaxed) {
                FAILED
            } else {
                DONE
            };
            self.state.store(outcome, Ordering::Release);
        }
    }

    fn error_message(&self) -> String {
        self.error
            .lock()
            .ok()
            .and_then(|e| e.clone())
            .unwrap_or_else(|| "request failed".to_owned())
    }
}

/// What `test` found.
pub enum Outcome {
    /// Still running.
    Pending,
    /// Finished; `sizes()` are valid.
    Done,
    /// Failed with this message.
    Failed(String),
}

/// The slots of one comm.
pub struct Pool {
    slots: Box<[Slot]>,
    /// Where the next search for a free slot starts: requests are released roughly
    /// in posting order, so the slot after the last one taken is usually free.
    next: AtomicUsize,
}

impl Pool {
    /// `capacity` slots owned by the comm at `core` (stable: the comm is in an `Arc`).
    pub fn new(capacity: usize, core: *const Core) -> Self {
        let slots = (0..capacity)
            .map(|_| Slot {
                state: AtomicU32::new(FREE),
                remaining: AtomicU32::new(0),
                has_error: AtomicBool::new(false),
                error: Mutex::new(None),
                nbufs: AtomicU32::new(0),
                sizes: Default::default(),
                core,
                prof: Default::default(),
            })
            .collect();
        Self {
            slots,
            next: AtomicUsize::new(0),
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Takes a free slot for an operation on `nbufs` buffers made of `parts` parts.
    pub fn acquire(&self, nbufs: usize, parts: usize) -> Option<Request> {
        let n = self.slots.len();
        let start = self.next.load(Ordering::Relaxed);
        let (at, slot) = (0..n)
            .map(|i| (start + i) % n)
            .map(|i| (i, &self.slots[i]))
            .find(|(_, s)| {
                // A plain load first: a locked compare-exchange on a busy slot costs more.
                s.state.load(Ordering::Relaxed) == FREE
                    && s.state
                        .compare_exchange(FREE, PENDING, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
            })?;
        self.next.store((at + 1) % n, Ordering::Relaxed);
        slot.remaining.store(parts as u32, Ordering::Relaxed);
        if slot.has_error.swap(false, Ordering::Relaxed) {
            if let Ok(mut e) = slot.error.lock() {
                *e = None;
            }
        }
        slot.nbufs.store(nbufs as u32, Ordering::Relaxed);
        for s in &slot.sizes {
            s.store(0, Ordering::Relaxed);
        }
        Some(Request(NonNull::from(slot)))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // NCCL's abort closes a comm with requests in flight and never tests them
        // again, but a host that does must get an error, not freed memory: slots still
        // held are marked failed and kept (a few KiB, only when requests were abandoned).
        let held = |s: &&Slot| s.state.load(Ordering::Acquire) != FREE;
        if !self.slots.iter().any(|s| held(&s)) {
            return;
        }
        for s in self.slots.iter().filter(held) {
            s.set_error("test() after its comm was closed".to_owned());
            s.state.store(FAILED, Ordering::Release);
        }
        std::mem::forget(std::mem::take(&mut self.slots));
    }
}

/// A pointer to a slot that helper threads and the control stream complete.
#[derive(Clone, Copy)]
pub struct SlotPtr(NonNull<Slot>);

// SAFETY: a `Slot` is Sync; the pointer stays valid while its comm lives, and
// helper threads stop using slots before the comm is freed (joined in close).
unsafe impl Send for SlotPtr {}

impl SlotPtr {
    /// The slot.
    pub fn get(&self) -> &Slot {
        // SAFETY: see the `Send` impl: the comm (and so the slot) outlives every
        // SlotPtr, which only live in that comm's queues and control state.
        unsafe { self.0.as_ref() }
    }
}

/// An in-flight request as NCCL holds it: a pointer to its slot.
pub struct Request(NonNull<Slot>);

// SAFETY: the slot is Sync and lives as long as the comm; NCCL may test a request
// from another thread than the one that posted it.
unsafe impl Send for Request {}

// SAFETY: `into_raw`/`from_raw` round-trip the slot pointer; a slot is a heap
// object with alignment ≥ 8, so its address is never 1 (the optional-completion
// sentinel); it stays valid until the comm closes, after which NCCL never tests.
unsafe impl RawHandle for Request {
    fn into_raw(self) -> NonNull<c_void> {
        let ptr = self.0.cast();
        std::mem::forget(self);
        ptr
    }

    unsafe fn from_raw(ptr: NonNull<c_void>) -> Self {
        Self(ptr.cast())
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        // NCCL is done with the request (tested done/failed, or never posted).
        self.slot().prof.end(0);
        self.slot().state.store(FREE, Ordering::Release);
    }
}

impl Request {
    /// The slot.
    pub fn slot(&self) -> &Slot {
        // SAFETY: a request never outlives its comm (see the RawHandle impl).
        unsafe { self.0.as_ref() }
    }

    /// A pointer helper threads and the control stream use to complete it.
    pub fn ptr(&self) -> SlotPtr {
        SlotPtr(self.0)
    }

    /// The comm that owns the request.
    pub fn core(&self) -> &Core {
        // SAFETY: the comm owns the slot's pool, so it is alive while the slot is.
        unsafe { &*self.slot().core }
    }

    /// Reads the outcome (one acquire load on the fast path).
    pub fn outcome(&self) -> Outcome {
        let slot = self.slot();
        match slot.state.load(Ordering::Acquire) {
            DONE => Outcome::Done,
            FAILED => Outcome::Failed(slot.error_message()),
            _ => Outcome::Pending,
        }
    }

    /// Sizes of a finished request, one per buffer.
    pub fn sizes(&self) -> impl Iterator<Item = usize> + '_ {
        let slot = self.slot();
        let n = slot.nbufs.load(Ordering::Relaxed) as usize;
        slot.sizes[..n.min(MAX_RECVS)]
            .iter()
            .map(|s| s.load(Ordering::Relaxed) as usize)
    }
}
