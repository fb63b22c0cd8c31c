//! The `Net` implementation: devices, comms, registrations and requests, over any
//! [`Backend`] (libibverbs in the shipped plugin, the fake NIC in unit tests).

use std::ffi::CStr;
use std::net::{IpAddr, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use cclkit_abi::net::{
    Buf, CommConfig, CommRef, InitArgs, MemRegion, Net, NetHandle, Properties, RecvBuf, Sizes,
};
use cclkit_abi::profiler::net::RequestProfiler;
use cclkit_abi::raw::common::{ptr, subsys};
use cclkit_abi::{Error, Result, nccl_info};

use crate::config::Config;
use crate::conn::setup::{Connecting, Listener};
use crate::conn::sock::{interfaces, pick_address};
use crate::nic::{Link, Nic, WriteOrder};
use crate::proto::endpoint::{AcceptOpts, ConnectOpts, sender_link};
use crate::proto::mr_cache::{CacheEntry, MrCache};
use crate::proto::plan::SendOpts;
use crate::proto::recv::{Receiver, RecvTarget};
use crate::proto::request::{ReqCell, State};
use crate::proto::send::{SendBuf, Sender};
use crate::proto::{MAX_DEVS, MAX_MESSAGE};
use crate::vdev::{MAX_VDEVS, PhysInfo, VDev, fuse};

mod regs;

/// Where devices come from.
pub trait Backend: Send + Sync + 'static {
    /// The NIC type.
    type Nic: Nic;
    /// Finds the usable ports; an error (with the reason) when there is none.
    fn discover(cfg: &Config) -> Result<Vec<(Self::Nic, Properties)>>;
}

/// The shipped backend: libibverbs, opened at run time.
pub struct Verbs;

impl Backend for Verbs {
    type Nic = crate::verbs::nic::VerbsNic;

    fn discover(cfg: &Config) -> Result<Vec<(Self::Nic, Properties)>> {
        Ok(crate::verbs::device::discover(cfg)?
            .into_iter()
            .map(|f| (f.nic, f.props))
            .collect())
    }
}

struct Device<N: Nic> {
    nic: Arc<N>,
    props: Properties,
    cache: Mutex<MrCache<N::Mr>>,
}

/// The plugin over backend `B`.
pub struct IbNet<B: Backend> {
    cfg: Config,
    /// Physical ports.
    devices: Vec<Device<B::Nic>>,
    /// What NCCL sees as devices: one per port, then those `makeVDevice` appended.
    vdevs: RwLock<Vec<VDev>>,
    listen_ip: IpAddr,
}

/// A communicator's context: the traffic class and SL its connections announce.
pub struct CommCtx {
    link: Link,
}

/// A listening endpoint.
pub struct IbListen<N: Nic> {
    dev: usize,
    inner: Listener<N>,
}

#[cfg(test)]
impl<N: Nic> IbListen<N> {
    /// Accepts in progress.
    pub(crate) fn inner_in_progress(&self) -> usize {
        self.inner.in_progress()
    }
}

/// The sending side of a connection.
pub struct IbSend<N: Nic> {
    dev: usize,
    inner: Arc<Mutex<Sender<N>>>,
    _side_channel: TcpStream,
}

/// The receiving side of a connection.
pub struct IbRecv<N: Nic> {
    dev: usize,
    inner: Arc<Mutex<Receiver<N>>>,
    _side_channel: TcpStream,
}

/// A registration handed to NCCL: one cached NIC registration per physical port of
/// the (virtual) device (none for an empty buffer, which needs no key), as NCCL's
/// `mrs[]`.
pub struct IbMr<M> {
    dev: usize,
    kind: i32,
    /// (physical port, its registration), in the virtual device's order.
    entries: Vec<(usize, Arc<CacheEntry<M>>)>,
}

enum Side<N: Nic> {
    Send(Arc<Mutex<Sender<N>>>),
    Recv(Arc<Mutex<Receiver<N>>>),
}

/// An in-flight send, receive or flush.
pub struct IbRequest<N: Nic> {
    cell: Arc<ReqCell>,
    side: Side<N>,
}

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::internal("NET/cclkit-ib: comm state poisoned by an earlier panic"))
}

impl<B: Backend> IbNet<B> {
    /// The plugin over given devices (what `init` builds after discovery).
    pub fn from_parts(cfg: Config, found: Vec<(B::Nic, Properties)>, listen_ip: IpAddr) -> Self {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let devices: Vec<Device<B::Nic>> = found
            .into_iter()
            .map(|(nic, props)| Device {
                nic: Arc::new(nic),
                props,
                cache: Mutex::new(MrCache::new(page)),
            })
            .collect();
        let vdevs = devices
            .iter()
            .enumerate()
            .map(|(i, d)| VDev::physical(i, d.props.clone()))
            .collect();
        Self {
            cfg,
            devices,
            vdevs: RwLock::new(vdevs),
            listen_ip,
        }
    }

