//! Unit tests of the device path that need no GPU: configuration, the GDR rule,
//! memory plans, registration and flush against fakes, and (with the `cuda`
//! feature) the slice computation on the emulated device against the host's.

use std::cell::Cell;
use std::time::Duration;

use cclkit_abi::raw::common::{NcclResult, ptr};

use super::mem::{Flusher, Registrar, flush, register};
use super::*;
use crate::topo::PciDistance;

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}

#[test]
fn device_kinds_parse() {
    assert_eq!(
        DeviceKind::parse("host", false).ok(),
        Some(DeviceKind::Host)
    );
    assert_eq!(
        DeviceKind::parse(" CPU ", false).ok(),
        Some(DeviceKind::Host)
    );
    let cuda = |ordinal, emulated| DeviceKind::Cuda { ordinal, emulated };
    assert_eq!(DeviceKind::parse("cuda", false).ok(), Some(cuda(0, false)));
    assert_eq!(DeviceKind::parse("gpu", true).ok(), Some(cuda(0, true)));
    assert_eq!(
        DeviceKind::parse("cuda:3", false).ok(),
        Some(cuda(3, false))
    );
    let e = DeviceKind::parse("cuda:x", false).expect_err("bad ordinal");
    assert!(e.message().contains("host, cuda or cuda:N"), "{e}");
    assert!(DeviceKind::parse("tpu", false).is_err());
    assert_eq!(
        DeviceKind::from_lookup(&env(&[])).ok(),
        Some(DeviceKind::Host)
    );
    let k = DeviceKind::from_lookup(&env(&[
        ("CCLKIT_DEVICE", "cuda:1"),
        ("CCLKIT_CUDA_EMULATE", "1"),
    ]));
    assert_eq!(k.ok(), Some(cuda(1, true)));
    assert_eq!(cuda(2, false).to_string(), "cuda:2");
}

#[test]
fn a_gpu_named_without_an_ordinal_takes_the_callers() {
    let cuda = |ordinal, emulated| DeviceKind::Cuda { ordinal, emulated };
    assert_eq!(
        DeviceKind::parse_or(" GPU ", false, || 5).ok(),
        Some(cuda(5, false))
    );
    assert_eq!(
        DeviceKind::parse_or("cuda", false, || 2).ok(),
        Some(cuda(2, false))
    );
    // An explicit ordinal, host memory and the emulated device never ask.
    let never = || -> usize { panic!("asked for an ordinal") };
    assert_eq!(
        DeviceKind::parse_or("cuda:1", false, never).ok(),
        Some(cuda(1, false))
    );
    assert_eq!(
        DeviceKind::parse_or("host", false, never).ok(),
        Some(DeviceKind::Host)
    );
    assert_eq!(
        DeviceKind::parse_or("cuda", true, never).ok(),
        Some(cuda(0, true))
    );
}

#[test]
fn cuda_without_a_driver_is_a_clear_error() {
    let r = Device::open(DeviceKind::Cuda {
        ordinal: 0,
        emulated: false,
    });
    #[cfg(feature = "cuda")]
    if cclkit_kernels::cuda::driver_present() {
        // A GPU machine: the device opens (or the ordinal is reported missing).
        if let Err(e) = &r {
            assert!(e.message().contains("no CUDA device 0"), "{e}");
        }
        return;
    }
    let e = r.expect_err("no CUDA here");
    #[cfg(feature = "cuda")]
    {
        assert!(
            e.message()
                .starts_with("--device cuda:0: no CUDA driver: libcuda.so.1 not found"),
            "{e}"
        );
        assert_eq!(e.code(), NcclResult::UNHANDLED_CUDA_ERROR);
    }
    #[cfg(not(feature = "cuda"))]
    assert!(e.message().contains("without the `cuda` feature"), "{e}");
    assert!(Device::open(DeviceKind::Host).is_ok_and(|d| !d.is_cuda()));
    // The probe says the same without opening anything.
    let kind = DeviceKind::Cuda {
        ordinal: 0,
        emulated: false,
    };
    let p = Device::probe(kind).expect_err("no CUDA here");
    assert_eq!(p.message(), e.message());
    assert!(Device::probe(DeviceKind::Host).is_ok());
    #[cfg(feature = "cuda")]
    assert!(
        Device::probe(DeviceKind::Cuda {
            ordinal: 0,
            emulated: true
        })
        .is_ok()
    );
}

