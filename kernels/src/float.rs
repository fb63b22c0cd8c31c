//! The 16- and 8-bit float formats NCCL reduces: storage types and their
//! conversions to and from `f32`.
//!
//! Every conversion is branch-free bit manipulation on one element (the `if`s
//! below are selects between cheap, side-effect-free values), so a loop over a
//! slice keeps the converted values in vector registers: the compiler turns
//! them into SIMD compares and blends. No lookup tables, no temporary `f32`
//! buffers.
//!
//! Rounding is IEEE round-to-nearest-even everywhere. Overflow:
//! * `f16`, `bf16`: to infinity (IEEE; what `__float2half_rn` and
//!   `__float2bfloat16` do).
//! * fp8 e4m3 and e5m2: **saturate** to the largest finite value, infinities
//!   included (`__NV_SATFINITE`, what CUDA's `__nv_fp8_e4m3`/`__nv_fp8_e5m2`
//!   constructors and therefore NCCL's fp8 kernels use).
//!
//! NaN: a NaN input always gives a NaN output; the sign is kept and the result
//! is quiet. `f16` keeps the top payload bits, exactly as the F16C
//! instructions do, so the software and hardware paths agree bit for bit.
//! e4m3 has one NaN per sign (`0x7f`/`0xff`); e5m2 NaNs keep the top payload
//! bit (`0x7e`/`0x7f`, as CUDA's host conversion does).

/// IEEE 754 binary16 (`ncclFloat16`, CUDA `__half`), stored as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct F16(pub u16);

/// bfloat16 (`ncclBfloat16`, CUDA `__nv_bfloat16`), stored as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct Bf16(pub u16);

/// OCP fp8 E4M3 "FN" (`ncclFloat8e4m3`, CUDA `__nv_fp8_e4m3`): bias 7, no
/// infinities, one NaN per sign (`S.1111.111`), largest finite value 448.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct Fp8E4M3(pub u8);

/// OCP fp8 E5M2 (`ncclFloat8e5m2`, CUDA `__nv_fp8_e5m2`): bias 15, IEEE-style
/// infinities and NaNs, largest finite value 57344. It is the top byte of an
/// [`F16`].
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct Fp8E5M2(pub u8);

/// 2^-24: the value of one `f16` subnormal step.
const F16_SUBNORMAL_STEP: f32 = 5.960_464_5e-8;
/// 2^-9: the value of one e4m3 subnormal step.
const E4M3_SUBNORMAL_STEP: f32 = 0.001_953_125;

/// `f16` bits to `f32`, exact.
#[inline(always)]
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let bits = if em >= 0x7c00 {
        // Inf/NaN: all-ones exponent; a NaN gets the quiet bit (as F16C does).
        let quiet = if em > 0x7c00 { 0x0040_0000 } else { 0 };
        0x7f80_0000 | ((em & 0x03ff) << 13) | quiet
    } else if em >= 0x0400 {
        // Normal: move into place and rebias (127 - 15 = 112).
        (em << 13) + (112 << 23)
    } else {
        // Subnormal or zero: em steps of 2^-24, exact in f32.
        (em as f32 * F16_SUBNORMAL_STEP).to_bits()
    };
    f32::from_bits(bits | sign)
}

/// `f32` to `f16` bits, round to nearest even, overflow to infinity.
#[inline(always)]
pub(crate) fn f32_to_f16_bits(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = (x >> 16) & 0x8000;
    let a = x & 0x7fff_ffff;
    let bits = if a > 0x7f80_0000 {
        // NaN: quiet, keep the top 9 payload bits (F16C's result).
        0x7e00 | ((a >> 13) & 0x03ff)
    } else if a >= 0x4780_0000 {
        // |f| >= 65536 (or inf): rounds past the largest finite half.
        0x7c00
    } else if a >= 0x3880_0000 {
        // Normal result (|f| >= 2^-14): rebias, round the 13 dropped bits to
        // nearest even; a carry into the exponent is the right answer,
        // including 65520..65536 -> inf.
        let odd = (a >> 13) & 1;
        (a - (112 << 23) + 0x0fff + odd) >> 13
    } else {
        // Subnormal or zero: adding 0.5 (ulp 2^-24) makes the FPU round to
        // the subnormal grid; the low bits are then the f16 encoding
        // (0x400, the smallest normal, when it rounds up).
        let magic = f32::from_bits(126 << 23);
        (f32::from_bits(a) + magic).to_bits() - (126 << 23)
    };
    (bits | sign) as u16
}

