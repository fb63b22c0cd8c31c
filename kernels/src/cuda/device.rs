//! [`CudaDevice`], its memory and its streams, over either backend: the CUDA
//! driver or the host emulator.

use std::ffi::c_void;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::{self, Driver};
use super::emul::Emulator;
use super::entries;
use super::{CudaError, DevPtr};
use crate::error::KernelError;

/// What a device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Marketing name (`cuDeviceGetName`).
    pub name: String,
    /// PCI bus id, lower case (`0000:17:00.0`); `None` on the emulated device.
    pub pci_bus_id: Option<String>,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Device memory in bytes.
    pub total_mem: usize,
    /// Whether `cuMemGetHandleForAddressRange` can export dma-bufs.
    pub dmabuf_supported: bool,
    /// The host emulator, not a GPU.
    pub emulated: bool,
}

enum Backend {
    Driver(Driver),
    Emulated(Emulator, DeviceInfo),
}

/// One CUDA device with the cclkit kernels loaded (or the emulated device).
/// Cheap to clone; shared between threads.
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<Backend>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CudaDevice").field(self.info()).finish()
    }
}

/// A dma-buf exported for device memory: `fd` covers the whole allocation,
/// `offset` is where the asked-for address lies in it (the arguments of
/// `regMrDmaBuf`). The fd closes on drop (NCCL closes it after registering).
#[derive(Debug)]
pub struct Dmabuf {
    /// The dma-buf file descriptor.
    pub fd: OwnedFd,
    /// Offset of the address in the dma-buf.
    pub offset: u64,
}

