//! A net plugin with no helper thread: all progress happens inside `isend`, `irecv`
//! and `test`, on non-blocking TCP sockets, one connection per comm, host memory only.
//!
//! Copy this crate (or run `cclkit new net NAME --template inline`) to start a
//! transport that polls its hardware from NCCL's proxy thread. Device: one, the
//! address in `CCLKIT_TEMPLATE_IP` (default 127.0.0.1). `export_net!` publishes it
//! as `ncclNetPlugin_v6` … `_v12`.
//!
//! How a request reaches its comm: `test()` is given only the request, so each
//! request carries a `Weak` reference to its connection's [`Link`] (owned by the comm)
//! and the sequence number of its operation. `test()` upgrades it, moves whatever the
//! socket takes or gives without blocking (`Link::progress`), and says whether its
//! own operation has finished. Operations finish in posting order per connection.
//!
//! Requests in flight at close: the comm holds the only strong reference to its
//! `Link`, so `closeSend`/`closeRecv` drop the socket and every queued operation at
//! once. NCCL never tests those requests again; if anything does, the upgrade fails
//! and the test reports "connection closed" instead of touching freed state.
//!
//! Wire format per message: an 8-byte little-endian size, then the payload.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use cclkit_abi::net::{
    Buf, CommConfig, CommRef, InitArgs, MemRegion, Net, NetHandle, Properties, RecvBuf, Sizes,
};
use cclkit_abi::raw::common::{ptr, subsys};
use cclkit_abi::{Error, Result, export_net, nccl_info, nccl_warn};

/// How long `connect` may wait for the TCP handshake. A connect to a listening socket
/// completes in the kernel without the peer calling accept, so this only bounds an
/// unreachable peer; it stays below the time NCCL (and `cclkit check`) allow a call.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The plugin: one device bound to one IP address.
pub struct TemplateNet {
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
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&p[0..8]);
    let port = u16::from_be_bytes([p[25], p[26]]);
    let ip = match p[8] {
        4 => {
            let mut b = [0u8; 4];
            b.copy_from_slice(&p[9..13]);
            IpAddr::from(b)
        }
        6 => {
            let mut b = [0u8; 16];
            b.copy_from_slice(&p[9..25]);
            IpAddr::from(b)
        }
        f => {
            return Err(Error::invalid_argument(format!(
                "bad handle: address family byte {f}"
            )));
        }
    };
    Ok((u64::from_le_bytes(magic), SocketAddr::new(ip, port)))
}

/// A listening socket, the magic every connection must present, and a connection
/// whose magic has not fully arrived yet (accept never waits for it).
pub struct Listen {
    listener: TcpListener,
    magic: u64,
    pending: Option<(TcpStream, [u8; 8], usize)>,
}

/// Which way a connection moves data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Send,
    Recv,
}

/// One posted send or receive, and how far it got.
struct Op {
    seq: u64,
    buf: Buf,
    /// The size header: written (send) or read (receive) so far.
    header: [u8; 8],
    header_done: usize,
    /// Payload bytes moved so far, and the payload size once known.
    moved: usize,
    size: Option<usize>,
    /// `Some` once finished: the size, or why it failed.
    outcome: Option<std::result::Result<usize, String>>,
}

/// A connection's state, owned by its comm and reached by its requests.
pub struct Link {
    stream: TcpStream,
    dir: Dir,
    ops: VecDeque<Op>,
    next_seq: u64,
    /// Set once the socket failed: every later post fails with it.
    failed: Option<String>,
}

/// Either side of a connection: the only strong reference to its [`Link`].
pub struct Conn(Arc<Mutex<Link>>);

/// An in-flight send or receive: where its operation lives, and which one it is.
pub struct Request {
    link: Weak<Mutex<Link>>,
    seq: u64,
}

impl Conn {
    /// Makes `stream` non-blocking and wraps it as a comm.
    fn new(stream: TcpStream, dir: Dir) -> Result<Self> {
        stream
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| Error::io("set_nodelay", e))?;
        Ok(Conn(Arc::new(Mutex::new(Link {
            stream,
            dir,
            ops: VecDeque::new(),
            next_seq: 0,
            failed: None,
        }))))
    }
}

