//! The clear-to-send FIFO: slot layout, and the host memory the NIC writes into.
//!
//! The receiver RDMA-writes one [`FifoElem`] per buffer of a (grouped) receive into
//! the sender's FIFO slot `(idx - 1) % MAX_REQUESTS`. `idx` (1, 2, 3, … per
//! connection, never 0) is the element's last word: a NIC writes a WRITE's bytes in
//! increasing address order, so once the sender sees the expected `idx` in every
//! element of the slot, the rest of the slot has landed (NCCL relies on the same).
//! Slot memory is read with atomic loads: the NIC may write it at any moment.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Keys, MAX_DEVS, MAX_RECVS, MAX_REQUESTS};

/// One clear-to-send entry: where the sender may write one buffer of a receive.
///
/// Wire layout (native endianness, both hosts run the same plugin build), eight
/// words = 64 bytes as NCCL's `ncclIbSendFifo`: `addr u64 | size u64 | rkeys
/// [u32; 8] | tag i32, nreqs u32 | idx u64`. One rkey per physical device of the
/// receiver's (virtual) device: the sender writes through its QP `q` with the key of
/// the receiver's device `q mod ndevs` (NCCL's `slots[r].rkeys[qp->remDevIdx]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FifoElem {
    /// Receive buffer address.
    pub addr: u64,
    /// Posted size in bytes.
    pub size: u64,
    /// Remote keys of the receive buffer, per device of the receiver.
    pub rkeys: Keys,
    /// Tag the matching send must carry.
    pub tag: i32,
    /// Buffers in this receive (1 … 8).
    pub nreqs: u32,
    /// Sequence number of the receive (≥ 1); last, see the module doc.
    pub idx: u64,
}

/// Bytes of one element.
pub const ELEM_BYTES: usize = 64;
/// Words of one element.
const ELEM_WORDS: usize = ELEM_BYTES / 8;
/// Bytes of one slot (`MAX_RECVS` elements).
pub const SLOT_BYTES: usize = ELEM_BYTES * MAX_RECVS;
/// Bytes of the whole FIFO.
pub const FIFO_BYTES: usize = SLOT_BYTES * MAX_REQUESTS;
/// Bytes of the per-slot size records of grouped receives (`u64` per buffer).
pub const SIZES_SLOT_BYTES: usize = 8 * MAX_RECVS;
/// Bytes of all size records.
pub const SIZES_BYTES: usize = SIZES_SLOT_BYTES * MAX_REQUESTS;

/// The slot of sequence number `idx` (≥ 1; a corrupt 0 maps to the last slot, where
/// the caller's sequence check rejects it).
pub fn slot_of(idx: u64) -> usize {
    (idx.wrapping_sub(1) % MAX_REQUESTS as u64) as usize
}

impl FifoElem {
    /// The words as laid out in memory.
    pub fn to_words(self) -> [u64; ELEM_WORDS] {
        let k = |i: usize| u64::from(self.rkeys[2 * i]) | u64::from(self.rkeys[2 * i + 1]) << 32;
        [
            self.addr,
            self.size,
            k(0),
            k(1),
            k(2),
            k(3),
            u64::from(self.tag as u32) | u64::from(self.nreqs) << 32,
            self.idx,
        ]
    }

    /// Inverse of [`to_words`](Self::to_words).
    pub fn from_words(w: [u64; ELEM_WORDS]) -> Self {
        let mut rkeys = [0u32; MAX_DEVS];
        for (i, k) in rkeys.iter_mut().enumerate() {
            *k = (w[2 + i / 2] >> (32 * (i % 2))) as u32;
        }
        Self {
            addr: w[0],
            size: w[1],
            rkeys,
            tag: w[6] as u32 as i32,
            nreqs: (w[6] >> 32) as u32,
            idx: w[7],
        }
    }
}

