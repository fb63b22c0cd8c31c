//! The device a communicator's buffers live on: host memory (the default) or a
//! CUDA GPU (`--device cuda`, `CCLKIT_DEVICE=cuda`).
//!
//! On a CUDA communicator the user buffers are device memory, the reductions run
//! as device kernels (`cclkit_kernels::cuda`), and each connection's FIFO slots
//! live where NCCL would put them ([`mem`]): GPU memory registered with
//! `NCCL_PTR_CUDA` or through dma-buf when GPUDirect RDMA applies ([`gdr`]),
//! otherwise pinned host memory the GPU maps (host staging); GPU receives are
//! flushed with `iflush` when needed. Device communicators run the Simple
//! protocol (LL and LL128 are flag protocols polled by GPU threads; cclkit's
//! proxy decodes them on the host).
//!
//! Without an NVIDIA driver, opening a CUDA device fails with "no CUDA driver:
//! libcuda.so.1 not found …". `CCLKIT_CUDA_EMULATE=1` (or `dmabuf`) opens the emulated device
//! instead (the same kernel source run on the CPU over host memory), which
//! exercises this whole path without a GPU.

use std::os::fd::OwnedFd;

use super::error::{Error, Result};

pub mod gdr;
pub mod mem;

#[cfg(feature = "cuda")]
pub mod compute;
/// Without the `cuda` feature there is no device work queue: the type has no
/// values, so the proxy's device branch compiles and never runs.
#[cfg(not(feature = "cuda"))]
pub mod compute {
    use cclkit_abi::raw::common::Protocol;

    use crate::error::Result;
    use crate::op::OpRef;
    use crate::schedule::Prim;

    /// Uninhabited without the `cuda` feature.
    pub enum DevCompute {}

    impl DevCompute {
        /// Never called (no value exists).
        ///
        /// # Safety
        /// None needed: unreachable.
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn proxy_step(
            &mut self,
            _prim: &Prim,
            _op: &OpRef,
            _off: usize,
            _len: usize,
            _proto: Protocol,
            _recvs: &[(*const u8, usize)],
            _sends: &[*mut u8],
        ) -> Result<()> {
            match *self {}
        }
    }
}
#[cfg(test)]
mod tests;

pub use gdr::{GdrDecision, GdrEnv, decide, need_flush, pci_sysfs_path};
pub use mem::{ConnPlan, RegKind, SlotKind, SlotMem};

/// Whether `CCLKIT_CUDA_EMULATE` asks for the emulated GPU (`1`, or `dmabuf`:
/// the emulated GPU also "exports" dma-bufs, see `CudaDevice::emulated_with`).
pub fn emulate_requested(get: &dyn Fn(&str) -> Option<String>) -> bool {
    get("CCLKIT_CUDA_EMULATE").is_some_and(|v| matches!(v.trim(), "1" | "dmabuf"))
}

/// Which device a communicator uses, as configured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Host memory.
    #[default]
    Host,
    /// CUDA device `ordinal` (`emulated`: the host emulator, for tests).
    Cuda {
        /// Device ordinal.
        ordinal: usize,
        /// Use the emulated device (`CCLKIT_CUDA_EMULATE=1`).
        emulated: bool,
    },
}

impl DeviceKind {
    /// Parses `host`, `cpu`, `cuda`, `gpu` or `cuda:N`.
    ///
    /// # Errors
    /// Anything else (the message lists what is accepted).
    pub fn parse(s: &str, emulated: bool) -> Result<Self> {
        Self::parse_or(s, emulated, || 0)
    }

