//! Test helpers: a deterministic RNG, and reference decoders and rounding for
//! the small float formats written independently of the crate (from the
//! format definitions: sign, exponent, mantissa, bias), computed in f64.

#![allow(dead_code)]

use cclkit_kernels::DataType;

/// xorshift64* with a fixed seed per test: failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next_u64() >> 56) as u8).collect()
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }
}

/// How a format handles the all-ones exponent and overflow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// IEEE: all-ones exponent is inf (mantissa 0) or NaN; overflow to inf.
    Ieee,
    /// IEEE encodings, but conversions saturate to the largest finite value
    /// (fp8 e5m2 with `__NV_SATFINITE`).
    IeeeSatfinite,
    /// e4m3 "FN": only S.1111.111 is NaN, no inf; conversions saturate.
    FiniteOnly,
}

/// A small binary float format.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    pub exp_bits: u32,
    pub man_bits: u32,
    pub bias: i32,
    pub kind: Kind,
}

pub const F16: Format = Format {
    exp_bits: 5,
    man_bits: 10,
    bias: 15,
    kind: Kind::Ieee,
};
pub const BF16: Format = Format {
    exp_bits: 8,
    man_bits: 7,
    bias: 127,
    kind: Kind::Ieee,
};
pub const E4M3: Format = Format {
    exp_bits: 4,
    man_bits: 3,
    bias: 7,
    kind: Kind::FiniteOnly,
};
pub const E5M2: Format = Format {
    exp_bits: 5,
    man_bits: 2,
    bias: 15,
    kind: Kind::IeeeSatfinite,
};

impl Format {
    pub fn width(&self) -> u32 {
        1 + self.exp_bits + self.man_bits
    }

    /// The exact value of `bits` (NaN for NaN encodings).
    pub fn decode(&self, bits: u32) -> f64 {
        let sign = if (bits >> (self.exp_bits + self.man_bits)) & 1 == 1 {
            -1.0
        } else {
            1.0
        };
        let e = (bits >> self.man_bits) & ((1 << self.exp_bits) - 1);
        let m = bits & ((1 << self.man_bits) - 1);
        let all_ones = (1 << self.exp_bits) - 1;
        match self.kind {
            Kind::Ieee | Kind::IeeeSatfinite if e == all_ones => {
                return if m == 0 {
                    sign * f64::INFINITY
                } else {
                    f64::NAN
                };
            }
            Kind::FiniteOnly if e == all_ones && m == (1 << self.man_bits) - 1 => return f64::NAN,
            _ => {}
        }
        let scale = |p: i32| 2f64.powi(p);
        if e == 0 {
            sign * f64::from(m) * scale(1 - self.bias - self.man_bits as i32)
        } else {
            sign * f64::from((1 << self.man_bits) + m)
                * scale(e as i32 - self.bias - self.man_bits as i32)
        }
    }

    pub fn is_nan(&self, bits: u32) -> bool {
        self.decode(bits).is_nan()
    }

    /// Non-negative finite values with their bits, ascending.
    pub fn table(&self) -> Vec<(f64, u32)> {
        let half = 1u32 << (self.width() - 1);
        (0..half)
            .map(|b| (self.decode(b), b))
            .filter(|(v, _)| v.is_finite())
            .collect()
    }

    /// Reference round-to-nearest-even of `x` (not NaN), by search over
    /// `table`, with the format's overflow rule. Negative results (zero
    /// included) get the sign bit.
    pub fn round(&self, table: &[(f64, u32)], x: f64) -> u32 {
        assert!(!x.is_nan());
        let sign = if x.is_sign_negative() {
            1u32 << (self.width() - 1)
        } else {
            0
        };
        let a = x.abs();
        let (max, max_bits) = *table.last().unwrap();
        let magnitude = if a > max {
            // Halfway to the next power of the top binade's step: the top
            // value's mantissa is odd, so a tie rounds up, i.e. overflows.
            let ulp = max - table[table.len() - 2].0;
            let overflows = a >= max + ulp / 2.0;
            match self.kind {
                Kind::Ieee if overflows => ((1 << self.exp_bits) - 1) << self.man_bits,
                _ => max_bits,
            }
        } else {
            let i = table.partition_point(|(v, _)| *v < a);
            let (hi, hi_bits) = table[i];
            if hi == a || i == 0 {
                hi_bits
            } else {
                let (lo, lo_bits) = table[i - 1];
                if a - lo < hi - a {
                    lo_bits
                } else if hi - a < a - lo {
                    hi_bits
                } else if lo_bits & 1 == 0 {
                    lo_bits
                } else {
                    hi_bits
                }
            }
        };
        magnitude | sign
    }
}

