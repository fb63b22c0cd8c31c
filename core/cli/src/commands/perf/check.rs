//! The `#wrong` column: deterministic per-rank input data and an independent check
//! of every output element.
//!
//! Element `i` of rank `r`'s input is a function of `(rep, r, i)`, so every rank can
//! compute every other rank's input and the exact expected output without talking.
//! Integers are compared exactly (wrapping sum/prod, NCCL's truncating avg). Float
//! inputs are small multiples of 1/4 (prod: ±1 with one ±2 or ±½ per element), so
//! the exact result is known in `f64`; a result is wrong when it is off by more than
//! the rounding a sum of `n` terms in that type can cause, `(n+1)·u·Σ|xᵢ|`, with `u`
//! the type's unit roundoff. Copies (gather, broadcast, …) are compared bit for bit.

use cclkit_abi::raw::common::{DataType, RedOp};
use cclkit_kernels::{Bf16, F16, Fp8E4M3, Fp8E5M2};

use super::colls::{Case, Coll, Slot};

/// Byte that fills receive buffers before a checked run (all-ones floats are NaN,
/// so an element nobody wrote is caught).
const POISON: u8 = 0xff;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Input data of one checked run.
#[derive(Clone, Copy, Debug)]
pub struct Data {
    dtype: DataType,
    op: RedOp,
    n: usize,
    seed: u64,
    elem: usize,
}

impl Data {
    /// Inputs for `dtype`/`op` on `n` ranks, repetition `rep`.
    pub fn new(dtype: DataType, op: RedOp, n: usize, rep: u64) -> Self {
        Self {
            dtype,
            op,
            n: n.max(1),
            seed: mix(rep.wrapping_add(0x5eed) ^ ((dtype.0 as u64) << 32) ^ (op.0 as u64)),
            elem: dtype.size().unwrap_or(1),
        }
    }

    fn hash(&self, rank: usize, i: usize) -> u64 {
        mix(i as u64 ^ mix(self.seed.wrapping_add(rank as u64)))
    }

    /// The value element `i` of `rank`'s input starts from, before rounding to the type.
    fn float_candidate(&self, rank: usize, i: usize) -> f32 {
        let h = self.hash(rank, i);
        if self.op == RedOp::PROD {
            if i % self.n == rank {
                [2.0, 0.5, -2.0, -0.5][(h & 3) as usize]
            } else {
                [1.0, -1.0][(h & 1) as usize]
            }
        } else {
            ((h >> 8) % 33) as f32 / 4.0 - 4.0
        }
    }

    /// Writes element `i` of `rank`'s input into `out` (`elem` bytes).
    fn write(&self, rank: usize, i: usize, out: &mut [u8]) {
        let e = self.elem;
        match self.dtype {
            DataType::FLOAT32 => out.copy_from_slice(&self.float_candidate(rank, i).to_ne_bytes()),
            DataType::FLOAT64 => {
                out.copy_from_slice(&f64::from(self.float_candidate(rank, i)).to_ne_bytes())
            }
            DataType::FLOAT16 => out.copy_from_slice(
                &F16::from_f32(self.float_candidate(rank, i))
                    .to_bits()
                    .to_ne_bytes(),
            ),
            DataType::BFLOAT16 => out.copy_from_slice(
                &Bf16::from_f32(self.float_candidate(rank, i))
                    .to_bits()
                    .to_ne_bytes(),
            ),
            DataType::FLOAT8E4M3 => {
                out[0] = Fp8E4M3::from_f32(self.float_candidate(rank, i)).to_bits()
            }
            DataType::FLOAT8E5M2 => {
                out[0] = Fp8E5M2::from_f32(self.float_candidate(rank, i)).to_bits()
            }
            _ => out.copy_from_slice(&self.hash(rank, i).to_ne_bytes()[..e]),
        }
    }

    /// Fills `out` with elements `start…` of `rank`'s input.
    pub fn fill(&self, rank: usize, start: usize, out: &mut [u8]) {
        for (k, chunk) in out.chunks_exact_mut(self.elem).enumerate() {
            self.write(rank, start + k, chunk);
        }
    }

    /// Elements of `got` that differ from elements `start…` of `rank`'s input.
    pub fn wrong_copies(&self, rank: usize, start: usize, got: &[u8]) -> u64 {
        let mut want = [0u8; 8];
        let e = self.elem;
        got.chunks_exact(e)
            .enumerate()
            .filter(|(k, g)| {
                self.write(rank, start + k, &mut want[..e]);
                *g != &want[..e]
            })
            .count() as u64
    }

