//! `cclkit doctor`'s GPUDirect RDMA section: for every GPU × net device, what a
//! `--device cuda` communicator would do (GDR or host staging, how GPU memory is
//! registered, whether receives are flushed), decided by the runtime's own rule
//! ([`cclkit_runtime::device::plans_for`]).

use std::fmt::Write as _;

use serde::Serialize;

use crate::commands::report::DeviceReport;
use cclkit_runtime::device::{GdrEnv, GpuFacts, RegKind, SlotKind, plans_for};

/// The GDR section.
#[derive(Debug, Default, Serialize)]
pub struct GdrReport {
    /// The GPUs seen, or why none ("no GPU: GDR not applicable …").
    pub summary: String,
    /// `NCCL_NET_GDR_LEVEL`, `NCCL_NET_GDR_READ`, … as seen.
    pub settings: Vec<(String, Option<String>)>,
    /// One decision per GPU × net device.
    pub decisions: Vec<GdrLine>,
    /// A setting the runtime would reject.
    pub problem: Option<String>,
}

/// The decision for one GPU and one net device.
#[derive(Debug, Serialize)]
pub struct GdrLine {
    /// GPU ordinal and name.
    pub gpu: String,
    /// Net device index and name.
    pub nic: String,
    /// PCI distance (PIX … SYS).
    pub distance: &'static str,
    /// GDR for sends (the NIC reads GPU memory).
    pub send: bool,
    /// GDR for receives (the NIC writes GPU memory).
    pub recv: bool,
    /// How receive slots would be registered.
    pub registration: &'static str,
    /// Whether GPU receives are flushed.
    pub flush: bool,
    /// Why.
    pub reason: String,
}

const SETTINGS: [&str; 5] = [
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_DMABUF_ENABLE",
    "NCCL_NET_FORCE_FLUSH",
    "NCCL_GDR_FLUSH_DISABLE",
];

/// The GPUs here: ordinal, name and facts; `Err` says why there are none.
#[cfg(feature = "cuda")]
fn gpus() -> Result<Vec<(String, GpuFacts)>, String> {
    use cclkit_kernels::cuda::CudaDevice;
    let n = CudaDevice::count().map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("the CUDA driver reports no device".to_owned());
    }
    (0..n)
        .map(|i| {
            CudaDevice::query(i)
                .map(|info| {
                    // The kernels this GPU would load (the sm_90 PTX from 9.0 on).
                    let ptx = cclkit_kernels::cuda::ptx_loaded_for(info.compute_capability)
                        .map_or_else(|e| e.to_string(), |p| format!("{} PTX", p.1));
                    (
                        format!(
                            "GPU {i} {} (PCI {}, sm_{}{}, {ptx})",
                            info.name,
                            info.pci_bus_id.as_deref().unwrap_or("?"),
                            info.compute_capability.0,
                            info.compute_capability.1,
                        ),
                        GpuFacts::of(&info),
                    )
                })
                .map_err(|e| e.to_string())
        })
        .collect()
}

#[cfg(not(feature = "cuda"))]
fn gpus() -> Result<Vec<(String, GpuFacts)>, String> {
    Err("cclkit was built without the `cuda` feature".to_owned())
}

/// Builds the section for the selected plugin's `devices`.
pub fn report(devices: &[DeviceReport], get: &dyn Fn(&str) -> Option<String>) -> GdrReport {
    let settings = SETTINGS.iter().map(|k| ((*k).to_owned(), get(k))).collect();
    let env = match GdrEnv::from_lookup(get) {
        Ok(e) => e,
        Err(e) => {
            return GdrReport {
                summary: "GDR settings are invalid".to_owned(),
                settings,
                decisions: Vec::new(),
                problem: Some(format!("GDR: {}", e.message())),
            };
        }
    };
    let gpus = match gpus() {
        Ok(g) => g,
        Err(why) => {
            return GdrReport {
                summary: format!("no GPU: GDR not applicable ({why})"),
                settings,
                decisions: Vec::new(),
                problem: None,
            };
        }
    };
    // Local ranks sharing a GPU time-slice it without MPS (`cclkit perf` warns).
    let mps = if crate::commands::perf::gpus::mps_found(get) {
        "a CUDA MPS control daemon is running"
    } else {
        "no CUDA MPS control daemon found (ranks sharing a GPU time-slice it)"
    };
    let summary = format!("{} GPU(s), decided per net device; {mps}", gpus.len());
    let decisions = decide_all(&gpus, devices, &env);
    GdrReport {
        summary,
        settings,
        decisions,
        problem: None,
    }
}

