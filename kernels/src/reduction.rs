//! [`Reduction`]: one collective's reduction (data type, op, `nRanks`), with
//! the fused steps a ring or tree schedule runs on host buffers.

use cclkit_abi::raw::common::{DataType, RedOp};

use crate::element::avg_is_premul;
use crate::error::KernelError;
use crate::exec::{Exec, Kind, copy_prefix};
use crate::float::{Bf16, F16, Fp8E4M3, Fp8E5M2};
use crate::host::{self, Level};

/// Runs `$body` with `$T` bound to the Rust type of `$dtype`.
macro_rules! by_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DataType::INT8 => {
                type $T = i8;
                $body
            }
            DataType::UINT8 => {
                type $T = u8;
                $body
            }
            DataType::INT32 => {
                type $T = i32;
                $body
            }
            DataType::UINT32 => {
                type $T = u32;
                $body
            }
            DataType::INT64 => {
                type $T = i64;
                $body
            }
            DataType::UINT64 => {
                type $T = u64;
                $body
            }
            DataType::FLOAT16 => {
                type $T = F16;
                $body
            }
            DataType::FLOAT32 => {
                type $T = f32;
                $body
            }
            DataType::FLOAT64 => {
                type $T = f64;
                $body
            }
            DataType::BFLOAT16 => {
                type $T = Bf16;
                $body
            }
            DataType::FLOAT8E4M3 => {
                type $T = Fp8E4M3;
                $body
            }
            DataType::FLOAT8E5M2 => {
                type $T = Fp8E5M2;
                $body
            }
            other => return Err(KernelError::UnknownDataType(other)),
        }
    };
}

/// One collective's reduction: data type, `ncclRedOp_t` and the number of
/// ranks, turned into NCCL's device-level op (`ncclDevRedOpFull`).
///
/// Every NCCL reduction is *pre-op → fold with a binary op → post-op*:
///
/// | op | binary op ⊕ | pre-op (each rank's own input, once) | post-op (final result, once) |
/// | --- | --- | --- | --- |
/// | sum, prod, min, max | itself | identity | identity |
/// | avg, float types | sum | `x × T(1/nRanks)`, rounded to `T` | identity |
/// | avg, integer types | sum (wrapping) | identity | `x / nRanks`, truncated toward zero |
///
/// That is NCCL's `ncclDevPreMulSum`/`ncclDevSumPostDiv` split: floats scale
/// before summing so partial sums cannot overflow where the mean would not;
/// integers cannot represent `1/nRanks`, so they divide once at the end. The
/// float scale is computed exactly as NCCL's `hostToDevRedOp` does
/// (`__float2half(float(1.0/nRanks))` for `f16`, likewise for bf16 and fp8;
/// `float(1.0/nRanks)` for `f32`; `1.0/nRanks` for `f64`), so host results
/// match NCCL's bit for bit when the fold order is the same.
///
/// All methods take byte slices of `dtype` elements (any alignment). The
/// destination must have the same length as every input and be a whole
/// number of elements; otherwise the call fails with [`KernelError`] and
/// writes nothing. The destination cannot alias an input (Rust's borrow rules
/// enforce it); use the `_in_place` forms to accumulate into a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduction {
    dtype: DataType,
    op: RedOp,
    n_ranks: u32,
    kind: Kind,
    elem_size: usize,
}

impl Reduction {
    /// Validates `dtype`, `op` and `n_ranks` (at least 1) and builds the
    /// device-level op. `n_ranks` only matters for `ncclAvg`.
    pub fn new(dtype: DataType, op: RedOp, n_ranks: u32) -> Result<Self, KernelError> {
        let elem_size = dtype.size().ok_or(KernelError::UnknownDataType(dtype))?;
        let premul = avg_is_premul(dtype).ok_or(KernelError::UnknownDataType(dtype))?;
        if n_ranks == 0 {
            return Err(KernelError::ZeroRanks);
        }
        let kind = match op {
            RedOp::SUM => Kind::Sum,
            RedOp::PROD => Kind::Prod,
            RedOp::MIN => Kind::Min,
            RedOp::MAX => Kind::Max,
            RedOp::AVG if premul => Kind::PreMulSum,
            RedOp::AVG => Kind::SumPostDiv,
            other => return Err(KernelError::UnknownRedOp(other)),
        };
        Ok(Self {
            dtype,
            op,
            n_ranks,
            kind,
            elem_size,
        })
    }

    /// The data type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The NCCL op.
    pub fn op(&self) -> RedOp {
        self.op
    }

    /// The number of ranks the average divides by.
    pub fn n_ranks(&self) -> u32 {
        self.n_ranks
    }

