//! Explicit F16C kernels for `f16` arithmetic on x86_64.
//!
//! The compiler cannot turn the portable bit-manipulation conversions of
//! [`crate::float`] into `vcvtph2ps`/`vcvtps2ph`, and the portable path costs
//! about a dozen integer operations per element each way. With F16C the
//! conversions are one instruction per eight elements, still in registers.
//! Results are bit-identical to the portable path: F16C rounds to nearest
//! even, overflows to infinity, handles subnormals, and quiets NaNs keeping
//! their top payload bits, which is what [`crate::float`] reproduces (the
//! unit tests below compare the two exhaustively and on random data).
//!
//! Only sum, prod and the `ncclAvg` pre-multiply live here: min/max return
//! one of their inputs unchanged and vectorise well in the portable form.

use core::arch::x86_64::{
    __m128i, __m256, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_storeu_si128, _mm256_add_ps,
    _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_mul_ps, _mm256_set1_ps,
};

use crate::element::Element;
use crate::float::F16;

/// The `f16` operations with an F16C kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) enum F16Op {
    /// `a + b`.
    Sum,
    /// `a * b`.
    Prod,
    /// `a + round(b × scale)`: the `ncclAvg` step that pre-multiplies `b`.
    SumPremul(F16),
}

/// Rounds eight `f32` lanes to `f16` (nearest even).
#[inline(always)]
unsafe fn narrow(v: __m256) -> __m128i {
    // SAFETY: only called from functions compiled with F16C.
    unsafe { _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v) }
}

/// Loads eight unaligned `f16` and widens them to `f32`.
#[inline(always)]
unsafe fn load(p: *const u16) -> __m256 {
    // SAFETY: the caller guarantees eight readable elements at p.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())) }
}

/// Narrows and stores eight `f16`, unaligned.
#[inline(always)]
unsafe fn store(p: *mut u16, v: __m256) {
    // SAFETY: the caller guarantees eight writable elements at p.
    unsafe { _mm_storeu_si128(p.cast::<__m128i>(), narrow(v)) }
}

/// The vector loop, 16 elements per iteration (two independent vectors keep
/// both conversion units busy), then a scalar tail with the portable code.
macro_rules! f16_loop {
    ($d:ident, $a:ident, $b:ident, $n:ident, |$x:ident, $y:ident| $vec:expr, |$sx:ident, $sy:ident| $scalar:expr) => {{
        let mut i = 0usize;
        while i + 16 <= $n {
            // SAFETY: i + 16 <= n elements are valid behind every pointer;
            // d equals a or overlaps neither input, and each group is fully
            // loaded before it is stored.
            unsafe {
                let ($x, $y) = (load($a.add(i)), load($b.add(i)));
                let r0 = $vec;
                let ($x, $y) = (load($a.add(i + 8)), load($b.add(i + 8)));
                let r1 = $vec;
                store($d.add(i), r0);
                store($d.add(i + 8), r1);
            }
            i += 16;
        }
        while i < $n {
            // SAFETY: i < n.
            unsafe {
                let $sx = F16($a.add(i).read_unaligned());
                let $sy = F16($b.add(i).read_unaligned());
                $d.add(i).write_unaligned(($scalar).0);
            }
            i += 1;
        }
    }};
}

/// `d[i] = op(a[i], b[i])` for `n` `f16` elements.
///
/// # Safety
/// AVX2 and F16C must be available; `d`, `a`, `b` must be valid for `n`
/// unaligned `u16` reads (and `d` for writes); `d` must either equal `a` or
/// overlap neither `a` nor `b`.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn f16_zip2(op: F16Op, d: *mut u16, a: *const u16, b: *const u16, n: usize) {
    match op {
        F16Op::Sum => f16_loop!(d, a, b, n, |x, y| _mm256_add_ps(x, y), |x, y| x
            .reduce_sum(y)),
        F16Op::Prod => f16_loop!(d, a, b, n, |x, y| _mm256_mul_ps(x, y), |x, y| x
            .reduce_prod(y)),
        F16Op::SumPremul(scale) => {
            let s = _mm256_set1_ps(scale.to_f32());
            f16_loop!(
                d,
                a,
                b,
                n,
                |x, y| _mm256_add_ps(x, _mm256_cvtph_ps(narrow(_mm256_mul_ps(y, s)))),
                |x, y| x.reduce_sum(y.premul(scale))
            )
        }
    }
}

/// `d[i] = round(s[i] × scale)` for `n` `f16` elements (the `ncclAvg` pre-op).
///
/// # Safety
/// As [`f16_zip2`], with `s` in place of both inputs.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn f16_premul(scale: F16, d: *mut u16, s: *const u16, n: usize) {
    let v = _mm256_set1_ps(scale.to_f32());
    // The loop macro wants two inputs; the second is ignored.
    f16_loop!(d, s, s, n, |x, _y| _mm256_mul_ps(x, v), |x, _y| x
        .premul(scale));
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
}