impl Link {
    /// Queues an operation and starts it at once (small messages finish right here).
    fn post(&mut self, buf: Buf, size: Option<usize>) -> Result<u64> {
        if let Some(why) = &self.failed {
            return Err(Error::remote(format!("connection failed earlier: {why}")));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let header = match size {
            Some(n) => (n as u64).to_le_bytes(),
            None => [0; 8],
        };
        self.ops.push_back(Op {
            seq,
            buf,
            header,
            header_done: 0,
            moved: 0,
            size,
            outcome: None,
        });
        self.progress();
        Ok(seq)
    }

    /// Moves bytes for the oldest unfinished operations until the socket would block.
    fn progress(&mut self) {
        while let Some(op) = self.ops.iter_mut().find(|o| o.outcome.is_none()) {
            let step = match self.dir {
                Dir::Send => send_some(&mut self.stream, op),
                Dir::Recv => recv_some(&mut self.stream, op),
            };
            match step {
                Ok(true) => op.outcome = Some(Ok(op.moved)),
                Ok(false) => return,
                Err(why) => {
                    // The byte stream is out of step: nothing after this can succeed.
                    for o in self.ops.iter_mut().filter(|o| o.outcome.is_none()) {
                        o.outcome = Some(Err(why.clone()));
                    }
                    self.failed = Some(why);
                    return;
                }
            }
        }
    }
}

/// Writes what the socket takes; `Ok(true)` when the whole message is out.
fn send_some(stream: &mut TcpStream, op: &mut Op) -> std::result::Result<bool, String> {
    let size = op.size.unwrap_or(0);
    // SAFETY: NCCL keeps the buffer valid and untouched until this request completes,
    // and the request is in flight while its operation is queued.
    let data = unsafe { op.buf.as_slice() };
    while op.header_done < 8 || op.moved < size {
        let chunk = if op.header_done < 8 {
            &op.header[op.header_done..]
        } else {
            &data[op.moved..size]
        };
        match stream.write(chunk) {
            Ok(0) => return Err("peer closed the connection".into()),
            Ok(n) if op.header_done < 8 => op.header_done += n,
            Ok(n) => op.moved += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("send to peer failed: {e}")),
        }
    }
    Ok(true)
}

/// Reads what has arrived; `Ok(true)` when the whole message is in.
fn recv_some(stream: &mut TcpStream, op: &mut Op) -> std::result::Result<bool, String> {
    loop {
        let size = match op.size {
            Some(s) => s,
            None if op.header_done == 8 => {
                let s = u64::from_le_bytes(op.header) as usize;
                if s > op.buf.len() {
                    return Err(format!(
                        "message truncated: peer sent {s} bytes, receive posted {}",
                        op.buf.len()
                    ));
                }
                op.size = Some(s);
                s
            }
            None => 0,
        };
        if op.size.is_some() && op.moved == size {
            return Ok(true);
        }
        let got = if op.size.is_none() {
            stream.read(&mut op.header[op.header_done..])
        } else {
            // SAFETY: NCCL keeps the buffer valid and untouched until this request
            // completes; only this operation writes it.
            let dst = unsafe { op.buf.as_mut_slice() };
            stream.read(&mut dst[op.moved..size])
        };
        match got {
            Ok(0) => return Err("peer closed the connection mid-message".into()),
            Ok(n) if op.size.is_none() => op.header_done += n,
            Ok(n) => op.moved += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("receive from peer failed: {e}")),
        }
    }
}

fn lock(link: &Mutex<Link>) -> std::sync::MutexGuard<'_, Link> {
    // A panic while holding the lock is contained by cclkit-abi; the link's state is
    // still consistent (each field is updated in one step), so keep using it.
    link.lock().unwrap_or_else(|p| p.into_inner())
}

impl Net for TemplateNet {
    const NAME: &'static CStr = c"TemplateInline";
    type Context = ();
    type ListenComm = Listen;
    type SendComm = Conn;
    type RecvComm = Conn;
    type Mr = ();
    type Request = Box<Request>;

