//! CUDA device kernels (feature `cuda`): NCCL's reductions and copies on device
//! memory, for every data type × op, with the same semantics as the host
//! kernels (bit for bit, NaN payloads aside).
//!
//! # How it fits together
//! * The kernels are the project's own CUDA C++ (`kernels/cuda/*.cu`, `*.h`),
//!   compiled to PTX by `make ptx` (clang, no CUDA toolkit) and committed
//!   (`kernels/cuda/cclkit_kernels.ptx`, sm_80, JIT-compiled forward by the
//!   driver on newer GPUs). `make ptx-check` assembles it with NVIDIA's
//!   `ptxas` for sm_80 and sm_90.
//! * They are launched through the CUDA driver API (cudarc, loaded with dlopen
//!   on first use: nothing links against CUDA, so this feature builds and runs
//!   on machines without it). [`driver_present`] is checked before any driver
//!   call, because cudarc panics when the library is missing; every driver call
//!   is also wrapped in `catch_unwind` (a driver too old for a symbol makes
//!   cudarc panic). Failures are [`CudaError`]s with a clear message, never
//!   panics.
//! * [`CudaDevice::emulated`] runs the same kernel source compiled for the
//!   host CPU (`kernels/cuda/emulator.cpp`, built by `build.rs`), one emulated
//!   thread at a time, on host memory. Tests use it to check the device code
//!   against the host kernels without a GPU, and the runtime can use it to
//!   exercise its device path (`CCLKIT_CUDA_EMULATE=1`).
//!
//! # Quick start
//! ```no_run
//! # fn main() -> Result<(), cclkit_kernels::cuda::CudaError> {
//! use cclkit_kernels::cuda::CudaDevice;
//! use cclkit_kernels::{DataType, RedOp, Reduction};
//!
//! let dev = CudaDevice::open(0)?; // Err(NoDriver) without an NVIDIA driver
//! let stream = dev.stream()?;
//! let bytes = 1024 * 4;
//! let (a, b, mut dst) = (dev.alloc(bytes)?, dev.alloc(bytes)?, dev.alloc(bytes)?);
//! let sum = Reduction::new(DataType::FLOAT32, RedOp::SUM, 1)?;
//! stream.reduce(&sum, &mut dst, &a, &b)?;
//! stream.synchronize()?;
//! # Ok(()) }
//! ```
//!
//! # Threads
//! A [`CudaDevice`] may be shared between threads (it makes its context
//! current on the calling thread before each driver call). A [`Stream`]
//! orders the work submitted through it; use one per thread.

use std::fmt;

use crate::error::KernelError;

mod device;
mod driver;
mod emul;
mod entries;
mod ops;
#[cfg(test)]
mod tests;

pub use device::{CudaDevice, DeviceBuffer, DeviceInfo, Dmabuf, HostBuffer, ManagedBuffer, Stream};
pub use driver::{driver_present, driver_version};
pub use entries::{BLOCK_THREADS, PTX, PTX_ENV, PTX_SM90, entry_names, ptx_for, ptx_loaded_for};

/// An address in the device's unified address space: device memory, or
/// mapped pinned host memory (and, on the emulated device, host memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevPtr(pub u64);

impl DevPtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevPtr {
        DevPtr(self.0.wrapping_add(bytes as u64))
    }
}

/// Why a CUDA call failed. Nothing in this module panics; every failure is
/// one of these.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// The CUDA driver library could not be loaded (no NVIDIA driver here).
    NoDriver,
    /// A driver call returned an error.
    Driver {
        /// The driver function (`cuInit`, `cuLaunchKernel`, …).
        call: &'static str,
        /// Its `CUresult` value.
        code: i32,
        /// `cuGetErrorName`/`cuGetErrorString` text.
        message: String,
    },
    /// cudarc panicked inside a driver call (typically: the driver lacks a
    /// symbol of the CUDA 12.8 API cudarc was built for).
    Panicked {
        /// The operation.
        call: &'static str,
        /// The panic message.
        message: String,
    },
    /// No device with that ordinal.
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// The arguments of a kernel call are wrong (types, ops, lengths).
    Kernel(KernelError),
    /// A pointer is not aligned to its element size (device loads need it).
    Misaligned {
        /// Which argument.
        what: &'static str,
        /// Its address.
        addr: u64,
        /// The alignment it needs.
        align: usize,
    },
    /// The device or this build cannot do what was asked.
    Unsupported(String),
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::NoDriver => f.write_str(
                "no CUDA driver: libcuda.so.1 not found (dlopen of libcuda.so and libcuda.so.1 \
                 failed); install the NVIDIA driver or add its directory to LD_LIBRARY_PATH",
            ),
            CudaError::Driver {
                call,
                code,
                message,
            } => write!(f, "{call} failed: {message} (CUresult {code})"),
            CudaError::Panicked { call, message } => write!(
                f,
                "{call}: the CUDA driver could not be used ({message}); a driver older than \
                 CUDA 12.8 may lack the entry point"
            ),
            CudaError::NoDevice { ordinal, count } => {
                write!(f, "no CUDA device {ordinal}: {count} device(s) present")
            }
            CudaError::Kernel(e) => write!(f, "{e}"),
            CudaError::Misaligned { what, addr, align } => write!(
                f,
                "{what} at {addr:#x} is not aligned to its {align}-byte elements"
            ),
            CudaError::Unsupported(what) => write!(f, "unsupported: {what}"),
        }
    }
}

impl std::error::Error for CudaError {}

impl From<KernelError> for CudaError {
    fn from(e: KernelError) -> Self {
        CudaError::Kernel(e)
    }
}

impl From<CudaError> for cclkit_abi::Error {
    /// Argument problems keep their codes (see [`KernelError`]); misaligned
    /// pointers are `ncclInvalidArgument`; unsupported requests
    /// `ncclInvalidUsage`; everything the driver reports is
    /// `ncclUnhandledCudaError`, as NCCL reports CUDA failures.
    fn from(e: CudaError) -> Self {
        use cclkit_abi::raw::common::NcclResult;
        match e {
            CudaError::Kernel(k) => k.into(),
            CudaError::Misaligned { .. } => cclkit_abi::Error::invalid_argument(e.to_string()),
            CudaError::Unsupported(_) => cclkit_abi::Error::invalid_usage(e.to_string()),
            _ => cclkit_abi::Error::new(NcclResult::UNHANDLED_CUDA_ERROR, e.to_string()),
        }
    }
}
