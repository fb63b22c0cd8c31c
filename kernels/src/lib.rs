//! cclkit-kernels: NCCL's reduction and copy kernels for host memory.
//!
//! Every NCCL data type (int8, uint8, int32, uint32, int64, uint64, half,
//! float, double, bfloat16, fp8 e4m3, fp8 e5m2) with every built-in op (sum,
//! prod, min, max, avg), with NCCL's semantics, for cclkit's reference
//! runtime that runs collectives on host buffers.
//!
//! # Quick start
//! ```
//! use cclkit_kernels::{DataType, RedOp, Reduction};
//!
//! // Two received f32 chunks, summed into a send buffer.
//! let a: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
//! let b: Vec<u8> = [0.5f32, 0.25].iter().flat_map(|x| x.to_ne_bytes()).collect();
//! let mut dst = vec![0u8; a.len()];
//! cclkit_kernels::reduce(DataType::FLOAT32, RedOp::SUM, &mut dst, &a, &b)?;
//! assert_eq!(dst[..4], 1.5f32.to_ne_bytes());
//!
//! // A whole collective's op: avg over 4 ranks scales each rank's input
//! // (float types) or divides the final sum (integer types), as NCCL does.
//! let avg = Reduction::new(DataType::INT32, RedOp::AVG, 4)?;
//! let mut acc = 7i32.to_ne_bytes();
//! avg.post_op_in_place(&mut acc)?;
//! assert_eq!(i32::from_ne_bytes(acc), 1);
//! # Ok::<(), cclkit_kernels::KernelError>(())
//! ```
//!
//! See `README.md` for how the runtime's ring and tree steps map onto these
//! calls, the tests, and benchmark numbers.
//!
//! # API
//! * [`reduce`], [`reduce_in_place`], [`copy`]: one binary step (`dst = a ⊕ b`)
//!   on byte slices, typed by a `ncclDataType_t`/`ncclRedOp_t` pair
//!   ([`DataType`], [`RedOp`], i32 newtypes: unknown values are errors).
//! * [`reduce_typed`], [`reduce_in_place_typed`]: the same on `&[T]` for
//!   callers that know the type ([`Element`]: `i8`…`f64`, [`F16`], [`Bf16`],
//!   [`Fp8E4M3`], [`Fp8E5M2`]); [`as_bytes`]/[`as_bytes_mut`] view typed slices
//!   as bytes for the rest of the API.
//! * [`Reduction`]: a collective's op with `nRanks`, its pre-op and post-op
//!   (how `ncclAvg` works) and the fused steps ring and tree schedules run:
//!   [`Reduction::reduce_local`] (`dst = recv ⊕ pre(local)`),
//!   [`Reduction::reduce_many`] (`dst = pre(local) ⊕ peer₀ ⊕ peer₁ ⊕ …`).
//!
//! Byte slices may have any alignment. Lengths must match and be whole
//! elements; otherwise the call returns [`KernelError`] and writes nothing.
//! Nothing here panics, and no kernel allocates.
//!
//! # Semantics
//! * Integers: wrapping two's-complement sum and prod (NCCL runs signed sums
//!   on its unsigned kernels, so CUDA wraps too); exact.
//! * `f32`, `f64`: IEEE operations, round to nearest even.
//! * `f16`, `bf16`, fp8: computed in `f32`, rounded once to nearest even;
//!   each binary step is the correctly rounded result (the bits NCCL's
//!   `__hadd`/`__hmul` give). fp8 saturates to its largest finite value
//!   (`__NV_SATFINITE`), infinities included; f16/bf16 overflow to infinity.
//! * min/max on floats: IEEE `minimumNumber`/`maximumNumber` (a NaN loses
//!   to a number, like `fminf`/`__hmin`; `-0 < +0`); the result is one of the
//!   inputs, bit for bit.
//! * NaN in, NaN out for sum/prod/avg (quiet, payload unspecified).
//! * avg: see [`Reduction`].
//!
//! # Features
//! * The loops are portable Rust the compiler vectorises, built twice:
//!   baseline x86_64 (SSE2) and AVX2+F16C, picked at run time
//!   (`is_x86_feature_detected!`); `f16` and fp8 sum/prod/avg use F16C
//!   instructions. `CCLKIT_KERNELS_SIMD=baseline` forces the portable
//!   baseline loops. Results are identical on every path (NaN payloads
//!   aside).
//! * `cuda`: the same kernels on CUDA device memory ([`cuda`]), launched
//!   through the CUDA driver loaded at run time (builds without CUDA).
//!
//! # Threads
//! Every function is a pure function of its arguments; call them from any
//! number of threads (the runtime's proxy threads do).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

#[cfg(feature = "cuda")]
pub mod cuda;
mod element;
mod error;
mod exec;
mod float;
mod host;
#[cfg(test)]
mod level_tests;
mod reduction;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use cclkit_abi::raw::common::{DataType, RedOp};
pub use element::Element;
pub use error::KernelError;
pub use float::{Bf16, F16, Fp8E4M3, Fp8E5M2};
pub use host::SIMD_ENV;
pub use reduction::{Reduction, copy};

/// `dst = a ⊕ b` for `dtype` elements, where ⊕ is `op` (`ncclAvg` adds: its
/// scaling is the pre-/post-op of a [`Reduction`]).
///
/// # Errors
/// Unknown `dtype` or `op`; `a` or `b` not as long as `dst`; a length that is
/// not a whole number of elements.
pub fn reduce(
    dtype: DataType,
    op: RedOp,
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
) -> Result<(), KernelError> {
    Reduction::new(dtype, op, 1)?.reduce(dst, a, b)
}

/// `acc = acc ⊕ b` (see [`reduce`]).
///
/// # Errors
/// As [`reduce`].
pub fn reduce_in_place(
    dtype: DataType,
    op: RedOp,
    acc: &mut [u8],
    b: &[u8],
) -> Result<(), KernelError> {
    Reduction::new(dtype, op, 1)?.reduce_in_place(acc, b)
}

/// `dst = a ⊕ b` on typed slices (see [`reduce`]).
///
/// # Errors
/// Unknown `op`; `a` or `b` not as long as `dst`.
pub fn reduce_typed<T: Element>(
    op: RedOp,
    dst: &mut [T],
    a: &[T],
    b: &[T],
) -> Result<(), KernelError> {
    reduce(T::DTYPE, op, as_bytes_mut(dst), as_bytes(a), as_bytes(b))
}

/// `acc = acc ⊕ b` on typed slices (see [`reduce`]).
///
/// # Errors
/// As [`reduce_typed`].
pub fn reduce_in_place_typed<T: Element>(
    op: RedOp,
    acc: &mut [T],
    b: &[T],
) -> Result<(), KernelError> {
    reduce_in_place(T::DTYPE, op, as_bytes_mut(acc), as_bytes(b))
}

/// Views a typed slice as its bytes (native endianness).
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: Element is sealed to plain-old-data types without padding, so
    // every byte is initialised; the byte slice covers exactly the same
    // memory and borrows it for the same lifetime.
    unsafe { core::slice::from_raw_parts(s.as_ptr().cast::<u8>(), size_of_val(s)) }
}

/// Views a typed slice as mutable bytes (native endianness).
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; additionally every bit pattern is a valid T,
    // so any bytes written through the view leave valid values.
    unsafe { core::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), size_of_val(s)) }
}
