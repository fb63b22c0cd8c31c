//! The CUDA driver, reached through cudarc's dynamically loaded bindings.
//!
//! Every call goes through [`call`], which first checks that the driver
//! library can be loaded (cudarc panics on every call otherwise) and contains
//! any panic cudarc raises (a missing symbol on an old driver), turning both
//! into [`CudaError`]s.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUresult};

use super::device::DeviceInfo;
use super::entries::{self, BLOCK_THREADS};
use super::{CudaError, DevPtr};

/// Whether the CUDA driver library (`libcuda.so.1`) can be loaded here.
/// Checked once per process.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the candidate library names; loading the
    // NVIDIA driver library runs no code of ours.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Runs `f` (driver calls) only if the driver is present, with panics turned
/// into [`CudaError::Panicked`].
pub(crate) fn call<T>(
    name: &'static str,
    f: impl FnOnce() -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let message = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panic without a message".to_owned());
            Err(CudaError::Panicked {
                call: name,
                message,
            })
        }
    }
}

/// A `CUresult` as a [`CudaError`] naming the call.
pub(crate) fn check(call: &'static str, r: CUresult) -> Result<(), CudaError> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const c_char = std::ptr::null();
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: out-pointers to locals; the driver returns static strings.
    let (rn, rt) = unsafe {
        (
            sys::cuGetErrorName(r, &mut name),
            sys::cuGetErrorString(r, &mut text),
        )
    };
    let cstr = |ok: CUresult, p: *const c_char| {
        if ok == CUresult::CUDA_SUCCESS && !p.is_null() {
            // SAFETY: a NUL-terminated static string from the driver.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        } else {
            None
        }
    };
    let message = match (cstr(rn, name), cstr(rt, text)) {
        (Some(n), Some(t)) => format!("{n}: {t}"),
        (Some(n), None) => n,
        _ => "unknown error".to_owned(),
    };
    Err(CudaError::Driver {
        call,
        code: r as i32,
        message,
    })
}

/// `cuInit(0)`, once per process (its result is remembered).
fn init() -> Result<(), CudaError> {
    static INIT: OnceLock<Result<(), CudaError>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: cuInit has no preconditions.
        call("cuInit", || check("cuInit", unsafe { sys::cuInit(0) }))
    })
    .clone()
}

/// The driver's CUDA version (e.g. 12080 for 12.8).
///
/// # Errors
/// [`CudaError::NoDriver`] without a driver; the driver's error otherwise.
pub fn driver_version() -> Result<i32, CudaError> {
    call("cuDriverGetVersion", || {
        let mut v: c_int = 0;
        // SAFETY: out-pointer to a local.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut v)
        })?;
        Ok(v)
    })
}

/// Number of CUDA devices.
pub(crate) fn device_count() -> Result<usize, CudaError> {
    init()?;
    call("cuDeviceGetCount", || {
        let mut n: c_int = 0;
        // SAFETY: out-pointer to a local; the driver is initialised.
        check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
        Ok(usize::try_from(n).unwrap_or(0))
    })
}

/// One device's primary context, with the kernels' module loaded.
pub(crate) struct Driver {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    module: sys::CUmodule,
    /// Functions by entry-table slot (`None`: no such kernel).
    functions: Vec<Option<sys::CUfunction>>,
    /// Largest grid used (the kernels stride over the rest).
    pub(crate) max_blocks: u32,
    pub(crate) info: DeviceInfo,
}

// SAFETY: the handles are process-wide driver objects; every method makes the
// context current on the calling thread before using them, which is how the
// driver API is meant to be used from several threads.
unsafe impl Send for Driver {}
// SAFETY: as above; no method mutates the struct.
unsafe impl Sync for Driver {}

fn attribute(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32, CudaError> {
    let mut v: c_int = 0;
    // SAFETY: out-pointer to a local; `dev` came from cuDeviceGet.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, a, dev)
    })?;
    Ok(v)
}

