//! Explicit F16C kernels for `f16` and fp8 arithmetic on x86_64.
//!
//! The compiler cannot turn the portable bit-manipulation conversions of
//! [`crate::float`] into `vcvtph2ps`/`vcvtps2ph`, and the portable path costs
//! one to three dozen integer operations per eight elements each way. With
//! F16C, `f16` converts in one instruction per eight elements, and fp8 goes
//! through `f16` with a few 16-bit integer operations per sixteen elements:
//! e5m2 is the top byte of an `f16`, and e4m3 is an `f16` scaled by 2^8 with
//! its exponent field in the same place. Everything stays in registers.
//!
//! Results are bit-identical to the portable path (the level tests compare
//! them): F16C rounds to nearest even, overflows to infinity, handles
//! subnormals and quiets NaNs keeping their top payload bits, as
//! [`crate::float`] does. For fp8 the detour through `f16` rounds twice
//! (`f32` → `f16` → fp8); that equals one rounding because `f16` carries more
//! than twice fp8's precision plus two bits and its subnormal grid is 2^7 to
//! 2^8 times finer than fp8's, so the first rounding can never create a tie
//! for the second (sums and products of fp8 values sit on fp8's grid or
//! carry at most 8 significant bits).
//!
//! Only sum, prod and the `ncclAvg` pre-multiply live here: min/max return
//! one of their inputs unchanged and vectorise well in the portable form.

use core::arch::x86_64::{
    __m128i, __m256, __m256i, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_packus_epi16,
    _mm_storeu_si128, _mm256_add_epi16, _mm256_add_ps, _mm256_and_si256, _mm256_andnot_si256,
    _mm256_castsi128_si256, _mm256_castsi256_si128, _mm256_cmpeq_epi16, _mm256_cmpgt_epi16,
    _mm256_cvtepu8_epi16, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_extracti128_si256,
    _mm256_inserti128_si256, _mm256_min_epu16, _mm256_mul_ps, _mm256_or_si256, _mm256_set1_epi16,
    _mm256_set1_ps, _mm256_slli_epi16, _mm256_srli_epi16,
};

use crate::element::Element;
use crate::float::{F16, Fp8E4M3, Fp8E5M2};

/// An element type with a 16-lane F16C load/store: `f16`, e4m3, e5m2.
pub(crate) trait F16cLanes: Element {
    /// The exact `f32` value of one element (portable code).
    fn scalar_to_f32(self) -> f32;
    /// Loads 16 unaligned elements, widened to two vectors of `f32`.
    ///
    /// # Safety
    /// F16C and AVX2 enabled in the caller; 16 readable elements at `p`.
    unsafe fn load16(p: *const Self) -> (__m256, __m256);
    /// Rounds two vectors of `f32` to this type and stores 16 elements.
    ///
    /// # Safety
    /// As `load16`, with 16 writable elements.
    unsafe fn store16(p: *mut Self, lo: __m256, hi: __m256);
    /// Rounds two vectors of `f32` to this type and back (the `ncclAvg`
    /// pre-multiplied value, rounded as stored).
    ///
    /// # Safety
    /// F16C and AVX2 enabled in the caller.
    unsafe fn round16(lo: __m256, hi: __m256) -> (__m256, __m256);
}

/// Rounds eight `f32` lanes to `f16` bits (nearest even).
#[inline(always)]
unsafe fn narrow(v: __m256) -> __m128i {
    // SAFETY: callers run with F16C enabled.
    unsafe { _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v) }
}

/// Rounds 16 `f32` lanes to 16 `f16` bit patterns in one register.
#[inline(always)]
unsafe fn narrow16(lo: __m256, hi: __m256) -> __m256i {
    // SAFETY: callers run with F16C and AVX2 enabled.
    unsafe { _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(narrow(lo)), narrow(hi)) }
}

/// Widens 16 `f16` bit patterns to two vectors of `f32`.
#[inline(always)]
unsafe fn widen16(h: __m256i) -> (__m256, __m256) {
    // SAFETY: callers run with F16C and AVX2 enabled.
    unsafe {
        (
            _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
        )
    }
}

