//! [`Element`]: the twelve NCCL data types as Rust types, with the scalar
//! semantics every kernel applies element by element.
//!
//! Integers use wrapping (two's complement) arithmetic, as NCCL's CUDA kernels
//! do: NCCL runs signed sum/prod on the unsigned kernels, so overflow wraps.
//! Floats follow IEEE: `f32`/`f64` natively; `f16`, `bf16` and fp8 are
//! computed in `f32` and rounded once to the storage type. `f32` carries more
//! than twice their precision plus two bits, so that double rounding is
//! innocuous: each `sum`/`prod` is the correctly rounded result, the same bits
//! NCCL's `__hadd`/`__hmul` (or its float fallbacks) produce.
//!
//! Min/max of floats are IEEE 754-2019 `minimumNumber`/`maximumNumber`: a NaN
//! loses to a number (CUDA's `fminf`/`__hmin`), `-0 < +0`, and the result is
//! always one of the two inputs, bit for bit (never re-rounded).

use cclkit_abi::raw::common::DataType;

use crate::float::{Bf16, F16, Fp8E4M3, Fp8E5M2};

pub(crate) mod sealed {
    /// Keeps [`super::Element`] closed and carries the `ncclAvg` pieces the
    /// kernels need but callers should not: the kernels reinterpret bytes as
    /// these types, which is only sound for plain-old-data types with no
    /// invalid bit patterns and no padding.
    pub trait Sealed: Sized {
        /// NCCL's `ncclAvg` pre-op for floats: `self × scale`, rounded once.
        /// Integers average by dividing after the sum; for them it returns
        /// `self` and is never used.
        fn premul(self, scale: Self) -> Self;
        /// NCCL's `ncclAvg` post-op for integers: `self / n` truncated toward
        /// zero (`FuncSumPostDiv`). Floats return `self` (never used).
        fn post_div(self, n: u32) -> Self;
        /// The `ncclAvg` multiplier for `n` ranks exactly as NCCL's
        /// `hostToDevRedOp` computes it (`T(float(1.0/n))` for 16/8-bit
        /// floats; integers: 1, never used).
        fn avg_scale(n: u32) -> Self;
    }
}

/// One of NCCL's reduction data types. Implemented for `i8`, `u8`, `i32`,
/// `u32`, `i64`, `u64`, [`F16`], `f32`, `f64`, [`Bf16`], [`Fp8E4M3`] and
/// [`Fp8E5M2`]; sealed.
///
/// Every implementor is plain old data: any bit pattern is a valid value and
/// there is no padding, so slices convert to and from bytes freely.
pub trait Element:
    sealed::Sealed + Copy + Default + PartialEq + core::fmt::Debug + Send + Sync + 'static
{
    /// The `ncclDataType_t` this type implements.
    const DTYPE: DataType;

    /// `a + b` (wrapping for integers; rounded once for floats).
    fn reduce_sum(self, rhs: Self) -> Self;
    /// `a * b` (wrapping for integers; rounded once for floats).
    fn reduce_prod(self, rhs: Self) -> Self;
    /// The smaller value (floats: `minimumNumber`, see the module docs).
    fn reduce_min(self, rhs: Self) -> Self;
    /// The larger value (floats: `maximumNumber`, see the module docs).
    fn reduce_max(self, rhs: Self) -> Self;
}

macro_rules! int_element {
    ($ty:ty, $dtype:ident) => {
        impl Element for $ty {
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            fn reduce_sum(self, rhs: Self) -> Self {
                self.wrapping_add(rhs)
            }
            #[inline(always)]
            fn reduce_prod(self, rhs: Self) -> Self {
                self.wrapping_mul(rhs)
            }
            #[inline(always)]
            fn reduce_min(self, rhs: Self) -> Self {
                Ord::min(self, rhs)
            }
            #[inline(always)]
            fn reduce_max(self, rhs: Self) -> Self {
                Ord::max(self, rhs)
            }
        }
        impl sealed::Sealed for $ty {
            #[inline(always)]
            fn premul(self, _scale: Self) -> Self {
                self
            }
            #[inline(always)]
            fn post_div(self, n: u32) -> Self {
                // |x| / n in the unsigned domain, then the sign back: truncation
                // toward zero, as FuncSumPostDiv::divide. Widening to i128 gives
                // the same for every width and cannot overflow (|q| <= |x|).
                let q = i128::from(self) / i128::from(n.max(1));
                q as $ty
            }
            #[inline(always)]
            fn avg_scale(_n: u32) -> Self {
                1
            }
        }
    };
}

