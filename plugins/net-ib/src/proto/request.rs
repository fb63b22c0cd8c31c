//! Completion state of one request, shared between the comm (which completes it
//! while polling its CQ) and the request handle NCCL tests.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use super::MAX_RECVS;

const PENDING: u8 = 0;
const DONE: u8 = 1;
const FAILED: u8 = 2;

/// Outcome of a request so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Still in flight.
    Pending,
    /// Completed; sizes are readable.
    Done,
    /// The connection failed; the comm holds the error.
    Failed,
}

/// One request's completion: state plus the size of each buffer.
#[derive(Debug)]
pub struct ReqCell {
    state: AtomicU8,
    n: usize,
    sizes: [AtomicU64; MAX_RECVS],
}

impl ReqCell {
    /// A pending request over `n` buffers (1 … 8).
    pub fn new(n: usize) -> Self {
        Self {
            state: AtomicU8::new(PENDING),
            n: n.clamp(1, MAX_RECVS),
            sizes: Default::default(),
        }
    }

    /// Number of buffers.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Always false (a request has at least one buffer); for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Completes with one size per buffer (extra entries are ignored).
    pub fn complete(&self, sizes: &[u64]) {
        for (slot, s) in self.sizes.iter().zip(sizes) {
            slot.store(*s, Ordering::Relaxed);
        }
        // Release: the sizes (and the data the NIC wrote before the completion we
        // polled) happen-before a test() that sees DONE.
        let _ = self
            .state
            .compare_exchange(PENDING, DONE, Ordering::Release, Ordering::Relaxed);
    }

    /// Marks the request failed (a later `complete` cannot undo it).
    pub fn fail(&self) {
        let _ = self
            .state
            .compare_exchange(PENDING, FAILED, Ordering::Release, Ordering::Relaxed);
    }

    /// Current state.
    pub fn state(&self) -> State {
        match self.state.load(Ordering::Acquire) {
            PENDING => State::Pending,
            DONE => State::Done,
            _ => State::Failed,
        }
    }

    /// Size of buffer `i` (valid once done).
    pub fn size(&self, i: usize) -> u64 {
        self.sizes.get(i).map_or(0, |s| s.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_once_and_failure_sticks() {
        let c = ReqCell::new(3);
        assert_eq!(c.state(), State::Pending);
        c.complete(&[1, 2, 3]);
        assert_eq!(c.state(), State::Done);
        assert_eq!((c.size(0), c.size(1), c.size(2), c.size(9)), (1, 2, 3, 0));
        c.fail();
        assert_eq!(c.state(), State::Done, "a done request stays done");
        let f = ReqCell::new(1);
        f.fail();
        f.complete(&[5]);
        assert_eq!(f.state(), State::Failed);
        assert_eq!(ReqCell::new(99).len(), MAX_RECVS);
    }
}