#[test]
fn gdr_env_defaults_and_errors() {
    let d = GdrEnv::from_lookup(&env(&[])).expect("defaults");
    assert_eq!(d, GdrEnv::default());
    assert!(d.dmabuf && !d.force_flush && !d.flush_disable && d.level.is_none());
    let e = GdrEnv::from_lookup(&env(&[
        ("NCCL_NET_GDR_LEVEL", "sys"),
        ("NCCL_NET_GDR_READ", "0"),
        ("NCCL_DMABUF_ENABLE", "0"),
        ("NCCL_NET_FORCE_FLUSH", "1"),
        ("NCCL_GDR_FLUSH_DISABLE", "1"),
    ]))
    .expect("set");
    assert_eq!(e.level, Some(PciDistance::Sys));
    assert_eq!(e.read, Some(false));
    assert!(!e.dmabuf && e.force_flush && e.flush_disable);
    assert_eq!(
        GdrEnv::from_lookup(&env(&[("NCCL_NET_GDR_LEVEL", "2")])).map(|e| e.level),
        Ok(Some(PciDistance::Pxb))
    );
    let bad = GdrEnv::from_lookup(&env(&[("NCCL_NET_GDR_LEVEL", "near")])).expect_err("bad");
    assert!(bad.message().contains("NCCL_NET_GDR_LEVEL=near"), "{bad}");
    assert!(GdrEnv::from_lookup(&env(&[("NCCL_NET_GDR_READ", "yes")])).is_err());
}

const GPU: &str = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0";
const NIC_PIX: &str = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0";
const NIC_PHB: &str = "/sys/devices/pci0000:00/0000:00:02.0/0000:05:00.0";

#[test]
fn gdr_rule() {
    let cuda = ptr::HOST | ptr::CUDA;
    let def = GdrEnv::default();
    let d = decide(Some(GPU), Some(NIC_PIX), cuda, &def);
    assert_eq!((d.distance, d.recv, d.send), (PciDistance::Pix, true, true));
    assert!(
        d.reason.contains("GDR for sends and receives"),
        "{}",
        d.reason
    );
    // Without NCCL_PTR_CUDA nothing else matters.
    let d = decide(Some(GPU), Some(NIC_PIX), ptr::HOST, &def);
    assert!(!d.recv && !d.send && d.reason.contains("NCCL_PTR_CUDA"));
    // PHB is beyond the default PXB level; allowed with NCCL_NET_GDR_LEVEL=PHB.
    let d = decide(Some(GPU), Some(NIC_PHB), cuda, &def);
    assert!(!d.recv && !d.send && d.reason.contains("PHB") && d.reason.contains("PXB"));
    let phb = GdrEnv {
        level: Some(PciDistance::Phb),
        ..def
    };
    assert!(decide(Some(GPU), Some(NIC_PHB), cuda, &phb).send);
    // NCCL_NET_GDR_READ=0: receives only.
    let no_read = GdrEnv {
        read: Some(false),
        ..def
    };
    let d = decide(Some(GPU), Some(NIC_PIX), cuda, &no_read);
    assert!(d.recv && !d.send && d.reason.contains("NCCL_NET_GDR_READ=0"));
    // An unknown path is SYS, so only NCCL_NET_GDR_LEVEL=SYS allows it.
    let d = decide(None, Some(NIC_PIX), cuda, &def);
    assert_eq!(d.distance, PciDistance::Sys);
    assert!(!d.recv && d.reason.contains("unknown"));
    let sys = GdrEnv {
        level: Some(PciDistance::Sys),
        ..def
    };
    assert!(decide(None, None, cuda, &sys).recv);
}

#[test]
fn flush_rule() {
    let def = GdrEnv::default();
    assert!(!need_flush(false, true, 8, &def), "no GDR, no flush");
    assert!(need_flush(true, false, 8, &def), "Ampere flushes");
    assert!(
        !need_flush(true, false, 9, &def),
        "Hopper orders PCIe writes"
    );
    assert!(need_flush(true, true, 9, &def), "plugin forceFlush");
    let force = GdrEnv {
        force_flush: true,
        ..def
    };
    assert!(need_flush(true, false, 9, &force));
    let off = GdrEnv {
        flush_disable: true,
        ..force
    };
    assert!(!need_flush(true, true, 8, &off));
}

#[test]
fn conn_plans() {
    assert_eq!(
        ConnPlan::cuda(false, true, true),
        ConnPlan {
            slots: SlotKind::Staged,
            reg: RegKind::Host,
            flush: false
        }
    );
    assert_eq!(ConnPlan::cuda(true, false, true).reg, RegKind::Cuda);
    assert_eq!(ConnPlan::cuda(true, true, false).reg, RegKind::DmaBuf);
    assert!(ConnPlan::cuda(true, true, true).flush);
    let all = ptr::HOST | ptr::CUDA | ptr::DMABUF;
    assert!(ConnPlan::dmabuf_possible(all, true, true));
    assert!(!ConnPlan::dmabuf_possible(
        ptr::HOST | ptr::CUDA,
        true,
        true
    ));
    assert!(
        !ConnPlan::dmabuf_possible(all, false, true),
        "NCCL_DMABUF_ENABLE=0"
    );
    assert!(
        !ConnPlan::dmabuf_possible(all, true, false),
        "GPU cannot export"
    );
    let (s, r, dec) = Device::Host.plans(Some(NIC_PIX), all, true, &GdrEnv::default());
    assert_eq!((s, r, dec), (ConnPlan::HOST, ConnPlan::HOST, None));
}