/// Narrows 16 `u16` lanes holding byte values to 16 bytes and stores them.
#[inline(always)]
unsafe fn store_bytes16(p: *mut u8, v: __m256i) {
    // SAFETY: callers run with AVX2; 16 writable bytes at p. Lanes are
    // <= 0xff, so the saturating pack is a plain narrowing.
    unsafe {
        let packed = _mm_packus_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        _mm_storeu_si128(p.cast::<__m128i>(), packed)
    }
}

/// Loads 16 bytes zero-extended to 16 `u16` lanes.
#[inline(always)]
unsafe fn load_bytes16(p: *const u8) -> __m256i {
    // SAFETY: callers run with AVX2; 16 readable bytes at p.
    unsafe { _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast::<__m128i>())) }
}

#[inline(always)]
unsafe fn splat(v: i16) -> __m256i {
    // SAFETY: callers run with AVX2.
    unsafe { _mm256_set1_epi16(v) }
}

/// `if mask { a } else { b }` per 16-bit lane.
#[inline(always)]
unsafe fn select(mask: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: callers run with AVX2.
    unsafe { _mm256_or_si256(_mm256_and_si256(mask, a), _mm256_andnot_si256(mask, b)) }
}

impl F16cLanes for F16 {
    #[inline(always)]
    fn scalar_to_f32(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> (__m256, __m256) {
        // SAFETY: 16 readable f16 at p (caller); F16C enabled (caller).
        unsafe {
            let p = p.cast::<__m128i>();
            (
                _mm256_cvtph_ps(_mm_loadu_si128(p)),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(1))),
            )
        }
    }
    #[inline(always)]
    unsafe fn store16(p: *mut Self, lo: __m256, hi: __m256) {
        // SAFETY: 16 writable f16 at p (caller); F16C enabled (caller).
        unsafe {
            let p = p.cast::<__m128i>();
            _mm_storeu_si128(p, narrow(lo));
            _mm_storeu_si128(p.add(1), narrow(hi));
        }
    }
    #[inline(always)]
    unsafe fn round16(lo: __m256, hi: __m256) -> (__m256, __m256) {
        // SAFETY: F16C enabled (caller).
        unsafe { (_mm256_cvtph_ps(narrow(lo)), _mm256_cvtph_ps(narrow(hi))) }
    }
}

/// e5m2 ⇄ `f16`: e5m2 is the top byte of an `f16`.
mod e5m2 {
    use super::*;

    /// 16 e5m2 (in u16 lanes) to `f16` bits.
    #[inline(always)]
    pub(super) unsafe fn to_f16(x: __m256i) -> __m256i {
        // SAFETY: AVX2 enabled (caller).
        unsafe { _mm256_slli_epi16::<8>(x) }
    }

    /// 16 `f16` bit patterns to e5m2 (in u16 lanes): round the low 8 bits to
    /// nearest even, saturate finite overflow and infinities to 0x7b, keep
    /// NaN as 0x7e | the top payload bit (as the portable code).
    #[inline(always)]
    pub(super) unsafe fn from_f16(h: __m256i) -> __m256i {
        // SAFETY: AVX2 enabled (caller).
        unsafe {
            let sign = _mm256_and_si256(_mm256_srli_epi16::<8>(h), splat(0x80));
            let m = _mm256_and_si256(h, splat(0x7fff));
            let odd = _mm256_and_si256(_mm256_srli_epi16::<8>(m), splat(1));
            let rounded =
                _mm256_srli_epi16::<8>(_mm256_add_epi16(_mm256_add_epi16(m, splat(0x7f)), odd));
            let rounded = _mm256_min_epu16(rounded, splat(0x7b));
            let nan = _mm256_cmpgt_epi16(m, splat(0x7c00));
            let nan_bits = _mm256_or_si256(
                splat(0x7e),
                _mm256_and_si256(_mm256_srli_epi16::<8>(m), splat(3)),
            );
            _mm256_or_si256(select(nan, nan_bits, rounded), sign)
        }
    }
}

/// e4m3 ⇄ `f16`: an e4m3 value × 2^-8 is an `f16` whose exponent field is the
/// e4m3 exponent field, subnormals included.
mod e4m3 {
    use super::*;