    /// Bytes per element.
    pub fn elem_size(&self) -> usize {
        self.elem_size
    }

    /// Whether the pre-op is not the identity (avg on a float type). When it
    /// is the identity a rank may send its input buffer as is.
    pub fn has_pre_op(&self) -> bool {
        self.kind == Kind::PreMulSum
    }

    /// Whether the post-op is not the identity (avg on an integer type).
    pub fn has_post_op(&self) -> bool {
        self.kind == Kind::SumPostDiv
    }

    /// This reduction run by the loops of `level`.
    pub(crate) fn at(&self, level: Level) -> At<'_> {
        At {
            red: self,
            exec: Exec {
                level,
                kind: self.kind,
                n_ranks: self.n_ranks,
            },
        }
    }

    /// `dst = a ⊕ b`: one binary step on data that already went through its
    /// pre-op (two received chunks, or a received chunk and a partial sum).
    pub fn reduce(&self, dst: &mut [u8], a: &[u8], b: &[u8]) -> Result<(), KernelError> {
        self.at(host::level()).reduce(dst, a, b)
    }

    /// `acc = acc ⊕ b`.
    pub fn reduce_in_place(&self, acc: &mut [u8], b: &[u8]) -> Result<(), KernelError> {
        self.at(host::level()).reduce_in_place(acc, b)
    }

    /// `dst = recv ⊕ pre(local)`, and the post-op on top when `finish`: the
    /// ring step that adds this rank's own input (`local`, straight from the
    /// user's send buffer) to the chunk received from the previous rank.
    /// `finish` marks the step that completes the reduction (the last
    /// reduce-scatter step), where integer avg divides.
    pub fn reduce_local(
        &self,
        dst: &mut [u8],
        recv: &[u8],
        local: &[u8],
        finish: bool,
    ) -> Result<(), KernelError> {
        self.at(host::level())
            .reduce_local(dst, recv, local, finish)
    }

    /// `acc = acc ⊕ pre(local)` (post-op too when `finish`): as
    /// [`reduce_local`](Self::reduce_local) when the received chunk sits in a
    /// buffer that may be overwritten (e.g. it was received into the output).
    pub fn reduce_local_in_place(
        &self,
        acc: &mut [u8],
        local: &[u8],
        finish: bool,
    ) -> Result<(), KernelError> {
        self.at(host::level())
            .reduce_local_in_place(acc, local, finish)
    }

    /// `dst = pre(local) ⊕ peers[0] ⊕ peers[1] ⊕ …` (post-op too when
    /// `finish`), folded left to right element by element, rounding to the
    /// data type after every ⊕ as NCCL does: the tree step that combines this
    /// rank's input with its children's partial results. `local` is `None`
    /// when this rank's input is already folded in. Each input is read once;
    /// more than two inputs are folded in L1-sized blocks.
    pub fn reduce_many(
        &self,
        dst: &mut [u8],
        local: Option<&[u8]>,
        peers: &[&[u8]],
        finish: bool,
    ) -> Result<(), KernelError> {
        self.at(host::level())
            .reduce_many(dst, local, peers, finish)
    }

    /// `dst = pre(src)`: the first step, where a rank's own input enters the
    /// reduction (a copy unless [`has_pre_op`](Self::has_pre_op)).
    pub fn pre_op(&self, dst: &mut [u8], src: &[u8]) -> Result<(), KernelError> {
        self.at(host::level()).pre_op(dst, src)
    }

    /// `buf = pre(buf)` (nothing unless [`has_pre_op`](Self::has_pre_op)).
    pub fn pre_op_in_place(&self, buf: &mut [u8]) -> Result<(), KernelError> {
        self.at(host::level()).pre_op_in_place(buf)
    }

    /// `dst = post(src)`: completes a reduction whose last step ran without
    /// `finish` (a copy unless [`has_post_op`](Self::has_post_op)).
    pub fn post_op(&self, dst: &mut [u8], src: &[u8]) -> Result<(), KernelError> {
        self.at(host::level()).post_op(dst, src)
    }

    /// `buf = post(buf)` (nothing unless [`has_post_op`](Self::has_post_op)).
    pub fn post_op_in_place(&self, buf: &mut [u8]) -> Result<(), KernelError> {
        self.at(host::level()).post_op_in_place(buf)
    }
}

/// A [`Reduction`] bound to one loop level: the implementations behind the
/// public methods (tests run them at every level).
pub(crate) struct At<'r> {
    red: &'r Reduction,
    exec: Exec,
}

