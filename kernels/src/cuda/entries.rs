//! The kernels' entry points as the Rust side knows them: names, parameter
//! shapes, the argument a reduction passes, and the launch geometry. Must match
//! `kernels/cuda/cclkit_loops.h` (a test checks every name and parameter list
//! against the committed PTX).

use std::ffi::CString;
use std::sync::OnceLock;

use cclkit_abi::raw::common::DataType;

use super::CudaError;
use crate::element::sealed::Sealed;
use crate::error::KernelError;
use crate::float::{Bf16, F16, Fp8E4M3, Fp8E5M2};

/// The committed sm_80 PTX (`make ptx`, clang-14), NUL-terminated for
/// `cuModuleLoadData`; the driver JIT-compiles it forward for any later GPU.
pub const PTX: &str = concat!(include_str!("../../cuda/cclkit_kernels.ptx"), "\0");

/// The committed sm_90 PTX (`make ptx`, clang-16): the same kernels, with the
/// hardware's fp8 conversions. Loaded on compute capability 9.0 and later.
pub const PTX_SM90: &str = concat!(include_str!("../../cuda/cclkit_kernels_sm90.ptx"), "\0");

/// Forces one PTX (`sm_80` or `sm_90`) instead of the choice by compute
/// capability; `gpu-check.sh` runs the kernel test under both on a Hopper GPU.
pub const PTX_ENV: &str = "CCLKIT_CUDA_PTX";

/// The PTX for a GPU of compute capability `cc`, and its name: sm_90 from 9.0
/// on, else sm_80; `forced` (the value of [`PTX_ENV`]) overrides that.
///
/// # Errors
/// A `forced` value other than `sm_80`/`sm_90`, or `sm_90` on an older GPU.
pub fn ptx_for(
    cc: (i32, i32),
    forced: Option<&str>,
) -> Result<(&'static str, &'static str), CudaError> {
    let hopper = cc >= (9, 0);
    match forced.map(str::trim) {
        None | Some("") if hopper => Ok((PTX_SM90, "sm_90")),
        None | Some("") | Some("sm_80") => Ok((PTX, "sm_80")),
        Some("sm_90") if hopper => Ok((PTX_SM90, "sm_90")),
        Some(v) => Err(CudaError::Unsupported(format!(
            "{PTX_ENV}={v:?}: expected sm_80 or sm_90 (sm_90 needs compute capability \
             9.0 or later; this GPU has {}.{})",
            cc.0, cc.1
        ))),
    }
}

/// The PTX [`CudaDevice::open`](super::CudaDevice::open) loads for a GPU of
/// compute capability `cc`: [`ptx_for`] with [`PTX_ENV`] read from the environment.
///
/// # Errors
/// As [`ptx_for`].
pub fn ptx_loaded_for(cc: (i32, i32)) -> Result<(&'static str, &'static str), CudaError> {
    ptx_for(cc, std::env::var(PTX_ENV).ok().as_deref())
}

/// Threads per block of every launch.
pub const BLOCK_THREADS: u32 = 256;

/// The device-level ops the kernels implement (NCCL's `ncclDevRedOp_t`, plus
/// the avg pre-/post-ops as their own kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DevOp {
    /// `dst = a + b`.
    Sum,
    /// `dst = a * b`.
    Prod,
    /// `dst = min(a, b)`.
    Min,
    /// `dst = max(a, b)`.
    Max,
    /// `dst = a + premul(b)`: ncclAvg on floats, `b` is a rank's own input.
    PreMulSum,
    /// `dst = (a + b) / n`: ncclAvg on integers, the completing step.
    SumPostDiv,
    /// `dst = premul(src)` (unary).
    PreMul,
    /// `dst = src / n` (unary).
    PostDiv,
}

impl DevOp {
    const ALL: [DevOp; 8] = [
        DevOp::Sum,
        DevOp::Prod,
        DevOp::Min,
        DevOp::Max,
        DevOp::PreMulSum,
        DevOp::SumPostDiv,
        DevOp::PreMul,
        DevOp::PostDiv,
    ];

    fn name(self) -> &'static str {
        match self {
            DevOp::Sum => "sum",
            DevOp::Prod => "prod",
            DevOp::Min => "min",
            DevOp::Max => "max",
            DevOp::PreMulSum => "premulsum",
            DevOp::SumPostDiv => "sumpostdiv",
            DevOp::PreMul => "premul",
            DevOp::PostDiv => "postdiv",
        }
    }

    /// Unary kernels take `(dst, src, n, arg)`; binary `(dst, a, b, n, arg)`.
    pub(crate) fn is_unary(self) -> bool {
        matches!(self, DevOp::PreMul | DevOp::PostDiv)
    }

    /// Whether a kernel exists for this op on floats / on integers.
    fn applies_to(self, float: bool) -> bool {
        match self {
            DevOp::PreMulSum | DevOp::PreMul => float,
            DevOp::SumPostDiv | DevOp::PostDiv => !float,
            _ => true,
        }
    }
}

