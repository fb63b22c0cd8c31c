//! Typed execution of one reduction step: picks the loop (portable or F16C)
//! and the per-element function for an (op, pre-op, post-op) combination.
//!
//! Lengths are validated by the caller ([`crate::Reduction`]); the loops here
//! only ever touch the whole elements all slices share, so a bad length can
//! at worst leave bytes unwritten, never read or write out of bounds.

use crate::element::Element;
use crate::element::sealed::Sealed;
use crate::host::{self, Level};

/// The device-level form of an op, as NCCL's `ncclDevRedOp_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `ncclDevSum`.
    Sum,
    /// `ncclDevProd`.
    Prod,
    /// `ncclDevMinMax` (min).
    Min,
    /// `ncclDevMinMax` (max).
    Max,
    /// `ncclDevPreMulSum`: `ncclAvg` on floats.
    PreMulSum,
    /// `ncclDevSumPostDiv`: `ncclAvg` on integers.
    SumPostDiv,
}

/// What one call runs: the loop level, the op, and `nRanks` for avg.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Exec {
    pub(crate) level: Level,
    pub(crate) kind: Kind,
    pub(crate) n_ranks: u32,
}

/// Expands `$run::<T, _>(args…, f)` with the per-element function for the
/// op, with the pre-op applied to the second input when `$pre_b` and the
/// post-op applied to the result when `$post`.
macro_rules! with_combine {
    ($exec:expr, $T:ty, $pre_b:expr, $post:expr, $run:path, ($($arg:expr),*)) => {{
        let exec: Exec = $exec;
        let level = exec.level;
        match exec.kind {
            Kind::Sum => $run(level, $($arg,)* <$T>::reduce_sum),
            Kind::Prod => $run(level, $($arg,)* <$T>::reduce_prod),
            Kind::Min => $run(level, $($arg,)* <$T>::reduce_min),
            Kind::Max => $run(level, $($arg,)* <$T>::reduce_max),
            Kind::PreMulSum if $pre_b => {
                let scale = <$T>::avg_scale(exec.n_ranks);
                $run(level, $($arg,)* move |x: $T, y: $T| x.reduce_sum(y.premul(scale)))
            }
            Kind::SumPostDiv if $post => {
                let n = exec.n_ranks;
                $run(level, $($arg,)* move |x: $T, y: $T| x.reduce_sum(y).post_div(n))
            }
            Kind::PreMulSum | Kind::SumPostDiv => $run(level, $($arg,)* <$T>::reduce_sum),
        }
    }};
}

impl Exec {
    /// Runs `dst = a ⊕ pre?(b)` with the F16C kernel when there is one for
    /// this type and op at this level (f16 and fp8 sum, prod, avg); returns
    /// whether it did.
    ///
    /// # Safety
    /// `d`, `a`, `b` valid for `n` elements of `dtype` (unaligned); `d` equal
    /// to `a` or overlapping neither input.
    #[cfg(target_arch = "x86_64")]
    unsafe fn f16c_binary(
        self,
        dtype: crate::DataType,
        d: *mut u8,
        a: *const u8,
        b: *const u8,
        n: usize,
        pre_b: bool,
    ) -> bool {
        use crate::DataType;
        use crate::float::{F16, Fp8E4M3, Fp8E5M2};
        if self.level != Level::Avx2 {
            return false;
        }
        // SAFETY: forwarded from the caller; Level::Avx2 means AVX2 and F16C
        // were detected.
        unsafe {
            match dtype {
                DataType::FLOAT16 => self.f16c_typed::<F16>(d.cast(), a.cast(), b.cast(), n, pre_b),
                DataType::FLOAT8E4M3 => {
                    self.f16c_typed::<Fp8E4M3>(d.cast(), a.cast(), b.cast(), n, pre_b)
                }
                DataType::FLOAT8E5M2 => {
                    self.f16c_typed::<Fp8E5M2>(d.cast(), a.cast(), b.cast(), n, pre_b)
                }
                _ => false,
            }
        }
    }