    /// 2^8 and 2^-8: the scale between an e4m3 value and its `f16` image.
    pub(super) const UP: f32 = 256.0;
    pub(super) const DOWN: f32 = 1.0 / 256.0;

    /// 16 e4m3 (in u16 lanes) to the `f16` bits of value × 2^-8 (NaN stays NaN).
    #[inline(always)]
    pub(super) unsafe fn to_f16(x: __m256i) -> __m256i {
        // SAFETY: AVX2 enabled (caller).
        unsafe {
            let sign = _mm256_slli_epi16::<8>(_mm256_and_si256(x, splat(0x80)));
            let mag = _mm256_and_si256(x, splat(0x7f));
            let nan = _mm256_cmpeq_epi16(mag, splat(0x7f));
            let h = select(nan, splat(0x7e00), _mm256_slli_epi16::<7>(mag));
            _mm256_or_si256(h, sign)
        }
    }

    /// The `f16` bits of value × 2^-8 to 16 e4m3 (in u16 lanes): round the
    /// low 7 bits to nearest even, saturate to 0x7e, NaN to 0x7f.
    #[inline(always)]
    pub(super) unsafe fn from_f16(h: __m256i) -> __m256i {
        // SAFETY: AVX2 enabled (caller).
        unsafe {
            let sign = _mm256_and_si256(_mm256_srli_epi16::<8>(h), splat(0x80));
            let m = _mm256_and_si256(h, splat(0x7fff));
            let odd = _mm256_and_si256(_mm256_srli_epi16::<7>(m), splat(1));
            let rounded =
                _mm256_srli_epi16::<7>(_mm256_add_epi16(_mm256_add_epi16(m, splat(0x3f)), odd));
            let rounded = _mm256_min_epu16(rounded, splat(0x7e));
            let nan = _mm256_cmpgt_epi16(m, splat(0x7c00));
            _mm256_or_si256(select(nan, splat(0x7f), rounded), sign)
        }
    }
}