/// NCCL's twelve types in `ncclDataType_t` order, with the kernels' names.
const TYPES: [(DataType, &str, bool); 12] = [
    (DataType::INT8, "i8", false),
    (DataType::UINT8, "u8", false),
    (DataType::INT32, "i32", false),
    (DataType::UINT32, "u32", false),
    (DataType::INT64, "i64", false),
    (DataType::UINT64, "u64", false),
    (DataType::FLOAT16, "f16", true),
    (DataType::FLOAT32, "f32", true),
    (DataType::FLOAT64, "f64", true),
    (DataType::BFLOAT16, "bf16", true),
    (DataType::FLOAT8E4M3, "e4m3", true),
    (DataType::FLOAT8E5M2, "e5m2", true),
];

/// Slot of the copy kernel in the entry table.
pub(crate) const COPY: usize = DevOp::ALL.len() * TYPES.len();
/// Size of the entry table (some slots are empty: no such kernel).
pub(crate) const SLOTS: usize = COPY + 1;

/// The table slot of `op` on `dtype`, if that kernel exists.
pub(crate) fn slot(op: DevOp, dtype: DataType) -> Result<usize, CudaError> {
    let t = TYPES
        .iter()
        .position(|(d, _, _)| *d == dtype)
        .ok_or(KernelError::UnknownDataType(dtype))?;
    let o = DevOp::ALL.iter().position(|x| *x == op).unwrap_or(0);
    if !op.applies_to(TYPES[t].2) {
        // Reduction never asks for these (avg is premul on floats, postdiv on
        // integers), so this is a caller bug worth a clear message.
        return Err(CudaError::Unsupported(format!(
            "no {} kernel for {dtype:?}",
            op.name()
        )));
    }
    Ok(o * TYPES.len() + t)
}

/// Every slot's entry name (`None` = no kernel), as C strings for the driver.
pub(crate) fn table() -> &'static [Option<CString>] {
    static TABLE: OnceLock<Vec<Option<CString>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut v = Vec::with_capacity(SLOTS);
        for op in DevOp::ALL {
            for (_, name, float) in TYPES {
                v.push(
                    op.applies_to(float)
                        .then(|| CString::new(format!("cclkit_{}_{name}", op.name())).ok())
                        .flatten(),
                );
            }
        }
        v.push(CString::new("cclkit_copy").ok());
        v
    })
}

/// Every entry point the PTX must export, with its parameter count (binary
/// kernels 5, unary 4, copy 3; all 64-bit).
pub fn entry_names() -> Vec<(String, usize)> {
    let mut v = Vec::with_capacity(SLOTS);
    for op in DevOp::ALL {
        for (_, name, float) in TYPES {
            if op.applies_to(float) {
                let params = if op.is_unary() { 4 } else { 5 };
                v.push((format!("cclkit_{}_{name}", op.name()), params));
            }
        }
    }
    v.push(("cclkit_copy".to_owned(), 3));
    v
}

/// The bits of the ncclAvg multiplier for `n_ranks` as a `dtype` value, exactly
/// as the host kernels compute it (NCCL's `hostToDevRedOp` rounding).
pub(crate) fn avg_scale_bits(dtype: DataType, n_ranks: u32) -> Result<u64, KernelError> {
    Ok(match dtype {
        DataType::FLOAT16 => u64::from(F16::avg_scale(n_ranks).to_bits()),
        DataType::FLOAT32 => u64::from(f32::avg_scale(n_ranks).to_bits()),
        DataType::FLOAT64 => f64::avg_scale(n_ranks).to_bits(),
        DataType::BFLOAT16 => u64::from(Bf16::avg_scale(n_ranks).to_bits()),
        DataType::FLOAT8E4M3 => u64::from(Fp8E4M3::avg_scale(n_ranks).to_bits()),
        DataType::FLOAT8E5M2 => u64::from(Fp8E5M2::avg_scale(n_ranks).to_bits()),
        other => return Err(KernelError::UnknownDataType(other)),
    })
}

/// Blocks for `bytes` of data: one 16-byte vector per thread per grid step,
/// at least one block, at most `max_blocks` (the grid strides over the rest).
pub(crate) fn grid_blocks(bytes: usize, max_blocks: u32) -> u32 {
    let vectors = bytes.div_ceil(16).max(1);
    let blocks = vectors.div_ceil(BLOCK_THREADS as usize);
    u32::try_from(blocks)
        .unwrap_or(u32::MAX)
        .clamp(1, max_blocks.max(1))
}