impl CudaDevice {
    /// Opens device `ordinal`: initialises the driver, retains its primary
    /// context and loads the kernels (the driver JIT-compiles the PTX for
    /// this GPU on first load and caches it).
    ///
    /// # Errors
    /// [`CudaError::NoDriver`] without an NVIDIA driver,
    /// [`CudaError::NoDevice`] for a missing ordinal, or the driver's error.
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        Ok(Self {
            inner: Arc::new(Backend::Driver(Driver::open(ordinal)?)),
        })
    }

    /// What device `ordinal` is (name, PCI bus id, compute capability,
    /// dma-buf support), without creating a context or loading the kernels.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn query(ordinal: usize) -> Result<DeviceInfo, CudaError> {
        Driver::query(ordinal).map(|(_, info)| info)
    }

    /// Number of CUDA devices.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn count() -> Result<usize, CudaError> {
        driver::device_count()
    }

    /// The emulated device: the kernels' source compiled for this CPU, on
    /// host memory. Launches emulate up to 4096 threads.
    pub fn emulated() -> Self {
        Self::emulated_with_threads(4096)
    }

    /// The emulated device, emulating at most `max_threads` threads per
    /// launch (tests vary it to exercise the grid-stride loops).
    pub fn emulated_with_threads(max_threads: u64) -> Self {
        Self::emulated_with(max_threads, false)
    }

    /// The emulated device; with `dmabuf`, it claims dma-buf support and
    /// [`dmabuf`](Self::dmabuf) hands out an fd of `/dev/null` (offset 0), so
    /// the `regMrDmaBuf` path can be exercised with a plugin that only checks
    /// the fd. Such an fd maps nothing: a real plugin must not be given it.
    pub fn emulated_with(max_threads: u64, dmabuf: bool) -> Self {
        let info = DeviceInfo {
            ordinal: 0,
            name: "cclkit emulated device (host CPU)".to_owned(),
            pci_bus_id: None,
            compute_capability: (0, 0),
            sm_count: 1,
            total_mem: 0,
            dmabuf_supported: dmabuf,
            emulated: true,
        };
        Self {
            inner: Arc::new(Backend::Emulated(
                Emulator {
                    max_threads: max_threads.max(1),
                },
                info,
            )),
        }
    }

    /// What this device is.
    pub fn info(&self) -> &DeviceInfo {
        match &*self.inner {
            Backend::Driver(d) => &d.info,
            Backend::Emulated(_, info) => info,
        }
    }

    /// Allocates `bytes` of device memory (zeroed on the emulated device,
    /// uninitialised on a GPU).
    ///
    /// # Errors
    /// The driver's error (e.g. out of memory).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        let ptr = match &*self.inner {
            Backend::Driver(d) => d.alloc(bytes)?,
            Backend::Emulated(e, _) => e.alloc(bytes)?,
        };
        Ok(DeviceBuffer {
            dev: self.clone(),
            ptr,
            len: bytes,
        })
    }

    /// Allocates `bytes` of pinned host memory mapped into the device's
    /// address space: the host writes and reads it directly, and kernels do
    /// too (through [`HostBuffer::dev_ptr`]). NCCL keeps its network FIFOs in
    /// such memory when GPUDirect RDMA is not used.
    ///
    /// # Errors
    /// The driver's error.
    pub fn alloc_host(&self, bytes: usize) -> Result<HostBuffer, CudaError> {
        let (host, dev_ptr) = match &*self.inner {
            Backend::Driver(d) => d.alloc_host(bytes)?,
            Backend::Emulated(e, _) => {
                let p = e.alloc(bytes)?;
                (p.0 as *mut u8, p)
            }
        };
        Ok(HostBuffer {
            dev: self.clone(),
            host,
            dev_ptr,
            len: bytes,
        })
    }

    /// Allocates `bytes` of managed memory: one address valid on the host and
    /// on the device, pages migrating to whichever touches them (so a host
    /// program can fill and check buffers the kernels work on).
    ///
    /// # Errors
    /// The driver's error.
    pub fn alloc_managed(&self, bytes: usize) -> Result<ManagedBuffer, CudaError> {
        let ptr = match &*self.inner {
            Backend::Driver(d) => d.alloc_managed(bytes)?,
            Backend::Emulated(e, _) => e.alloc(bytes)?,
        };
        if bytes > 0 {
            // SAFETY: a fresh allocation of `bytes` host-addressable bytes.
            unsafe { std::ptr::write_bytes(ptr.0 as *mut u8, 0, bytes) };
        }
        Ok(ManagedBuffer {
            buf: DeviceBuffer {
                dev: self.clone(),
                ptr,
                len: bytes,
            },
        })
    }

    /// A new stream (the order in which work submitted through it runs).
    ///
    /// # Errors
    /// The driver's error.
    pub fn stream(&self) -> Result<Stream, CudaError> {
        let raw = match &*self.inner {
            Backend::Driver(d) => d.stream_create()?,
            Backend::Emulated(..) => std::ptr::null_mut(),
        };
        Ok(Stream {
            dev: self.clone(),
            raw,
        })
    }

    /// Exports the allocation holding `p` as a dma-buf (for `regMrDmaBuf`).
    ///
    /// # Errors
    /// [`CudaError::Unsupported`] where the device (or the emulator) has no
    /// dma-buf support; the driver's error otherwise.
    pub fn dmabuf(&self, p: DevPtr) -> Result<Dmabuf, CudaError> {
        match &*self.inner {
            Backend::Driver(d) => d.dmabuf(p).map(|(fd, offset)| Dmabuf { fd, offset }),
            Backend::Emulated(_, info) if info.dmabuf_supported => std::fs::File::open("/dev/null")
                .map(|f| Dmabuf {
                    fd: f.into(),
                    offset: 0,
                })
                .map_err(|e| CudaError::Unsupported(format!("emulated dma-buf: /dev/null: {e}"))),
            Backend::Emulated(..) => Err(CudaError::Unsupported(
                "the emulated device has no dma-buf export".to_owned(),
            )),
        }
    }

    /// Whether the kernels can read and write `p`: device memory, managed
    /// memory or pinned host memory, not pageable host memory (always true on
    /// the emulated device, whose "device memory" is host memory).
    ///
    /// # Errors
    /// The driver's error.
    pub fn accessible(&self, p: DevPtr) -> Result<bool, CudaError> {
        match &*self.inner {
            Backend::Driver(d) => d.accessible(p),
            Backend::Emulated(..) => Ok(true),
        }
    }

    fn max_blocks(&self) -> u32 {
        match &*self.inner {
            Backend::Driver(d) => d.max_blocks,
            // The emulator caps threads itself; the grid only bounds them.
            Backend::Emulated(..) => u32::MAX,
        }
    }
}

/// Device memory, freed on drop.
pub struct DeviceBuffer {
    dev: CudaDevice,
    ptr: DevPtr,
    len: usize,
}

impl DeviceBuffer {
    /// Its address.
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device it lives on.
    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// The address `offset` bytes in, if `offset + len` fits.
    pub(crate) fn range(&self, offset: usize, len: usize) -> Result<DevPtr, CudaError> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(KernelError::LengthMismatch {
                input: "buffer",
                peer: None,
                expected: self.len,
                actual: offset.saturating_add(len),
            }
            .into());
        }
        Ok(self.ptr.offset(offset))
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr.0, self.len)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        match &*self.dev.inner {
            // A failed free leaks device memory; there is nobody to tell.
            Backend::Driver(d) => {
                let _ = d.free(self.ptr);
            }
            // SAFETY: allocated by the emulator with this size, freed once.
            Backend::Emulated(e, _) => unsafe { e.free(self.ptr, self.len) },
        }
    }
}

/// Managed memory (zeroed), freed on drop. The host reads and writes it as a
/// byte slice; device work on it must be finished (its stream synchronised)
/// before the host touches it again.
pub struct ManagedBuffer {
    buf: DeviceBuffer,
}

impl ManagedBuffer {
    /// Its address (the same on the host and the device).
    pub fn ptr(&self) -> DevPtr {
        self.buf.ptr
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.buf.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.buf.len == 0
    }
}

