//! Deterministic random message contents: both processes derive message `id`'s
//! bytes from the shared seed, so the receiver checks data it never saw.

/// SplitMix64 step, to spread (seed, id) into a state.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small PRNG (xorshift64*), also used to shuffle message order.
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Self(mix(seed) | 1)
    }

    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Fills `buf` with message `id`'s bytes.
pub fn fill(seed: u64, id: u64, buf: &mut [u8]) {
    let mut r = Rng::new(seed ^ mix(id));
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&r.next_u64().to_le_bytes());
    }
    let tail = chunks.into_remainder();
    let last = r.next_u64().to_le_bytes();
    let n = tail.len();
    tail.copy_from_slice(&last[..n]);
}

/// Index of the first byte of `buf` that differs from message `id`, if any.
pub fn first_mismatch(seed: u64, id: u64, buf: &[u8]) -> Option<usize> {
    let mut want = vec![0u8; buf.len()];
    fill(seed, id, &mut want);
    buf.iter().zip(&want).position(|(a, b)| a != b)
}

/// Shuffles `v` in place (Fisher–Yates).
pub fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i + 1));
    }
}