    /// [`parse`](Self::parse), with a GPU named without an ordinal (`cuda`, `gpu`)
    /// on the one `unnamed` gives (the library's default is 0, as NCCL uses the
    /// device the application set; `cclkit perf` gives local rank `i` GPU `i`).
    /// The emulated device is always 0.
    ///
    /// # Errors
    /// As [`parse`](Self::parse).
    pub fn parse_or(s: &str, emulated: bool, unnamed: impl FnOnce() -> usize) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        let cuda = |ordinal| DeviceKind::Cuda { ordinal, emulated };
        match s.as_str() {
            "host" | "cpu" => Ok(DeviceKind::Host),
            "cuda" | "gpu" => Ok(cuda(if emulated { 0 } else { unnamed() })),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(cuda)
                .ok_or_else(|| {
                    Error::invalid_argument(format!(
                        "device '{s}' is not valid (host, cuda or cuda:N)"
                    ))
                }),
        }
    }

    /// Reads `CCLKIT_DEVICE` (default host) and `CCLKIT_CUDA_EMULATE`.
    ///
    /// # Errors
    /// An invalid `CCLKIT_DEVICE`.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        get("CCLKIT_DEVICE").map_or(Ok(DeviceKind::Host), |v| {
            Self::parse(&v, emulate_requested(get))
        })
    }

    /// Whether this is a CUDA device.
    pub fn is_cuda(self) -> bool {
        matches!(self, DeviceKind::Cuda { .. })
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceKind::Host => f.write_str("host"),
            DeviceKind::Cuda {
                ordinal,
                emulated: false,
            } => write!(f, "cuda:{ordinal}"),
            DeviceKind::Cuda {
                ordinal,
                emulated: true,
            } => write!(f, "cuda:{ordinal} (emulated)"),
        }
    }
}

/// What the GDR rule needs to know about a GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuFacts {
    /// Its `/sys/devices/pci…` path, when known.
    pub pci_path: Option<String>,
    /// Whether it can export dma-bufs.
    pub dmabuf: bool,
    /// Compute capability major (flushes are needed before 9).
    pub cc_major: i32,
}

#[cfg(feature = "cuda")]
impl GpuFacts {
    /// The facts of a CUDA device.
    pub fn of(info: &cclkit_kernels::cuda::DeviceInfo) -> Self {
        Self {
            pci_path: info.pci_bus_id.as_deref().and_then(pci_sysfs_path),
            dmabuf: info.dmabuf_supported,
            cc_major: info.compute_capability.0,
        }
    }
}

/// The memory plans (send, receive) and the GDR decision for connections
/// between `gpu` and a NIC at `nic_pci` whose plugin reports `ptr_support` and
/// `force_flush`: the one place the runtime and `cclkit doctor` decide it.
pub fn plans_for(
    gpu: &GpuFacts,
    nic_pci: Option<&str>,
    ptr_support: i32,
    force_flush: bool,
    env: &GdrEnv,
) -> (ConnPlan, ConnPlan, GdrDecision) {
    let dec = decide(gpu.pci_path.as_deref(), nic_pci, ptr_support, env);
    let dmabuf = ConnPlan::dmabuf_possible(ptr_support, env.dmabuf, gpu.dmabuf);
    let flush = need_flush(dec.recv, force_flush, gpu.cc_major, env);
    (
        ConnPlan::cuda(dec.send, dmabuf, false),
        ConnPlan::cuda(dec.recv, dmabuf, flush),
        dec,
    )
}

/// Where one direction of a connection keeps its FIFO slots: the device and
/// the plan ([`Device::plans`]), and how long a receive flush may take.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The communicator's device.
    pub device: Device,
    /// The memory plan.
    pub plan: ConnPlan,
    /// Limit for one `iflush` (the communicator's operation timeout).
    pub flush_timeout: std::time::Duration,
}

impl Placement {
    /// Host memory (host communicators).
    pub fn host() -> Self {
        Self {
            device: Device::Host,
            plan: ConnPlan::HOST,
            flush_timeout: std::time::Duration::from_secs(300),
        }
    }
}

/// A user buffer for a communicator on some device, used as a byte slice on
/// the host: plain host memory, or on a CUDA device managed memory (one address
/// for host and GPU; pages migrate to the GPU when its kernels touch them).
/// Tools like `cclkit perf` fill and check data through the slice and hand the
/// same slice to the collectives.
pub enum UserBuffer {
    /// Host memory.
    Host(Vec<u8>),
    /// CUDA managed memory.
    #[cfg(feature = "cuda")]
    Managed(cclkit_kernels::cuda::ManagedBuffer),
}