impl std::ops::Deref for ManagedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.buf.len == 0 {
            return &[];
        }
        // SAFETY: managed memory is host-addressable for its whole length and
        // initialised (zeroed at allocation); device work on it has finished
        // before the host looks (the type's contract).
        unsafe { std::slice::from_raw_parts(self.buf.ptr.0 as *const u8, self.buf.len) }
    }
}

impl std::ops::DerefMut for ManagedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        if self.buf.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `deref`; `&mut self` makes the view exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.buf.ptr.0 as *mut u8, self.buf.len) }
    }
}

// The free path is DeviceBuffer's (cuMemFree also frees managed memory).

/// Pinned, device-mapped host memory, freed on drop.
pub struct HostBuffer {
    dev: CudaDevice,
    host: *mut u8,
    dev_ptr: DevPtr,
    len: usize,
}

// SAFETY: the buffer owns its allocation; the raw pointer is only an address.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    /// The host address.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.host
    }

    /// The host address, for reading.
    pub fn as_ptr(&self) -> *const u8 {
        self.host
    }

    /// The address kernels use (the same as the host address under unified
    /// addressing, and on the emulated device).
    pub fn dev_ptr(&self) -> DevPtr {
        self.dev_ptr
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        match &*self.dev.inner {
            Backend::Driver(d) => {
                let _ = d.free_host(self.host);
            }
            // SAFETY: allocated by the emulator with this size, freed once.
            Backend::Emulated(e, _) => unsafe { e.free(self.dev_ptr, self.len) },
        }
    }
}

/// An ordered queue of device work. Use one per thread. Work on the emulated
/// device runs at once; on a GPU it runs asynchronously until
/// [`synchronize`](Self::synchronize).
pub struct Stream {
    dev: CudaDevice,
    raw: sys::CUstream,
}

// SAFETY: a CUstream may be used from any thread with its context current
// (the driver backend makes it current on every call); `Stream` is not Sync,
// so one thread submits at a time.
unsafe impl Send for Stream {}

impl Stream {
    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// Waits until everything submitted so far has run.
    ///
    /// # Errors
    /// The driver's error, including a failure of earlier asynchronous work.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        match &*self.dev.inner {
            Backend::Driver(d) => d.stream_sync(self.raw),
            Backend::Emulated(..) => Ok(()),
        }
    }

    /// Copies `bytes` from `src` to `dst` (any direction: device, mapped
    /// host or pageable host addresses), asynchronously.
    ///
    /// # Safety
    /// Both ranges valid for `bytes` until the stream has run the copy; they
    /// do not overlap.
    pub unsafe fn memcpy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), CudaError> {
        match &*self.dev.inner {
            // SAFETY: forwarded from the caller.
            Backend::Driver(d) => unsafe { d.memcpy(dst, src, bytes, self.raw) },
            Backend::Emulated(e, _) => {
                // SAFETY: forwarded from the caller.
                unsafe { e.memcpy(dst, src, bytes) };
                Ok(())
            }
        }
    }

    /// Copies `src` into `dst` at `offset` and waits for it.
    ///
    /// # Errors
    /// The range does not fit `dst`; the driver's error.
    pub fn upload(
        &self,
        dst: &mut DeviceBuffer,
        offset: usize,
        src: &[u8],
    ) -> Result<(), CudaError> {
        let d = dst.range(offset, src.len())?;
        // SAFETY: `d` has src.len() bytes (checked); `src` lives until the sync.
        unsafe { self.memcpy(d, DevPtr(src.as_ptr() as u64), src.len())? };
        self.synchronize()
    }

    /// Copies `dst.len()` bytes of `src` from `offset` into `dst` and waits.
    ///
    /// # Errors
    /// The range does not fit `src`; the driver's error.
    pub fn download(
        &self,
        src: &DeviceBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), CudaError> {
        let s = src.range(offset, dst.len())?;
        // SAFETY: `s` has dst.len() bytes (checked); `dst` lives until the sync.
        unsafe { self.memcpy(DevPtr(dst.as_mut_ptr() as u64), s, dst.len())? };
        self.synchronize()
    }

    /// Launches table slot `slot` over `bytes` of data.
    ///
    /// # Safety
    /// As [`Driver::launch`].
    pub(crate) unsafe fn launch(
        &self,
        slot: usize,
        bytes: usize,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let blocks = entries::grid_blocks(bytes, self.dev.max_blocks());
        match &*self.dev.inner {
            // SAFETY: forwarded from the caller.
            Backend::Driver(d) => unsafe { d.launch(slot, blocks, self.raw, params) },
            // SAFETY: forwarded from the caller.
            Backend::Emulated(e, _) => unsafe { e.launch(slot, blocks, params) },
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Backend::Driver(d) = &*self.dev.inner {
            let _ = d.stream_sync(self.raw);
            let _ = d.stream_destroy(self.raw);
        }
    }
}