/// `bf16` bits to `f32`, exact (a bf16 is the top half of an f32).
#[inline(always)]
pub(crate) fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `f32` to `bf16` bits, round to nearest even, overflow to infinity.
#[inline(always)]
pub(crate) fn f32_to_bf16_bits(f: f32) -> u16 {
    let x = f.to_bits();
    let bits = if (x & 0x7fff_ffff) > 0x7f80_0000 {
        // NaN: keep sign and top payload bits, set the quiet bit.
        (x >> 16) | 0x0040
    } else {
        // Cannot overflow u32: the largest finite |x| is 0x7f7f_ffff, a sign
        // bit only adds 0x8000_0000 and the bias is below 0x8000.
        (x + 0x7fff + ((x >> 16) & 1)) >> 16
    };
    bits as u16
}

/// fp8 e4m3 bits to `f32`, exact.
#[inline(always)]
pub(crate) fn e4m3_bits_to_f32(b: u8) -> f32 {
    let b = u32::from(b);
    let sign = (b & 0x80) << 24;
    let em = b & 0x7f;
    let bits = if em == 0x7f {
        0x7fc0_0000
    } else if em >= 0x08 {
        // Normal: rebias 7 -> 127 and move the 3 mantissa bits into place.
        (em << 20) + (120 << 23)
    } else {
        // Subnormal or zero: em steps of 2^-9.
        (em as f32 * E4M3_SUBNORMAL_STEP).to_bits()
    };
    f32::from_bits(bits | sign)
}

/// `f32` to fp8 e4m3 bits: round to nearest even, saturate to ±448.
#[inline(always)]
pub(crate) fn f32_to_e4m3_bits(f: f32) -> u8 {
    let x = f.to_bits();
    let sign = (x >> 24) & 0x80;
    let a = x & 0x7fff_ffff;
    let bits = if a > 0x7f80_0000 {
        0x7f
    } else if a > 0x43e0_0000 {
        // Above 448 (infinity included): satfinite.
        0x7e
    } else if a >= 0x3c80_0000 {
        // Normal (|f| >= 2^-6): round the 20 dropped bits, then rebias.
        let odd = (a >> 20) & 1;
        ((a + 0x0007_ffff + odd) >> 20) - (120 << 3)
    } else {
        // Subnormal: 2^14 has an ulp of 2^-9, the e4m3 subnormal step.
        (f32::from_bits(a) + f32::from_bits(141 << 23)).to_bits() - (141 << 23)
    };
    (bits | sign) as u8
}

/// fp8 e5m2 bits to `f32`, exact (e5m2 is the top byte of an f16).
#[inline(always)]
pub(crate) fn e5m2_bits_to_f32(b: u8) -> f32 {
    f16_bits_to_f32(u16::from(b) << 8)
}

/// `f32` to fp8 e5m2 bits: round to nearest even, saturate to ±57344.
#[inline(always)]
pub(crate) fn f32_to_e5m2_bits(f: f32) -> u8 {
    let x = f.to_bits();
    let sign = (x >> 24) & 0x80;
    let a = x & 0x7fff_ffff;
    let bits = if a > 0x7f80_0000 {
        // NaN: 0x7e plus the top payload bit below the quiet bit, as CUDA.
        0x7e | ((a >> 21) & 0x03)
    } else if a > 0x4760_0000 {
        // Above 57344 (infinity included): satfinite.
        0x7b
    } else if a >= 0x3880_0000 {
        // Normal (|f| >= 2^-14): round the 21 dropped bits, then rebias.
        let odd = (a >> 21) & 1;
        ((a + 0x000f_ffff + odd) >> 21) - (112 << 2)
    } else {
        // Subnormal: 128 has an ulp of 2^-16, the e5m2 subnormal step.
        (f32::from_bits(a) + f32::from_bits(134 << 23)).to_bits() - (134 << 23)
    };
    (bits | sign) as u8
}

