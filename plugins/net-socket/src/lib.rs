//! `cclkit-socket`: a TCP net plugin for NCCL/RCCL, host memory only.
//!
//! Built as `libnccl-net-cclkit-socket.so` (and the RCCL name) it is found with
//! `NCCL_NET_PLUGIN=cclkit-socket`; as an rlib it is `cclkit`'s built-in fallback.
//!
//! Compared with NCCL's built-in Socket transport:
//! * several TCP streams per comm, moved by helper threads the comm owns (counts
//!   from `NCCL_SOCKET_NTHREADS`/`NCCL_NSOCKS_PERTHREAD`, else chosen from the
//!   interface); large messages are striped over them, small ones ride on the
//!   control stream with their header, written and read by the proxy thread,
//!   several per system call (`isend` queues, `test` writes every queued message
//!   with one `sendmsg`; the receiver reads ahead and parses many headers per `recv`);
//! * per-stream state machines on both sides: a partial header or payload is kept,
//!   never lost (NCCL's inline path can desynchronise, NCCL_ABI.md §5.1);
//! * grouped receives (`maxRecvs` up to 8) with clear-to-send records, matched by
//!   tag as NCCL's IB transport does;
//! * every connection must present the listen's random magic; a message larger
//!   than its receive, or a peer that dies, fails the request with a message
//!   naming the peer, and closing a comm joins its threads and closes its sockets.
//!
//! Modules: [`config`] (environment), [`iface`] (devices), [`wire`] (bytes on the
//! wire), `connect`/`listen` (connection setup), `send`/`recv` (control streams),
//! `worker` (helper threads), `comm` (shared state), `slots` (requests).
// A panic on a path NCCL can reach would only become an internal error at the C
// edge; return a described error instead. Tests may unwrap.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

use std::ffi::CStr;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};

use cclkit_abi::net::{
    Buf, CommConfig, CommRef, InitArgs, MemRegion, Net, NetHandle, Properties, RecvBuf, Sizes,
};
use cclkit_abi::profiler::net::RequestProfiler;
use cclkit_abi::raw::common::{ptr, subsys};
use cclkit_abi::raw::net::{MAX_COLLNET_SIZE, MAX_NET_SIZE, NCCL_NET_MAX_REQUESTS};
use cclkit_abi::{Error, Result, export_net, nccl_info, nccl_warn};

#[cfg(test)]
mod batch_tests;
mod comm;
pub mod config;
mod connect;
pub mod iface;
mod listen;
mod prof;
mod recv;
mod send;
mod slots;
mod sys;
pub mod wire;
mod worker;

use comm::{Comm, Control, Dir, Health, Parts};
use config::Config;
use connect::Connecting;
use iface::Device;
use listen::Listen;
/// The speed `getProperties` reports for a link whose speed the kernel does not
/// know (a VM's virtio NIC, `lo`): NCCL's socket transport assumes the same.
const UNKNOWN_SPEED_MBPS: i32 = 10_000;
use recv::RecvCtl;
use send::SendCtl;
use slots::{Outcome, Request};
use wire::HandleInfo;

/// A device and the streams its comms use.
#[derive(Debug, Clone)]
struct Nic {
    dev: Device,
    /// Helper threads per comm.
    threads: usize,
    /// Data streams per comm (threads × sockets per thread).
    streams: usize,
}

/// The plugin: the configuration and the usable interfaces.
pub struct SocketNet {
    cfg: Config,
    nics: Vec<Nic>,
}

/// A listening endpoint: the socket, the magic, and what the comm will be made of.
pub struct ListenComm {
    inner: Listen,
    threads: usize,
    max_recvs: usize,
}

impl SocketNet {
    fn nic(&self, dev: usize) -> Result<&Nic> {
        self.nics.get(dev).ok_or_else(|| {
            Error::invalid_argument(format!(
                "device {dev} out of range ({} devices)",
                self.nics.len()
            ))
        })
    }
}

fn streams_for(cfg: &Config, dev: &Device) -> (usize, usize) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (auto_threads, auto_socks) = iface::auto_streams(dev, cpus);
    let threads = cfg.nthreads.unwrap_or(auto_threads);
    let socks = cfg.socks_per_thread.unwrap_or(auto_socks);
    let streams = (threads * socks).min(wire::MAX_STREAMS);
    (threads, streams)
}

impl Net for SocketNet {
    const NAME: &'static CStr = c"cclkit-socket";
    type Context = ();
    type ListenComm = ListenComm;
    type SendComm = Comm;
    type RecvComm = Comm;
    type Mr = ();
    type Request = Request;

