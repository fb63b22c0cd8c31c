//! A rank's bootstrap endpoint: its listener, the address table, point-to-point
//! messages and the small collectives built on them.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};

use super::listen::Listener;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::*;
use crate::error::{Error, Result};

/// A rank's bootstrap endpoint: its listener and the addresses of every rank.
pub struct Bootstrap {
    rank: usize,
    peers: Vec<SocketAddr>,
    magic: u64,
    timeout: Duration,
    listener: Listener,
    /// Messages that arrived before someone asked for them.
    unexpected: Mutex<VecDeque<Frame>>,
    /// Per-call sequence for collective tags (every rank calls in the same order).
    seq: AtomicU64,
}

/// Tag spaces: collectives of the bootstrap itself vs. callers' tags.
pub(super) const TAG_ALLGATHER: u64 = 1 << 62;

impl Bootstrap {
    /// Joins the communicator named by `id` as `rank` of `nranks`.
    pub fn init(id: &UniqueId, rank: usize, nranks: usize, timeout: Duration) -> Result<Self> {
        if nranks == 0 || nranks > MAX_RANKS {
            return Err(Error::invalid_argument(format!(
                "nranks {nranks} is outside 1..={MAX_RANKS} (the bootstrap's rank limit)"
            )));
        }
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
            .map_err(|e| Error::from_io(format!("bootstrap: bind {ip}"), e))?;
        let me = listener
            .local_addr()
            .map_err(|e| Error::from_io("bootstrap listen", e))?;
        let listener = Listener::start(
            listener,
            format!("rank {rank}: bootstrap listener {me}"),
            id.magic,
            Kind::Data,
            timeout,
        )?;

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
        .map_err(|e| Error::from_io(&what, e))?;
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
        .map_err(|e| Error::from_io(&what, e))
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
            let Some(inc) = self.listener.next(deadline) else {
                let strays = match self.listener.strays() {
                    0 => String::new(),
                    n => format!(
                        " ({n} stray connection(s) were dropped meanwhile, not from rank {peer})"
                    ),
                };
                return Err(Error::timeout(format!(
                    "rank {}: timed out after {:?} waiting for a bootstrap message from rank {peer} (is it alive?){strays}",
                    self.rank, self.timeout
                )));
            };
            if inc.frame.from as usize >= self.peers.len() {
                tracing::warn!(target: "cclkit::bootstrap", "rank {}: dropped a bootstrap message from {} claiming to be rank {}", self.rank, inc.peer, inc.frame.from);
                continue;
            }
            pending.push_back(inc.frame);
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

pub(super) fn parse_table(mut t: &[u8], nranks: usize) -> Result<Vec<SocketAddr>> {
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
