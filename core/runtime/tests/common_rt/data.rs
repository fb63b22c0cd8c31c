//! Random inputs and serial references for every NCCL data type and reduction op.
//!
//! Every rank can regenerate every other rank's input from the seed, so references
//! need no communication. Integers are checked exactly (wrapping sum and prod, avg =
//! wrapped sum / n truncated, as NCCL). Floats: min/max exactly (the result is one of
//! the inputs, `-0 < +0`); sum, prod and avg against the f64 value of the inputs with
//! the serial bound the kernels crate documents (kernels/README.md):
//! `|got − s| ≤ γ(n−1)·Σ|xᵢ| + n·η` for sums, `γ(n−1)·|p| + n·η` for products, and
//! `(γ(n−1) + 3u)·Σ|xᵢ|/n + n·η` for avg; any fold order or tree shape obeys it.

use cclkit_abi::raw::common::{DataType, RedOp};
use cclkit_kernels::{Bf16, F16, Fp8E4M3, Fp8E5M2};
use cclkit_runtime::Comm;

/// Every NCCL data type.
pub const TYPES: [DataType; 12] = [
    DataType::INT8,
    DataType::UINT8,
    DataType::INT32,
    DataType::UINT32,
    DataType::INT64,
    DataType::UINT64,
    DataType::FLOAT16,
    DataType::FLOAT32,
    DataType::FLOAT64,
    DataType::BFLOAT16,
    DataType::FLOAT8E4M3,
    DataType::FLOAT8E5M2,
];

/// Every built-in reduction op.
pub const OPS: [RedOp; 5] = [RedOp::SUM, RedOp::PROD, RedOp::MIN, RedOp::MAX, RedOp::AVG];

/// splitmix64: fast, deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// A generator for the stream named by `parts` (seed, case, rank, …).
    pub fn new(parts: &[u64]) -> Self {
        let mut r = Self(0x9e37_79b9_7f4a_7c15);
        for &p in parts {
            r.0 ^= p;
            r.next_u64();
        }
        r
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.fill(&mut v);
        v
    }
}

/// Bytes per element.
pub fn size(dt: DataType) -> usize {
    dt.size().expect("known type")
}

/// Integer types.
pub fn is_int(dt: DataType) -> bool {
    dt.0 <= DataType::UINT64.0
}

fn signed(dt: DataType) -> bool {
    matches!(dt, DataType::INT8 | DataType::INT32 | DataType::INT64)
}

/// Element `i` of an integer buffer, as a mathematical integer.
pub fn int_at(dt: DataType, b: &[u8], i: usize) -> i128 {
    let w = size(dt);
    let mut raw = [0u8; 8];
    raw[..w].copy_from_slice(&b[i * w..(i + 1) * w]);
    let u = u64::from_le_bytes(raw);
    wrap(dt, i128::from(u))
}