impl std::ops::Deref for UserBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            UserBuffer::Host(v) => v,
            #[cfg(feature = "cuda")]
            UserBuffer::Managed(m) => m,
        }
    }
}

impl std::ops::DerefMut for UserBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            UserBuffer::Host(v) => v,
            #[cfg(feature = "cuda")]
            UserBuffer::Managed(m) => m,
        }
    }
}

/// An opened device.
#[derive(Clone, Debug)]
pub enum Device {
    /// Host memory.
    Host,
    /// A CUDA device (or the emulated one).
    #[cfg(feature = "cuda")]
    Cuda(cclkit_kernels::cuda::CudaDevice),
}

/// A CUDA error as a runtime error (driver failures are `ncclUnhandledCudaError`).
#[cfg(feature = "cuda")]
pub(crate) fn cuda_error(e: cclkit_kernels::cuda::CudaError) -> Error {
    let abi: cclkit_abi::Error = e.into();
    Error::new(abi.code(), abi.message().to_owned())
}

impl Device {
    /// Opens `kind`. CUDA devices are opened once per process and shared.
    ///
    /// # Errors
    /// "no CUDA driver: libcuda.so.1 not found …" without a driver, a missing
    /// ordinal, a driver failure, or a cclkit built without the `cuda` feature.
    pub fn open(kind: DeviceKind) -> Result<Self> {
        match kind {
            DeviceKind::Host => Ok(Device::Host),
            DeviceKind::Cuda { ordinal, emulated } => {
                open_cuda(ordinal, emulated).map_err(|e| e.context(format!("--device {kind}")))
            }
        }
    }

