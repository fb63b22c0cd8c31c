//! The reduction steps of a [`Reduction`] on device memory, as [`Stream`]
//! methods. Each mirrors the host method of the same name (see
//! `reduction.rs`): the same op choice (pre-/post-op for ncclAvg), the same
//! fold order, the same validation before anything is launched.
//!
//! The `_raw` forms take device addresses (what the runtime has: user
//! buffers and FIFO slots); the others take [`DeviceBuffer`]s and wait for
//! the result.

use std::ffi::c_void;

use cclkit_abi::raw::common::{DataType, RedOp};

use super::device::{DeviceBuffer, Stream};
use super::entries::{self, COPY, DevOp};
use super::{CudaError, DevPtr};
use crate::Reduction;
use crate::error::KernelError;

/// The binary op for one step of `red`: `pre` = the second input is a rank's
/// own data (avg on floats pre-multiplies it), `post` = this step completes
/// the reduction (avg on integers divides). Mirrors `exec.rs`' `with_combine!`.
fn binary_op(red: &Reduction, pre: bool, post: bool) -> Result<Kernel, CudaError> {
    let (op, arg) = match red.op() {
        RedOp::SUM => (DevOp::Sum, 0),
        RedOp::PROD => (DevOp::Prod, 0),
        RedOp::MIN => (DevOp::Min, 0),
        RedOp::MAX => (DevOp::Max, 0),
        RedOp::AVG if red.has_pre_op() && pre => (
            DevOp::PreMulSum,
            entries::avg_scale_bits(red.dtype(), red.n_ranks())?,
        ),
        RedOp::AVG if red.has_post_op() && post => (DevOp::SumPostDiv, u64::from(red.n_ranks())),
        RedOp::AVG => (DevOp::Sum, 0),
        other => return Err(KernelError::UnknownRedOp(other).into()),
    };
    Ok(Kernel {
        op,
        arg,
        dtype: red.dtype(),
    })
}

/// One kernel choice: the op, its scalar argument (avg scale bits or rank
/// count) and the data type.
#[derive(Clone, Copy, Debug)]
struct Kernel {
    op: DevOp,
    arg: u64,
    dtype: DataType,
}

/// Element size of `dtype`.
fn elem(dtype: DataType) -> Result<usize, CudaError> {
    Ok(dtype.size().ok_or(KernelError::UnknownDataType(dtype))?)
}