impl F16cLanes for Fp8E5M2 {
    #[inline(always)]
    fn scalar_to_f32(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> (__m256, __m256) {
        // SAFETY: 16 readable bytes at p; F16C and AVX2 enabled (caller).
        unsafe { widen16(e5m2::to_f16(load_bytes16(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn store16(p: *mut Self, lo: __m256, hi: __m256) {
        // SAFETY: 16 writable bytes at p; F16C and AVX2 enabled (caller).
        unsafe { store_bytes16(p.cast(), e5m2::from_f16(narrow16(lo, hi))) }
    }
    #[inline(always)]
    unsafe fn round16(lo: __m256, hi: __m256) -> (__m256, __m256) {
        // SAFETY: F16C and AVX2 enabled (caller).
        unsafe { widen16(e5m2::to_f16(e5m2::from_f16(narrow16(lo, hi)))) }
    }
}

impl F16cLanes for Fp8E4M3 {
    #[inline(always)]
    fn scalar_to_f32(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> (__m256, __m256) {
        // SAFETY: 16 readable bytes at p; F16C and AVX2 enabled (caller).
        unsafe {
            let (lo, hi) = widen16(e4m3::to_f16(load_bytes16(p.cast())));
            let up = _mm256_set1_ps(e4m3::UP);
            (_mm256_mul_ps(lo, up), _mm256_mul_ps(hi, up))
        }
    }
    #[inline(always)]
    unsafe fn store16(p: *mut Self, lo: __m256, hi: __m256) {
        // SAFETY: 16 writable bytes at p; F16C and AVX2 enabled (caller).
        // The 2^-8 scaling is exact for |v| >= 2^-118; anything smaller
        // rounds to (signed) zero in e4m3 either way.
        unsafe {
            let down = _mm256_set1_ps(e4m3::DOWN);
            let h = narrow16(_mm256_mul_ps(lo, down), _mm256_mul_ps(hi, down));
            store_bytes16(p.cast(), e4m3::from_f16(h))
        }
    }
    #[inline(always)]
    unsafe fn round16(lo: __m256, hi: __m256) -> (__m256, __m256) {
        // SAFETY: F16C and AVX2 enabled (caller).
        unsafe {
            let down = _mm256_set1_ps(e4m3::DOWN);
            let h = narrow16(_mm256_mul_ps(lo, down), _mm256_mul_ps(hi, down));
            let (lo, hi) = widen16(e4m3::to_f16(e4m3::from_f16(h)));
            let up = _mm256_set1_ps(e4m3::UP);
            (_mm256_mul_ps(lo, up), _mm256_mul_ps(hi, up))
        }
    }
}

/// The operations with an F16C kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) enum FloatOp<T> {
    /// `a + b`.
    Sum,
    /// `a * b`.
    Prod,
    /// `a + round(b × scale)`: the `ncclAvg` step that pre-multiplies `b`.
    SumPremul(T),
}

/// `d[i] = op(a[i], b[i])` for `n` elements: 16 per vector step, the
/// remainder with the portable scalar code.
///
/// # Safety
/// AVX2 and F16C must be available; `d`, `a`, `b` must be valid for `n`
/// unaligned reads (and `d` for writes); `d` must either equal `a` or overlap
/// neither `a` nor `b` (each group of 16 is loaded before it is stored).
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn zip2<T: F16cLanes>(
    op: FloatOp<T>,
    d: *mut T,
    a: *const T,
    b: *const T,
    n: usize,
) {
    let mut i = 0usize;
    let scale = match op {
        FloatOp::SumPremul(s) => s.scalar_to_f32(),
        FloatOp::Sum | FloatOp::Prod => 1.0,
    };
    let vscale = _mm256_set1_ps(scale);
    while i + 16 <= n {
        // SAFETY: i + 16 <= n elements behind every pointer (caller).
        unsafe {
            let (a0, a1) = T::load16(a.add(i));
            let (b0, b1) = T::load16(b.add(i));
            let (r0, r1) = match op {
                FloatOp::Sum => (_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1)),
                FloatOp::Prod => (_mm256_mul_ps(a0, b0), _mm256_mul_ps(a1, b1)),
                FloatOp::SumPremul(_) => {
                    let (p0, p1) = T::round16(_mm256_mul_ps(b0, vscale), _mm256_mul_ps(b1, vscale));
                    (_mm256_add_ps(a0, p0), _mm256_add_ps(a1, p1))
                }
            };
            T::store16(d.add(i), r0, r1);
        }
        i += 16;
    }
    while i < n {
        // SAFETY: i < n.
        unsafe {
            let (x, y) = (a.add(i).read_unaligned(), b.add(i).read_unaligned());
            let r = match op {
                FloatOp::Sum => x.reduce_sum(y),
                FloatOp::Prod => x.reduce_prod(y),
                FloatOp::SumPremul(s) => x.reduce_sum(y.premul(s)),
            };
            d.add(i).write_unaligned(r);
        }
        i += 1;
    }
}

/// `d[i] = round(s[i] × scale)` for `n` elements (the `ncclAvg` pre-op).
///
/// # Safety
/// As [`zip2`], with `s` in place of both inputs.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn premul<T: F16cLanes>(scale: T, d: *mut T, s: *const T, n: usize) {
    let v = _mm256_set1_ps(scale.scalar_to_f32());
    let mut i = 0usize;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n elements behind both pointers (caller).
        unsafe {
            let (x0, x1) = T::load16(s.add(i));
            T::store16(d.add(i), _mm256_mul_ps(x0, v), _mm256_mul_ps(x1, v));
        }
        i += 16;
    }
    while i < n {
        // SAFETY: i < n.
        unsafe {
            d.add(i)
                .write_unaligned(s.add(i).read_unaligned().premul(scale))
        };
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::float::{f16_bits_to_f32, f32_to_f16_bits};

    fn have_f16c() -> bool {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")
    }

    /// F16C widening agrees with the portable conversion on all 2^16 inputs.
    #[test]
    fn widen_matches_portable_exhaustively() {
        if !have_f16c() {
            eprintln!("skipped: no F16C on this CPU");
            return;
        }
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for chunk in all.chunks_exact(8) {
            let mut out = [0f32; 8];
            // SAFETY: F16C checked; chunk has 8 elements; out has 8 lanes.
            unsafe {
                let v = _mm256_cvtph_ps(_mm_loadu_si128(chunk.as_ptr().cast::<__m128i>()));
                core::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr(), v);
            }
            for (h, f) in chunk.iter().zip(out) {
                assert_eq!(f.to_bits(), f16_bits_to_f32(*h).to_bits(), "f16 {h:#06x}");
            }
        }
    }

    /// F16C narrowing agrees with the portable conversion on every f32 whose
    /// low 13 bits are one of the rounding-relevant patterns (2^19 × 8
    /// inputs: every exponent and every kept mantissa, each at below-tie,
    /// tie, above-tie and exact positions), both signs.
    #[test]
    fn narrow_matches_portable_on_rounding_boundaries() {
        if !have_f16c() {
            eprintln!("skipped: no F16C on this CPU");
            return;
        }
        const LOW: [u32; 8] = [0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x0800, 0x17ff];
        let mut lanes = [0f32; 8];
        for high in 0..(1u32 << 19) {
            for (lane, low) in lanes.iter_mut().zip(LOW) {
                *lane = f32::from_bits((high << 13) | low);
            }
            let mut out = [0u16; 8];
            // SAFETY: F16C checked; 8 lanes each way.
            unsafe {
                let v = core::arch::x86_64::_mm256_loadu_ps(lanes.as_ptr());
                _mm_storeu_si128(out.as_mut_ptr().cast::<__m128i>(), narrow(v));
            }
            for (f, h) in lanes.iter().zip(out) {
                assert_eq!(h, f32_to_f16_bits(*f), "f32 {:#010x}", f.to_bits());
            }
        }
    }

    /// The fp8 vector loads decode all 256 patterns like the portable code,
    /// and the vector stores round every f32 sum and product of every pair
    /// of fp8 values (the only values the kernels store, which is what makes
    /// the f32 -> f16 -> fp8 double rounding exact) like the portable code.
    #[test]
    fn fp8_lanes_match_portable_on_every_sum_and_product() {
        if !have_f16c() {
            eprintln!("skipped: no F16C on this CPU");
            return;
        }
        fn check<T: F16cLanes>(from_bits: fn(u8) -> T, to_bits: fn(T) -> u8) {
            let all: Vec<T> = (0..=255u8).map(from_bits).collect();
            for chunk in all.chunks_exact(16) {
                let mut lanes = [0f32; 16];
                // SAFETY: F16C checked; 16 elements.
                unsafe {
                    let (lo, hi) = T::load16(chunk.as_ptr());
                    core::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), lo);
                    core::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
                }
                for (x, f) in chunk.iter().zip(lanes) {
                    assert_eq!(
                        f.to_bits(),
                        x.scalar_to_f32().to_bits(),
                        "decode {:#04x}",
                        to_bits(*x)
                    );
                }
            }
            // (f32 result, what the portable code stores for it)
            let mut values = Vec::with_capacity(2 * 256 * 256);
            let mut expected = Vec::with_capacity(2 * 256 * 256);
            for x in &all {
                for y in &all {
                    values.push(x.scalar_to_f32() + y.scalar_to_f32());
                    expected.push(x.reduce_sum(*y));
                    values.push(x.scalar_to_f32() * y.scalar_to_f32());
                    expected.push(x.reduce_prod(*y));
                }
            }
            for (chunk, want) in values.chunks_exact(16).zip(expected.chunks_exact(16)) {
                let mut out = [T::default(); 16];
                // SAFETY: F16C checked; 16 lanes.
                unsafe {
                    let lo = core::arch::x86_64::_mm256_loadu_ps(chunk.as_ptr());
                    let hi = core::arch::x86_64::_mm256_loadu_ps(chunk.as_ptr().add(8));
                    T::store16(out.as_mut_ptr(), lo, hi);
                }
                for ((f, y), w) in chunk.iter().zip(out).zip(want) {
                    let want = to_bits(*w);
                    let both_nan = y.scalar_to_f32().is_nan() && f.is_nan();
                    assert!(
                        to_bits(y) == want || both_nan,
                        "f32 {:#010x}: {:#04x} vs {want:#04x}",
                        f.to_bits(),
                        to_bits(y)
                    );
                }
            }
        }
        check::<Fp8E4M3>(Fp8E4M3, |x| x.0);
        check::<Fp8E5M2>(Fp8E5M2, |x| x.0);
    }
}