/// Zeroed, page-aligned host memory that a NIC may read or write (FIFO, staging,
/// size records). Accessed only through atomic 64-bit words.
pub struct HostMem {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain owned memory; all access goes through atomics.
unsafe impl Send for HostMem {}
// SAFETY: as above.
unsafe impl Sync for HostMem {}

impl HostMem {
    /// `len` zeroed bytes (rounded up to 8), aligned to 4096.
    pub fn new(len: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len.max(8).next_multiple_of(8), 4096).ok()?;
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(Self { ptr, layout })
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Never empty (at least 8 bytes); for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn word(&self, byte_offset: usize) -> &AtomicU64 {
        // Cannot fire: callers pass slot < MAX_REQUESTS and element < MAX_RECVS. Kept
        // so that a bug panics (caught by the export guard) instead of corrupting memory.
        assert!(
            byte_offset % 8 == 0 && byte_offset + 8 <= self.len(),
            "word offset {byte_offset} outside {} bytes",
            self.len()
        );
        // SAFETY: in bounds and 8-aligned (base is page-aligned); the memory lives as
        // long as `self`, and is only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(byte_offset).cast()) }
    }

    /// Loads the word at `byte_offset`.
    pub fn load(&self, byte_offset: usize, order: Ordering) -> u64 {
        self.word(byte_offset).load(order)
    }

    /// Stores the word at `byte_offset`.
    pub fn store(&self, byte_offset: usize, value: u64, order: Ordering) {
        self.word(byte_offset).store(value, order)
    }

    /// Reads element `elem` of slot `slot` of a FIFO.
    pub fn read_elem(&self, slot: usize, elem: usize) -> FifoElem {
        let base = slot * SLOT_BYTES + elem * ELEM_BYTES;
        let mut w = [0u64; ELEM_WORDS];
        for (i, word) in w.iter_mut().enumerate() {
            *word = self.load(base + 8 * i, Ordering::Relaxed);
        }
        FifoElem::from_words(w)
    }

    /// The `idx` word of element `elem` of slot `slot` (Acquire: the other words of
    /// the element are read after it).
    pub fn elem_idx(&self, slot: usize, elem: usize) -> u64 {
        self.load(
            slot * SLOT_BYTES + elem * ELEM_BYTES + ELEM_BYTES - 8,
            Ordering::Acquire,
        )
    }

    /// Writes element `elem` of slot `slot` (staging memory the NIC will read).
    pub fn write_elem(&self, slot: usize, elem: usize, e: FifoElem) {
        let base = slot * SLOT_BYTES + elem * ELEM_BYTES;
        for (i, w) in e.to_words().into_iter().enumerate() {
            self.store(base + 8 * i, w, Ordering::Relaxed);
        }
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elem_round_trips_and_idx_is_the_last_word() {
        let e = FifoElem {
            addr: 0x7f00_dead_beef_0040,
            size: (1 << 40) + 12345,
            rkeys: [0xfeed_f00d, 2, 3, 4, 5, 6, 7, 0xffff_fffe],
            tag: -3,
            nreqs: 8,
            idx: 0x1_0000_0001,
        };
        assert_eq!(FifoElem::from_words(e.to_words()), e);
        assert_eq!(e.to_words()[ELEM_WORDS - 1], e.idx);
        let mem = HostMem::new(FIFO_BYTES).unwrap();
        assert_eq!(mem.addr() % 4096, 0);
        mem.write_elem(31, 7, e);
        assert_eq!(mem.read_elem(31, 7), e);
        assert_eq!(mem.elem_idx(31, 7), e.idx);
        assert_eq!(mem.read_elem(0, 0), FifoElem::default());
        assert_eq!(FIFO_BYTES, 16384);
    }

    #[test]
    fn slots_wrap_every_max_requests() {
        assert_eq!(slot_of(1), 0);
        assert_eq!(slot_of(32), 31);
        assert_eq!(slot_of(33), 0);
        assert_eq!(slot_of(1000), 999 % 32);
        assert_eq!(slot_of(0), 31, "a corrupt 0 does not underflow");
    }
}