    /// Elements of `got` that differ from the reduction over every rank of elements
    /// `start…` of the inputs.
    pub fn wrong_reduced(&self, start: usize, got: &[u8]) -> u64 {
        if is_float(self.dtype) {
            self.wrong_reduced_float(start, got)
        } else {
            self.wrong_reduced_int(start, got)
        }
    }

    fn wrong_reduced_int(&self, start: usize, got: &[u8]) -> u64 {
        let e = self.elem;
        let bits = 8 * e as u32;
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let signed = matches!(
            self.dtype,
            DataType::INT8 | DataType::INT32 | DataType::INT64
        );
        // The value of `bits`-wide two's complement `v`, for comparisons and avg.
        let value = |v: u64| -> i128 {
            let v = v & mask;
            if signed && bits < 128 && v >> (bits - 1) & 1 == 1 {
                i128::from(v) - (1i128 << bits)
            } else {
                i128::from(v)
            }
        };
        let mut b = [0u8; 8];
        let mut wrong = 0;
        for (k, g) in got.chunks_exact(e).enumerate() {
            let i = start + k;
            let x = |r: usize| self.hash(r, i) & mask;
            let want: u64 = match self.op {
                RedOp::PROD => (0..self.n).fold(1u64, |a, r| a.wrapping_mul(x(r))),
                RedOp::MAX => (0..self.n).map(x).max_by_key(|&v| value(v)).unwrap_or(0),
                RedOp::MIN => (0..self.n).map(x).min_by_key(|&v| value(v)).unwrap_or(0),
                RedOp::AVG => {
                    let sum = (0..self.n).fold(0u64, |a, r| a.wrapping_add(x(r)));
                    // Truncating division of the wrapped sum, as NCCL's SumPostDiv.
                    (value(sum) / self.n as i128) as u64
                }
                _ => (0..self.n).fold(0u64, |a, r| a.wrapping_add(x(r))),
            } & mask;
            b[..e].copy_from_slice(g);
            if u64::from_ne_bytes(b) & mask != want {
                wrong += 1;
            }
        }
        wrong
    }

    fn wrong_reduced_float(&self, start: usize, got: &[u8]) -> u64 {
        let e = self.elem;
        let mut b = [0u8; 8];
        let decode = |bytes: &[u8], b: &mut [u8; 8]| -> f64 {
            b[..e].copy_from_slice(bytes);
            decode(self.dtype, b)
        };
        // The avg scale exactly as NCCL rounds 1/n into the type.
        let scale = match self.dtype {
            DataType::FLOAT64 => 1.0 / self.n as f64,
            t => {
                let mut s = [0u8; 8];
                encode_f32(t, (1.0 / self.n as f64) as f32, &mut s[..e]);
                decode(&s[..e], &mut b)
            }
        };
        let u = unit_roundoff(self.dtype);
        let tiny = smallest_subnormal(self.dtype);
        let nf = self.n as f64;
        let mut inp = [0u8; 8];
        let mut wrong = 0;
        for (k, g) in got.chunks_exact(e).enumerate() {
            let i = start + k;
            let x = |r: usize, inp: &mut [u8; 8], b: &mut [u8; 8]| -> f64 {
                self.write(r, i, &mut inp[..e]);
                decode(&inp[..e], b)
            };
            let (want, mag) = match self.op {
                RedOp::PROD => {
                    let p = (0..self.n).fold(1.0, |a, r| a * x(r, &mut inp, &mut b));
                    (p, p.abs())
                }
                RedOp::MAX => (
                    (0..self.n)
                        .map(|r| x(r, &mut inp, &mut b))
                        .fold(f64::NEG_INFINITY, f64::max),
                    0.0,
                ),
                RedOp::MIN => (
                    (0..self.n)
                        .map(|r| x(r, &mut inp, &mut b))
                        .fold(f64::INFINITY, f64::min),
                    0.0,
                ),
                op => {
                    let s = if op == RedOp::AVG { scale } else { 1.0 };
                    (0..self.n).fold((0.0, 0.0), |(a, m), r| {
                        let v = x(r, &mut inp, &mut b) * s;
                        (a + v, m + v.abs())
                    })
                }
            };
            let have = decode(g, &mut b);
            let tol = (nf + 1.0) * u * mag + tiny;
            // A NaN result is wrong too.
            if (have - want).abs().is_nan() || (have - want).abs() > tol {
                wrong += 1;
            }
        }
        wrong
    }
}

