//! Connection memory on a device: where a connection's FIFO slots live, how they
//! are registered with the net plugin, and the flush after GPU receives. This is
//! what NCCL's net transport does around `regMr`/`iflush` (NCCL_ABI.md §2.11):
//!
//! | device, GDR | slots | registration | after a receive |
//! | --- | --- | --- | --- |
//! | host | host memory | `regMr(NCCL_PTR_HOST)` | — |
//! | CUDA, no GDR | pinned host memory the GPU maps ("host staging") | `regMr(NCCL_PTR_HOST)` | — |
//! | CUDA, GDR | GPU memory | `regMrDmaBuf(fd, offset)` when the plugin has `NCCL_PTR_DMABUF` and `NCCL_DMABUF_ENABLE` is on, else `regMr(NCCL_PTR_CUDA)` | `iflush` when [`super::need_flush`] says so |

use std::time::{Duration, Instant};

use cclkit_abi::raw::common::ptr;

use super::Device;
use crate::error::net_err;
use crate::error::{Error, Result};
use cclkit_host::net::{Mr, RecvBuffer, RecvComm, Request, SendComm};

/// Where a connection's FIFO slots live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// Ordinary host memory (host communicators).
    Host,
    /// Pinned host memory mapped into the GPU: the GPU reads and writes it,
    /// the NIC sees host memory.
    Staged,
    /// GPU memory the NIC reads or writes directly (GPUDirect RDMA).
    Gpu,
}

/// How the slots are registered with the plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegKind {
    /// `regMr(…, NCCL_PTR_HOST)`.
    Host,
    /// `regMr(…, NCCL_PTR_CUDA)`.
    Cuda,
    /// `regMrDmaBuf(…, NCCL_PTR_CUDA, offset, fd)` with a dma-buf of the GPU memory.
    DmaBuf,
}

/// The memory plan of one direction of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnPlan {
    /// Where the slots live.
    pub slots: SlotKind,
    /// How they are registered.
    pub reg: RegKind,
    /// Whether a completed receive must be flushed (`iflush`) before use.
    pub flush: bool,
}

impl ConnPlan {
    /// Host memory, registered as host memory, no flush.
    pub const HOST: ConnPlan = ConnPlan {
        slots: SlotKind::Host,
        reg: RegKind::Host,
        flush: false,
    };

    /// The plan for a CUDA device: GPU slots when `gdr` (this direction may
    /// use GPUDirect RDMA), registered through dma-buf when `dmabuf` (the
    /// plugin has `NCCL_PTR_DMABUF`, `NCCL_DMABUF_ENABLE` is on and the GPU can
    /// export dma-bufs), flushed when `flush`; pinned host staging otherwise.
    pub fn cuda(gdr: bool, dmabuf: bool, flush: bool) -> ConnPlan {
        if !gdr {
            return ConnPlan {
                slots: SlotKind::Staged,
                reg: RegKind::Host,
                flush: false,
            };
        }
        ConnPlan {
            slots: SlotKind::Gpu,
            reg: if dmabuf {
                RegKind::DmaBuf
            } else {
                RegKind::Cuda
            },
            flush,
        }
    }

    /// Whether `ptr_support` lets this plan register through dma-buf.
    pub fn dmabuf_possible(ptr_support: i32, env_dmabuf: bool, gpu_exports: bool) -> bool {
        ptr_support & ptr::DMABUF != 0 && env_dmabuf && gpu_exports
    }
}

/// A connection's slot memory, allocated as its [`ConnPlan`] says.
pub struct SlotMem {
    inner: Inner,
    bytes: usize,
}

enum Inner {
    Host(Vec<u64>),
    #[cfg(feature = "cuda")]
    Staged(cclkit_kernels::cuda::HostBuffer),
    #[cfg(feature = "cuda")]
    Gpu(cclkit_kernels::cuda::DeviceBuffer),
}