    /// Virtual device `dev` (NCCL's device index).
    fn vdev(&self, dev: usize) -> Result<VDev> {
        self.vdevs
            .read()
            .map_err(|_| Error::internal("NET/cclkit-ib: device list poisoned"))?
            .get(dev)
            .cloned()
            .ok_or_else(|| Error::invalid_argument(format!("device {dev} out of range")))
    }

    /// The NICs of virtual device `v`, in its order.
    fn nics(&self, v: &VDev) -> Vec<Arc<B::Nic>> {
        v.devs
            .iter()
            .map(|&d| Arc::clone(&self.devices[d].nic))
            .collect()
    }

    /// NCCL's `flushEnabled`: GPUDirect possible (peer memory or dma-buf) and
    /// `NCCL_GDR_FLUSH_DISABLE` unset.
    fn flush_enabled(&self, props: &Properties) -> bool {
        !self.cfg.gdr_flush_disable && props.ptr_support & (ptr::CUDA | ptr::DMABUF) != 0
    }

    fn comm_dev(comm: &CommRef<'_, Self>) -> usize {
        match comm {
            CommRef::Send(s) => s.dev,
            CommRef::Recv(r) => r.dev,
        }
    }

    /// GPU memory through `regMr` needs peer memory (NCCL_PTR_CUDA); through
    /// `regMrDmaBuf` it needs dma-buf (NCCL_PTR_DMABUF).
    fn check_kind(&self, dev: &Properties, kind: i32, dmabuf: bool) -> Result<()> {
        let need = if dmabuf { ptr::DMABUF } else { ptr::CUDA };
        match kind {
            ptr::HOST => Ok(()),
            ptr::CUDA if dev.ptr_support & need != 0 => Ok(()),
            ptr::CUDA if dmabuf => Err(Error::internal(format!(
                "NET/cclkit-ib: {} cannot register GPU memory through dma-buf \
                 (the dma-buf probe failed)",
                dev.name
            ))),
            ptr::CUDA => Err(Error::internal(format!(
                "NET/cclkit-ib: {} cannot register GPU memory with ibv_reg_mr: no peer-memory \
                 module (nvidia_peermem); NCCL should use regMrDmaBuf or host staging",
                dev.name
            ))),
            k => Err(Error::invalid_argument(format!(
                "regMr: unknown pointer type {k}"
            ))),
        }
    }
}

type MrOf<B> = IbMr<<<B as Backend>::Nic as Nic>::Mr>;

impl<B: Backend> Net for IbNet<B> {
    const NAME: &'static CStr = c"cclkit-ib";
    const SUPPORTS_DMABUF: bool = true;
    const HAS_MAKE_VDEVICE: bool = true;

    type Context = CommCtx;
    type ListenComm = IbListen<B::Nic>;
    type SendComm = IbSend<B::Nic>;
    type RecvComm = IbRecv<B::Nic>;
    type Mr = MrOf<B>;
    type Request = Box<IbRequest<B::Nic>>;

