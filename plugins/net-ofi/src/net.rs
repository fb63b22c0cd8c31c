//! `impl Net for OfiNet`: the NCCL-facing plugin, mapping each call onto the
//! modules above.

use std::ffi::CStr;
use std::sync::{Arc, Mutex};

use cclkit_abi::net::{
    Buf, CommConfig, CommRef, InitArgs, MemRegion, Net, NetHandle, Properties, RecvBuf, Sizes,
};
use cclkit_abi::profiler::net::RequestProfiler;
use cclkit_abi::raw::common::{ptr, subsys};
use cclkit_abi::raw::net::{MAX_COLLNET_SIZE, NCCL_MAX_NET_SIZE_BYTES};
use cclkit_abi::{Error, Result, nccl_info};

use crate::comm::{self, Listen, RecvComm, SendComm};
use crate::config::Config;
use crate::cuda::Cuda;
use crate::data::{self, OfiMr, Request};
use crate::device::Device;
use crate::discover::{DeviceDesc, discover};
use crate::fabric::MemIface;
use crate::fabric::info::runtime_version;
use crate::fabric::objects::dmabuf_built;
use crate::prof;

/// The libfabric net plugin (one instance per process).
pub struct OfiNet {
    cfg: Config,
    provider: String,
    descs: Vec<DeviceDesc>,
    opened: Mutex<Vec<Option<Arc<Device>>>>,
    cuda: Option<Cuda>,
}

/// Link speed when neither the provider nor sysfs tells (NCCL's socket default).
const DEFAULT_SPEED_MBPS: i32 = 10_000;

fn sysfs_speed(name: &str) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{name}/speed")).ok()?;
    s.trim().parse::<i32>().ok().filter(|v| *v > 0)
}

