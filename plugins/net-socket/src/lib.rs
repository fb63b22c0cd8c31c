//! TCP socket net plugin for NCCL/RCCL (`cclkit-socket`).
//!
//! Bootstrap version: one TCP stream per comm and one helper thread per direction.
//! The multi-stream data path replaces this; the exported symbols stay the same.
//!
//! Wire format per message: an 8-byte little-endian size, then the payload.

use std::ffi::CStr;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cclkit_abi::net::{
    Buf, CommConfig, CommRef, InitArgs, MemRegion, Net, NetHandle, Properties, RecvBuf, Sizes,
};
use cclkit_abi::raw::common::{ptr, subsys};
use cclkit_abi::{Error, Result, export_net, nccl_info, nccl_warn};

/// The plugin: one device bound to one IP address.
pub struct SocketNet {
    ip: IpAddr,
}

/// Handle payload: [0..8] magic, [8] family (4/6), [9..25] IP, [25..27] port (BE).
fn write_handle(handle: &mut NetHandle, magic: u64, addr: SocketAddr) {
    let p = handle.payload_mut();
    p[0..8].copy_from_slice(&magic.to_le_bytes());
    match addr.ip() {
        IpAddr::V4(v4) => {
            p[8] = 4;
            p[9..13].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            p[8] = 6;
            p[9..25].copy_from_slice(&v6.octets());
        }
    }
    p[25..27].copy_from_slice(&addr.port().to_be_bytes());
}

fn read_handle(handle: &NetHandle) -> Result<(u64, SocketAddr)> {
    let p = handle.payload();
    let magic = u64::from_le_bytes(p[0..8].try_into().map_err(|_| Error::internal("handle"))?);
    let port = u16::from_be_bytes([p[25], p[26]]);
    let ip = match p[8] {
        4 => IpAddr::from(<[u8; 4]>::try_from(&p[9..13]).map_err(|_| Error::internal("handle"))?),
        6 => IpAddr::from(<[u8; 16]>::try_from(&p[9..25]).map_err(|_| Error::internal("handle"))?),
        f => {
            return Err(Error::invalid_argument(format!(
                "bad handle: address family byte {f}"
            )));
        }
    };
    Ok((magic, SocketAddr::new(ip, port)))
}

/// A listening socket and the magic every connection must present.
pub struct Listen {
    listener: TcpListener,
    magic: u64,
}

/// A request's state: 0 pending, `DONE | size` done, `FAILED` failed.
struct ReqState {
    word: AtomicU64,
    error: Mutex<Option<String>>,
}

const DONE: u64 = 1 << 63;
const FAILED: u64 = 1 << 62;

impl ReqState {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            word: AtomicU64::new(0),
            error: Mutex::new(None),
        })
    }
    fn finish(&self, result: std::result::Result<usize, String>) {
        match result {
            Ok(n) => self.word.store(DONE | n as u64, Ordering::Release),
            Err(e) => {
                if let Ok(mut slot) = self.error.lock() {
                    *slot = Some(e);
                }
                self.word.store(FAILED, Ordering::Release);
            }
        }
    }
}

/// An in-flight send or receive.
pub struct Request(Arc<ReqState>);

/// Work for a helper thread: a buffer and where to report.
struct Job {
    buf: Buf,
    state: Arc<ReqState>,
}

/// One direction of a connection: the socket and its helper thread.
pub struct Conn {
    jobs: Option<Sender<Job>>,
    stream: TcpStream,
    worker: Option<JoinHandle<()>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Closing the channel ends the worker's loop; shutting the socket down
        // unblocks it if it waits on the peer. Then nothing of the comm remains.
        self.jobs = None;
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn spawn(stream: &TcpStream, name: &str, work: fn(&mut TcpStream, Receiver<Job>)) -> Result<Conn> {
    let mut io = stream.try_clone().map_err(|e| Error::io("dup socket", e))?;
    let (tx, rx) = channel();
    let worker = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || work(&mut io, rx))
        .map_err(|e| Error::io("spawn helper thread", e))?;
    let stream = stream.try_clone().map_err(|e| Error::io("dup socket", e))?;
    Ok(Conn {
        jobs: Some(tx),
        stream,
        worker: Some(worker),
    })
}

fn send_loop(stream: &mut TcpStream, jobs: Receiver<Job>) {
    for job in jobs {
        // SAFETY: NCCL keeps the buffer valid and untouched until this request completes.
        let data = unsafe { job.buf.as_slice() };
        let result = stream
            .write_all(&(data.len() as u64).to_le_bytes())
            .and_then(|()| stream.write_all(data))
            .map(|()| data.len())
            .map_err(|e| format!("send to peer failed: {e}"));
        let failed = result.is_err();
        job.state.finish(result);
        if failed {
            break;
        }
    }
}

fn recv_loop(stream: &mut TcpStream, jobs: Receiver<Job>) {
    for job in jobs {
        let mut header = [0u8; 8];
        let result = stream
            .read_exact(&mut header)
            .map_err(|e| format!("peer closed or failed: {e}"))
            .and_then(|()| {
                let size = u64::from_le_bytes(header) as usize;
                if size > job.buf.len() {
                    return Err(format!(
                        "message truncated: peer sent {size} bytes, receive posted {}",
                        job.buf.len()
                    ));
                }
                // SAFETY: NCCL keeps the buffer valid and untouched until this request completes.
                let dst = unsafe { job.buf.as_mut_slice() };
                stream
                    .read_exact(&mut dst[..size])
                    .map(|()| size)
                    .map_err(|e| format!("peer failed mid-message: {e}"))
            });
        let failed = result.is_err();
        job.state.finish(result);
        if failed {
            break;
        }
    }
}

