//! Bootstrap: how ranks find each other before any plugin connection exists.
//!
//! Like NCCL's `ncclGetUniqueId` / bootstrap: a [`UniqueId`] names a root (address +
//! random magic). Every rank opens its own listener, tells the root where it is, and
//! gets back the address table of all ranks. Afterwards ranks exchange small messages
//! (net handles, peer info) directly: [`Bootstrap::send`] / [`Bootstrap::recv`], and
//! [`Bootstrap::allgather`] / [`Bootstrap::barrier`] on top.
//!
//! Every connection starts with the magic; a connection with another magic (another
//! job, a stale id) is closed and logged, never matched. Every wait has a deadline
//! (`CCLKIT_BOOTSTRAP_TIMEOUT`), so a rank that never shows up or a wrong id is a
//! clear error, not a hang.

use std::collections::VecDeque;
use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::{Error, Result};

/// Default for `CCLKIT_BOOTSTRAP_TIMEOUT` (seconds).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest bootstrap message accepted (guards against garbage length fields).
const MAX_MESSAGE: usize = 64 << 20;

/// The bootstrap timeout from `CCLKIT_BOOTSTRAP_TIMEOUT` (seconds, fractions allowed).
pub fn timeout_from_env() -> Result<Duration> {
    match std::env::var("CCLKIT_BOOTSTRAP_TIMEOUT") {
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| *s > 0.0 && s.is_finite())
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "CCLKIT_BOOTSTRAP_TIMEOUT={v} is not a positive number of seconds"
                ))
            }),
        Err(_) => Ok(DEFAULT_TIMEOUT),
    }
}

/// Identifies one communicator's bootstrap root: where it listens and the magic every
/// connection must present. Printable and parseable (`cclkit1:10.0.0.1:40123:9f…`),
/// so launchers pass it through the environment.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct UniqueId {
    /// The root's listening address.
    pub root: SocketAddr,
    /// Random per-communicator magic.
    pub magic: u64,
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cclkit1:{}:{:016x}", self.root, self.magic)
    }
}

impl FromStr for UniqueId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid_argument(format!(
                "'{s}' is not a cclkit unique id (cclkit1:ADDR:PORT:MAGIC)"
            ))
        };
        let rest = s.trim().strip_prefix("cclkit1:").ok_or_else(bad)?;
        let (addr, magic) = rest.rsplit_once(':').ok_or_else(bad)?;
        Ok(Self {
            root: addr.parse().map_err(|_| bad())?,
            magic: u64::from_str_radix(magic, 16).map_err(|_| bad())?,
        })
    }
}

/// A random 64-bit value (std's per-process random hasher keys plus time and pid).
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// The local address used to reach `peer` (no packet is sent: a UDP `connect` only
/// asks the kernel for the route). Falls back to loopback when there is no route.
pub fn local_ip_towards(peer: IpAddr) -> IpAddr {
    let any = SocketAddr::new(
        if peer.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        },
        0,
    );
    UdpSocket::bind(any)
        .and_then(|s| s.connect((peer, 9)).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .unwrap_or(if peer.is_ipv4() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            peer
        })
}

// ---- framing --------------------------------------------------------------------

/// Message kinds on bootstrap connections.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Kind {
    Hello = 1,
    Table = 2,
    Abort = 3,
    Data = 4,
}

/// `[magic u64][kind u8][from u32][tag u64][len u32][payload]`, little-endian.
struct Frame {
    kind: Kind,
    from: u32,
    tag: u64,
    payload: Vec<u8>,
}

const HEADER: usize = 8 + 1 + 4 + 8 + 4;

fn write_frame(s: &mut TcpStream, magic: u64, f: &Frame) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(HEADER + f.payload.len());
    buf.extend_from_slice(&magic.to_le_bytes());
    buf.push(f.kind as u8);
    buf.extend_from_slice(&f.from.to_le_bytes());
    buf.extend_from_slice(&f.tag.to_le_bytes());
    buf.extend_from_slice(&(f.payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&f.payload);
    s.write_all(&buf)
}