impl SlotMem {
    /// Allocates `bytes` (8-byte aligned at least) on `device` for `plan`.
    ///
    /// # Errors
    /// A CUDA plan on a host device, or the allocation failed.
    pub fn alloc(device: &Device, plan: &ConnPlan, bytes: usize) -> Result<Self> {
        let inner = match (plan.slots, device) {
            (SlotKind::Host, _) => Inner::Host(vec![0u64; bytes.div_ceil(8)]),
            #[cfg(feature = "cuda")]
            (SlotKind::Staged, Device::Cuda(d)) => {
                let b = d.alloc_host(bytes).map_err(super::cuda_error)?;
                if b.dev_ptr().0 != b.as_ptr() as u64 {
                    return Err(Error::system(
                        "pinned host memory has a different device address: cclkit needs \
                         unified addressing (64-bit Linux)",
                    ));
                }
                Inner::Staged(b)
            }
            #[cfg(feature = "cuda")]
            (SlotKind::Gpu, Device::Cuda(d)) => {
                Inner::Gpu(d.alloc(bytes).map_err(super::cuda_error)?)
            }
            (kind, _) => {
                return Err(Error::internal(format!(
                    "{kind:?} slots need a CUDA device"
                )));
            }
        };
        Ok(Self { inner, bytes })
    }