    /// Checks that `kind` can be opened, without creating a GPU context (for
    /// tools that spawn ranks: fail before any rank waits for another).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn probe(kind: DeviceKind) -> Result<()> {
        match kind {
            DeviceKind::Host | DeviceKind::Cuda { emulated: true, .. } => Ok(()),
            #[cfg(feature = "cuda")]
            DeviceKind::Cuda { ordinal, .. } => cclkit_kernels::cuda::CudaDevice::query(ordinal)
                .map(|_| ())
                .map_err(|e| cuda_error(e).context(format!("--device {kind}"))),
            #[cfg(not(feature = "cuda"))]
            DeviceKind::Cuda { ordinal, .. } => open_cuda(ordinal, false).map(|_| ()),
        }
    }

    /// Whether buffers live on a CUDA device.
    pub fn is_cuda(&self) -> bool {
        !matches!(self, Device::Host)
    }

    /// The GPU's `/sys/devices/pci…` path, when known.
    pub fn gpu_pci_path(&self) -> Option<String> {
        match self {
            Device::Host => None,
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.info().pci_bus_id.as_deref().and_then(pci_sysfs_path),
        }
    }

    /// The memory plans (send, receive) for connections through a NIC whose
    /// plugin reports `ptr_support` and `force_flush`, at `nic_pci`.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub fn plans(
        &self,
        nic_pci: Option<&str>,
        ptr_support: i32,
        force_flush: bool,
        env: &GdrEnv,
    ) -> (ConnPlan, ConnPlan, Option<GdrDecision>) {
        match self {
            Device::Host => (ConnPlan::HOST, ConnPlan::HOST, None),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => {
                let (s, r, dec) = plans_for(
                    &GpuFacts::of(d.info()),
                    nic_pci,
                    ptr_support,
                    force_flush,
                    env,
                );
                (s, r, Some(dec))
            }
        }
    }

    /// A dma-buf for the GPU allocation holding `p` and `p`'s offset in it.
    ///
    /// # Errors
    /// Not a CUDA device, or the export failed.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub fn dmabuf(&self, p: *mut u8) -> Result<(OwnedFd, u64)> {
        match self {
            Device::Host => Err(Error::invalid_usage("dma-buf export needs a CUDA device")),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d
                .dmabuf(cclkit_kernels::cuda::DevPtr(p as u64))
                .map(|b| (b.fd, b.offset))
                .map_err(cuda_error),
        }
    }

    /// The device work queue a communicator's proxy uses (`None` on the host).
    ///
    /// # Errors
    /// The driver could not create a stream.
    pub fn compute(&self) -> Result<Option<compute::DevCompute>> {
        match self {
            Device::Host => Ok(None),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => compute::DevCompute::new(d).map(Some),
        }
    }

    /// A zeroed user buffer of `len` bytes on this device (see [`UserBuffer`]).
    ///
    /// # Errors
    /// The allocation failed.
    pub fn alloc_user(&self, len: usize) -> Result<UserBuffer> {
        match self {
            Device::Host => Ok(UserBuffer::Host(vec![0u8; len])),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d
                .alloc_managed(len)
                .map(UserBuffer::Managed)
                .map_err(cuda_error),
        }
    }

    /// Checks that a user buffer suits this device: on a GPU, device, managed
    /// or pinned host memory its kernels can access (pageable host memory is
    /// refused before any kernel touches it).
    ///
    /// # Errors
    /// A buffer the device cannot access, or a driver failure.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub fn check_buffer(&self, p: *const u8, len: usize, what: &str) -> Result<()> {
        match self {
            Device::Host => Ok(()),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => {
                if len == 0
                    || d.accessible(cclkit_kernels::cuda::DevPtr(p as u64))
                        .map_err(cuda_error)?
                {
                    return Ok(());
                }
                Err(Error::invalid_usage(format!(
                    "{what} at {p:p} is not memory the GPU can access: a --device cuda \
                     communicator needs device, managed or pinned host buffers"
                )))
            }
        }
    }

    /// Whether this is the emulated device (`CCLKIT_CUDA_EMULATE`).
    pub fn is_emulated(&self) -> bool {
        match self {
            Device::Host => false,
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.info().emulated,
        }
    }

    /// The GPU in a few words, `0 (NVIDIA H200, PCI 0000:00:06.0)`; `None` on
    /// host memory.
    pub fn gpu_label(&self) -> Option<String> {
        match self {
            Device::Host => None,
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => {
                let i = d.info();
                Some(format!(
                    "{} ({}, PCI {})",
                    i.ordinal,
                    i.name,
                    i.pci_bus_id.as_deref().unwrap_or("-")
                ))
            }
        }
    }

    /// One line for logs and `cclkit doctor`.
    pub fn describe(&self) -> String {
        match self {
            Device::Host => "host memory".to_owned(),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => {
                let i = d.info();
                format!(
                    "CUDA device {}: {}{} (sm_{}{}, {} SMs, PCI {})",
                    i.ordinal,
                    i.name,
                    if i.emulated { " [emulated]" } else { "" },
                    i.compute_capability.0,
                    i.compute_capability.1,
                    i.sm_count,
                    i.pci_bus_id.as_deref().unwrap_or("-")
                )
            }
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize, emulated: bool) -> Result<Device> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use cclkit_kernels::cuda::CudaDevice;
    static OPEN: OnceLock<Mutex<HashMap<(usize, bool), CudaDevice>>> = OnceLock::new();
    let mut open = OPEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(d) = open.get(&(ordinal, emulated)) {
        return Ok(Device::Cuda(d.clone()));
    }
    let d = if emulated {
        // `dmabuf`: the emulator also "exports" dma-bufs (a /dev/null fd), so a
        // test plugin can see the regMrDmaBuf path.
        let dmabuf = std::env::var("CCLKIT_CUDA_EMULATE").is_ok_and(|v| v.trim() == "dmabuf");
        CudaDevice::emulated_with(4096, dmabuf)
    } else {
        CudaDevice::open(ordinal).map_err(cuda_error)?
    };
    tracing::info!(target: "cclkit::device", "{}", Device::Cuda(d.clone()).describe());
    open.insert((ordinal, emulated), d.clone());
    Ok(Device::Cuda(d))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize, _emulated: bool) -> Result<Device> {
    Err(Error::invalid_usage(
        "this cclkit was built without the `cuda` feature (cargo build --features cuda)",
    ))
}