    fn init(_: &InitArgs) -> Result<Self> {
        let ip = match std::env::var("CCLKIT_TEMPLATE_IP") {
            Ok(s) => s.parse().map_err(|_| {
                Error::invalid_argument(format!("CCLKIT_TEMPLATE_IP={s} is not an IP address"))
            })?,
            Err(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        nccl_info!(
            subsys::NET | subsys::INIT,
            "template-inline net: one device on {ip}, no helper threads"
        );
        Ok(Self { ip })
    }

    fn devices(&self) -> usize {
        1
    }

    fn properties(&self, _dev: usize) -> Result<Properties> {
        Ok(Properties {
            name: format!("template-inline-{}", self.ip),
            ..Properties::host("template-inline")
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
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("local_addr", e))?;
        write_handle(handle, magic, addr);
        Ok(Listen {
            listener,
            magic,
            pending: None,
        })
    }

    fn connect(&self, _: &(), _dev: usize, handle: &mut NetHandle) -> Result<Option<Conn>> {
        let (magic, addr) = read_handle(handle)?;
        let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
            .map_err(|e| Error::remote(format!("connect to {addr}: {e}")))?;
        // Eight bytes into a fresh socket's empty send buffer never block.
        stream
            .write_all(&magic.to_le_bytes())
            .map_err(|e| Error::remote(format!("connect to {addr}: {e}")))?;
        Conn::new(stream, Dir::Send).map(Some)
    }

    fn accept(&self, listen: &mut Listen) -> Result<Option<Conn>> {
        let (mut stream, mut magic, mut got) = match listen.pending.take() {
            Some(p) => p,
            None => match listen.listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(true)
                        .map_err(|e| Error::io("set_nonblocking", e))?;
                    (s, [0u8; 8], 0)
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(Error::io("accept", e)),
            },
        };
        while got < 8 {
            match stream.read(&mut magic[got..]) {
                Ok(0) => return Ok(None),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    listen.pending = Some((stream, magic, got));
                    return Ok(None);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("reading the connection magic", e)),
            }
        }
        if u64::from_le_bytes(magic) != listen.magic {
            nccl_warn!("template-inline net: dropped a connection without the listen magic");
            return Ok(None);
        }
        Conn::new(stream, Dir::Recv).map(Some)
    }

    fn reg_mr(&self, _comm: CommRef<'_, Self>, region: MemRegion) -> Result<()> {
        if region.kind != ptr::HOST {
            return Err(Error::internal(format!(
                "template-inline net registers host memory only (type {})",
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
        let seq = lock(&comm.0).post(buf, Some(buf.len()))?;
        Ok(Some(Box::new(Request {
            link: Arc::downgrade(&comm.0),
            seq,
        })))
    }

    fn irecv(
        &self,
        comm: &mut Conn,
        bufs: &[RecvBuf<'_, ()>],
        _optional: bool,
    ) -> Result<Option<Box<Request>>> {
        let [one] = bufs else {
            return Err(Error::invalid_argument(format!(
                "template-inline net receives one buffer at a time, got {}",
                bufs.len()
            )));
        };
        let seq = lock(&comm.0).post(one.buf, None)?;
        Ok(Some(Box::new(Request {
            link: Arc::downgrade(&comm.0),
            seq,
        })))
    }

    fn test(request: &mut Box<Request>, sizes: &mut Sizes<'_>) -> Result<bool> {
        let link = request
            .link
            .upgrade()
            .ok_or_else(|| Error::invalid_usage("test() after its connection was closed"))?;
        let mut link = lock(&link);
        link.progress();
        let at = link
            .ops
            .iter()
            .position(|o| o.seq == request.seq)
            .ok_or_else(|| Error::invalid_usage("request already completed"))?;
        let outcome = match &link.ops[at].outcome {
            None => return Ok(false),
            Some(o) => o.clone(),
        };
        link.ops.remove(at);
        let size = outcome.map_err(Error::remote)?;
        sizes.set(0, size)?;
        Ok(true)
    }
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

export_net!(TemplateNet);