int_element!(i8, INT8);
int_element!(u8, UINT8);
int_element!(i32, INT32);
int_element!(u32, UINT32);
int_element!(i64, INT64);
int_element!(u64, UINT64);

/// `minimumNumber`/`maximumNumber` on raw float bits, through an integer key
/// that orders like the float (`-0 < +0`) so the compiler vectorises it as
/// integer compares and blends.
macro_rules! float_minmax {
    ($bits:ty, $signed:ty, $abs_mask:expr, $nan_above:expr) => {
        /// Total-order key: flip the magnitude bits of negative values, so a
        /// signed compare of keys is a float compare with `-0 < +0`.
        #[inline(always)]
        fn key(bits: $bits) -> $signed {
            let s = bits as $signed;
            s ^ ((s >> (<$bits>::BITS - 1)) & ($abs_mask as $signed))
        }
        #[inline(always)]
        fn is_nan(bits: $bits) -> bool {
            (bits & $abs_mask) > $nan_above
        }
        #[inline(always)]
        pub(crate) fn min_bits(a: $bits, b: $bits) -> $bits {
            if is_nan(b) || (!is_nan(a) && key(a) <= key(b)) {
                a
            } else {
                b
            }
        }
        #[inline(always)]
        pub(crate) fn max_bits(a: $bits, b: $bits) -> $bits {
            if is_nan(b) || (!is_nan(a) && key(a) >= key(b)) {
                a
            } else {
                b
            }
        }
    };
}

mod mm16 {
    //! `f16` (NaN above 0x7c00).
    float_minmax!(u16, i16, 0x7fffu16, 0x7c00u16);
}
mod mmbf16 {
    //! `bf16` (NaN above 0x7f80).
    float_minmax!(u16, i16, 0x7fffu16, 0x7f80u16);
}
mod mm32 {
    //! `f32`.
    float_minmax!(u32, i32, 0x7fff_ffffu32, 0x7f80_0000u32);
}
mod mm64 {
    //! `f64`.
    float_minmax!(u64, i64, 0x7fff_ffff_ffff_ffffu64, 0x7ff0_0000_0000_0000u64);
}
mod mme4m3 {
    //! e4m3: only `S.1111.111` is NaN.
    float_minmax!(u8, i8, 0x7fu8, 0x7eu8);
}
mod mme5m2 {
    //! e5m2 (NaN above 0x7c).
    float_minmax!(u8, i8, 0x7fu8, 0x7cu8);
}

impl Element for f32 {
    const DTYPE: DataType = DataType::FLOAT32;
    #[inline(always)]
    fn reduce_sum(self, rhs: Self) -> Self {
        self + rhs
    }
    #[inline(always)]
    fn reduce_prod(self, rhs: Self) -> Self {
        self * rhs
    }
    #[inline(always)]
    fn reduce_min(self, rhs: Self) -> Self {
        f32::from_bits(mm32::min_bits(self.to_bits(), rhs.to_bits()))
    }
    #[inline(always)]
    fn reduce_max(self, rhs: Self) -> Self {
        f32::from_bits(mm32::max_bits(self.to_bits(), rhs.to_bits()))
    }
}
impl sealed::Sealed for f32 {
    #[inline(always)]
    fn premul(self, scale: Self) -> Self {
        self * scale
    }
    #[inline(always)]
    fn post_div(self, _n: u32) -> Self {
        self
    }
    #[inline(always)]
    fn avg_scale(n: u32) -> Self {
        (1.0 / f64::from(n.max(1))) as f32
    }
}

impl Element for f64 {
    const DTYPE: DataType = DataType::FLOAT64;
    #[inline(always)]
    fn reduce_sum(self, rhs: Self) -> Self {
        self + rhs
    }
    #[inline(always)]
    fn reduce_prod(self, rhs: Self) -> Self {
        self * rhs
    }
    #[inline(always)]
    fn reduce_min(self, rhs: Self) -> Self {
        f64::from_bits(mm64::min_bits(self.to_bits(), rhs.to_bits()))
    }
    #[inline(always)]
    fn reduce_max(self, rhs: Self) -> Self {
        f64::from_bits(mm64::max_bits(self.to_bits(), rhs.to_bits()))
    }
}
impl sealed::Sealed for f64 {
    #[inline(always)]
    fn premul(self, scale: Self) -> Self {
        self * scale
    }
    #[inline(always)]
    fn post_div(self, _n: u32) -> Self {
        self
    }
    #[inline(always)]
    fn avg_scale(n: u32) -> Self {
        1.0 / f64::from(n.max(1))
    }
}