fn is_float(d: DataType) -> bool {
    matches!(
        d,
        DataType::FLOAT16
            | DataType::FLOAT32
            | DataType::FLOAT64
            | DataType::BFLOAT16
            | DataType::FLOAT8E4M3
            | DataType::FLOAT8E5M2
    )
}

fn decode(d: DataType, b: &[u8; 8]) -> f64 {
    let u16v = u16::from_ne_bytes([b[0], b[1]]);
    match d {
        DataType::FLOAT32 => f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
        DataType::FLOAT64 => f64::from_ne_bytes(*b),
        DataType::FLOAT16 => f64::from(F16::from_bits(u16v).to_f32()),
        DataType::BFLOAT16 => f64::from(Bf16::from_bits(u16v).to_f32()),
        DataType::FLOAT8E4M3 => f64::from(Fp8E4M3::from_bits(b[0]).to_f32()),
        DataType::FLOAT8E5M2 => f64::from(Fp8E5M2::from_bits(b[0]).to_f32()),
        _ => f64::NAN,
    }
}

fn encode_f32(d: DataType, v: f32, out: &mut [u8]) {
    match d {
        DataType::FLOAT32 => out.copy_from_slice(&v.to_ne_bytes()),
        DataType::FLOAT16 => out.copy_from_slice(&F16::from_f32(v).to_bits().to_ne_bytes()),
        DataType::BFLOAT16 => out.copy_from_slice(&Bf16::from_f32(v).to_bits().to_ne_bytes()),
        DataType::FLOAT8E4M3 => out[0] = Fp8E4M3::from_f32(v).to_bits(),
        DataType::FLOAT8E5M2 => out[0] = Fp8E5M2::from_f32(v).to_bits(),
        _ => out.copy_from_slice(&f64::from(v).to_ne_bytes()[..out.len()]),
    }
}

/// Half an ulp of 1: 2^-(mantissa bits + 1).
fn unit_roundoff(d: DataType) -> f64 {
    let p = match d {
        DataType::FLOAT16 => 11,
        DataType::BFLOAT16 => 8,
        DataType::FLOAT8E4M3 => 4,
        DataType::FLOAT8E5M2 => 3,
        DataType::FLOAT32 => 24,
        _ => 53,
    };
    0.5f64.powi(p)
}

fn smallest_subnormal(d: DataType) -> f64 {
    let e = match d {
        DataType::FLOAT16 => 24,
        DataType::BFLOAT16 => 133,
        DataType::FLOAT8E4M3 => 9,
        DataType::FLOAT8E5M2 => 16,
        DataType::FLOAT32 => 149,
        _ => 1074,
    };
    0.5f64.powi(e)
}

/// Fills `slot` with `me`'s input for `case` and poisons everything the run writes.
pub fn prepare(case: &Case, data: &Data, me: usize, slot: &mut Slot) {
    let l = case.layout;
    let e = case.dtype.size().unwrap_or(1);
    let part = l.count * e;
    slot.recv[..l.recv.max(l.send)].fill(POISON);
    let ip = case.in_place;
    // (buffer, byte offset, bytes, first element) of this rank's input, if it has one.
    let (in_recv, off, len) = match case.coll {
        Coll::Broadcast | Coll::Scatter if me != case.root => return,
        Coll::AllGather | Coll::Gather if ip => (true, me * part, part),
        Coll::ReduceScatter | Coll::AllToAll | Coll::Scatter => (ip, 0, l.send),
        _ => (ip, 0, l.send),
    };
    let buf = if in_recv {
        &mut slot.recv[off..off + len]
    } else {
        &mut slot.send[off..off + len]
    };
    let src = if matches!(case.coll, Coll::Broadcast | Coll::Scatter) {
        case.root
    } else {
        me
    };
    data.fill(src, 0, buf);
}