    fn init(_args: &InitArgs) -> Result<Self> {
        let (cfg, warnings) = Config::from_env()?;
        for w in warnings {
            nccl_warn!("{w}");
        }
        let devices = iface::discover(cfg.ifname.as_deref(), cfg.family)?;
        if devices.is_empty() {
            return Err(Error::system(format!(
                "cclkit-socket: no usable IP interface (NCCL_SOCKET_IFNAME={}, \
                 NCCL_SOCKET_FAMILY={:?})",
                cfg.ifname.as_deref().unwrap_or("unset"),
                cfg.family
            )));
        }
        let nics: Vec<Nic> = devices
            .into_iter()
            .map(|dev| {
                let (threads, streams) = streams_for(&cfg, &dev);
                Nic {
                    dev,
                    threads,
                    streams,
                }
            })
            .collect();
        nccl_info!(subsys::NET | subsys::INIT, "cclkit-socket: {cfg}");
        for (i, n) in nics.iter().enumerate() {
            nccl_info!(
                subsys::NET | subsys::INIT,
                "cclkit-socket: dev {i} {} {} speed {}, {} helper threads, {} data streams \
                 per comm",
                n.dev.name,
                n.dev.addr,
                n.dev.speed_mbps.map_or_else(
                    || format!("unknown (reported as {UNKNOWN_SPEED_MBPS} Mb/s, as NCCL does)"),
                    |s| format!("{s} Mb/s")
                ),
                n.threads,
                n.streams
            );
        }
        Ok(Self { cfg, nics })
    }

    fn devices(&self) -> usize {
        self.nics.len()
    }

    fn properties(&self, dev: usize) -> Result<Properties> {
        let n = self.nic(dev)?;
        Ok(Properties {
            pci_path: n.dev.pci_path.clone(),
            guid: dev as u64,
            speed_mbps: n
                .dev
                .speed_mbps
                .map_or(UNKNOWN_SPEED_MBPS, |s| i32::try_from(s).unwrap_or(i32::MAX)),
            max_recvs: self.cfg.max_recvs as i32,
            // `test` reports sizes as int: keep every transfer well below 2 GiB.
            max_p2p_bytes: MAX_NET_SIZE,
            max_coll_bytes: MAX_COLLNET_SIZE,
            ..Properties::host(n.dev.name.clone())
        })
    }

    fn open_context(&self, _comm_id: u64, _config: CommConfig) -> Result<()> {
        Ok(())
    }

    fn listen(&self, _ctx: &(), dev: usize, handle: &mut NetHandle) -> Result<ListenComm> {
        let n = self.nic(dev)?;
        let bind = match n.dev.addr {
            IpAddr::V4(a) => SocketAddr::new(IpAddr::V4(a), 0),
            IpAddr::V6(a) => SocketAddr::V6(SocketAddrV6::new(a, 0, 0, n.dev.scope_id)),
        };
        let magic = cclkit_abi::sock::random_u64().map_err(|e| Error::io("getrandom", e))?;
        let inner = Listen::bind(bind, magic, 1 + n.streams, self.cfg.connect_timeout)?;
        HandleInfo {
            magic,
            addr: inner.local_addr()?,
            nstreams: n.streams,
            max_recvs: self.cfg.max_recvs,
        }
        .write(handle);
        Ok(ListenComm {
            inner,
            threads: n.threads,
            max_recvs: self.cfg.max_recvs,
        })
    }

    fn connect(&self, _ctx: &(), dev: usize, handle: &mut NetHandle) -> Result<Option<Comm>> {
        let n = self.nic(dev)?;
        let mut pending = match handle.take_pending::<Connecting>() {
            Some(p) => p,
            None => Box::new(Connecting::start(
                HandleInfo::read(handle)?,
                self.cfg.connect_timeout,
            )?),
        };
        if !pending.progress()? {
            handle.set_pending(pending);
            return Ok(None);
        }
        let info = pending.info;
        let mut socks = pending.into_sockets().into_iter();
        let control = socks
            .next()
            .ok_or_else(|| Error::internal("connect produced no control socket"))?;
        let lanes: Vec<_> = socks.collect();
        tune(std::iter::once(&control).chain(&lanes))?;
        let slots = NCCL_NET_MAX_REQUESTS * info.max_recvs;
        Comm::start(Parts {
            dir: Dir::Send,
            peer: info.addr.to_string(),
            control: Control::Send(SendCtl::new(
                control,
                self.cfg.inline_bytes,
                self.cfg.min_chunk,
                info.max_recvs > 1,
                slots,
            )),
            lanes,
            threads: n.threads.max(1),
            slots,
        })
        .map(Some)
    }