/// The small-float format of `dtype`, if it is one.
pub fn format_of(dtype: DataType) -> Option<Format> {
    match dtype {
        DataType::FLOAT16 => Some(F16),
        DataType::BFLOAT16 => Some(BF16),
        DataType::FLOAT8E4M3 => Some(E4M3),
        DataType::FLOAT8E5M2 => Some(E5M2),
        _ => None,
    }
}

pub fn is_int(dtype: DataType) -> bool {
    matches!(
        dtype,
        DataType::INT8
            | DataType::UINT8
            | DataType::INT32
            | DataType::UINT32
            | DataType::INT64
            | DataType::UINT64
    )
}

pub fn is_signed(dtype: DataType) -> bool {
    matches!(dtype, DataType::INT8 | DataType::INT32 | DataType::INT64)
}

/// Element `i` of `bytes` as raw bits (native endian).
pub fn bits_at(dtype: DataType, bytes: &[u8], i: usize) -> u64 {
    let size = dtype.size().unwrap();
    let mut buf = [0u8; 8];
    buf[..size].copy_from_slice(&bytes[i * size..(i + 1) * size]);
    u64::from_le_bytes(buf) // tests run on little-endian hosts
}

/// Writes raw bits as element `i`.
pub fn set_bits(dtype: DataType, bytes: &mut [u8], i: usize, bits: u64) {
    let size = dtype.size().unwrap();
    bytes[i * size..(i + 1) * size].copy_from_slice(&bits.to_le_bytes()[..size]);
}

/// Integer element as i128 (sign- or zero-extended).
pub fn int_value(dtype: DataType, bits: u64) -> i128 {
    let width = 8 * dtype.size().unwrap() as u32;
    if is_signed(dtype) {
        let shift = 128 - width;
        ((bits as i128) << shift) >> shift
    } else {
        bits as i128
    }
}

/// An i128 truncated to the type's width, as raw bits.
pub fn int_bits(dtype: DataType, v: i128) -> u64 {
    let width = 8 * dtype.size().unwrap() as u32;
    let mask = if width == 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    };
    (v as u64) & mask
}

/// Float element as f64 (exact) for every float type.
pub fn float_value(dtype: DataType, bits: u64) -> f64 {
    match dtype {
        DataType::FLOAT32 => f64::from(f32::from_bits(bits as u32)),
        DataType::FLOAT64 => f64::from_bits(bits),
        _ => format_of(dtype).unwrap().decode(bits as u32),
    }
}

/// Rounds an f64 to the float type (reference, correctly rounded).
pub struct Rounder {
    dtype: DataType,
    table: Vec<(f64, u32)>,
}

impl Rounder {
    pub fn new(dtype: DataType) -> Self {
        let table = format_of(dtype).map(|f| f.table()).unwrap_or_default();
        Rounder { dtype, table }
    }
    pub fn round(&self, x: f64) -> u64 {
        match self.dtype {
            DataType::FLOAT32 => u64::from((x as f32).to_bits()),
            DataType::FLOAT64 => x.to_bits(),
            d => u64::from(format_of(d).unwrap().round(&self.table, x)),
        }
    }
    /// Unit roundoff (2^-p) and the smallest positive subnormal.
    pub fn unit_roundoff(&self) -> (f64, f64) {
        match self.dtype {
            DataType::FLOAT32 => (2f64.powi(-24), 2f64.powi(-149)),
            DataType::FLOAT64 => (2f64.powi(-53), 2f64.powi(-1074)),
            d => {
                let f = format_of(d).unwrap();
                (
                    2f64.powi(-(f.man_bits as i32) - 1),
                    2f64.powi(1 - f.bias - f.man_bits as i32),
                )
            }
        }
    }
    /// Largest finite value.
    pub fn max(&self) -> f64 {
        match self.dtype {
            DataType::FLOAT32 => f64::from(f32::MAX),
            DataType::FLOAT64 => f64::MAX,
            _ => self.table.last().unwrap().0,
        }
    }
}

/// Every data type.
pub fn all_types() -> Vec<DataType> {
    (0..DataType::COUNT).map(DataType).collect()
}

/// Float `minimumNumber`/`maximumNumber` on bits: NaN loses, -0 < +0, ties
/// (identical bits) keep `a`.
pub fn float_select(dtype: DataType, a: u64, b: u64, min: bool) -> u64 {
    let (x, y) = (float_value(dtype, a), float_value(dtype, b));
    if y.is_nan() {
        return a;
    }
    if x.is_nan() {
        return b;
    }
    let b_wins = if min {
        y < x || (x == y && x == 0.0 && y.is_sign_negative() && !x.is_sign_negative())
    } else {
        y > x || (x == y && x == 0.0 && !y.is_sign_negative() && x.is_sign_negative())
    };
    if b_wins { b } else { a }
}