fn guid(provider: &str, name: &str) -> u64 {
    format!("{provider}/{name}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

impl OfiNet {
    /// The opened device `dev`, opening its endpoint on first use.
    fn device(&self, dev: usize) -> Result<Arc<Device>> {
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        let slot = opened
            .get_mut(dev)
            .ok_or_else(|| Error::invalid_argument(format!("NET/OFI: no device {dev}")))?;
        if let Some(d) = slot {
            return Ok(Arc::clone(d));
        }
        let desc = &self.descs[dev];
        // Bundles copy on the host: never on a device NCCL may hand GPU memory
        // (so every send of a device with bundles is host memory).
        // Writes likewise (their targets are host registrations).
        let (bundles, writes) = if self.gpu_direct(desc) {
            (0, None)
        } else {
            (
                self.cfg.bundle_bytes_for(&self.provider),
                self.cfg.write_range_for(&self.provider),
            )
        };
        let d = Device::open(dev, &self.provider, desc, &self.cfg, bundles, writes)?;
        *slot = Some(Arc::clone(&d));
        Ok(d)
    }

    fn gpu_direct(&self, desc: &DeviceDesc) -> bool {
        desc.hmem && self.cuda.is_some()
    }

    fn dmabuf(&self, desc: &DeviceDesc) -> bool {
        // FI_MR_DMABUF exists from libfabric 1.20 on, in the headers built against
        // and in the library loaded.
        self.gpu_direct(desc) && dmabuf_built() && runtime_version() >= (1, 20)
    }

    fn mem_iface(&self, dev: &Device, region: &MemRegion) -> Result<MemIface> {
        if region.kind == ptr::HOST {
            return Ok(MemIface::System);
        }
        let desc = &self.descs[dev.index];
        match (&self.cuda, region.kind) {
            (Some(c), ptr::CUDA) if desc.hmem => Ok(MemIface::Cuda(c.device_of(region.addr)?)),
            _ => Err(Error::internal(format!(
                "NET/OFI regMr: memory type {} is not supported on {} ({} has {}FI_HMEM, CUDA driver {})",
                region.kind,
                dev.name,
                self.provider,
                if desc.hmem { "" } else { "no " },
                if self.cuda.is_some() {
                    "present"
                } else {
                    "absent"
                }
            ))),
        }
    }
}

fn comm_dev<'a>(comm: &'a CommRef<'_, OfiNet>) -> &'a Arc<Device> {
    match comm {
        CommRef::Send(s) => &s.dev,
        CommRef::Recv(r) => &r.dev,
    }
}

impl Net for OfiNet {
    const NAME: &'static CStr = c"cclkit-ofi";
    const SUPPORTS_DMABUF: bool = true;

    type Context = ();
    type ListenComm = Listen;
    type SendComm = SendComm;
    type RecvComm = RecvComm;
    type Mr = OfiMr;
    type Request = Box<Request>;

    fn init(args: &InitArgs) -> Result<Self> {
        let cfg = Config::from_env()?;
        let disc = discover(&cfg)?;
        let cuda = if cfg.gdr && disc.devices.iter().any(|d| d.hmem) {
            Cuda::load()
        } else {
            None
        };
        let (major, minor) = runtime_version();
        nccl_info!(
            subsys::NET | subsys::INIT,
            "NET/OFI: libfabric {major}.{minor}, provider {}, {} device(s), host ABI v{}, maxRecvs {}, \
             liveness {} ms, MR cache {}, CUDA {}",
            disc.provider,
            disc.devices.len(),
            args.host_abi,
            cfg.max_recvs,
            cfg.liveness_ms,
            if cfg.mr_cache { "on" } else { "off" },
            if cuda.is_some() { "found" } else { "not used" }
        );
        let n = disc.devices.len();
        Ok(Self {
            cfg,
            provider: disc.provider,
            descs: disc.devices,
            opened: Mutex::new(vec![None; n]),
            cuda,
        })
    }

    fn devices(&self) -> usize {
        self.descs.len()
    }

    fn properties(&self, dev: usize) -> Result<Properties> {
        let d = self
            .descs
            .get(dev)
            .ok_or_else(|| Error::invalid_argument(format!("NET/OFI: no device {dev}")))?;
        let mut ptr_support = ptr::HOST;
        if self.gpu_direct(d) {
            ptr_support |= ptr::CUDA;
        }
        if self.dmabuf(d) {
            ptr_support |= ptr::DMABUF;
        }
        Ok(Properties {
            name: d.name.clone(),
            pci_path: d.pci_path.clone(),
            guid: guid(&self.provider, &d.name),
            ptr_support,
            reg_is_global: true,
            speed_mbps: d
                .speed_mbps
                .or_else(|| sysfs_speed(&d.name))
                .unwrap_or(DEFAULT_SPEED_MBPS),
            max_comms: i32::from(u16::MAX),
            max_recvs: self.cfg.max_recvs as i32,
            max_p2p_bytes: d.max_msg_size.clamp(1, NCCL_MAX_NET_SIZE_BYTES),
            max_coll_bytes: d.max_msg_size.clamp(1, MAX_COLLNET_SIZE),
            ..Properties::host(d.name.clone())
        })
    }

    fn open_context(&self, _comm_id: u64, _config: CommConfig) -> Result<()> {
        Ok(())
    }

    fn listen(&self, _ctx: &(), dev: usize, handle: &mut NetHandle) -> Result<Listen> {
        comm::listen(&self.device(dev)?, handle)
    }

    fn connect(&self, _ctx: &(), dev: usize, handle: &mut NetHandle) -> Result<Option<SendComm>> {
        comm::connect(&self.device(dev)?, handle)
    }

    fn accept(&self, listen: &mut Listen) -> Result<Option<RecvComm>> {
        comm::accept(listen)
    }

    fn reg_mr(&self, comm: CommRef<'_, Self>, region: MemRegion) -> Result<OfiMr> {
        let dev = Arc::clone(comm_dev(&comm));
        let iface = self.mem_iface(&dev, &region)?;
        let mut e = dev.lock();
        let eng = &mut *e;
        // SAFETY: NCCL keeps the region allocated until deregMr.
        let r = unsafe {
            eng.mrs
                .acquire(&eng.domain, &eng.ep, region.addr, region.len, iface)?
        };
        drop(e);
        Ok(OfiMr { dev, r })
    }

    fn reg_mr_dmabuf(
        &self,
        comm: CommRef<'_, Self>,
        region: MemRegion,
        offset: u64,
        fd: i32,
    ) -> Result<OfiMr> {
        let dev = Arc::clone(comm_dev(&comm));
        if !self.dmabuf(&self.descs[dev.index]) {
            return Err(Error::unsupported(
                "NET/OFI regMrDmaBuf (needs FI_HMEM, the CUDA driver and libfabric >= 1.20)",
            ));
        }
        let iface = self.mem_iface(&dev, &region)?;
        let mut e = dev.lock();
        let eng = &mut *e;
        // SAFETY: NCCL keeps the dma-buf open until deregMr.
        let r = unsafe {
            eng.mrs.acquire_dmabuf(
                &eng.domain,
                &eng.ep,
                fd,
                offset,
                region.addr,
                region.len,
                iface,
            )?
        };
        drop(e);
        Ok(OfiMr { dev, r })
    }

    fn isend(
        &self,
        comm: &mut SendComm,
        buf: Buf,
        tag: i32,
        mr: Option<&OfiMr>,
    ) -> Result<Option<Box<Request>>> {
        data::isend(comm, buf, tag, mr)
    }

    fn irecv(
        &self,
        comm: &mut RecvComm,
        bufs: &[RecvBuf<'_, OfiMr>],
        _optional_completion: bool,
    ) -> Result<Option<Box<Request>>> {
        data::irecv(comm, bufs)
    }

    fn isend_profiled(
        &self,
        comm: &mut SendComm,
        buf: Buf,
        tag: i32,
        mr: Option<&OfiMr>,
        profiler: RequestProfiler,
    ) -> Result<Option<Box<Request>>> {
        let len = buf.len();
        let mut req = data::isend(comm, buf, tag, mr)?;
        if let Some(r) = req.as_mut() {
            start_event(r, profiler, prof::OP_SEND, len);
        }
        Ok(req)
    }

    fn irecv_profiled(
        &self,
        comm: &mut RecvComm,
        bufs: &[RecvBuf<'_, OfiMr>],
        _optional_completion: bool,
        profiler: RequestProfiler,
    ) -> Result<Option<Box<Request>>> {
        let len = bufs.iter().map(|b| b.buf.len()).sum();
        let mut req = data::irecv(comm, bufs)?;
        if let Some(r) = req.as_mut() {
            start_event(r, profiler, prof::OP_RECV, len);
        }
        Ok(req)
    }

    fn test(request: &mut Box<Request>, sizes: &mut Sizes<'_>) -> Result<bool> {
        data::test(request, sizes)
    }
}

/// Starts a posted request's profiler event (no engine look-up without one).
fn start_event(r: &mut Request, profiler: RequestProfiler, op: i32, len: usize) {
    if !profiler.is_enabled() {
        return;
    }
    let backlogged = r.waits_in_backlog();
    r.prof = prof::ReqEvent::start(profiler, r.conn(), op, len, backlogged);
}
