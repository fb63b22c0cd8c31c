//! Typed execution of one reduction step: picks the loop (portable or F16C)
//! and the per-element function for an (op, pre-op, post-op) combination.
//!
//! Lengths are validated by the caller ([`crate::Reduction`]); the loops here
//! only ever touch the whole elements all slices share, so a bad length can
//! at worst leave bytes unwritten, never read or write out of bounds.

use crate::element::Element;
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
    /// The F16C kernel for this step on `f16`, if there is one.
    #[cfg(target_arch = "x86_64")]
    fn f16_op(self, pre_b: bool) -> Option<crate::x86::F16Op> {
        use crate::float::F16;
        use crate::x86::F16Op;
        if self.level != Level::Avx2 {
            return None;
        }
        match self.kind {
            Kind::Sum => Some(F16Op::Sum),
            Kind::Prod => Some(F16Op::Prod),
            Kind::PreMulSum if pre_b => Some(F16Op::SumPremul(F16::avg_scale(self.n_ranks))),
            Kind::PreMulSum => Some(F16Op::Sum),
            Kind::Min | Kind::Max | Kind::SumPostDiv => None,
        }
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
        if T::DTYPE == crate::DataType::FLOAT16 {
            if let Some(op) = self.f16_op(pre_b) {
                let n = dst.len().min(a.len()).min(b.len()) / 2;
                // SAFETY: f16_op returns Some only at Level::Avx2 (AVX2 and
                // F16C detected); n elements fit in every slice; dst is a
                // `&mut` so it overlaps neither input.
                unsafe {
                    crate::x86::f16_zip2(
                        op,
                        dst.as_mut_ptr().cast(),
                        a.as_ptr().cast(),
                        b.as_ptr().cast(),
                        n,
                    )
                };
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
        if T::DTYPE == crate::DataType::FLOAT16 {
            if let Some(op) = self.f16_op(pre_b) {
                let n = acc.len().min(b.len()) / 2;
                let d = acc.as_mut_ptr().cast::<u16>();
                // SAFETY: as in `binary`; d is both output and first input,
                // which f16_zip2 allows, and `b` cannot overlap a `&mut`.
                unsafe { crate::x86::f16_zip2(op, d, d, b.as_ptr().cast(), n) };
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
        if T::DTYPE == crate::DataType::FLOAT16 && self.level == Level::Avx2 {
            let scale = crate::float::F16::avg_scale(self.n_ranks);
            let n = dst.len().min(src.len()) / 2;
            // SAFETY: Level::Avx2 means AVX2 and F16C were detected; n fits;
            // dst is a `&mut`, disjoint from src.
            unsafe {
                crate::x86::f16_premul(scale, dst.as_mut_ptr().cast(), src.as_ptr().cast(), n)
            };
            return;
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
        if T::DTYPE == crate::DataType::FLOAT16 && self.level == Level::Avx2 {
            let scale = crate::float::F16::avg_scale(self.n_ranks);
            let n = buf.len() / 2;
            let d = buf.as_mut_ptr().cast::<u16>();
            // SAFETY: as in `pre`; in place is allowed (d equals the input).
            unsafe { crate::x86::f16_premul(scale, d, d, n) };
            return;
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