/// Records what registration asked for.
#[derive(Default)]
struct FakeComm {
    calls: Vec<(i32, Option<u64>)>,
    refuse: bool,
}

impl Registrar for FakeComm {
    type Mr = usize;
    unsafe fn reg(&mut self, _data: *mut u8, _size: usize, ptr_type: i32) -> crate::Result<usize> {
        if self.refuse {
            return Err(crate::Error::internal(
                "regMr: plugin refused NCCL_PTR_CUDA",
            ));
        }
        self.calls.push((ptr_type, None));
        Ok(self.calls.len())
    }
    unsafe fn reg_dmabuf(
        &mut self,
        _data: *mut u8,
        _size: usize,
        ptr_type: i32,
        offset: u64,
        fd: i32,
    ) -> crate::Result<usize> {
        assert!(fd >= 0);
        self.calls.push((ptr_type, Some(offset)));
        Ok(self.calls.len())
    }
}

#[test]
fn registration_follows_the_plan() {
    let mut mem = SlotMem::alloc(&Device::Host, &ConnPlan::HOST, 100).expect("host slots");
    assert_eq!(mem.bytes(), 100);
    assert_eq!(mem.base() as usize % 8, 0);
    let mut c = FakeComm::default();
    // SAFETY: `mem` outlives the fake registration (which keeps nothing).
    let id = unsafe { register(&mut c, &mut mem, &ConnPlan::HOST, &Device::Host) }.expect("reg");
    assert_eq!((id, c.calls[0]), (1, (ptr::HOST, None)));
    // dma-buf export is impossible on the host: falls back to regMr(NCCL_PTR_CUDA),
    // as it does when a GPU's export fails.
    let plan = ConnPlan::cuda(true, true, false);
    // SAFETY: as above.
    unsafe { register(&mut c, &mut mem, &plan, &Device::Host) }.expect("fallback");
    assert_eq!(c.calls[1], (ptr::CUDA, None));
    // A refusal keeps the plugin's message.
    c.refuse = true;
    let plan = ConnPlan::cuda(true, false, false);
    // SAFETY: as above.
    let e = unsafe { register(&mut c, &mut mem, &plan, &Device::Host) }.expect_err("refused");
    assert!(e.message().contains("refused NCCL_PTR_CUDA"));
    // Device slots need a CUDA device.
    assert!(SlotMem::alloc(&Device::Host, &ConnPlan::cuda(false, false, false), 8).is_err());
}

/// A flush that completes after `polls` tests (never when `None`).
struct FakeFlush {
    request: bool,
    polls: Option<u32>,
    iflushes: Cell<u32>,
}

impl Flusher for FakeFlush {
    type Mr = ();
    type Req = u32;
    unsafe fn iflush(
        &mut self,
        _data: *mut u8,
        _size: usize,
        _mr: Option<&()>,
    ) -> crate::Result<Option<u32>> {
        self.iflushes.set(self.iflushes.get() + 1);
        Ok(self.request.then_some(0))
    }
    fn test_flush(&mut self, req: &mut u32) -> crate::Result<bool> {
        *req += 1;
        Ok(self.polls.is_some_and(|n| *req >= n))
    }
}

#[test]
fn flush_waits_for_the_plugin() {
    let mut data = [0u8; 16];
    let t = Duration::from_secs(10);
    let fake = |request, polls| FakeFlush {
        request,
        polls,
        iflushes: Cell::new(0),
    };
    let mut f = fake(true, Some(3));
    // SAFETY: `data` outlives each flush; the fakes keep no pointer.
    unsafe { flush(&mut f, data.as_mut_ptr(), 16, None, t) }.expect("completes");
    assert_eq!(f.iflushes.get(), 1);
    // No request: nothing to wait for; nothing received: no iflush at all.
    let mut f = fake(false, None);
    // SAFETY: as above.
    unsafe { flush(&mut f, data.as_mut_ptr(), 16, None, t) }.expect("no request");
    // SAFETY: as above.
    unsafe { flush(&mut f, data.as_mut_ptr(), 0, None, t) }.expect("empty");
    assert_eq!(f.iflushes.get(), 1);
    // A flush that never completes times out.
    let mut f = fake(true, None);
    // SAFETY: as above.
    let e = unsafe {
        flush(
            &mut f,
            data.as_mut_ptr(),
            16,
            None,
            Duration::from_millis(20),
        )
    }
    .expect_err("stuck");
    assert_eq!(e.code(), NcclResult::TIMEOUT);
    assert!(e.message().contains("iflush of 16 received bytes"), "{e}");
}

#[cfg(feature = "cuda")]
mod cuda;