impl At<'_> {
    /// `dst` must be whole elements; every input as long as `dst`.
    fn check(&self, dst: usize, inputs: &[(&'static str, usize)]) -> Result<(), KernelError> {
        if dst % self.red.elem_size != 0 {
            return Err(KernelError::PartialElement {
                dtype: self.red.dtype,
                len: dst,
            });
        }
        for &(input, actual) in inputs {
            if actual != dst {
                return Err(KernelError::LengthMismatch {
                    input,
                    peer: None,
                    expected: dst,
                    actual,
                });
            }
        }
        Ok(())
    }

    pub(crate) fn reduce(&self, dst: &mut [u8], a: &[u8], b: &[u8]) -> Result<(), KernelError> {
        self.check(dst.len(), &[("a", a.len()), ("b", b.len())])?;
        let exec = self.exec;
        by_type!(self.red.dtype, T => exec.binary::<T>(dst, a, b, false, false));
        Ok(())
    }

    pub(crate) fn reduce_in_place(&self, acc: &mut [u8], b: &[u8]) -> Result<(), KernelError> {
        self.check(acc.len(), &[("b", b.len())])?;
        let exec = self.exec;
        by_type!(self.red.dtype, T => exec.binary_in_place::<T>(acc, b, false, false));
        Ok(())
    }

    pub(crate) fn reduce_local(
        &self,
        dst: &mut [u8],
        recv: &[u8],
        local: &[u8],
        finish: bool,
    ) -> Result<(), KernelError> {
        self.check(dst.len(), &[("recv", recv.len()), ("local", local.len())])?;
        let exec = self.exec;
        by_type!(self.red.dtype, T => exec.binary::<T>(dst, recv, local, true, finish));
        Ok(())
    }

    pub(crate) fn reduce_local_in_place(
        &self,
        acc: &mut [u8],
        local: &[u8],
        finish: bool,
    ) -> Result<(), KernelError> {
        self.check(acc.len(), &[("local", local.len())])?;
        let exec = self.exec;
        by_type!(self.red.dtype, T => exec.binary_in_place::<T>(acc, local, true, finish));
        Ok(())
    }

    pub(crate) fn reduce_many(
        &self,
        dst: &mut [u8],
        local: Option<&[u8]>,
        peers: &[&[u8]],
        finish: bool,
    ) -> Result<(), KernelError> {
        if local.is_none() && peers.is_empty() {
            return Err(KernelError::NoInputs);
        }
        self.check(
            dst.len(),
            &[("local", local.map_or(dst.len(), <[u8]>::len))],
        )?;
        for (i, p) in peers.iter().enumerate() {
            if p.len() != dst.len() {
                return Err(KernelError::LengthMismatch {
                    input: "peers",
                    peer: Some(i),
                    expected: dst.len(),
                    actual: p.len(),
                });
            }
        }
        let exec = self.exec;
        by_type!(self.red.dtype, T => exec.many::<T>(dst, local, peers, finish));
        Ok(())
    }

    pub(crate) fn pre_op(&self, dst: &mut [u8], src: &[u8]) -> Result<(), KernelError> {
        self.check(dst.len(), &[("src", src.len())])?;
        let exec = self.exec;
        by_type!(self.red.dtype, T => exec.pre::<T>(dst, src));
        Ok(())
    }

    pub(crate) fn pre_op_in_place(&self, buf: &mut [u8]) -> Result<(), KernelError> {
        self.check(buf.len(), &[])?;
        let exec = self.exec;
        by_type!(self.red.dtype, T => exec.pre_in_place::<T>(buf));
        Ok(())
    }

    pub(crate) fn post_op(&self, dst: &mut [u8], src: &[u8]) -> Result<(), KernelError> {
        self.check(dst.len(), &[("src", src.len())])?;
        let exec = self.exec;
        by_type!(self.red.dtype, T => exec.post::<T>(dst, src));
        Ok(())
    }

    pub(crate) fn post_op_in_place(&self, buf: &mut [u8]) -> Result<(), KernelError> {
        self.check(buf.len(), &[])?;
        let exec = self.exec;
        by_type!(self.red.dtype, T => exec.post_in_place::<T>(buf));
        Ok(())
    }
}

/// `dst = src` (a `memcpy`): the copy kernel, for every data type.
pub fn copy(dst: &mut [u8], src: &[u8]) -> Result<(), KernelError> {
    if dst.len() != src.len() {
        return Err(KernelError::LengthMismatch {
            input: "src",
            peer: None,
            expected: dst.len(),
            actual: src.len(),
        });
    }
    copy_prefix(dst, src);
    Ok(())
}
