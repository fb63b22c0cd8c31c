//! Concurrent listening: a bootstrap listener (the root's or a rank's) accepts in its
//! own thread and reads each connection's header in a short-lived thread of its own,
//! under [`HEADER_DEADLINE`]. A silent, short or foreign connection therefore costs
//! at most that deadline and one WARN naming the peer, and never holds up the
//! connections behind it; complete frames reach the owner through a channel.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::*;
use crate::error::{Error, Result};

/// How long a new connection may take to deliver its whole header.
pub const HEADER_DEADLINE: Duration = Duration::from_secs(2);
/// Connections whose header is still being read at once; beyond it new connections
/// are dropped at once (a flood costs threads and memory only up to this bound).
pub const MAX_PENDING: usize = 512;
/// Stack of a header-reading thread (it only reads a frame and logs).
const READER_STACK: usize = 256 << 10;

/// A complete frame from a connection that passed the checks.
pub(super) struct Incoming {
    pub(super) frame: Frame,
    pub(super) stream: TcpStream,
    pub(super) peer: SocketAddr,
}

/// State shared by the accepting thread and the header readers.
struct Shared {
    stop: AtomicBool,
    pending: AtomicUsize,
    strays: AtomicU64,
    who: String,
    magic: u64,
    kind: Kind,
    payload_timeout: Duration,
}

/// A listener whose connections are read concurrently (see the module docs).
pub(super) struct Listener {
    addr: SocketAddr,
    shared: Arc<Shared>,
    rx: Mutex<mpsc::Receiver<Incoming>>,
}

impl Listener {
    /// Serves `l`, passing on frames of `kind` with `magic`; `who` names the owner in
    /// logs; a payload must arrive within `payload_timeout` after its header.
    pub(super) fn start(
        l: TcpListener,
        who: String,
        magic: u64,
        kind: Kind,
        payload_timeout: Duration,
    ) -> Result<Self> {
        let addr = l.local_addr().map_err(|e| Error::from_io(&who, e))?;
        l.set_nonblocking(false)
            .map_err(|e| Error::from_io(&who, e))?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            strays: AtomicU64::new(0),
            who,
            magic,
            kind,
            payload_timeout,
        });
        let (tx, rx) = mpsc::channel();
        let s = shared.clone();
        std::thread::Builder::new()
            .name("cclkit-bootstrap-accept".into())
            .spawn(move || accept_loop(l, s, tx))
            .map_err(|e| Error::system(format!("{}: spawn: {e}", shared.who)))?;
        Ok(Self {
            addr,
            shared,
            rx: Mutex::new(rx),
        })
    }

    /// The next accepted frame, or `None` at `deadline`.
    pub(super) fn next(&self, deadline: Instant) -> Option<Incoming> {
        let rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let left = deadline.saturating_duration_since(Instant::now());
        rx.recv_timeout(left).ok()
    }

    /// Connections dropped so far (silent, short, foreign, or over the flood bound).
    pub(super) fn strays(&self) -> u64 {
        self.shared.strays.load(Ordering::Relaxed)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread out of its blocking accept so it sees `stop`.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(500));
    }
}

fn accept_loop(l: TcpListener, s: Arc<Shared>, tx: mpsc::Sender<Incoming>) {
    loop {
        let accepted = l.accept();
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!(target: "cclkit::bootstrap", "{}: accept failed: {e}", s.who);
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if s.pending.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING {
            s.pending.fetch_sub(1, Ordering::SeqCst);
            stray(
                &s,
                peer,
                &format!("more than {MAX_PENDING} connections pending"),
            );
            continue;
        }
        let (s2, tx2) = (s.clone(), tx.clone());
        let spawned = std::thread::Builder::new()
            .name("cclkit-bootstrap-read".into())
            .stack_size(READER_STACK)
            .spawn(move || {
                let got = read_one(stream, peer, &s2);
                s2.pending.fetch_sub(1, Ordering::SeqCst);
                if let Some(inc) = got {
                    let _ = tx2.send(inc);
                }
            });
        if spawned.is_err() {
            s.pending.fetch_sub(1, Ordering::SeqCst);
            stray(&s, peer, "no thread to read it");
        }
    }
}

fn stray(s: &Shared, peer: SocketAddr, why: &str) {
    s.strays.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(target: "cclkit::bootstrap", "{}: dropped a stray connection from {peer}: {why}", s.who);
}

/// Reads and checks one connection's frame; `None` (after one WARN) when refused.
fn read_one(mut stream: TcpStream, peer: SocketAddr, s: &Shared) -> Option<Incoming> {
    let _ = stream.set_read_timeout(Some(HEADER_DEADLINE));
    let _ = stream.set_write_timeout(Some(s.payload_timeout));
    let _ = stream.set_nodelay(true);
    let mut h = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        match stream.read(&mut h[got..]) {
            Ok(0) => {
                stray(
                    s,
                    peer,
                    &format!("closed after {got} of {HEADER} header bytes"),
                );
                return None;
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                let what = if got == 0 { "silent" } else { "short header" };
                stray(
                    s,
                    peer,
                    &format!("{what}: {got} of {HEADER} header bytes within {HEADER_DEADLINE:?}"),
                );
                return None;
            }
        }
    }
    let head = match parse_header(&h, s.magic) {
        Ok(x) if x.kind == s.kind => x,
        Ok(x) => {
            stray(s, peer, &format!("unexpected message kind {:?}", x.kind));
            return None;
        }
        Err(r) => {
            stray(s, peer, &r.to_string());
            return None;
        }
    };
    let _ = stream.set_read_timeout(Some(s.payload_timeout.max(HEADER_DEADLINE)));
    // Grown as bytes arrive: a header that merely claims a large payload costs nothing.
    let mut payload = Vec::with_capacity(head.len.min(64 << 10));
    let read = (&mut stream)
        .take(head.len as u64)
        .read_to_end(&mut payload);
    if read.is_err() || payload.len() != head.len {
        stray(
            s,
            peer,
            &format!("payload: {} of {} bytes delivered", payload.len(), head.len),
        );
        return None;
    }
    Some(Incoming {
        frame: Frame {
            kind: head.kind,
            from: head.from,
            tag: head.tag,
            payload,
        },
        stream,
        peer,
    })
}
