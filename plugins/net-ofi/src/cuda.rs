//! The one CUDA call this plugin needs: which device a pointer lives on
//! (`fi_mr_attr.device.cuda` for `FI_HMEM` registrations). `libcuda.so.1` is
//! opened at `init` only when the provider offers `FI_HMEM`; without it the
//! plugin reports host memory only.

use std::ffi::{c_int, c_void};

use cclkit_abi::{Error, Result};

/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
const DEVICE_ORDINAL: c_int = 9;

type GetAttr = unsafe extern "C" fn(data: *mut c_void, attribute: c_int, ptr: u64) -> c_int;

/// The CUDA driver, opened with `dlopen`.
pub struct Cuda {
    lib: *mut c_void,
    get_attr: GetAttr,
}

// SAFETY: the handle is only passed to dlclose once (Drop); the driver API is
// thread-safe.
unsafe impl Send for Cuda {}
// SAFETY: as above; `&self` methods only call the thread-safe driver.
unsafe impl Sync for Cuda {}

impl Cuda {
    /// Opens the driver, `None` when it is not installed.
    pub fn load() -> Option<Self> {
        // SAFETY: plain dlopen/dlsym with NUL-terminated names.
        unsafe {
            let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            if lib.is_null() {
                return None;
            }
            let sym = libc::dlsym(lib, c"cuPointerGetAttribute".as_ptr());
            if sym.is_null() {
                libc::dlclose(lib);
                return None;
            }
            Some(Self {
                lib,
                get_attr: std::mem::transmute::<*mut c_void, GetAttr>(sym),
            })
        }
    }

    /// The ordinal of the device holding `addr`.
    pub fn device_of(&self, addr: usize) -> Result<i32> {
        let mut ordinal: c_int = -1;
        // SAFETY: cuPointerGetAttribute writes one int for this attribute.
        let rc = unsafe {
            (self.get_attr)(
                (&mut ordinal as *mut c_int).cast(),
                DEVICE_ORDINAL,
                addr as u64,
            )
        };
        if rc != 0 || ordinal < 0 {
            return Err(Error::new(
                cclkit_abi::raw::common::NcclResult::UNHANDLED_CUDA_ERROR,
                format!(
                    "NET/OFI: cuPointerGetAttribute(DEVICE_ORDINAL, {addr:#x}) failed with CUresult {rc}"
                ),
            ));
        }
        Ok(ordinal)
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: opened by dlopen in `load`, closed once.
        unsafe { libc::dlclose(self.lib) };
    }
}