    /// The slots' address: a host address for host and staged memory, a device
    /// address for GPU memory (never dereferenced on the host).
    pub fn base(&mut self) -> *mut u8 {
        match &mut self.inner {
            Inner::Host(v) => v.as_mut_ptr().cast(),
            #[cfg(feature = "cuda")]
            Inner::Staged(b) => b.as_mut_ptr(),
            #[cfg(feature = "cuda")]
            Inner::Gpu(b) => b.ptr().0 as *mut u8,
        }
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// What registration needs from a comm; implemented by the plugin's
/// [`SendComm`]/[`RecvComm`] (and by fakes in tests).
pub trait Registrar {
    /// The registration handle.
    type Mr;

    /// `regMr(data, size, ptr_type)`.
    ///
    /// # Safety
    /// `data` valid for `size` bytes of that kind until deregistered.
    unsafe fn reg(&mut self, data: *mut u8, size: usize, ptr_type: i32) -> Result<Self::Mr>;

    /// `regMrDmaBuf(data, size, ptr_type, offset, fd)`.
    ///
    /// # Safety
    /// As [`reg`](Self::reg), and `fd` a dma-buf holding `data` at `offset`.
    unsafe fn reg_dmabuf(
        &mut self,
        data: *mut u8,
        size: usize,
        ptr_type: i32,
        offset: u64,
        fd: i32,
    ) -> Result<Self::Mr>;
}

macro_rules! registrar_for {
    ($ty:ty) => {
        impl Registrar for $ty {
            type Mr = Mr;
            unsafe fn reg(&mut self, data: *mut u8, size: usize, ptr_type: i32) -> Result<Mr> {
                // SAFETY: forwarded from the caller.
                unsafe { self.reg_mr(data, size, ptr_type) }.map_err(|e| net_err(e, "regMr"))
            }
            unsafe fn reg_dmabuf(
                &mut self,
                data: *mut u8,
                size: usize,
                ptr_type: i32,
                offset: u64,
                fd: i32,
            ) -> Result<Mr> {
                // SAFETY: forwarded from the caller.
                unsafe { self.reg_mr_dmabuf(data, size, ptr_type, offset, fd) }
                    .map_err(|e| net_err(e, "regMrDmaBuf"))
            }
        }
    };
}
registrar_for!(SendComm);
registrar_for!(RecvComm);

/// Registers `mem` on `comm` as `plan` says. A dma-buf that cannot be exported
/// falls back to `regMr(NCCL_PTR_CUDA)` with a warning.
///
/// # Safety
/// `mem` stays allocated until the registration is deregistered.
///
/// # Errors
/// The plugin refused the registration (its message is kept).
pub unsafe fn register<R: Registrar>(
    comm: &mut R,
    mem: &mut SlotMem,
    plan: &ConnPlan,
    device: &Device,
) -> Result<R::Mr> {
    let (base, bytes) = (mem.base(), mem.bytes());
    match plan.reg {
        // SAFETY: forwarded from the caller.
        RegKind::Host => unsafe { comm.reg(base, bytes, ptr::HOST) },
        // SAFETY: forwarded from the caller; GPU memory of this device.
        RegKind::Cuda => unsafe { comm.reg(base, bytes, ptr::CUDA) },
        RegKind::DmaBuf => match device.dmabuf(base) {
            Ok((fd, offset)) => {
                use std::os::fd::AsRawFd;
                // SAFETY: forwarded from the caller; `fd` holds `base` at
                // `offset` and stays open for the call (NCCL closes it after).
                unsafe { comm.reg_dmabuf(base, bytes, ptr::CUDA, offset, fd.as_raw_fd()) }
            }
            Err(e) => {
                tracing::warn!(
                    target: "cclkit::device",
                    "dma-buf export failed ({e}); registering with regMr(NCCL_PTR_CUDA)"
                );
                // SAFETY: as above.
                unsafe { comm.reg(base, bytes, ptr::CUDA) }
            }
        },
    }
}

/// What a flush needs from a receive comm; implemented by [`RecvComm`] (and by
/// fakes in tests).
pub trait Flusher {
    /// The registration handle.
    type Mr;
    /// A pending flush.
    type Req;

    /// `iflush` of one received buffer: `Ok(None)` = nothing to wait for.
    ///
    /// # Safety
    /// `data` valid for `size` bytes, registered as `mr`, until the flush completes.
    unsafe fn iflush(
        &mut self,
        data: *mut u8,
        size: usize,
        mr: Option<&Self::Mr>,
    ) -> Result<Option<Self::Req>>;

    /// `test`: whether the flush completed.
    fn test_flush(&mut self, req: &mut Self::Req) -> Result<bool>;
}

impl Flusher for RecvComm {
    type Mr = Mr;
    type Req = Request;

    unsafe fn iflush(
        &mut self,
        data: *mut u8,
        size: usize,
        mr: Option<&Mr>,
    ) -> Result<Option<Request>> {
        let buf = RecvBuffer {
            data,
            size,
            tag: 0,
            mr,
        };
        // SAFETY: forwarded from the caller.
        unsafe { RecvComm::iflush(self, &[buf]) }.map_err(|e| net_err(e, "iflush"))
    }

    fn test_flush(&mut self, req: &mut Request) -> Result<bool> {
        self.test(req)
            .map(|done| done.is_some())
            .map_err(|e| net_err(e, "test(iflush)"))
    }
}

/// Flushes `size` received bytes at `data` and waits for it, as NCCL does
/// after a GPU receive: `iflush`, then `test` until done. Nothing to do for an
/// empty receive.
///
/// # Safety
/// As [`Flusher::iflush`].
///
/// # Errors
/// The plugin's error, or a timeout after `timeout`.
pub unsafe fn flush<F: Flusher>(
    comm: &mut F,
    data: *mut u8,
    size: usize,
    mr: Option<&F::Mr>,
    timeout: Duration,
) -> Result<()> {
    if size == 0 {
        return Ok(());
    }
    // SAFETY: forwarded from the caller.
    let Some(mut req) = (unsafe { comm.iflush(data, size, mr)? }) else {
        return Ok(());
    };
    let deadline = Instant::now() + timeout;
    let mut spins = 0u32;
    while !comm.test_flush(&mut req)? {
        if Instant::now() > deadline {
            return Err(Error::timeout(format!(
                "iflush of {size} received bytes did not complete within {timeout:?}"
            )));
        }
        spins = spins.saturating_add(1);
        if spins > 64 {
            std::thread::yield_now();
        }
    }
    Ok(())
}