/// Reads one frame; `Ok(None)` when the magic does not match (the caller drops the
/// connection and logs it).
fn read_frame(s: &mut TcpStream, magic: u64) -> Result<Option<Frame>> {
    let mut h = [0u8; HEADER];
    s.read_exact(&mut h)
        .map_err(|e| Error::io("bootstrap read", e))?;
    let le64 = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    let le32 = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap_or([0; 4]));
    if le64(&h[0..8]) != magic {
        return Ok(None);
    }
    let kind = match h[8] {
        1 => Kind::Hello,
        2 => Kind::Table,
        3 => Kind::Abort,
        4 => Kind::Data,
        k => {
            return Err(Error::internal(format!(
                "bootstrap: unknown message kind {k}"
            )));
        }
    };
    let len = le32(&h[21..25]) as usize;
    if len > MAX_MESSAGE {
        return Err(Error::internal(format!(
            "bootstrap: message of {len} bytes exceeds {MAX_MESSAGE}"
        )));
    }
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload)
        .map_err(|e| Error::io("bootstrap read", e))?;
    Ok(Some(Frame {
        kind,
        from: le32(&h[9..13]),
        tag: le64(&h[13..21]),
        payload,
    }))
}

/// Accepts one connection before `deadline` (polling a non-blocking listener).
fn accept_until(l: &TcpListener, deadline: Instant) -> Result<Option<(TcpStream, SocketAddr)>> {
    loop {
        match l.accept() {
            Ok((s, a)) => {
                s.set_nonblocking(false)
                    .map_err(|e| Error::io("bootstrap accept", e))?;
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(100));
                s.set_read_timeout(Some(left))
                    .map_err(|e| Error::io("bootstrap accept", e))?;
                s.set_write_timeout(Some(left))
                    .map_err(|e| Error::io("bootstrap accept", e))?;
                return Ok(Some((s, a)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("bootstrap accept", e)),
        }
    }
}

fn connect_until(addr: SocketAddr, deadline: Instant, what: &str) -> Result<TcpStream> {
    let mut last = None;
    while Instant::now() < deadline {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(50));
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => {
                s.set_read_timeout(Some(left))
                    .map_err(|e| Error::io(what, e))?;
                s.set_write_timeout(Some(left))
                    .map_err(|e| Error::io(what, e))?;
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            // The peer may not listen yet (it starts later): retry until the deadline.
            Err(e) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    Err(Error::timeout(format!(
        "{what}: could not connect to {addr} before the bootstrap timeout ({})",
        last.map_or("no attempt".into(), |e| e.to_string())
    )))
}

// ---- root -----------------------------------------------------------------------

/// The root's gathering thread (NCCL's bootstrap root). Dropping it waits for it.
pub struct BootstrapRoot {
    thread: Option<JoinHandle<Result<()>>>,
}

impl BootstrapRoot {
    /// Listens on `bind` (port 0 = any) and gathers one communicator's ranks in a
    /// thread. Returns the id to hand to every rank.
    pub fn start(bind: SocketAddr, magic: u64, timeout: Duration) -> Result<(UniqueId, Self)> {
        let listener = TcpListener::bind(bind)
            .map_err(|e| Error::io(format!("bootstrap root: bind {bind}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("bootstrap root", e))?;
        let mut root = listener
            .local_addr()
            .map_err(|e| Error::io("bootstrap root", e))?;
        if root.ip().is_unspecified() {
            root.set_ip(local_ip_towards(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))));
        }
        let thread = std::thread::Builder::new()
            .name("cclkit-bootstrap-root".into())
            .spawn(move || gather(listener, magic, timeout))
            .map_err(|e| Error::system(format!("bootstrap root: spawn: {e}")))?;
        Ok((
            UniqueId { root, magic },
            Self {
                thread: Some(thread),
            },
        ))
    }

    /// Waits for the gathering to finish and returns its outcome.
    pub fn join(mut self) -> Result<()> {
        self.thread.take().map_or(Ok(()), |t| {
            t.join()
                .unwrap_or_else(|_| Err(Error::internal("bootstrap root thread panicked")))
        })
    }
}

impl Drop for BootstrapRoot {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn gather(listener: TcpListener, magic: u64, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut nranks: Option<usize> = None;
    let mut joined: Vec<Option<(TcpStream, Vec<u8>)>> = Vec::new();
    let abort = |joined: &mut Vec<Option<(TcpStream, Vec<u8>)>>, msg: String| {
        tracing::warn!(target: "cclkit::bootstrap", "{msg}");
        for (s, _) in joined.iter_mut().flatten() {
            let _ = write_frame(
                s,
                magic,
                &Frame {
                    kind: Kind::Abort,
                    from: u32::MAX,
                    tag: 0,
                    payload: msg.clone().into_bytes(),
                },
            );
        }
        Err(Error::invalid_usage(msg))
    };
    while nranks.is_none_or(|n| joined.iter().flatten().count() < n) {
        let Some((mut s, peer)) = accept_until(&listener, deadline)? else {
            let missing: Vec<usize> = joined
                .iter()
                .enumerate()
                .filter(|(_, j)| j.is_none())
                .map(|(r, _)| r)
                .collect();
            return abort(
                &mut joined,
                match nranks {
                    Some(n) => format!(
                        "bootstrap root: ranks {missing:?} of {n} never joined within {timeout:?} (CCLKIT_BOOTSTRAP_TIMEOUT)"
                    ),
                    None => format!("bootstrap root: no rank joined within {timeout:?}"),
                },
            );
        };
        let hello = match read_frame(&mut s, magic) {
            Ok(Some(f)) if f.kind == Kind::Hello && f.payload.len() >= 4 => f,
            Ok(_) => {
                tracing::warn!(target: "cclkit::bootstrap", "bootstrap root: dropped a connection from {peer} with a wrong magic or message (another job, or a mismatched unique id)");
                continue;
            }
            Err(e) => {
                tracing::warn!(target: "cclkit::bootstrap", "bootstrap root: dropped a connection from {peer}: {e}");
                continue;
            }
        };
        let their_n = u32::from_le_bytes(hello.payload[0..4].try_into().unwrap_or([0; 4])) as usize;
        let rank = hello.from as usize;
        match nranks {
            None => {
                nranks = Some(their_n);
                joined.resize_with(their_n, || None);
            }
            Some(n) if n != their_n => {
                joined.push(Some((s, Vec::new())));
                return abort(
                    &mut joined,
                    format!(
                        "bootstrap root: rank {rank} says nranks={their_n}, earlier ranks said {n}"
                    ),
                );
            }
            Some(_) => {}
        }
        if rank >= joined.len() || joined[rank].is_some() {
            joined.push(Some((s, Vec::new())));
            return abort(
                &mut joined,
                format!(
                    "bootstrap root: rank {rank} joined twice or is outside 0..{}",
                    nranks.unwrap_or(0)
                ),
            );
        }
        joined[rank] = Some((s, hello.payload[4..].to_vec()));
    }
    // Everyone is here: send the address table (length-prefixed entries).
    let mut table = Vec::new();
    for (_, addr) in joined.iter().flatten() {
        table.extend_from_slice(&(addr.len() as u32).to_le_bytes());
        table.extend_from_slice(addr);
    }
    for (rank, (s, _)) in joined.iter_mut().flatten().enumerate() {
        write_frame(
            s,
            magic,
            &Frame {
                kind: Kind::Table,
                from: u32::MAX,
                tag: 0,
                payload: table.clone(),
            },
        )
        .map_err(|e| Error::io(format!("bootstrap root: send table to rank {rank}"), e))?;
    }
    Ok(())
}

// ---- per-rank state -------------------------------------------------------------

/// A rank's bootstrap endpoint: its listener and the addresses of every rank.
pub struct Bootstrap {
    rank: usize,
    peers: Vec<SocketAddr>,
    magic: u64,
    timeout: Duration,
    listener: TcpListener,
    /// Messages that arrived before someone asked for them.
    unexpected: Mutex<VecDeque<Frame>>,
    /// Per-call sequence for collective tags (every rank calls in the same order).
    seq: AtomicU64,
}

/// Tag spaces: collectives of the bootstrap itself vs. callers' tags.
const TAG_ALLGATHER: u64 = 1 << 62;

impl Bootstrap {
    /// Joins the communicator named by `id` as `rank` of `nranks`.
    pub fn init(id: &UniqueId, rank: usize, nranks: usize, timeout: Duration) -> Result<Self> {
        if rank >= nranks {
            return Err(Error::invalid_argument(format!(
                "rank {rank} is not below nranks {nranks}"
            )));
        }
        let deadline = Instant::now() + timeout;
        let ip = match std::env::var("CCLKIT_BOOTSTRAP_IP") {
            Ok(v) => v.parse().map_err(|_| {
                Error::invalid_argument(format!("CCLKIT_BOOTSTRAP_IP={v} is not an IP"))
            })?,
            Err(_) => local_ip_towards(id.root.ip()),
        };
        let listener = TcpListener::bind((ip, 0))
            .map_err(|e| Error::io(format!("bootstrap: bind {ip}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("bootstrap listen", e))?;
        let me = listener
            .local_addr()
            .map_err(|e| Error::io("bootstrap listen", e))?;

        let what = format!("rank {rank}: bootstrap root {}", id.root);
        let mut root = connect_until(id.root, deadline, &what)?;
        let mut hello = (nranks as u32).to_le_bytes().to_vec();
        hello.extend_from_slice(me.to_string().as_bytes());
        write_frame(
            &mut root,
            id.magic,
            &Frame {
                kind: Kind::Hello,
                from: rank as u32,
                tag: 0,
                payload: hello,
            },
        )
        .map_err(|e| Error::io(&what, e))?;
        let table = match read_frame(&mut root, id.magic) {
            Ok(Some(f)) if f.kind == Kind::Table => f.payload,
            Ok(Some(f)) if f.kind == Kind::Abort => {
                return Err(Error::invalid_usage(format!(
                    "rank {rank}: {}",
                    String::from_utf8_lossy(&f.payload)
                )));
            }
            Ok(_) => {
                return Err(Error::invalid_usage(format!(
                    "{what}: unexpected answer (wrong unique id?)"
                )));
            }
            Err(e) if e.code() == cclkit_abi::raw::common::NcclResult::TIMEOUT => {
                return Err(Error::timeout(format!(
                    "{what}: timed out after {timeout:?} waiting for all {nranks} ranks to join (CCLKIT_BOOTSTRAP_TIMEOUT); \
                     does every rank use the same unique id and nranks?"
                )));
            }
            Err(e) => {
                return Err(e.context(format!(
                    "{what}: the root closed the connection (wrong magic: a stale or mismatched unique id?)"
                )));
            }
        };
        let peers = parse_table(&table, nranks)?;
        Ok(Self {
            rank,
            peers,
            magic: id.magic,
            timeout,
            listener,
            unexpected: Mutex::new(VecDeque::new()),
            seq: AtomicU64::new(0),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.peers.len()
    }

    /// The bootstrap timeout in force.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Address of `peer`'s bootstrap listener (its IP is how other ranks reach it).
    pub fn peer_addr(&self, peer: usize) -> Option<SocketAddr> {
        self.peers.get(peer).copied()
    }

    /// Sends `data` to `peer` under `tag` (a fresh connection per message).
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        let addr = *self
            .peers
            .get(peer)
            .ok_or_else(|| Error::invalid_argument(format!("bootstrap: no rank {peer}")))?;
        let what = format!("rank {}: bootstrap send to rank {peer}", self.rank);
        let mut s = connect_until(addr, Instant::now() + self.timeout, &what)?;
        write_frame(
            &mut s,
            self.magic,
            &Frame {
                kind: Kind::Data,
                from: self.rank as u32,
                tag,
                payload: data.to_vec(),
            },
        )
        .map_err(|e| Error::io(&what, e))
    }

    /// Receives the message `peer` sent under `tag`, waiting up to the bootstrap timeout.
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        let deadline = Instant::now() + self.timeout;
        let mut pending = self.unexpected.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(i) = pending
                .iter()
                .position(|f| f.from as usize == peer && f.tag == tag)
            {
                return Ok(pending.remove(i).map(|f| f.payload).unwrap_or_default());
            }
            let Some((mut s, from)) = accept_until(&self.listener, deadline)? else {
                return Err(Error::timeout(format!(
                    "rank {}: timed out after {:?} waiting for a bootstrap message from rank {peer} (is it alive?)",
                    self.rank, self.timeout
                )));
            };
            match read_frame(&mut s, self.magic) {
                Ok(Some(f)) if f.kind == Kind::Data => pending.push_back(f),
                Ok(_) => {
                    tracing::warn!(target: "cclkit::bootstrap", "rank {}: dropped a bootstrap connection from {from} with a wrong magic (another job?)", self.rank)
                }
                Err(e) => {
                    tracing::warn!(target: "cclkit::bootstrap", "rank {}: dropped a bootstrap connection from {from}: {e}", self.rank)
                }
            }
        }
    }

    /// Every rank's `mine`, indexed by rank (a ring: n-1 steps of send-next/recv-prev).
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = self.nranks();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut all = vec![Vec::new(); n];
        all[self.rank] = mine.to_vec();
        let (next, prev) = ((self.rank + 1) % n, (self.rank + n - 1) % n);
        for step in 0..n.saturating_sub(1) {
            let tag = TAG_ALLGATHER | (seq << 20) | step as u64;
            let send_idx = (self.rank + n - step) % n;
            let recv_idx = (self.rank + n - step - 1) % n;
            self.send(next, tag, &all[send_idx])?;
            all[recv_idx] = self.recv(prev, tag)?;
        }
        Ok(all)
    }

    /// A counter every rank advances identically (one per collective call), for
    /// callers that need fresh tags in step with the other ranks.
    pub fn allgather_seq(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    /// Returns once every rank called it.
    pub fn barrier(&self) -> Result<()> {
        self.allgather(&[]).map(|_| ())
    }
}

fn parse_table(mut t: &[u8], nranks: usize) -> Result<Vec<SocketAddr>> {
    let mut out = Vec::with_capacity(nranks);
    while t.len() >= 4 {
        let len = u32::from_le_bytes(t[0..4].try_into().unwrap_or([0; 4])) as usize;
        let s = t
            .get(4..4 + len)
            .ok_or_else(|| Error::internal("bootstrap: truncated address table"))?;
        let s =
            std::str::from_utf8(s).map_err(|_| Error::internal("bootstrap: bad address table"))?;
        out.push(
            s.parse()
                .map_err(|_| Error::internal(format!("bootstrap: bad address {s}")))?,
        );
        t = &t[4 + len..];
    }
    if out.len() != nranks {
        return Err(Error::internal(format!(
            "bootstrap: table has {} ranks, expected {nranks}",
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local_root(timeout: Duration) -> (UniqueId, BootstrapRoot) {
        BootstrapRoot::start("127.0.0.1:0".parse().unwrap(), random_u64(), timeout).unwrap()
    }

    #[test]
    fn unique_id_round_trips_as_text() {
        let id = UniqueId {
            root: "10.1.2.3:4567".parse().unwrap(),
            magic: 0xdead_beef_0123,
        };
        assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
        assert!("cclkit1:nonsense".parse::<UniqueId>().is_err());
        let v6 = UniqueId {
            root: "[::1]:80".parse().unwrap(),
            magic: 7,
        };
        assert_eq!(v6.to_string().parse::<UniqueId>().unwrap(), v6);
    }

    #[test]
    fn five_ranks_allgather_and_exchange() {
        let (id, root) = local_root(Duration::from_secs(20));
        let n = 5;
        let handles: Vec<_> = (0..n)
            .map(|r| {
                std::thread::spawn(move || {
                    let b = Bootstrap::init(&id, r, n, Duration::from_secs(20)).unwrap();
                    let all = b.allgather(format!("rank{r}").as_bytes()).unwrap();
                    for (i, v) in all.iter().enumerate() {
                        assert_eq!(v, format!("rank{i}").as_bytes());
                    }
                    // Out-of-order tags: send two, receive them in the other order.
                    let next = (r + 1) % n;
                    b.send(next, 7, &[r as u8; 3]).unwrap();
                    b.send(next, 8, &[r as u8 + 100]).unwrap();
                    let prev = (r + n - 1) % n;
                    assert_eq!(b.recv(prev, 8).unwrap(), vec![prev as u8 + 100]);
                    assert_eq!(b.recv(prev, 7).unwrap(), vec![prev as u8; 3]);
                    b.barrier().unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        root.join().unwrap();
    }

    #[test]
    fn missing_rank_is_a_clear_timeout() {
        let (id, root) = local_root(Duration::from_millis(800));
        let t = std::thread::spawn(move || {
            Bootstrap::init(&id, 0, 3, Duration::from_secs(5))
                .err()
                .unwrap()
        });
        let err = t.join().unwrap();
        assert!(
            err.message().contains("ranks [1, 2] of 3 never joined"),
            "{err}"
        );
        assert!(root.join().unwrap_err().message().contains("never joined"));
    }

    #[test]
    fn wrong_magic_is_rejected_not_matched() {
        let (id, root) = local_root(Duration::from_millis(1500));
        let wrong = UniqueId {
            magic: id.magic ^ 1,
            ..id
        };
        let err = Bootstrap::init(&wrong, 0, 1, Duration::from_secs(3))
            .err()
            .unwrap();
        assert!(
            err.message().contains("wrong magic") || err.message().contains("unique id"),
            "{err}"
        );
        // The root keeps waiting for a real rank, then gives up cleanly.
        assert!(
            root.join()
                .unwrap_err()
                .message()
                .contains("no rank joined")
        );
    }

    #[test]
    fn nranks_mismatch_is_reported_to_ranks() {
        let (id, root) = local_root(Duration::from_secs(10));
        // Whichever arrives first sets nranks; both must hear about the mismatch.
        let a =
            std::thread::spawn(move || Bootstrap::init(&id, 0, 3, Duration::from_secs(10)).err());
        let b = Bootstrap::init(&id, 1, 2, Duration::from_secs(10))
            .err()
            .unwrap();
        let a = a.join().unwrap().unwrap();
        for e in [&a, &b] {
            assert!(e.message().contains("says nranks="), "{e}");
        }
        let _ = root.join();
    }
}
