//! The emulated device: the kernels' CUDA C++ source compiled for the host
//! (`kernels/cuda/emulator.cpp`, built by `build.rs`), run one emulated thread
//! after another on host memory. "Device memory" is 256-byte aligned host
//! memory, so a [`DevPtr`] is a host address.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ffi::{c_char, c_int, c_void};

use super::entries;
use super::{CudaError, DevPtr};

unsafe extern "C" {
    /// Runs entry `entry` as `threads` threads in total; 0 on success, -1 for
    /// an unknown entry. Parameters as for `cuLaunchKernel`.
    fn cclkit_emul_launch(entry: *const c_char, threads: u64, params: *mut *mut c_void) -> c_int;
}

/// Alignment of emulated allocations (cuMemAlloc gives at least 256).
const ALIGN: usize = 256;

/// The emulated device's state: how many threads a launch emulates at most.
#[derive(Debug)]
pub(crate) struct Emulator {
    pub(crate) max_threads: u64,
}

impl Emulator {
    /// Runs table slot `slot` as a grid of `blocks` blocks of
    /// [`entries::BLOCK_THREADS`], capped at `max_threads` threads (the loops
    /// stride, so any thread count gives the same result).
    ///
    /// # Safety
    /// As [`super::driver::Driver::launch`], with host addresses.
    pub(crate) unsafe fn launch(
        &self,
        slot: usize,
        blocks: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let name = entries::table()
            .get(slot)
            .and_then(Option::as_ref)
            .ok_or_else(|| CudaError::Unsupported(format!("no kernel in slot {slot}")))?;
        let threads = (u64::from(blocks) * u64::from(entries::BLOCK_THREADS))
            .min(self.max_threads)
            .max(1);
        // SAFETY: forwarded from the caller; the name is NUL-terminated.
        let rc = unsafe { cclkit_emul_launch(name.as_ptr(), threads, params.as_mut_ptr()) };
        if rc != 0 {
            return Err(CudaError::Unsupported(format!(
                "the emulator has no entry {name:?}"
            )));
        }
        Ok(())
    }

    /// Zeroed, 256-byte aligned host memory standing in for device memory.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<DevPtr, CudaError> {
        let layout = Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|e| CudaError::Unsupported(format!("allocation of {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        if p.is_null() {
            return Err(CudaError::Unsupported(format!(
                "out of host memory for {bytes} emulated device bytes"
            )));
        }
        Ok(DevPtr(p as u64))
    }

    /// Frees an allocation of `bytes` made by [`alloc`](Self::alloc).
    ///
    /// # Safety
    /// `p` came from `alloc(bytes)` and is freed once.
    pub(crate) unsafe fn free(&self, p: DevPtr, bytes: usize) {
        if let Ok(layout) = Layout::from_size_align(bytes.max(1), ALIGN) {
            // SAFETY: forwarded from the caller; same layout as the allocation.
            unsafe { dealloc(p.0 as *mut u8, layout) };
        }
    }

    /// A copy between host addresses (memmove: the ranges may overlap).
    ///
    /// # Safety
    /// Both ranges valid for `bytes`.
    pub(crate) unsafe fn memcpy(&self, dst: DevPtr, src: DevPtr, bytes: usize) {
        if bytes > 0 {
            // SAFETY: forwarded from the caller.
            unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, bytes) };
        }
    }
}
