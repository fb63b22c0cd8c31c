//! The 32-bit immediate carried by the RDMA WRITE_WITH_IMM that completes a receive.
//!
//! * single-buffer receive of less than 2 GiB: the immediate is the size sent, so the
//!   receiver learns it without reading memory;
//! * grouped receive (2 … 8 buffers), or a single buffer of 2 GiB or more (messages go
//!   up to NCCL's 1 TiB): bit 31 is set and the low 31 bits are the receive's sequence
//!   number (mod 2^31), checked by the receiver; the WRITE_WITH_IMM itself wrote the
//!   per-buffer sizes into its size records.
//!
//! Every QP of a connection carries one such write per message (the receiver posts
//! one receive per QP), with the same immediate.

use cclkit_abi::{Error, Result};

const MULTI: u32 = 1 << 31;

/// A decoded immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imm {
    /// Size of the one buffer sent.
    Single(u32),
    /// Sequence number (mod 2^31) of a grouped receive.
    Multi(u32),
}

impl Imm {
    /// The immediate for a single-buffer message of `size` bytes.
    pub fn single(size: usize) -> Result<Self> {
        u32::try_from(size)
            .ok()
            .filter(|s| s & MULTI == 0)
            .map(Imm::Single)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "message of {size} bytes does not fit the 31-bit immediate"
                ))
            })
    }

    /// The immediate for grouped receive `idx`.
    pub fn multi(idx: u64) -> Self {
        Imm::Multi((idx as u32) & !MULTI)
    }

    /// The wire value.
    pub fn encode(self) -> u32 {
        match self {
            Imm::Single(size) => size & !MULTI,
            Imm::Multi(seq) => MULTI | (seq & !MULTI),
        }
    }

    /// Decodes a wire value (every value is valid).
    pub fn decode(raw: u32) -> Self {
        if raw & MULTI == 0 {
            Imm::Single(raw)
        } else {
            Imm::Multi(raw & !MULTI)
        }
    }

    /// Whether this immediate belongs to receive `idx` with `nbufs` buffers (a single
    /// buffer of 2 GiB or more also reports its size through the size records).
    pub fn matches(self, idx: u64, nbufs: usize) -> bool {
        match self {
            Imm::Single(_) => nbufs == 1,
            Imm::Multi(_) => self == Imm::multi(idx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_sizes_round_trip_up_to_2_pow_31() {
        for size in [0usize, 1, 127, 128, 4096, 1 << 20, 1 << 30, (1 << 31) - 1] {
            let imm = Imm::single(size).unwrap();
            assert_eq!(Imm::decode(imm.encode()), Imm::Single(size as u32));
            assert!(imm.matches(77, 1));
            assert!(!imm.matches(77, 2));
        }
        assert!(Imm::single(1 << 31).is_err());
        assert!(Imm::single(usize::MAX).is_err());
    }

    #[test]
    fn multi_carries_the_sequence_number_and_sets_bit_31() {
        for idx in [1u64, 2, 33, 0x7fff_ffff, 0x8000_0000, 0x1_2345_6789] {
            let imm = Imm::multi(idx);
            let raw = imm.encode();
            assert_ne!(raw & (1 << 31), 0);
            assert_eq!(raw & 0x7fff_ffff, (idx & 0x7fff_ffff) as u32);
            assert_eq!(Imm::decode(raw), imm);
            assert!(imm.matches(idx, 8));
            assert!(!imm.matches(idx + 1, 8));
            assert!(imm.matches(idx, 1), "a ≥ 2 GiB single message uses records");
        }
        assert_eq!(Imm::decode(0x8000_0005), Imm::Multi(5));
        assert_eq!(Imm::decode(5), Imm::Single(5));
    }
}