    /// # Safety
    /// As `f16c_binary`, and the level is `Avx2`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn f16c_typed<U: crate::x86::F16cLanes>(
        self,
        d: *mut U,
        a: *const U,
        b: *const U,
        n: usize,
        pre_b: bool,
    ) -> bool {
        use crate::x86::FloatOp;
        let op = match self.kind {
            Kind::Sum => FloatOp::Sum,
            Kind::Prod => FloatOp::Prod,
            Kind::PreMulSum if pre_b => FloatOp::SumPremul(U::avg_scale(self.n_ranks)),
            Kind::PreMulSum => FloatOp::Sum,
            Kind::Min | Kind::Max | Kind::SumPostDiv => return false,
        };
        // SAFETY: forwarded from the caller.
        unsafe { crate::x86::zip2(op, d, a, b, n) };
        true
    }

    /// `dst = pre(src)` with the F16C kernel when there is one; returns
    /// whether it ran.
    ///
    /// # Safety
    /// `d`, `s` valid for `n` elements of `dtype`; `d` equal to `s` or
    /// disjoint from it.
    #[cfg(target_arch = "x86_64")]
    unsafe fn f16c_premul(
        self,
        dtype: crate::DataType,
        d: *mut u8,
        s: *const u8,
        n: usize,
    ) -> bool {
        use crate::DataType;
        use crate::float::{F16, Fp8E4M3, Fp8E5M2};
        use crate::x86::premul;
        if self.level != Level::Avx2 {
            return false;
        }
        let r = self.n_ranks;
        // SAFETY: forwarded from the caller; Level::Avx2 checked above.
        unsafe {
            match dtype {
                DataType::FLOAT16 => premul(F16::avg_scale(r), d.cast(), s.cast(), n),
                DataType::FLOAT8E4M3 => premul(Fp8E4M3::avg_scale(r), d.cast(), s.cast(), n),
                DataType::FLOAT8E5M2 => premul(Fp8E5M2::avg_scale(r), d.cast(), s.cast(), n),
                _ => return false,
            }
        }
        true
    }

    /// `dst = post?(a ⊕ pre?(b))`.
    pub(crate) fn binary<T: Element>(
        self,
        dst: &mut [u8],
        a: &[u8],
        b: &[u8],
        pre_b: bool,
        post: bool,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            let n = dst.len().min(a.len()).min(b.len()) / size_of::<T>();
            // SAFETY: n elements fit in every slice; dst is a `&mut`, so it
            // overlaps neither input.
            if unsafe {
                self.f16c_binary(T::DTYPE, dst.as_mut_ptr(), a.as_ptr(), b.as_ptr(), n, pre_b)
            } {
                return;
            }
        }
        with_combine!(self, T, pre_b, post, host::zip2, (dst, a, b))
    }

    /// `acc = post?(acc ⊕ pre?(b))`.
    pub(crate) fn binary_in_place<T: Element>(
        self,
        acc: &mut [u8],
        b: &[u8],
        pre_b: bool,
        post: bool,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            let n = acc.len().min(b.len()) / size_of::<T>();
            let d = acc.as_mut_ptr();
            // SAFETY: n elements fit; d is both output and first input, which
            // the kernel allows, and `b` cannot overlap a `&mut`.
            if unsafe { self.f16c_binary(T::DTYPE, d, d, b.as_ptr(), n, pre_b) } {
                return;
            }
        }
        with_combine!(self, T, pre_b, post, host::zip2_in_place, (acc, b))
    }

    /// `dst = pre(src)`: the `ncclAvg` pre-multiply for floats, a copy
    /// otherwise.
    pub(crate) fn pre<T: Element>(self, dst: &mut [u8], src: &[u8]) {
        if self.kind != Kind::PreMulSum {
            copy_prefix(dst, src);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let n = dst.len().min(src.len()) / size_of::<T>();
            // SAFETY: n fits; dst is a `&mut`, disjoint from src.
            if unsafe { self.f16c_premul(T::DTYPE, dst.as_mut_ptr(), src.as_ptr(), n) } {
                return;
            }
        }
        let scale = T::avg_scale(self.n_ranks);
        host::map(self.level, dst, src, move |x: T| x.premul(scale));
    }

    /// `buf = pre(buf)`.
    pub(crate) fn pre_in_place<T: Element>(self, buf: &mut [u8]) {
        if self.kind != Kind::PreMulSum {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let n = buf.len() / size_of::<T>();
            let d = buf.as_mut_ptr();
            // SAFETY: n fits; in place is allowed (d equals the input).
            if unsafe { self.f16c_premul(T::DTYPE, d, d, n) } {
                return;
            }
        }
        let scale = T::avg_scale(self.n_ranks);
        host::map_in_place(self.level, buf, move |x: T| x.premul(scale));
    }

    /// `dst = post(src)`: the `ncclAvg` division for integers, a copy
    /// otherwise.
    pub(crate) fn post<T: Element>(self, dst: &mut [u8], src: &[u8]) {
        if self.kind != Kind::SumPostDiv {
            copy_prefix(dst, src);
            return;
        }
        let n = self.n_ranks;
        host::map(self.level, dst, src, move |x: T| x.post_div(n));
    }

    /// `buf = post(buf)`.
    pub(crate) fn post_in_place<T: Element>(self, buf: &mut [u8]) {
        if self.kind != Kind::SumPostDiv {
            return;
        }
        let n = self.n_ranks;
        host::map_in_place(self.level, buf, move |x: T| x.post_div(n));
    }

    /// `dst = post?(pre?(local) ⊕ peers[0] ⊕ peers[1] ⊕ …)` with at least
    /// one input. More than two inputs are folded block by block so the
    /// partial result stays in L1 while each peer streams through once.
    pub(crate) fn many<'a, T: Element>(
        self,
        dst: &mut [u8],
        local: Option<&'a [u8]>,
        peers: &[&'a [u8]],
        finish: bool,
    ) {
        match (local, peers) {
            (None, []) => {}
            (Some(l), []) => {
                self.pre::<T>(dst, l);
                if finish {
                    self.post_in_place::<T>(dst);
                }
            }
            (None, [p]) => {
                if finish {
                    self.post::<T>(dst, p);
                } else {
                    copy_prefix(dst, p);
                }
            }
            (Some(l), [p]) => self.binary::<T>(dst, p, l, true, finish),
            (None, [p0, p1]) => self.binary::<T>(dst, p0, p1, false, finish),
            _ => {
                let mut start = 0;
                for block in dst.chunks_mut(MANY_BLOCK) {
                    let range = start..start + block.len();
                    start = range.end;
                    let part =
                        |s: &'a [u8]| -> &'a [u8] { s.get(range.clone()).unwrap_or_default() };
                    let rest = match local {
                        Some(l) => {
                            let first = peers.first().copied().unwrap_or_default();
                            self.binary::<T>(
                                block,
                                part(first),
                                part(l),
                                true,
                                finish && peers.len() == 1,
                            );
                            peers.get(1..).unwrap_or_default()
                        }
                        None => {
                            let p0 = peers.first().copied().unwrap_or_default();
                            let p1 = peers.get(1).copied().unwrap_or_default();
                            self.binary::<T>(
                                block,
                                part(p0),
                                part(p1),
                                false,
                                finish && peers.len() == 2,
                            );
                            peers.get(2..).unwrap_or_default()
                        }
                    };
                    for (i, p) in rest.iter().enumerate() {
                        self.binary_in_place::<T>(
                            block,
                            part(p),
                            false,
                            finish && i + 1 == rest.len(),
                        );
                    }
                }
            }
        }
    }
}

/// Block size for folds of more than two inputs: a multiple of every element
/// size, small enough that the partial result stays in L1.
const MANY_BLOCK: usize = 8 << 10;

/// Copies the common prefix of `src` into `dst` (lengths were validated).
pub(crate) fn copy_prefix(dst: &mut [u8], src: &[u8]) {
    let n = dst.len().min(src.len());
    if let (Some(d), Some(s)) = (dst.get_mut(..n), src.get(..n)) {
        d.copy_from_slice(s);
    }
}