/// A connect that is still in progress: the connecting thread reports here.
struct PendingConnect(Receiver<std::io::Result<TcpStream>>);

impl Net for SocketNet {
    const NAME: &'static CStr = c"cclkit-socket";
    type Context = ();
    type ListenComm = Listen;
    type SendComm = Conn;
    type RecvComm = Conn;
    type Mr = ();
    type Request = Box<Request>;

    fn init(_: &InitArgs) -> Result<Self> {
        let ip = match std::env::var("CCLKIT_SOCKET_IP") {
            Ok(s) => s.parse().map_err(|_| {
                Error::invalid_argument(format!("CCLKIT_SOCKET_IP={s} is not an IP address"))
            })?,
            Err(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        nccl_info!(
            subsys::NET | subsys::INIT,
            "cclkit-socket: one device on {ip}"
        );
        Ok(Self { ip })
    }

    fn devices(&self) -> usize {
        1
    }

    fn properties(&self, _dev: usize) -> Result<Properties> {
        Ok(Properties {
            name: format!("socket-{}", self.ip),
            ..Properties::host("cclkit-socket")
        })
    }

    fn open_context(&self, _comm_id: u64, _config: CommConfig) -> Result<()> {
        Ok(())
    }

    fn listen(&self, _: &(), _dev: usize, handle: &mut NetHandle) -> Result<Listen> {
        let listener = TcpListener::bind((self.ip, 0)).map_err(|e| Error::io("bind", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        let magic = random_magic();
        write_handle(
            handle,
            magic,
            listener
                .local_addr()
                .map_err(|e| Error::io("local_addr", e))?,
        );
        Ok(Listen { listener, magic })
    }

    fn connect(&self, _: &(), _dev: usize, handle: &mut NetHandle) -> Result<Option<Conn>> {
        let pending = match handle.take_pending::<PendingConnect>() {
            Some(p) => p,
            None => {
                // First call: connect on a short-lived thread so this call never blocks.
                let (magic, addr) = read_handle(handle)?;
                let (tx, rx) = channel();
                std::thread::spawn(move || {
                    let r = TcpStream::connect_timeout(&addr, Duration::from_secs(30)).and_then(
                        |mut s| {
                            s.set_nodelay(true)?;
                            s.write_all(&magic.to_le_bytes())?;
                            Ok(s)
                        },
                    );
                    let _ = tx.send(r);
                });
                Box::new(PendingConnect(rx))
            }
        };
        match pending.0.try_recv() {
            Ok(Ok(stream)) => Ok(Some(spawn(&stream, "cclkit-sock-send", send_loop)?)),
            Ok(Err(e)) => Err(Error::remote(format!("connect: {e}"))),
            Err(TryRecvError::Empty) => {
                handle.set_pending(pending);
                Ok(None)
            }
            Err(TryRecvError::Disconnected) => Err(Error::internal("connect thread vanished")),
        }
    }

    fn accept(&self, listen: &mut Listen) -> Result<Option<Conn>> {
        let (mut stream, peer) = match listen.listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(Error::io("accept", e)),
        };
        stream
            .set_nonblocking(false)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| Error::io("set_read_timeout", e))?;
        let mut magic = [0u8; 8];
        if stream.read_exact(&mut magic).is_err() || u64::from_le_bytes(magic) != listen.magic {
            nccl_warn!("cclkit-socket: dropped a connection from {peer} without the listen magic");
            return Ok(None);
        }
        stream
            .set_read_timeout(None)
            .map_err(|e| Error::io("set_read_timeout", e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| Error::io("set_nodelay", e))?;
        Ok(Some(spawn(&stream, "cclkit-sock-recv", recv_loop)?))
    }

    fn reg_mr(&self, _comm: CommRef<'_, Self>, region: MemRegion) -> Result<()> {
        if region.kind != ptr::HOST {
            return Err(Error::internal(format!(
                "cclkit-socket registers host memory only (type {})",
                region.kind
            )));
        }
        Ok(())
    }

    fn isend(
        &self,
        comm: &mut Conn,
        buf: Buf,
        _tag: i32,
        _mr: Option<&()>,
    ) -> Result<Option<Box<Request>>> {
        post(comm, buf)
    }

    fn irecv(
        &self,
        comm: &mut Conn,
        bufs: &[RecvBuf<'_, ()>],
        _optional: bool,
    ) -> Result<Option<Box<Request>>> {
        match bufs {
            [one] => post(comm, one.buf),
            _ => Err(Error::invalid_argument(format!(
                "cclkit-socket receives one buffer at a time, got {}",
                bufs.len()
            ))),
        }
    }

    fn test(request: &mut Box<Request>, sizes: &mut Sizes<'_>) -> Result<bool> {
        let word = request.0.word.load(Ordering::Acquire);
        if word & FAILED != 0 {
            let msg = request
                .0
                .error
                .lock()
                .ok()
                .and_then(|e| e.clone())
                .unwrap_or_default();
            return Err(Error::remote(msg));
        }
        if word & DONE == 0 {
            return Ok(false);
        }
        sizes.set(0, (word & !DONE) as usize)?;
        Ok(true)
    }
}

fn post(comm: &mut Conn, buf: Buf) -> Result<Option<Box<Request>>> {
    let state = ReqState::new();
    let jobs = comm
        .jobs
        .as_ref()
        .ok_or_else(|| Error::invalid_usage("connection closed"))?;
    jobs.send(Job {
        buf,
        state: Arc::clone(&state),
    })
    .map_err(|_| Error::remote("connection failed earlier; no more transfers"))?;
    Ok(Some(Box::new(Request(state))))
}

fn random_magic() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

export_net!(SocketNet);
