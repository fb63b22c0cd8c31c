//! The element-wise loops every host kernel is made of, and the choice of
//! instruction set.
//!
//! Each loop is written once, as a plain indexed loop over unaligned
//! elements, and compiled twice: for the baseline target (SSE2 on x86_64) and,
//! on x86_64, inside a `#[target_feature(enable = "avx2,f16c")]` wrapper that
//! the dispatcher picks at run time when the CPU has both. The compiler
//! vectorises each copy for its instruction set; the shipped build needs no
//! `-C target-cpu`.
//!
//! The loops take byte slices and read/write elements unaligned, so callers
//! may pass any byte offset. `&mut`/`&` parameters tell the compiler the
//! destination does not overlap the inputs, which is what lets it vectorise
//! without run-time overlap checks; in-place variants read and write the same
//! slice instead.

use std::sync::OnceLock;

/// Which compiled copy of the loops runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// The target's baseline (SSE2 on x86_64).
    Baseline,
    /// x86_64 with AVX2 and F16C, detected at run time.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// The environment variable that forces the baseline loops
/// (`CCLKIT_KERNELS_SIMD=baseline`), read once.
pub const SIMD_ENV: &str = "CCLKIT_KERNELS_SIMD";

/// The level for this process: the best the CPU supports unless
/// [`SIMD_ENV`] says `baseline`.
pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let forced_baseline =
            std::env::var(SIMD_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("baseline"));
        if forced_baseline {
            return Level::Baseline;
        }
        best_level()
    })
}

/// The best level the CPU supports.
pub(crate) fn best_level() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
            return Level::Avx2;
        }
    }
    Level::Baseline
}

/// Every level this CPU can run (for tests that compare them).
#[cfg(test)]
pub(crate) fn available_levels() -> Vec<Level> {
    let mut levels = vec![Level::Baseline];
    #[cfg(target_arch = "x86_64")]
    {
        if best_level() == Level::Avx2 {
            levels.push(Level::Avx2);
        }
    }
    levels
}

/// Number of whole `T`s in `len` bytes.
#[inline(always)]
fn count<T>(len: usize) -> usize {
    len / size_of::<T>()
}

#[inline(always)]
fn zip2_body<T: Copy, F: Fn(T, T) -> T>(dst: &mut [u8], a: &[u8], b: &[u8], f: &F) {
    let n = count::<T>(dst.len().min(a.len()).min(b.len()));
    let d = dst.as_mut_ptr().cast::<T>();
    let pa = a.as_ptr().cast::<T>();
    let pb = b.as_ptr().cast::<T>();
    for i in 0..n {
        // SAFETY: i < n and every slice holds at least n * size_of::<T>()
        // bytes; accesses are unaligned; T is plain old data (sealed Element).
        unsafe {
            d.add(i)
                .write_unaligned(f(pa.add(i).read_unaligned(), pb.add(i).read_unaligned()))
        }
    }
}

#[inline(always)]
fn zip2_in_place_body<T: Copy, F: Fn(T, T) -> T>(acc: &mut [u8], b: &[u8], f: &F) {
    let n = count::<T>(acc.len().min(b.len()));
    let d = acc.as_mut_ptr().cast::<T>();
    let pb = b.as_ptr().cast::<T>();
    for i in 0..n {
        // SAFETY: as in zip2_body; acc is read then written at the same index.
        unsafe {
            d.add(i)
                .write_unaligned(f(d.add(i).read_unaligned(), pb.add(i).read_unaligned()))
        }
    }
}

#[inline(always)]
fn map_body<T: Copy, F: Fn(T) -> T>(dst: &mut [u8], src: &[u8], f: &F) {
    let n = count::<T>(dst.len().min(src.len()));
    let d = dst.as_mut_ptr().cast::<T>();
    let ps = src.as_ptr().cast::<T>();
    for i in 0..n {
        // SAFETY: as in zip2_body.
        unsafe { d.add(i).write_unaligned(f(ps.add(i).read_unaligned())) }
    }
}

#[inline(always)]
fn map_in_place_body<T: Copy, F: Fn(T) -> T>(buf: &mut [u8], f: &F) {
    let n = count::<T>(buf.len());
    let d = buf.as_mut_ptr().cast::<T>();
    for i in 0..n {
        // SAFETY: as in zip2_body.
        unsafe { d.add(i).write_unaligned(f(d.add(i).read_unaligned())) }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The same loops compiled with AVX2 and F16C enabled. Callers must have
    //! checked both features (`Level::Avx2` is only produced after that).

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn zip2<T: Copy, F: Fn(T, T) -> T>(
        dst: &mut [u8],
        a: &[u8],
        b: &[u8],
        f: &F,
    ) {
        super::zip2_body(dst, a, b, f)
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn zip2_in_place<T: Copy, F: Fn(T, T) -> T>(acc: &mut [u8], b: &[u8], f: &F) {
        super::zip2_in_place_body(acc, b, f)
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn map<T: Copy, F: Fn(T) -> T>(dst: &mut [u8], src: &[u8], f: &F) {
        super::map_body(dst, src, f)
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn map_in_place<T: Copy, F: Fn(T) -> T>(buf: &mut [u8], f: &F) {
        super::map_in_place_body(buf, f)
    }
}

/// `dst[i] = f(a[i], b[i])` over the whole elements the three slices share.
#[inline(always)]
pub(crate) fn zip2<T: Copy, F: Fn(T, T) -> T>(
    level: Level,
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
    f: F,
) {
    match level {
        // SAFETY: Level::Avx2 is only produced once AVX2 and F16C are detected.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { avx2::zip2(dst, a, b, &f) },
        Level::Baseline => zip2_body(dst, a, b, &f),
    }
}

/// `acc[i] = f(acc[i], b[i])`.
#[inline(always)]
pub(crate) fn zip2_in_place<T: Copy, F: Fn(T, T) -> T>(
    level: Level,
    acc: &mut [u8],
    b: &[u8],
    f: F,
) {
    match level {
        // SAFETY: as in zip2.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { avx2::zip2_in_place(acc, b, &f) },
        Level::Baseline => zip2_in_place_body(acc, b, &f),
    }
}

/// `dst[i] = f(src[i])`.
#[inline(always)]
pub(crate) fn map<T: Copy, F: Fn(T) -> T>(level: Level, dst: &mut [u8], src: &[u8], f: F) {
    match level {
        // SAFETY: as in zip2.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { avx2::map(dst, src, &f) },
        Level::Baseline => map_body(dst, src, &f),
    }
}

/// `buf[i] = f(buf[i])`.
#[inline(always)]
pub(crate) fn map_in_place<T: Copy, F: Fn(T) -> T>(level: Level, buf: &mut [u8], f: F) {
    match level {
        // SAFETY: as in zip2.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { avx2::map_in_place(buf, &f) },
        Level::Baseline => map_in_place_body(buf, &f),
    }
}