fn c_buf_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl Driver {
    /// What device `ordinal` is, without creating a context.
    pub(crate) fn query(ordinal: usize) -> Result<(sys::CUdevice, DeviceInfo), CudaError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        call("query device", || {
            use sys::CUdevice_attribute as A;
            let mut dev: sys::CUdevice = 0;
            let ord = c_int::try_from(ordinal).unwrap_or(c_int::MAX);
            // SAFETY: out-pointer to a local; ordinal < count.
            check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ord) })?;
            let mut name = [0u8; 256];
            // SAFETY: the buffer holds 256 bytes, as passed.
            check("cuDeviceGetName", unsafe {
                sys::cuDeviceGetName(name.as_mut_ptr().cast(), 256, dev)
            })?;
            let mut bus = [0u8; 64];
            // SAFETY: the buffer holds 64 bytes, as passed.
            check("cuDeviceGetPCIBusId", unsafe {
                sys::cuDeviceGetPCIBusId(bus.as_mut_ptr().cast(), 64, dev)
            })?;
            let mut total: usize = 0;
            // SAFETY: out-pointer to a local.
            check("cuDeviceTotalMem", unsafe {
                sys::cuDeviceTotalMem_v2(&mut total, dev)
            })?;
            let sm_count = attribute(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let info = DeviceInfo {
                ordinal,
                name: c_buf_string(&name),
                pci_bus_id: Some(c_buf_string(&bus).to_ascii_lowercase()),
                compute_capability: (
                    attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                    attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
                ),
                sm_count: u32::try_from(sm_count).unwrap_or(1),
                total_mem: total,
                dmabuf_supported: attribute(dev, A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
                    .is_ok_and(|v| v != 0),
                emulated: false,
            };
            Ok((dev, info))
        })
    }

    /// Retains device `ordinal`'s primary context and loads the PTX module.
    pub(crate) fn open(ordinal: usize) -> Result<Self, CudaError> {
        let (dev, info) = Self::query(ordinal)?;
        let sm_count = info.sm_count;
        let (ptx, _) = entries::ptx_loaded_for(info.compute_capability)?;
        call("open device", || {
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; `dev` is valid.
            check("cuDevicePrimaryCtxRetain", unsafe {
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
            })?;
            let mut drv = Driver {
                dev,
                ctx,
                module: std::ptr::null_mut(),
                functions: Vec::new(),
                // Enough blocks to fill every SM several times over; the
                // kernels stride beyond that.
                max_blocks: sm_count.max(1).saturating_mul(16),
                info,
            };
            drv.bind()?;
            let mut module: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: PTX is NUL-terminated text; the context is current.
            check("cuModuleLoadData", unsafe {
                sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast())
            })?;
            drv.module = module;
            for name in entries::table() {
                let f = match name {
                    Some(n) => {
                        let mut f: sys::CUfunction = std::ptr::null_mut();
                        // SAFETY: the module is loaded; `n` is NUL-terminated.
                        check("cuModuleGetFunction", unsafe {
                            sys::cuModuleGetFunction(&mut f, module, n.as_ptr())
                        })?;
                        Some(f)
                    }
                    None => None,
                };
                drv.functions.push(f);
            }
            Ok(drv)
        })
    }

    /// Makes the context current on this thread.
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        call("cuCtxSetCurrent", || {
            // SAFETY: the context is retained until drop.
            check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
        })
    }

    /// Runs `f` with the context current, panics contained.
    pub(crate) fn with<T>(
        &self,
        name: &'static str,
        f: impl FnOnce() -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        call(name, || {
            // SAFETY: the context is retained until drop.
            check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })?;
            f()
        })
    }

    /// Launches table slot `slot` with `blocks` blocks on `stream`.
    ///
    /// # Safety
    /// `params` point to values of the kernel's parameter types; the memory
    /// they address stays valid until the stream has run the kernel.
    pub(crate) unsafe fn launch(
        &self,
        slot: usize,
        blocks: u32,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let f = self
            .functions
            .get(slot)
            .copied()
            .flatten()
            .ok_or_else(|| CudaError::Unsupported(format!("no kernel in slot {slot}")))?;
        self.with("cuLaunchKernel", || {
            // SAFETY: forwarded from the caller; `f` belongs to the loaded module.
            check("cuLaunchKernel", unsafe {
                sys::cuLaunchKernel(
                    f,
                    blocks as c_uint,
                    1,
                    1,
                    BLOCK_THREADS,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })
        })
    }

    /// `cuMemAlloc`.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<DevPtr, CudaError> {
        self.with("cuMemAlloc", || {
            let mut p: sys::CUdeviceptr = 0;
            // SAFETY: out-pointer to a local.
            check("cuMemAlloc", unsafe {
                sys::cuMemAlloc_v2(&mut p, bytes.max(1))
            })?;
            Ok(DevPtr(p))
        })
    }

    /// `cuMemFree`.
    pub(crate) fn free(&self, p: DevPtr) -> Result<(), CudaError> {
        self.with("cuMemFree", || {
            // SAFETY: `p` came from `alloc` on this context and is freed once.
            check("cuMemFree", unsafe { sys::cuMemFree_v2(p.0) })
        })
    }

    /// `cuMemAllocManaged(ATTACH_GLOBAL)`: memory both the host and the device
    /// address (pages migrate on use).
    pub(crate) fn alloc_managed(&self, bytes: usize) -> Result<DevPtr, CudaError> {
        self.with("cuMemAllocManaged", || {
            let mut p: sys::CUdeviceptr = 0;
            let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as c_uint;
            // SAFETY: out-pointer to a local.
            check("cuMemAllocManaged", unsafe {
                sys::cuMemAllocManaged(&mut p, bytes.max(1), flags)
            })?;
            Ok(DevPtr(p))
        })
    }

    /// `cuMemHostAlloc(PORTABLE | DEVICEMAP)`: pinned host memory the device
    /// reads and writes directly (NCCL's host FIFO buffers without GDR).
    pub(crate) fn alloc_host(&self, bytes: usize) -> Result<(*mut u8, DevPtr), CudaError> {
        self.with("cuMemHostAlloc", || {
            let mut h: *mut c_void = std::ptr::null_mut();
            let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
            // SAFETY: out-pointer to a local.
            check("cuMemHostAlloc", unsafe {
                sys::cuMemHostAlloc(&mut h, bytes.max(1), flags)
            })?;
            let mut d: sys::CUdeviceptr = 0;
            // SAFETY: `h` is a mapped allocation of this context.
            let r = check("cuMemHostGetDevicePointer", unsafe {
                sys::cuMemHostGetDevicePointer_v2(&mut d, h, 0)
            });
            if let Err(e) = r {
                // SAFETY: `h` was just allocated and is not used elsewhere.
                let _ = unsafe { sys::cuMemFreeHost(h) };
                return Err(e);
            }
            Ok((h.cast(), DevPtr(d)))
        })
    }

    /// `cuMemFreeHost`.
    pub(crate) fn free_host(&self, h: *mut u8) -> Result<(), CudaError> {
        self.with("cuMemFreeHost", || {
            // SAFETY: `h` came from `alloc_host` and is freed once.
            check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(h.cast()) })
        })
    }

    /// A non-blocking stream.
    pub(crate) fn stream_create(&self) -> Result<sys::CUstream, CudaError> {
        self.with("cuStreamCreate", || {
            let mut s: sys::CUstream = std::ptr::null_mut();
            let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
            // SAFETY: out-pointer to a local.
            check("cuStreamCreate", unsafe {
                sys::cuStreamCreate(&mut s, flags)
            })?;
            Ok(s)
        })
    }

    /// `cuStreamDestroy`.
    pub(crate) fn stream_destroy(&self, s: sys::CUstream) -> Result<(), CudaError> {
        self.with("cuStreamDestroy", || {
            // SAFETY: `s` came from `stream_create` and is destroyed once.
            check("cuStreamDestroy", unsafe { sys::cuStreamDestroy_v2(s) })
        })
    }

    /// `cuStreamSynchronize`.
    pub(crate) fn stream_sync(&self, s: sys::CUstream) -> Result<(), CudaError> {
        self.with("cuStreamSynchronize", || {
            // SAFETY: `s` is a live stream of this context.
            check("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(s)
            })
        })
    }

    /// `cuMemcpyAsync` (unified addressing: any direction).
    ///
    /// # Safety
    /// Both ranges valid for `bytes` until the stream has run the copy.
    pub(crate) unsafe fn memcpy(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
        s: sys::CUstream,
    ) -> Result<(), CudaError> {
        self.with("cuMemcpyAsync", || {
            // SAFETY: forwarded from the caller.
            check("cuMemcpyAsync", unsafe {
                sys::cuMemcpyAsync(dst.0, src.0, bytes, s)
            })
        })
    }

    /// Whether kernels of this context can access `p`: device or managed memory,
    /// or pinned/registered host memory (`cuPointerGetAttribute`); pageable host
    /// memory the driver does not know is not.
    pub(crate) fn accessible(&self, p: DevPtr) -> Result<bool, CudaError> {
        self.with("cuPointerGetAttribute", || {
            let mut kind: c_uint = 0;
            // SAFETY: MEMORY_TYPE writes one CUmemorytype (a 32-bit enum) into
            // the local; read as a plain integer, so no value is invalid.
            let r = unsafe {
                sys::cuPointerGetAttribute(
                    (&mut kind as *mut c_uint).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    p.0,
                )
            };
            if r == CUresult::CUDA_ERROR_INVALID_VALUE {
                return Ok(false);
            }
            check("cuPointerGetAttribute", r)?;
            // CU_MEMORYTYPE_HOST (pinned), _DEVICE, _UNIFIED.
            Ok(matches!(kind, 1 | 2 | 4))
        })
    }

    /// A dma-buf fd covering the allocation that holds `p`, and the offset of
    /// `p` in it (`cuMemGetHandleForAddressRange`, what NCCL passes to
    /// `regMrDmaBuf`).
    pub(crate) fn dmabuf(&self, p: DevPtr) -> Result<(OwnedFd, u64), CudaError> {
        if !self.info.dmabuf_supported {
            return Err(CudaError::Unsupported(format!(
                "device {} ({}) does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0)",
                self.info.ordinal, self.info.name
            )));
        }
        self.with("cuMemGetHandleForAddressRange", || {
            let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
            // SAFETY: out-pointers to locals; `p` is an address of this context.
            check("cuMemGetAddressRange", unsafe {
                sys::cuMemGetAddressRange_v2(&mut base, &mut size, p.0)
            })?;
            let mut fd: c_int = -1;
            // SAFETY: the handle out-pointer is an int, as the dma-buf type needs.
            check("cuMemGetHandleForAddressRange", unsafe {
                sys::cuMemGetHandleForAddressRange(
                    (&mut fd as *mut c_int).cast(),
                    base,
                    size,
                    sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    0,
                )
            })?;
            if fd < 0 {
                return Err(CudaError::Unsupported(
                    "cuMemGetHandleForAddressRange returned no fd".to_owned(),
                ));
            }
            // SAFETY: the driver handed us a new fd that nobody else owns.
            Ok((unsafe { OwnedFd::from_raw_fd(fd) }, p.0 - base))
        })
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let dev = self.dev;
        let module = self.module;
        let _ = self.with("release device", || {
            if !module.is_null() {
                // SAFETY: loaded by `open`, unloaded once.
                let _ = unsafe { sys::cuModuleUnload(module) };
            }
            // SAFETY: retained by `open`, released once.
            check("cuDevicePrimaryCtxRelease", unsafe {
                sys::cuDevicePrimaryCtxRelease_v2(dev)
            })
        });
    }
}