macro_rules! float_type {
    ($ty:ident, $bits:ty, $to:ident, $from:ident, $what:literal) => {
        impl $ty {
            #[doc = concat!("Reinterprets raw ", $what, " bits.")]
            #[inline(always)]
            pub const fn from_bits(bits: $bits) -> Self {
                Self(bits)
            }

            #[doc = concat!("The raw ", $what, " bits.")]
            #[inline(always)]
            pub const fn to_bits(self) -> $bits {
                self.0
            }

            /// The exact `f32` value (every value of this format is one).
            #[inline(always)]
            pub fn to_f32(self) -> f32 {
                $to(self.0)
            }

            #[doc = concat!("Rounds an `f32` to ", $what, " (see the module docs for overflow and NaN).")]
            #[inline(always)]
            pub fn from_f32(value: f32) -> Self {
                Self($from(value))
            }

            /// Whether this is a NaN.
            #[inline(always)]
            pub fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }
        }

        impl From<$ty> for f32 {
            #[inline(always)]
            fn from(value: $ty) -> f32 {
                value.to_f32()
            }
        }
    };
}

float_type!(F16, u16, f16_bits_to_f32, f32_to_f16_bits, "IEEE half");
float_type!(Bf16, u16, bf16_bits_to_f32, f32_to_bf16_bits, "bfloat16");
float_type!(Fp8E4M3, u8, e4m3_bits_to_f32, f32_to_e4m3_bits, "fp8 e4m3");
float_type!(Fp8E5M2, u8, e5m2_bits_to_f32, f32_to_e5m2_bits, "fp8 e5m2");

impl F16 {
    /// Largest finite value, 65504.
    pub const MAX: F16 = F16(0x7bff);
    /// Positive infinity.
    pub const INFINITY: F16 = F16(0x7c00);
}

impl Bf16 {
    /// Largest finite value, about 3.39e38.
    pub const MAX: Bf16 = Bf16(0x7f7f);
    /// Positive infinity.
    pub const INFINITY: Bf16 = Bf16(0x7f80);
}

impl Fp8E4M3 {
    /// Largest finite value, 448 (the format has no infinity).
    pub const MAX: Fp8E4M3 = Fp8E4M3(0x7e);
}

impl Fp8E5M2 {
    /// Largest finite value, 57344.
    pub const MAX: Fp8E5M2 = Fp8E5M2(0x7b);
    /// Positive infinity.
    pub const INFINITY: Fp8E5M2 = Fp8E5M2(0x7c);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(F16::from_f32(1.0).0, 0x3c00);
        assert_eq!(F16::from_f32(65504.0).0, 0x7bff);
        assert_eq!(F16::from_f32(65520.0).0, 0x7c00);
        assert_eq!(F16::from_f32(-0.0).0, 0x8000);
        assert_eq!(F16(0x0001).to_f32(), F16_SUBNORMAL_STEP);
        assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
        assert_eq!(Fp8E4M3::from_f32(448.0).0, 0x7e);
        assert_eq!(Fp8E4M3::from_f32(1.0e9).0, 0x7e);
        assert_eq!(Fp8E4M3::from_f32(f32::NEG_INFINITY).0, 0xfe);
        assert_eq!(Fp8E4M3::from_f32(f32::NAN).0, 0x7f);
        assert_eq!(Fp8E4M3(0x01).to_f32(), E4M3_SUBNORMAL_STEP);
        assert_eq!(Fp8E4M3(0x08).to_f32(), 1.0 / 64.0);
        assert_eq!(Fp8E5M2::from_f32(57344.0).0, 0x7b);
        assert_eq!(Fp8E5M2::from_f32(f32::INFINITY).0, 0x7b);
        assert_eq!(Fp8E5M2(0x7c).to_f32(), f32::INFINITY);
        assert_eq!(Fp8E5M2(0x01).to_f32(), 1.0 / 65536.0);
    }
}