    fn accept(&self, listen: &mut ListenComm) -> Result<Option<Comm>> {
        let Some(acc) = listen.inner.accept()? else {
            return Ok(None);
        };
        let mut socks = acc.socks.into_iter();
        let control = socks
            .next()
            .ok_or_else(|| Error::internal("accept produced no control socket"))?;
        let lanes: Vec<_> = socks.collect();
        tune(std::iter::once(&control).chain(&lanes))?;
        Comm::start(Parts {
            dir: Dir::Recv,
            peer: acc.peer.to_string(),
            control: Control::Recv(RecvCtl::new(
                control,
                listen.max_recvs,
                NCCL_NET_MAX_REQUESTS,
            )),
            lanes,
            threads: listen.threads.max(1),
            slots: NCCL_NET_MAX_REQUESTS,
        })
        .map(Some)
    }

    fn reg_mr(&self, _comm: CommRef<'_, Self>, region: MemRegion) -> Result<()> {
        if region.kind != ptr::HOST {
            return Err(Error::internal(format!(
                "cclkit-socket moves host memory only (NCCL_PTR_HOST); refusing to register \
                 {} bytes at {:#x} of pointer type {} (NCCL_PTR_CUDA = GPU memory needs a \
                 GPUDirect-capable transport)",
                region.len, region.addr, region.kind
            )));
        }
        Ok(())
    }

    fn isend(
        &self,
        comm: &mut Comm,
        buf: Buf,
        tag: i32,
        _mr: Option<&()>,
    ) -> Result<Option<Request>> {
        send::isend(comm.core(), buf, tag)
    }

    fn irecv(
        &self,
        comm: &mut Comm,
        bufs: &[RecvBuf<'_, ()>],
        _optional_completion: bool,
    ) -> Result<Option<Request>> {
        recv::irecv(comm.core(), bufs)
    }

    fn isend_profiled(
        &self,
        comm: &mut Comm,
        buf: Buf,
        tag: i32,
        _mr: Option<&()>,
        profiler: RequestProfiler,
    ) -> Result<Option<Request>> {
        let len = buf.len();
        let req = send::isend(comm.core(), buf, tag)?;
        if let Some(r) = &req {
            let fd = prof_fd(comm.core());
            r.slot().prof.start(profiler, fd, prof::OP_SEND, len);
        }
        Ok(req)
    }

    fn irecv_profiled(
        &self,
        comm: &mut Comm,
        bufs: &[RecvBuf<'_, ()>],
        _optional_completion: bool,
        profiler: RequestProfiler,
    ) -> Result<Option<Request>> {
        let len = bufs.iter().map(|b| b.buf.len()).sum();
        let req = recv::irecv(comm.core(), bufs)?;
        if let Some(r) = &req {
            let fd = prof_fd(comm.core());
            r.slot().prof.start(profiler, fd, prof::OP_RECV, len);
        }
        Ok(req)
    }

    fn test(request: &mut Request, sizes: &mut Sizes<'_>) -> Result<bool> {
        if let Some(done) = finished(request, sizes)? {
            return Ok(done);
        }
        let core = request.core();
        core.progress();
        if let Some(done) = finished(request, sizes)? {
            return Ok(done);
        }
        match core.health() {
            Health::Ok | Health::Failing => Ok(false),
            Health::Failed(message) => Err(Error::remote(message)),
        }
    }
}

/// `Some(true)` with sizes reported when done, an error when failed, else `None`.
fn finished(request: &Request, sizes: &mut Sizes<'_>) -> Result<Option<bool>> {
    match request.outcome() {
        Outcome::Pending => Ok(None),
        Outcome::Done => {
            for (i, size) in request.sizes().enumerate() {
                sizes.set(i, size)?;
            }
            request.slot().prof.end(request.sizes().sum());
            Ok(Some(true))
        }
        Outcome::Failed(message) => Err(Error::invalid_usage(message)),
    }
}

/// The socket a request's profiler event names: the comm's first data lane.
fn prof_fd(core: &comm::Core) -> i32 {
    use std::os::fd::AsRawFd;
    core.lanes.first().map_or(-1, |l| l.sock.as_raw_fd())
}

/// Socket options of every connection of a comm: no Nagle delay (a message's last
/// segment must not wait for an ACK), and keepalive so a vanished host is noticed.
fn tune<'a>(socks: impl Iterator<Item = &'a std::net::TcpStream>) -> Result<()> {
    for s in socks {
        s.set_nodelay(true)
            .map_err(|e| Error::io("setsockopt(TCP_NODELAY)", e))?;
        sys::set_keepalive(s, 30, 10, 3).map_err(|e| Error::io("setsockopt(SO_KEEPALIVE)", e))?;
    }
    Ok(())
}

export_net!(SocketNet);