/// `v` wrapped into the type's range (two's complement).
pub fn wrap(dt: DataType, v: i128) -> i128 {
    let bits = 8 * size(dt) as u32;
    let m = v.rem_euclid(1i128 << bits);
    if signed(dt) && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

/// Element `i` of a float buffer, exactly, as f64.
pub fn float_at(dt: DataType, b: &[u8], i: usize) -> f64 {
    let w = size(dt);
    let e = &b[i * w..(i + 1) * w];
    match dt {
        DataType::FLOAT16 => f64::from(F16(u16::from_le_bytes([e[0], e[1]])).to_f32()),
        DataType::BFLOAT16 => f64::from(Bf16(u16::from_le_bytes([e[0], e[1]])).to_f32()),
        DataType::FLOAT32 => f64::from(f32::from_le_bytes([e[0], e[1], e[2], e[3]])),
        DataType::FLOAT64 => f64::from_le_bytes(e.try_into().expect("8 bytes")),
        DataType::FLOAT8E4M3 => f64::from(Fp8E4M3(e[0]).to_f32()),
        DataType::FLOAT8E5M2 => f64::from(Fp8E5M2(e[0]).to_f32()),
        _ => panic!("{dt:?} is not a float type"),
    }
}

/// Writes `x` (rounded to the type) as element `i`.
fn set_float(dt: DataType, b: &mut [u8], i: usize, x: f64) {
    let w = size(dt);
    let e = &mut b[i * w..(i + 1) * w];
    match dt {
        DataType::FLOAT16 => e.copy_from_slice(&F16::from_f32(x as f32).0.to_le_bytes()),
        DataType::BFLOAT16 => e.copy_from_slice(&Bf16::from_f32(x as f32).0.to_le_bytes()),
        DataType::FLOAT32 => e.copy_from_slice(&(x as f32).to_le_bytes()),
        DataType::FLOAT64 => e.copy_from_slice(&x.to_le_bytes()),
        DataType::FLOAT8E4M3 => e[0] = Fp8E4M3::from_f32(x as f32).0,
        DataType::FLOAT8E5M2 => e[0] = Fp8E5M2::from_f32(x as f32).0,
        _ => panic!("{dt:?} is not a float type"),
    }
}

/// Unit roundoff and smallest subnormal of a float type.
fn precision(dt: DataType) -> (f64, f64) {
    let p = |e: i32| 2f64.powi(e);
    match dt {
        DataType::FLOAT16 => (p(-11), p(-24)),
        DataType::BFLOAT16 => (p(-8), p(-133)),
        DataType::FLOAT32 => (p(-24), p(-149)),
        DataType::FLOAT64 => (p(-53), f64::from_bits(1)),
        DataType::FLOAT8E4M3 => (p(-4), p(-9)),
        DataType::FLOAT8E5M2 => (p(-3), p(-16)),
        _ => (0.0, 0.0),
    }
}

/// A rank's input of `count` elements for `op`: raw bits for integers; for floats
/// values that 8 ranks can sum or multiply without overflowing any type, zeros and
/// signs mixed in (products near 1 so they neither overflow nor underflow).
pub fn input(dt: DataType, op: RedOp, count: usize, rng: &mut Rng) -> Vec<u8> {
    let mut v = rng.bytes(count * size(dt));
    if !is_int(dt) {
        for i in 0..count {
            let x = match (op, rng.below(16)) {
                (_, 0) => 0.0,
                (RedOp::PROD, k) => rng.range(0.75, 1.5) * if k % 3 == 0 { -1.0 } else { 1.0 },
                _ => rng.range(-8.0, 8.0),
            };
            set_float(dt, &mut v, i, x);
        }
    }
    v
}

/// Checks `got` (`count` elements) against the reduction of `inputs` (each at
/// element offset `at`); returns the first problem.
pub fn check_reduction(
    dt: DataType,
    op: RedOp,
    inputs: &[&[u8]],
    at: usize,
    got: &[u8],
) -> Result<(), String> {
    let n = inputs.len();
    let count = got.len() / size(dt);
    let (u, eta) = precision(dt);
    let k = n.saturating_sub(1) as f64;
    let mut gamma = k * u / (1.0 - k * u);
    if dt == DataType::FLOAT64 {
        gamma *= 2.0; // the f64 reference itself rounds
    }
    for i in 0..count {
        if is_int(dt) {
            let xs = inputs.iter().map(|b| int_at(dt, b, at + i));
            let want = match op {
                RedOp::PROD => xs.fold(1i128, |a, x| wrap(dt, a.wrapping_mul(x))),
                RedOp::MIN => xs.min().unwrap_or(0),
                RedOp::MAX => xs.max().unwrap_or(0),
                RedOp::AVG => wrap(dt, xs.sum()) / n as i128,
                _ => wrap(dt, xs.sum()),
            };
            let g = int_at(dt, got, i);
            if g != want {
                return Err(format!("{dt:?} {op:?} [{i}]: got {g}, want {want}"));
            }
            continue;
        }
        let g = float_at(dt, got, i);
        let xs = inputs.iter().map(|b| float_at(dt, b, at + i));
        if op == RedOp::MIN || op == RedOp::MAX {
            // minimumNumber/maximumNumber with -0 < +0: compare (value, sign).
            let key = |x: f64| (x, u8::from(!x.is_sign_negative()));
            let want = xs
                .reduce(|a, b| {
                    let a_first = key(a).partial_cmp(&key(b)) != Some(std::cmp::Ordering::Greater);
                    if a_first == (op == RedOp::MIN) { a } else { b }
                })
                .unwrap_or(0.0);
            if g != want || g.is_sign_negative() != want.is_sign_negative() {
                return Err(format!("{dt:?} {op:?} [{i}]: got {g:e}, want {want:e}"));
            }
            continue;
        }
        let (sum, abs, prod) = xs.fold((0.0, 0.0, 1.0), |(s, a, p), x| (s + x, a + x.abs(), p * x));
        let (exact, bound) = match op {
            RedOp::PROD => (prod, gamma * prod.abs() + n as f64 * eta),
            RedOp::AVG => (
                sum / n as f64,
                (gamma + 3.0 * u) * abs / n as f64 + n as f64 * eta,
            ),
            _ => (sum, gamma * abs + n as f64 * eta),
        };
        let err = (g - exact).abs();
        if err.is_nan() || err > bound {
            return Err(format!(
                "{dt:?} {op:?} n={n} [{i}]: got {g:e}, exact {exact:e}, error {err:e} > bound {bound:e}"
            ));
        }
    }
    Ok(())
}

/// Index of the first differing byte (for messages about large buffers).
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Asserts `got == want` without printing megabytes.
pub fn assert_bytes(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = first_diff(got, want) {
        panic!(
            "{what}: {} bytes differ from the expected {} bytes, first at byte {i} (got {:?}, want {:?})",
            got.len(),
            want.len(),
            got.get(i),
            want.get(i)
        );
    }
}

/// 64-bit FNV-1a of a buffer (to compare results across ranks cheaply).
pub fn digest(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Asserts every rank holds the same `value` (through the bootstrap).
pub fn assert_same_everywhere(comm: &Comm, value: u64, what: &str) {
    let all = comm
        .bootstrap()
        .allgather(&value.to_le_bytes())
        .unwrap_or_else(|e| panic!("{what}: allgather: {e}"));
    for (r, v) in all.iter().enumerate() {
        assert_eq!(
            v.as_slice(),
            value.to_le_bytes(),
            "{what}: rank {r} holds a different result than rank {}",
            comm.rank()
        );
    }
}
