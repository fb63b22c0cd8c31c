//! The GPUDirect RDMA decision, in one place: may the NIC read (sends) and write
//! (receives) GPU memory directly, or must the data be staged through host memory?
//!
//! NCCL's rule (`ncclTopoCheckGdr`), which this reproduces:
//! 1. the plugin must support `NCCL_PTR_CUDA` for the device (`ptrSupport`);
//! 2. the PCI distance between the GPU and the NIC must be within
//!    `NCCL_NET_GDR_LEVEL` (default PXB; names PIX/PXB/PHB/NODE/SYS or 0–5);
//! 3. for sends (the NIC *reads* GPU memory) `NCCL_NET_GDR_READ` must allow it
//!    (default on).
//!
//! The distance rule itself is `topo::gdr_enabled` over `topo::pci_distance`;
//! this module adds the plugin capability, the environment and the reason text
//! `cclkit doctor` prints.

use cclkit_abi::raw::common::ptr;

use crate::error::{Error, Result};
use crate::topo::{self, PciDistance};

/// The environment knobs of the GDR path, read once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdrEnv {
    /// `NCCL_NET_GDR_LEVEL` (`None` = NCCL's default, PXB).
    pub level: Option<PciDistance>,
    /// `NCCL_NET_GDR_READ` (`None` = default, on).
    pub read: Option<bool>,
    /// `NCCL_DMABUF_ENABLE` (default on): register GPU memory through dma-buf
    /// when the plugin offers `NCCL_PTR_DMABUF`.
    pub dmabuf: bool,
    /// `NCCL_NET_FORCE_FLUSH` (default off): flush after every GPU receive even
    /// where PCIe ordering makes it unnecessary.
    pub force_flush: bool,
    /// `NCCL_GDR_FLUSH_DISABLE` (default off): never flush.
    pub flush_disable: bool,
}

impl Default for GdrEnv {
    fn default() -> Self {
        Self {
            level: None,
            read: None,
            dmabuf: true,
            force_flush: false,
            flush_disable: false,
        }
    }
}

fn flag(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<bool>> {
    get(name)
        .map(|v| match v.trim() {
            "0" => Ok(false),
            "1" => Ok(true),
            other => Err(Error::invalid_argument(format!(
                "{name}={other} is not valid (0 or 1)"
            ))),
        })
        .transpose()
}

impl GdrEnv {
    /// Reads the process environment.
    ///
    /// # Errors
    /// A value NCCL would not accept (named in the message).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Reads the knobs through `get` (`None` = unset).
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let level = get("NCCL_NET_GDR_LEVEL")
            .map(|v| {
                PciDistance::parse(&v).ok_or_else(|| {
                    Error::invalid_argument(format!(
                        "NCCL_NET_GDR_LEVEL={v} is not valid (PIX, PXB, PHB, NODE, SYS or 0-5)"
                    ))
                })
            })
            .transpose()?;
        Ok(Self {
            level,
            read: flag(get, "NCCL_NET_GDR_READ")?,
            dmabuf: flag(get, "NCCL_DMABUF_ENABLE")?.unwrap_or(true),
            force_flush: flag(get, "NCCL_NET_FORCE_FLUSH")?.unwrap_or(false),
            flush_disable: flag(get, "NCCL_GDR_FLUSH_DISABLE")?.unwrap_or(false),
        })
    }
}

/// The GDR decision between one GPU and one NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GdrDecision {
    /// PCI distance (SYS when either path is unknown, as NCCL).
    pub distance: PciDistance,
    /// Receives land in GPU memory (the NIC writes it).
    pub recv: bool,
    /// Sends are read from GPU memory (the NIC reads it).
    pub send: bool,
    /// Why, in one line (for logs and `cclkit doctor`).
    pub reason: String,
}

/// Decides GDR for a GPU at `gpu_pci` and a NIC at `nic_pci` (`/sys/devices/…`
/// paths) whose plugin reports `ptr_support`.
pub fn decide(
    gpu_pci: Option<&str>,
    nic_pci: Option<&str>,
    ptr_support: i32,
    env: &GdrEnv,
) -> GdrDecision {
    let distance = match (gpu_pci, nic_pci) {
        (Some(g), Some(n)) => topo::pci_distance(g, n),
        _ => PciDistance::Sys,
    };
    let level = env.level.unwrap_or(PciDistance::Pxb);
    if ptr_support & ptr::CUDA == 0 {
        return GdrDecision {
            distance,
            recv: false,
            send: false,
            reason: "the plugin does not support NCCL_PTR_CUDA for this device: host staging"
                .to_owned(),
        };
    }
    let recv = topo::gdr_enabled(distance, false, env.level, env.read);
    let send = topo::gdr_enabled(distance, true, env.level, env.read);
    let reason = if !recv {
        let unknown = if gpu_pci.is_none() || nic_pci.is_none() {
            " (a PCI path is unknown)"
        } else {
            ""
        };
        format!(
            "GPU-NIC distance {}{unknown} is beyond NCCL_NET_GDR_LEVEL={}: host staging",
            distance.name(),
            level.name()
        )
    } else if !send {
        format!(
            "distance {} within NCCL_NET_GDR_LEVEL={}: GDR for receives; NCCL_NET_GDR_READ=0: sends staged",
            distance.name(),
            level.name()
        )
    } else {
        format!(
            "distance {} within NCCL_NET_GDR_LEVEL={}: GDR for sends and receives",
            distance.name(),
            level.name()
        )
    };
    GdrDecision {
        distance,
        recv,
        send,
        reason,
    }
}

/// Whether received GPU data must be flushed (`iflush`) before the GPU reads
/// it: only with GDR, never with `NCCL_GDR_FLUSH_DISABLE=1`, always when the
/// plugin sets `forceFlush` or `NCCL_NET_FORCE_FLUSH=1`, otherwise on GPUs before
/// Hopper (compute capability < 9.0), whose PCIe writes may be seen out of order
/// (NCCL's `ncclTopoNeedFlush`).
pub fn need_flush(gdr_recv: bool, plugin_force_flush: bool, cc_major: i32, env: &GdrEnv) -> bool {
    gdr_recv && !env.flush_disable && (plugin_force_flush || env.force_flush || cc_major < 9)
}

/// The `/sys/devices/pci…` path of the PCI device `bus_id` (`0000:17:00.0`), as
/// NCCL resolves it (the realpath of `/sys/bus/pci/devices/<bus id>`).
pub fn pci_sysfs_path(bus_id: &str) -> Option<String> {
    std::fs::canonicalize(format!(
        "/sys/bus/pci/devices/{}",
        bus_id.to_ascii_lowercase()
    ))
    .ok()
    .map(|p| p.to_string_lossy().into_owned())
}
