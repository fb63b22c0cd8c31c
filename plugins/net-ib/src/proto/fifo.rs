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

use super::{MAX_RECVS, MAX_REQUESTS};

/// One clear-to-send entry: where the sender may write one buffer of a receive.
///
/// Wire layout (native endianness, both hosts run the same plugin build):
/// `addr u64 | size[0..32] u32, rkey u32 | tag i32, nreqs u8, size[32..56] u24 |
/// idx u64` = 32 bytes. The size has 56 bits (messages go up to NCCL's 1 TiB; NCCL's
/// own `ncclIbSendFifo` has a 64-bit size in a 64-byte element).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FifoElem {
    /// Receive buffer address.
    pub addr: u64,
    /// Posted size in bytes (below 2^56).
    pub size: u64,
    /// Remote key of the receive buffer.
    pub rkey: u32,
    /// Tag the matching send must carry.
    pub tag: i32,
    /// Buffers in this receive (1 … 8).
    pub nreqs: u32,
    /// Sequence number of the receive (≥ 1); last, see the module doc.
    pub idx: u64,
}

/// Bytes of one element.
pub const ELEM_BYTES: usize = 32;
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
    /// The four words as laid out in memory.
    pub fn to_words(self) -> [u64; 4] {
        [
            self.addr,
            (self.size & 0xffff_ffff) | u64::from(self.rkey) << 32,
            u64::from(self.tag as u32)
                | u64::from(self.nreqs & 0xff) << 32
                | (self.size >> 32 & 0xff_ffff) << 40,
            self.idx,
        ]
    }

    /// Inverse of [`to_words`](Self::to_words).
    pub fn from_words(w: [u64; 4]) -> Self {
        Self {
            addr: w[0],
            size: (w[1] & 0xffff_ffff) | (w[2] >> 40) << 32,
            rkey: (w[1] >> 32) as u32,
            tag: w[2] as u32 as i32,
            nreqs: ((w[2] >> 32) & 0xff) as u32,
            idx: w[3],
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
        let mut w = [0u64; 4];
        for (i, word) in w.iter_mut().enumerate() {
            *word = self.load(base + 8 * i, Ordering::Relaxed);
        }
        FifoElem::from_words(w)
    }

    /// The `idx` word of element `elem` of slot `slot` (Acquire: the other words of
    /// the element are read after it).
    pub fn elem_idx(&self, slot: usize, elem: usize) -> u64 {
        self.load(
            slot * SLOT_BYTES + elem * ELEM_BYTES + 24,
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
            rkey: 0xfeed_f00d,
            tag: -3,
            nreqs: 8,
            idx: 0x1_0000_0001,
        };
        assert_eq!(FifoElem::from_words(e.to_words()), e);
        assert_eq!(e.to_words()[3], e.idx);
        let mem = HostMem::new(FIFO_BYTES).unwrap();
        assert_eq!(mem.addr() % 4096, 0);
        mem.write_elem(31, 7, e);
        assert_eq!(mem.read_elem(31, 7), e);
        assert_eq!(mem.elem_idx(31, 7), e.idx);
        assert_eq!(mem.read_elem(0, 0), FifoElem::default());
        assert_eq!(FIFO_BYTES, 8192);
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
