//! Splitting one buffer over the QPs of a connection (`NCCL_IB_QPS_PER_CONNECTION`).
//!
//! Each QP carries one contiguous chunk; chunks are `ceil(size / nqps)` rounded up to
//! 128 bytes (NCCL's alignment, so chunk boundaries fall on cache lines), hence the
//! last QPs may get a short or empty chunk.

use std::ops::Range;

/// Chunk alignment in bytes.
pub const ALIGN: usize = 128;

/// The byte range of a `size`-byte buffer that QP `q` of `nqps` carries.
pub fn chunk(size: usize, nqps: usize, q: usize) -> Range<usize> {
    let nqps = nqps.max(1);
    let per = size.div_ceil(nqps).next_multiple_of(ALIGN);
    let start = q.saturating_mul(per).min(size);
    start..start.saturating_add(per).min(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn chunks_tile_the_buffer_with_aligned_boundaries() {
        let mut rng = rand::rng();
        for _ in 0..2000 {
            let size = match rng.random_range(0..4) {
                0 => rng.random_range(0..300),
                1 => rng.random_range(0..70_000),
                2 => rng.random_range(0..(1 << 24)),
                _ => (1 << 30) - rng.random_range(0..1000),
            };
            let nqps = rng.random_range(1..=16);
            let mut next = 0;
            for q in 0..nqps {
                let r = chunk(size, nqps, q);
                assert_eq!(r.start, next, "size {size} nqps {nqps} q {q}");
                assert!(r.start <= r.end && r.end <= size);
                if r.end < size {
                    assert_eq!(r.end % ALIGN, 0, "size {size} nqps {nqps} q {q}");
                }
                assert!(r.len() <= size.div_ceil(nqps).next_multiple_of(ALIGN));
                next = r.end;
            }
            assert_eq!(next, size, "size {size} nqps {nqps}");
        }
    }

    #[test]
    fn exact_examples() {
        assert_eq!(chunk(1000, 1, 0), 0..1000);
        assert_eq!(chunk(1000, 2, 0), 0..512);
        assert_eq!(chunk(1000, 2, 1), 512..1000);
        assert_eq!(chunk(100, 4, 0), 0..100);
        assert_eq!(chunk(100, 4, 3), 100..100);
        assert_eq!(chunk(0, 3, 1), 0..0);
        assert_eq!(chunk(1 << 20, 4, 2), (1 << 19)..(3 << 18));
    }
}