    fn init(_args: &InitArgs) -> Result<Self> {
        let cfg = Config::from_env();
        if cfg.disable {
            return Err(Error::internal(
                "NET/cclkit-ib: disabled by NCCL_IB_DISABLE=1",
            ));
        }
        let found = B::discover(&cfg)?;
        let (ifname, ip) = pick_address(&interfaces(), &cfg.socket_ifname, cfg.socket_family)
            .ok_or_else(|| {
                Error::system(format!(
                    "NET/cclkit-ib: no network interface for the TCP side channel \
                     (NCCL_SOCKET_IFNAME={})",
                    cfg.socket_ifname
                ))
            })?;
        nccl_info!(
            subsys::NET | subsys::INIT,
            "NET/cclkit-ib: {} device(s) [{}], side channel on {ifname} ({ip}); {cfg}",
            found.len(),
            found
                .iter()
                .map(|(_, p)| format!("{}:{}", p.name, p.port))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(Self::from_parts(cfg, found, ip))
    }

    fn devices(&self) -> usize {
        self.vdevs.read().map_or(0, |v| v.len())
    }

    fn properties(&self, dev: usize) -> Result<Properties> {
        Ok(self.vdev(dev)?.props)
    }

    fn open_context(&self, _comm_id: u64, config: CommConfig) -> Result<CommCtx> {
        let comm_tc = match config.traffic_class {
            Some(tc) => Some(u8::try_from(tc).map_err(|_| {
                Error::invalid_argument(format!("trafficClass {tc} outside 0..=255"))
            })?),
            None => None,
        };
        Ok(CommCtx {
            link: sender_link(self.cfg.traffic_class, self.cfg.sl, comm_tc),
        })
    }

    /// NCCL's `ncclIbMakeVDevice`: appends a virtual device fusing `devs` (see
    /// [`crate::vdev`]); refused with `NCCL_IB_MERGE_NICS=0` or mixed link layers.
    fn make_vdevice(&self, devs: &[usize]) -> Result<usize> {
        let phys: Vec<PhysInfo<'_>> = self
            .devices
            .iter()
            .map(|d| PhysInfo {
                props: &d.props,
                link_layer: d.nic.port_addr().link_layer,
            })
            .collect();
        let v = fuse(self.cfg.merge_nics, devs, &phys)?;
        let mut all = self
            .vdevs
            .write()
            .map_err(|_| Error::internal("NET/cclkit-ib: device list poisoned"))?;
        if all.len() >= MAX_VDEVS {
            return Err(Error::invalid_usage(format!(
                "NET/cclkit-ib: cannot allocate any more virtual devices ({MAX_VDEVS})"
            )));
        }
        nccl_info!(
            subsys::NET,
            "NET/cclkit-ib: made virtual device [{}] name={} speed={} ndevs={}",
            all.len(),
            v.props.name,
            v.props.speed_mbps,
            v.devs.len()
        );
        all.push(v);
        Ok(all.len() - 1)
    }

    fn listen(
        &self,
        ctx: &CommCtx,
        dev: usize,
        handle: &mut NetHandle,
    ) -> Result<Self::ListenComm> {
        let v = self.vdev(dev)?;
        let _ = ctx;
        let opts = AcceptOpts {
            flush: self.flush_enabled(&v.props),
            fifo_tc: self.cfg.fifo_tc,
            inline: self.cfg.use_inline,
            ooo_rq: self.cfg.ooo_rq,
        };
        let inner = Listener::new(self.nics(&v), self.listen_ip, opts, handle)?;
        Ok(IbListen { dev, inner })
    }

    fn connect(
        &self,
        ctx: &CommCtx,
        dev: usize,
        handle: &mut NetHandle,
    ) -> Result<Option<Self::SendComm>> {
        let mut state = match handle.take_pending::<Connecting<B::Nic>>() {
            Some(s) => s,
            None => Box::new(Connecting::start(
                self.nics(&self.vdev(dev)?),
                handle,
                ConnectOpts {
                    nqps: self.cfg.qps_per_connection,
                    link: ctx.link,
                    ece: self.cfg.ece_enable,
                    ooo_rq: self.cfg.ooo_rq,
                    send: SendOpts {
                        split: self.cfg.split_data_on_qps,
                        // The NIC's setting and the negotiated OOO RQ, at connect.
                        ar: false,
                        ar_threshold: self.cfg.ar_threshold,
                        ooo: false,
                    },
                },
            )?),
        };
        match state.step()? {
            Some((sender, side)) => Ok(Some(IbSend {
                dev,
                inner: Arc::new(Mutex::new(sender)),
                _side_channel: side,
            })),
            None => {
                handle.set_pending(state);
                Ok(None)
            }
        }
    }

    fn accept(&self, listen: &mut Self::ListenComm) -> Result<Option<Self::RecvComm>> {
        Ok(listen.inner.accept()?.map(|(receiver, side)| IbRecv {
            dev: listen.dev,
            inner: Arc::new(Mutex::new(receiver)),
            _side_channel: side,
        }))
    }

    fn reg_mr(&self, comm: CommRef<'_, Self>, region: MemRegion) -> Result<Self::Mr> {
        let dev = Self::comm_dev(&comm);
        self.check_kind(&self.vdev(dev)?.props, region.kind, false)?;
        self.register(dev, region, |nic, start, len| {
            // SAFETY: NCCL keeps the buffer allocated until deregMr, and the cache
            // drops this registration at the last deregMr covering it; the pages
            // around the buffer belong to the same allocation's mappings.
            unsafe { nic.reg_mr(start, len, WriteOrder::Relaxed) }
        })
    }

    fn reg_mr_dmabuf(
        &self,
        comm: CommRef<'_, Self>,
        region: MemRegion,
        offset: u64,
        fd: i32,
    ) -> Result<Self::Mr> {
        let dev = Self::comm_dev(&comm);
        let props = self.vdev(dev)?.props;
        if props.ptr_support & ptr::DMABUF == 0 {
            return Err(Error::internal(format!(
                "NET/cclkit-ib: {} does not support dma-buf registration",
                props.name
            )));
        }
        self.check_kind(&props, region.kind, true)?;
        // Like NCCL: the page-aligned range is the iova, the offset is the caller's.
        self.register(dev, region, |nic, start, len| {
            nic.reg_mr_dmabuf(start, len, offset, fd)
        })
    }

    fn dereg_mr(&self, comm: CommRef<'_, Self>, mr: Self::Mr) -> Result<()> {
        let _ = comm;
        self.release(mr)
    }

    fn isend(
        &self,
        comm: &mut Self::SendComm,
        buf: Buf,
        tag: i32,
        mr: Option<&Self::Mr>,
    ) -> Result<Option<Self::Request>> {
        self.isend_profiled(comm, buf, tag, mr, RequestProfiler::none())
    }

    /// Reports one QP event per QP the send uses ([`crate::proto::prof`]).
    fn isend_profiled(
        &self,
        comm: &mut Self::SendComm,
        buf: Buf,
        tag: i32,
        mr: Option<&Self::Mr>,
        profiler: RequestProfiler,
    ) -> Result<Option<Self::Request>> {
        if buf.len() > MAX_MESSAGE {
            return Err(Error::invalid_argument(format!(
                "isend of {} bytes exceeds maxP2pBytes ({MAX_MESSAGE})",
                buf.len()
            )));
        }
        let addr = buf.as_ptr() as usize;
        let lkeys = self
            .covering(comm.dev, mr, addr, buf.len())?
            .map_or([0; MAX_DEVS], |k| k.0);
        let send = SendBuf {
            addr: addr as u64,
            len: buf.len(),
            lkeys,
        };
        let cell = lock(&comm.inner)?.isend_profiled(send, tag, profiler)?;
        Ok(cell.map(|cell| {
            Box::new(IbRequest {
                cell,
                side: Side::Send(Arc::clone(&comm.inner)),
            })
        }))
    }

    fn irecv(
        &self,
        comm: &mut Self::RecvComm,
        bufs: &[RecvBuf<'_, Self::Mr>],
        optional_completion: bool,
    ) -> Result<Option<Self::Request>> {
        self.irecv_profiled(comm, bufs, optional_completion, RequestProfiler::none())
    }

    /// Reports one QP event per QP the receive is posted on ([`crate::proto::prof`]).
    fn irecv_profiled(
        &self,
        comm: &mut Self::RecvComm,
        bufs: &[RecvBuf<'_, Self::Mr>],
        _optional_completion: bool,
        profiler: RequestProfiler,
    ) -> Result<Option<Self::Request>> {
        let mut targets = Vec::with_capacity(bufs.len());
        for b in bufs {
            let addr = b.buf.as_ptr() as usize;
            let rkeys = self
                .covering(comm.dev, b.mr, addr, b.buf.len())?
                .map_or([0; MAX_DEVS], |k| k.1);
            targets.push(RecvTarget {
                addr: addr as u64,
                len: b.buf.len(),
                rkeys,
                tag: b.tag,
            });
        }
        let cell = lock(&comm.inner)?.irecv_profiled(&targets, profiler)?;
        Ok(cell.map(|cell| {
            Box::new(IbRequest {
                cell,
                side: Side::Recv(Arc::clone(&comm.inner)),
            })
        }))
    }

    fn iflush(
        &self,
        comm: &mut Self::RecvComm,
        bufs: &[RecvBuf<'_, Self::Mr>],
    ) -> Result<Option<Self::Request>> {
        // Only GPU memory needs the PCIe-ordering read; NCCL reads from the last
        // non-empty buffer.
        let Some((b, mr)) = bufs
            .iter()
            .rev()
            .filter(|b| !b.buf.is_empty())
            .find_map(|b| b.mr.filter(|m| m.kind == ptr::CUDA).map(|m| (b, m)))
        else {
            return Ok(None);
        };
        let addr = b.buf.as_ptr() as usize;
        let (_, rkeys) = self
            .covering(comm.dev, Some(mr), addr, b.buf.len())?
            .ok_or_else(|| Error::internal("flush without registration"))?;
        let target = (addr as u64, rkeys);
        let cell = lock(&comm.inner)?.iflush(Some(target))?;
        Ok(cell.map(|cell| {
            Box::new(IbRequest {
                cell,
                side: Side::Recv(Arc::clone(&comm.inner)),
            })
        }))
    }

    fn test(request: &mut Self::Request, sizes: &mut Sizes<'_>) -> Result<bool> {
        if request.cell.state() == State::Pending {
            // Errors also fail the request's cell; reported below.
            let _ = match &request.side {
                Side::Send(s) => lock(s)?.progress(),
                Side::Recv(r) => lock(r)?.progress(),
            };
        }
        match request.cell.state() {
            State::Pending => Ok(false),
            State::Done => {
                for i in 0..request.cell.len() {
                    sizes.set(i, request.cell.size(i) as usize)?;
                }
                Ok(true)
            }
            State::Failed => Err(match &request.side {
                Side::Send(s) => lock(s)?.fatal().cloned(),
                Side::Recv(r) => lock(r)?.fatal().cloned(),
            }
            .unwrap_or_else(|| Error::remote("NET/cclkit-ib: request failed"))),
        }
    }
}