/// Every GPU × net device decision.
pub fn decide_all(
    gpus: &[(String, GpuFacts)],
    devices: &[DeviceReport],
    env: &GdrEnv,
) -> Vec<GdrLine> {
    let mut out = Vec::with_capacity(gpus.len() * devices.len());
    for (gpu, facts) in gpus {
        for d in devices {
            let (_, recv, dec) = plans_for(
                facts,
                d.pci_path.as_deref(),
                d.ptr_support,
                d.force_flush,
                env,
            );
            out.push(GdrLine {
                gpu: gpu.clone(),
                nic: format!("net {} {}", d.dev, d.name),
                distance: dec.distance.name(),
                send: dec.send,
                recv: dec.recv,
                registration: match (recv.slots, recv.reg) {
                    (SlotKind::Gpu, RegKind::DmaBuf) => "regMrDmaBuf (dma-buf of GPU memory)",
                    (SlotKind::Gpu, _) => "regMr NCCL_PTR_CUDA",
                    _ => "host staging (pinned host memory, regMr NCCL_PTR_HOST)",
                },
                flush: recv.flush,
                reason: dec.reason,
            });
        }
    }
    out
}

/// Renders the section.
pub fn render(o: &mut String, r: &GdrReport) {
    let _ = writeln!(o, "\nGPU (--device cuda)");
    let set: Vec<String> = r
        .settings
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => format!("{k} unset"),
        })
        .collect();
    let _ = writeln!(o, "  {}", set.join("; "));
    let _ = writeln!(o, "  {}", r.summary);
    for l in &r.decisions {
        let gdr = match (l.send, l.recv) {
            (true, true) => "GDR send+recv",
            (false, true) => "GDR recv only",
            _ => "no GDR",
        };
        let _ = writeln!(
            o,
            "    {} <-> {}: {} ({}), {}{}",
            l.gpu,
            l.nic,
            gdr,
            l.distance,
            l.registration,
            if l.flush {
                ", iflush after receives"
            } else {
                ""
            }
        );
        let _ = writeln!(o, "      {}", l.reason);
    }
}

#[cfg(test)]
mod tests {
    use cclkit_abi::net::Properties;
    use cclkit_abi::raw::common::ptr;

    use super::*;

    const GPU: &str = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0";
    const NIC: &str = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0";

    fn nic(dev: usize, ptr_support: i32) -> DeviceReport {
        let mut p = Properties::host(format!("mlx5_{dev}"));
        p.pci_path = Some(NIC.to_owned());
        p.ptr_support = ptr_support;
        DeviceReport::new(dev, &p)
    }

    #[test]
    fn decisions_per_gpu_and_nic() {
        let hopper = GpuFacts {
            pci_path: Some(GPU.to_owned()),
            dmabuf: true,
            cc_major: 9,
        };
        let ampere = GpuFacts {
            cc_major: 8,
            dmabuf: false,
            ..hopper.clone()
        };
        let gpus = vec![("GPU 0".to_owned(), hopper), ("GPU 1".to_owned(), ampere)];
        let devs = [
            nic(0, ptr::HOST | ptr::CUDA | ptr::DMABUF),
            nic(1, ptr::HOST),
        ];
        let lines = decide_all(&gpus, &devs, &GdrEnv::default());
        assert_eq!(lines.len(), 4);
        let l = &lines[0];
        assert_eq!(
            (l.distance, l.send, l.recv, l.flush),
            ("PIX", true, true, false)
        );
        assert!(l.registration.starts_with("regMrDmaBuf"));
        assert!(lines[1].registration.starts_with("host staging") && !lines[1].recv);
        // Ampere without dma-buf export: regMr NCCL_PTR_CUDA and a flush.
        assert_eq!(lines[2].registration, "regMr NCCL_PTR_CUDA");
        assert!(lines[2].flush);
        let mut o = String::new();
        render(
            &mut o,
            &GdrReport {
                summary: "2 GPU(s)".to_owned(),
                settings: vec![("NCCL_NET_GDR_LEVEL".to_owned(), None)],
                decisions: lines,
                problem: None,
            },
        );
        assert!(
            o.contains("GPU 0 <-> net 0 mlx5_0: GDR send+recv (PIX), regMrDmaBuf"),
            "{o}"
        );
        assert!(o.contains("GPU 1 <-> net 0 mlx5_0: GDR send+recv (PIX), regMr NCCL_PTR_CUDA, iflush after receives"), "{o}");
        assert!(o.contains("no GDR (PIX), host staging"), "{o}");
    }

    #[test]
    fn settings_and_no_gpu() {
        let bad = |k: &str| (k == "NCCL_NET_GDR_LEVEL").then(|| "close".to_owned());
        let r = report(&[], &bad);
        assert!(
            r.problem
                .as_deref()
                .is_some_and(|p| p.contains("NCCL_NET_GDR_LEVEL=close"))
        );
        let r = report(&[nic(0, ptr::HOST)], &|_| None);
        assert_eq!(r.settings.len(), 5);
        #[cfg(feature = "cuda")]
        let no_gpu = !cclkit_kernels::cuda::driver_present();
        #[cfg(not(feature = "cuda"))]
        let no_gpu = true;
        if no_gpu {
            assert!(
                r.summary.starts_with("no GPU: GDR not applicable"),
                "{}",
                r.summary
            );
            assert!(r.decisions.is_empty() && r.problem.is_none());
        } else {
            assert!(!r.decisions.is_empty(), "one line per GPU for the NIC");
        }
    }
}