/// `bytes` must be whole elements and every pointer element-aligned.
fn check(dtype: DataType, bytes: usize, ptrs: &[(&'static str, DevPtr)]) -> Result<u64, CudaError> {
    let e = elem(dtype)?;
    if bytes % e != 0 {
        return Err(KernelError::PartialElement { dtype, len: bytes }.into());
    }
    for &(what, p) in ptrs {
        if p.0 % e as u64 != 0 {
            return Err(CudaError::Misaligned {
                what,
                addr: p.0,
                align: e,
            });
        }
    }
    Ok((bytes / e) as u64)
}

impl Stream {
    /// Launches `dst = a ⊕ b` with the kernel for (`op`, `dtype`).
    ///
    /// # Safety
    /// As [`reduce_raw`](Self::reduce_raw).
    unsafe fn binary(
        &self,
        k: Kernel,
        dst: DevPtr,
        a: DevPtr,
        b: DevPtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        let mut n = check(k.dtype, bytes, &[("dst", dst), ("a", a), ("b", b)])?;
        let slot = entries::slot(k.op, k.dtype)?;
        if n == 0 {
            return Ok(());
        }
        let (mut d, mut a, mut b, mut arg) = (dst.0, a.0, b.0, k.arg);
        let mut params: [*mut c_void; 5] = [
            (&raw mut d).cast(),
            (&raw mut a).cast(),
            (&raw mut b).cast(),
            (&raw mut n).cast(),
            (&raw mut arg).cast(),
        ];
        // SAFETY: the five parameters match the binary kernels' signature;
        // memory validity is forwarded from the caller.
        unsafe { self.launch(slot, bytes, &mut params) }
    }

    /// Launches `dst = f(src)` with a unary kernel.
    ///
    /// # Safety
    /// As [`reduce_raw`](Self::reduce_raw).
    unsafe fn unary(
        &self,
        k: Kernel,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        let mut n = check(k.dtype, bytes, &[("dst", dst), ("src", src)])?;
        let slot = entries::slot(k.op, k.dtype)?;
        if n == 0 {
            return Ok(());
        }
        let (mut d, mut s, mut arg) = (dst.0, src.0, k.arg);
        let mut params: [*mut c_void; 4] = [
            (&raw mut d).cast(),
            (&raw mut s).cast(),
            (&raw mut n).cast(),
            (&raw mut arg).cast(),
        ];
        // SAFETY: the four parameters match the unary kernels' signature;
        // memory validity is forwarded from the caller.
        unsafe { self.launch(slot, bytes, &mut params) }
    }

    /// `dst = src` for `bytes` bytes with the copy kernel (any alignment).
    ///
    /// # Safety
    /// `dst` and `src` address `bytes` bytes this device can access, valid
    /// until the stream has run the kernel; equal or disjoint.
    pub unsafe fn copy_raw(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        let (mut d, mut s, mut n) = (dst.0, src.0, bytes as u64);
        let mut params: [*mut c_void; 3] = [
            (&raw mut d).cast(),
            (&raw mut s).cast(),
            (&raw mut n).cast(),
        ];
        // SAFETY: the three parameters match cclkit_copy; memory validity is
        // forwarded from the caller.
        unsafe { self.launch(COPY, bytes, &mut params) }
    }

    /// `dst = a ⊕ b` (see [`Reduction::reduce`]).
    ///
    /// # Safety
    /// Every pointer addresses `bytes` bytes this device can access (device
    /// memory of its context, or mapped pinned host memory), valid until the
    /// stream has run the kernel. `dst` may equal an input (in place) but
    /// must not partially overlap one.
    ///
    /// # Errors
    /// As the host method, plus [`CudaError::Misaligned`] for a pointer not
    /// aligned to the element size, and launch failures.
    pub unsafe fn reduce_raw(
        &self,
        red: &Reduction,
        dst: DevPtr,
        a: DevPtr,
        b: DevPtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        let k = binary_op(red, false, false)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.binary(k, dst, a, b, bytes) }
    }

    /// `dst = [post](recv ⊕ pre(local))` (see [`Reduction::reduce_local`]).
    ///
    /// # Safety
    /// As [`reduce_raw`](Self::reduce_raw).
    ///
    /// # Errors
    /// As [`reduce_raw`](Self::reduce_raw).
    pub unsafe fn reduce_local_raw(
        &self,
        red: &Reduction,
        dst: DevPtr,
        recv: DevPtr,
        local: DevPtr,
        bytes: usize,
        finish: bool,
    ) -> Result<(), CudaError> {
        let k = binary_op(red, true, finish)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.binary(k, dst, recv, local, bytes) }
    }

    /// `dst = pre(src)` (see [`Reduction::pre_op`]; a copy unless avg on floats).
    ///
    /// # Safety
    /// As [`reduce_raw`](Self::reduce_raw).
    ///
    /// # Errors
    /// As [`reduce_raw`](Self::reduce_raw).
    pub unsafe fn pre_op_raw(
        &self,
        red: &Reduction,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        let dtype = red.dtype();
        if red.has_pre_op() {
            let k = Kernel {
                op: DevOp::PreMul,
                arg: entries::avg_scale_bits(dtype, red.n_ranks())?,
                dtype,
            };
            // SAFETY: forwarded from the caller.
            unsafe { self.unary(k, dst, src, bytes) }
        } else {
            check(dtype, bytes, &[])?;
            // SAFETY: forwarded from the caller.
            unsafe { self.copy_raw(dst, src, bytes) }
        }
    }

    /// `dst = post(src)` (see [`Reduction::post_op`]; a copy unless avg on
    /// integers).
    ///
    /// # Safety
    /// As [`reduce_raw`](Self::reduce_raw).
    ///
    /// # Errors
    /// As [`reduce_raw`](Self::reduce_raw).
    pub unsafe fn post_op_raw(
        &self,
        red: &Reduction,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        let dtype = red.dtype();
        if red.has_post_op() {
            let k = Kernel {
                op: DevOp::PostDiv,
                arg: u64::from(red.n_ranks()),
                dtype,
            };
            // SAFETY: forwarded from the caller.
            unsafe { self.unary(k, dst, src, bytes) }
        } else {
            check(dtype, bytes, &[])?;
            // SAFETY: forwarded from the caller.
            unsafe { self.copy_raw(dst, src, bytes) }
        }
    }

    /// `dst = [post](pre(local) ⊕ peers[0] ⊕ peers[1] ⊕ …)`, folded left to
    /// right with one launch per ⊕ (see [`Reduction::reduce_many`]).
    ///
    /// # Safety
    /// As [`reduce_raw`](Self::reduce_raw); `dst` may equal `peers[0]` (or
    /// `local` when there is no peer) but no later input.
    ///
    /// # Errors
    /// As [`reduce_raw`](Self::reduce_raw), and [`KernelError::NoInputs`].
    pub unsafe fn reduce_many_raw(
        &self,
        red: &Reduction,
        dst: DevPtr,
        local: Option<DevPtr>,
        peers: &[DevPtr],
        bytes: usize,
        finish: bool,
    ) -> Result<(), CudaError> {
        let dtype = red.dtype();
        let rest = match (local, peers) {
            (None, []) => return Err(KernelError::NoInputs.into()),
            (Some(l), []) => {
                // SAFETY: forwarded from the caller.
                unsafe { self.pre_op_raw(red, dst, l, bytes)? };
                if finish {
                    // SAFETY: forwarded from the caller; in place on `dst`.
                    unsafe { self.post_op_raw(red, dst, dst, bytes)? };
                }
                return Ok(());
            }
            (None, [p]) => {
                return if finish {
                    // SAFETY: forwarded from the caller.
                    unsafe { self.post_op_raw(red, dst, *p, bytes) }
                } else {
                    check(dtype, bytes, &[])?;
                    // SAFETY: forwarded from the caller.
                    unsafe { self.copy_raw(dst, *p, bytes) }
                };
            }
            (Some(l), [p, rest @ ..]) => {
                let k = binary_op(red, true, finish && rest.is_empty())?;
                // SAFETY: forwarded from the caller.
                unsafe { self.binary(k, dst, *p, l, bytes)? };
                rest
            }
            (None, [p0, p1, rest @ ..]) => {
                let k = binary_op(red, false, finish && rest.is_empty())?;
                // SAFETY: forwarded from the caller.
                unsafe { self.binary(k, dst, *p0, *p1, bytes)? };
                rest
            }
        };
        for (i, p) in rest.iter().enumerate() {
            let k = binary_op(red, false, finish && i + 1 == rest.len())?;
            // SAFETY: forwarded from the caller; `dst` holds the partial
            // result and is the in-place input, `p` is a later input.
            unsafe { self.binary(k, dst, dst, *p, bytes)? };
        }
        Ok(())
    }

    /// `dst = a ⊕ b` on whole buffers, waiting for the result.
    ///
    /// # Errors
    /// Buffers of different lengths or devices; as [`reduce_raw`](Self::reduce_raw).
    pub fn reduce(
        &self,
        red: &Reduction,
        dst: &mut DeviceBuffer,
        a: &DeviceBuffer,
        b: &DeviceBuffer,
    ) -> Result<(), CudaError> {
        let n = dst.len();
        let (d, a, b) = (dst.range(0, n)?, a.range(0, n)?, b.range(0, n)?);
        // SAFETY: three live buffers of at least `n` bytes (checked), kept
        // borrowed until the synchronize below; `dst` is exclusively borrowed
        // so it cannot alias `a` or `b`.
        unsafe { self.reduce_raw(red, d, a, b, n)? };
        self.synchronize()
    }

    /// `dst = src` on whole buffers with the copy kernel, waiting for it.
    ///
    /// # Errors
    /// `src` shorter than `dst`; launch failures.
    pub fn copy(&self, dst: &mut DeviceBuffer, src: &DeviceBuffer) -> Result<(), CudaError> {
        let n = dst.len();
        let (d, s) = (dst.range(0, n)?, src.range(0, n)?);
        // SAFETY: as in `reduce`.
        unsafe { self.copy_raw(d, s, n)? };
        self.synchronize()
    }
}