/// The small float formats: arithmetic in `f32`, one rounding back.
macro_rules! small_float_element {
    ($ty:ident, $dtype:ident, $mm:ident) => {
        impl Element for $ty {
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            fn reduce_sum(self, rhs: Self) -> Self {
                $ty::from_f32(self.to_f32() + rhs.to_f32())
            }
            #[inline(always)]
            fn reduce_prod(self, rhs: Self) -> Self {
                $ty::from_f32(self.to_f32() * rhs.to_f32())
            }
            #[inline(always)]
            fn reduce_min(self, rhs: Self) -> Self {
                $ty($mm::min_bits(self.0, rhs.0))
            }
            #[inline(always)]
            fn reduce_max(self, rhs: Self) -> Self {
                $ty($mm::max_bits(self.0, rhs.0))
            }
        }
        impl sealed::Sealed for $ty {
            #[inline(always)]
            fn premul(self, scale: Self) -> Self {
                $ty::from_f32(self.to_f32() * scale.to_f32())
            }
            #[inline(always)]
            fn post_div(self, _n: u32) -> Self {
                self
            }
            #[inline(always)]
            fn avg_scale(n: u32) -> Self {
                // NCCL: __float2half(float(1.0/nRanks)) and friends; the
                // double -> float -> T double rounding is reproduced on purpose.
                $ty::from_f32((1.0 / f64::from(n.max(1))) as f32)
            }
        }
    };
}

small_float_element!(F16, FLOAT16, mm16);
small_float_element!(Bf16, BFLOAT16, mmbf16);
small_float_element!(Fp8E4M3, FLOAT8E4M3, mme4m3);
small_float_element!(Fp8E5M2, FLOAT8E5M2, mme5m2);

/// Whether `ncclAvg` on `dtype` is a pre-multiplied sum (floats) rather than
/// a sum followed by a division (integers); `None` for an unknown type.
pub(crate) fn avg_is_premul(dtype: DataType) -> Option<bool> {
    match dtype {
        DataType::INT8
        | DataType::UINT8
        | DataType::INT32
        | DataType::UINT32
        | DataType::INT64
        | DataType::UINT64 => Some(false),
        DataType::FLOAT16
        | DataType::FLOAT32
        | DataType::FLOAT64
        | DataType::BFLOAT16
        | DataType::FLOAT8E4M3
        | DataType::FLOAT8E5M2 => Some(true),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::sealed::Sealed;
    use super::*;

    #[test]
    fn int_post_div_truncates_toward_zero() {
        assert_eq!((-7i32).post_div(2), -3);
        assert_eq!(7i32.post_div(2), 3);
        assert_eq!(i8::MIN.post_div(128), -1);
        assert_eq!(i8::MIN.post_div(300), 0);
        assert_eq!(i64::MIN.post_div(1), i64::MIN);
        assert_eq!(u64::MAX.post_div(3), u64::MAX / 3);
    }

    #[test]
    fn float_min_max_semantics() {
        assert_eq!(1.0f32.reduce_min(f32::NAN), 1.0);
        assert_eq!(f32::NAN.reduce_max(2.0), 2.0);
        assert!(f32::NAN.reduce_min(f32::NAN).is_nan());
        assert_eq!((-0.0f32).reduce_max(0.0).to_bits(), 0);
        assert_eq!(0.0f32.reduce_min(-0.0).to_bits(), 0x8000_0000);
        assert_eq!((-3.0f64).reduce_min(-2.0), -3.0);
        assert_eq!(Fp8E4M3(0xff).reduce_min(Fp8E4M3(0x01)), Fp8E4M3(0x01));
        assert_eq!(F16(0x8000).reduce_min(F16(0x0000)), F16(0x8000));
    }

    #[test]
    fn avg_scales_match_nccl() {
        assert_eq!(F16::avg_scale(3), F16::from_f32((1.0f64 / 3.0) as f32));
        assert_eq!(Fp8E4M3::avg_scale(2048).to_f32(), 0.0);
        assert_eq!(f32::avg_scale(4), 0.25);
    }
}