/// Wrong elements in `me`'s output of `case` (0 where this rank has no output).
pub fn verify(case: &Case, data: &Data, me: usize, n: usize, slot: &Slot) -> u64 {
    let l = case.layout;
    let e = case.dtype.size().unwrap_or(1);
    let part = l.count * e;
    let base = l.count;
    let rb = &slot.recv;
    let out = |ip_off: usize, len: usize| {
        let at = if case.in_place { ip_off } else { 0 };
        &rb[at..at + len]
    };
    match case.coll {
        Coll::AllReduce => data.wrong_reduced(0, &rb[..l.recv]),
        Coll::Reduce if me == case.root => data.wrong_reduced(0, &rb[..l.recv]),
        Coll::Reduce => 0,
        Coll::Broadcast => data.wrong_copies(case.root, 0, &rb[..l.recv]),
        Coll::SendRecv => data.wrong_copies((me + n - 1) % n, 0, &rb[..l.recv]),
        Coll::ReduceScatter => data.wrong_reduced(me * base, out(me * part, part)),
        Coll::Scatter => data.wrong_copies(case.root, me * base, out(me * part, part)),
        Coll::AllGather => (0..n)
            .map(|p| data.wrong_copies(p, 0, &rb[p * part..(p + 1) * part]))
            .sum(),
        Coll::Gather if me == case.root => (0..n)
            .map(|p| data.wrong_copies(p, 0, &rb[p * part..(p + 1) * part]))
            .sum(),
        Coll::Gather => 0,
        Coll::AllToAll => (0..n)
            .map(|p| data.wrong_copies(p, me * base, &rb[p * part..(p + 1) * part]))
            .sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cclkit_kernels::Reduction;

    /// Reduces every rank's input with the kernels the runtime uses, in ring order.
    fn reduce_like_runtime(d: &Data, dtype: DataType, op: RedOp, n: usize, len: usize) -> Vec<u8> {
        let e = dtype.size().unwrap();
        let red = Reduction::new(dtype, op, n as u32).unwrap();
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                let mut v = vec![0u8; len * e];
                d.fill(r, 0, &mut v);
                v
            })
            .collect();
        let mut acc = vec![0u8; len * e];
        red.pre_op(&mut acc, &inputs[0]).unwrap();
        for (k, inp) in inputs.iter().enumerate().skip(1) {
            let mut next = vec![0u8; len * e];
            red.reduce_local(&mut next, &acc, inp, k + 1 == n).unwrap();
            acc = next;
        }
        acc
    }

    #[test]
    fn every_type_and_op_checks_clean_and_catches_corruption() {
        for &(_, dtype) in &super::super::options::TYPES {
            for &(_, op) in &super::super::options::OPS {
                for n in [2usize, 3, 4, 7] {
                    let d = Data::new(dtype, op, n, 3);
                    let got = reduce_like_runtime(&d, dtype, op, n, 257);
                    assert_eq!(d.wrong_reduced(0, &got), 0, "{dtype:?} {op:?} n={n}");
                    let e = dtype.size().unwrap();
                    // Three elements nobody wrote (the poison pattern) are found.
                    let mut bad = got.clone();
                    for k in [0usize, 100, 256] {
                        bad[k * e..(k + 1) * e].fill(POISON);
                    }
                    assert_eq!(d.wrong_reduced(0, &bad), 3, "{dtype:?} {op:?} n={n}");
                    // So is a wrong sign on a clearly non-zero float result, or any
                    // changed bit of an integer.
                    let mut flipped = got.clone();
                    flipped[e - 1] ^= if is_float(dtype) { 0x80 } else { 0x01 };
                    let changed = d.wrong_reduced(0, &flipped);
                    let v = if is_float(dtype) {
                        let mut b = [0u8; 8];
                        b[..e].copy_from_slice(&got[..e]);
                        decode(dtype, &b).abs()
                    } else {
                        1.0
                    };
                    // (fp8 sums of 7 ranks may legitimately be off by several units.)
                    let coarse = matches!(dtype, DataType::FLOAT8E4M3 | DataType::FLOAT8E5M2);
                    if v >= 4.0 && !coarse {
                        assert_eq!(changed, 1, "{dtype:?} {op:?} n={n} value {v}");
                    }
                }
            }
        }
    }

    #[test]
    fn copies_compare_exactly_and_data_differs_by_rank_and_rep() {
        let d = Data::new(DataType::INT32, RedOp::SUM, 4, 1);
        let mut a = vec![0u8; 400];
        d.fill(2, 10, &mut a);
        assert_eq!(d.wrong_copies(2, 10, &a), 0);
        assert_eq!(d.wrong_copies(1, 10, &a), 100);
        assert!(d.wrong_copies(2, 11, &a) > 90);
        let d2 = Data::new(DataType::INT32, RedOp::SUM, 4, 2);
        assert!(d2.wrong_copies(2, 10, &a) > 90);
    }
}
