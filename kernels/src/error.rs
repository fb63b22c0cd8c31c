//! [`KernelError`]: why a kernel refused its arguments.
//!
//! Kernels validate everything before touching memory and never panic: a bad
//! argument is an error naming the problem, and the destination is left
//! untouched.

use std::fmt;

use cclkit_abi::raw::common::{DataType, RedOp};

/// A kernel call with arguments it cannot honour. Nothing was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelError {
    /// `ncclDataType_t` value outside NCCL's twelve types.
    UnknownDataType(DataType),
    /// `ncclRedOp_t` value outside sum/prod/max/min/avg (user-created ops are
    /// not kernels of this crate).
    UnknownRedOp(RedOp),
    /// An input is not as long as the destination.
    LengthMismatch {
        /// The input's parameter name (`"a"`, `"b"`, `"recv"`, `"local"`,
        /// `"src"` or `"peers"`).
        input: &'static str,
        /// Its index when `input` is `"peers"`.
        peer: Option<usize>,
        /// Destination length in bytes.
        expected: usize,
        /// The input's length in bytes.
        actual: usize,
    },
    /// A byte length that is not a whole number of elements.
    PartialElement {
        /// The data type.
        dtype: DataType,
        /// The length in bytes.
        len: usize,
    },
    /// `ncclAvg` (and every [`crate::Reduction`]) needs at least one rank.
    ZeroRanks,
    /// A multi-input reduction was given no input at all.
    NoInputs,
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            KernelError::UnknownDataType(dtype) => {
                write!(
                    f,
                    "unknown ncclDataType_t {} (valid: 0..{})",
                    dtype.0,
                    DataType::COUNT
                )
            }
            KernelError::UnknownRedOp(op) => write!(
                f,
                "unsupported ncclRedOp_t {} (valid: 0..{}; user-created ops have no host kernel)",
                op.0,
                RedOp::COUNT
            ),
            KernelError::LengthMismatch {
                input,
                peer,
                expected,
                actual,
            } => match peer {
                Some(i) => write!(
                    f,
                    "length mismatch: {input}[{i}] has {actual} bytes, dst has {expected}"
                ),
                None => write!(
                    f,
                    "length mismatch: {input} has {actual} bytes, dst has {expected}"
                ),
            },
            KernelError::PartialElement { dtype, len } => write!(
                f,
                "{len} bytes is not a whole number of {dtype:?} elements ({} bytes each)",
                dtype.size().unwrap_or(0)
            ),
            KernelError::ZeroRanks => {
                f.write_str("a reduction needs at least one rank (nRanks = 0)")
            }
            KernelError::NoInputs => {
                f.write_str("a multi-input reduction needs at least one input")
            }
        }
    }
}

impl std::error::Error for KernelError {}

impl From<KernelError> for cclkit_abi::Error {
    /// Unknown types/ops and `nRanks = 0` are `ncclInvalidArgument`; buffer
    /// shape problems are `ncclInvalidUsage` (a valid call with mismatched
    /// sizes).
    fn from(err: KernelError) -> Self {
        match err {
            KernelError::UnknownDataType(_)
            | KernelError::UnknownRedOp(_)
            | KernelError::ZeroRanks => cclkit_abi::Error::invalid_argument(err.to_string()),
            KernelError::LengthMismatch { .. }
            | KernelError::PartialElement { .. }
            | KernelError::NoInputs => cclkit_abi::Error::invalid_usage(err.to_string()),
        }
    }
}
