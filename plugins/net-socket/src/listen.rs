//! The listening side: accepts TCP connections without blocking, reads each one's
//! hello, and groups the connections of one comm by their nonce.
//!
//! Only a connection that presents this listen's random magic is trusted. Anything
//! else (a port scanner, a stale peer, another job) is closed and logged, never
//! matched to a comm, and cannot hold resources for long: a connection must finish
//! its hello, and a comm its connections, within the connect timeout.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use cclkit_abi::{Error, Result, nccl_warn};

use crate::sys;
use crate::wire::{Hello, VERSION};

/// Connections accepted per `accept` call (keeps one call short).
const ACCEPT_BURST: usize = 64;
/// Most connections waiting for their hello; more are refused.
const MAX_HANDSHAKES: usize = 1024;

/// A connection whose hello is not complete yet.
struct Handshake {
    sock: TcpStream,
    peer: SocketAddr,
    buf: [u8; Hello::LEN],
    got: usize,
    since: Instant,
}

/// Connections of one comm, by index.
struct Group {
    nonce: u64,
    socks: Vec<Option<TcpStream>>,
    have: usize,
    since: Instant,
    peer: SocketAddr,
}

/// A listening endpoint.
pub struct Listen {
    listener: TcpListener,
    magic: u64,
    /// Connections per comm (1 + data streams).
    count: usize,
    timeout: Duration,
    handshakes: Vec<Handshake>,
    groups: Vec<Group>,
}

/// A complete set of connections: the peer, control socket first.
pub struct Accepted {
    /// Peer address (of the control connection).
    pub peer: SocketAddr,
    /// Control socket, then data streams.
    pub socks: Vec<TcpStream>,
}

impl Listen {
    /// Binds to `addr` (port chosen by the kernel).
    pub fn bind(addr: SocketAddr, magic: u64, count: usize, timeout: Duration) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(&format!("cclkit-socket: bind {addr}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        Ok(Self {
            listener,
            magic,
            count,
            timeout,
            handshakes: Vec::new(),
            groups: Vec::new(),
        })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| Error::io("local_addr", e))
    }

    /// One non-blocking step: `Ok(Some)` when a comm's connections are all here.
    pub fn accept(&mut self) -> Result<Option<Accepted>> {
        for _ in 0..ACCEPT_BURST {
            match self.listener.accept() {
                Ok((sock, peer)) => {
                    if self.handshakes.len() >= MAX_HANDSHAKES {
                        nccl_warn!(
                            "cclkit-socket: refusing connection from {peer}: \
                             {MAX_HANDSHAKES} connections already wait for their hello"
                        );
                        continue;
                    }
                    sock.set_nonblocking(true)
                        .map_err(|e| Error::io("set_nonblocking", e))?;
                    self.handshakes.push(Handshake {
                        sock,
                        peer,
                        buf: [0; Hello::LEN],
                        got: 0,
                        since: Instant::now(),
                    });
                }
                Err(e) if sys::would_block(&e) => break,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => continue,
                Err(e) => return Err(Error::io("cclkit-socket: accept", e)),
            }
        }
        self.read_hellos();
        self.expire();
        let complete = self.groups.iter().position(|g| g.have == self.count);
        Ok(complete.map(|i| {
            let g = self.groups.swap_remove(i);
            Accepted {
                peer: g.peer,
                socks: g.socks.into_iter().flatten().collect(),
            }
        }))
    }

    fn read_hellos(&mut self) {
        let mut i = 0;
        while i < self.handshakes.len() {
            let h = &mut self.handshakes[i];
            match sys::recv(h.sock.as_raw_fd(), &mut h.buf[h.got..]) {
                Ok(0) => {
                    nccl_warn!(
                        "cclkit-socket: connection from {} closed before its hello; dropped",
                        h.peer
                    );
                    self.handshakes.swap_remove(i);
                    continue;
                }
                Ok(n) => h.got += n,
                Err(e) if sys::would_block(&e) => {}
                Err(e) => {
                    nccl_warn!("cclkit-socket: connection from {} failed: {e}", h.peer);
                    self.handshakes.swap_remove(i);
                    continue;
                }
            }
            if h.got < Hello::LEN {
                i += 1;
                continue;
            }
            let h = self.handshakes.swap_remove(i);
            self.admit(h);
        }
    }

    /// Checks a complete hello and files the connection into its comm's group.
    fn admit(&mut self, h: Handshake) {
        let hello = Hello::decode(&h.buf);
        let reason = if hello.magic != self.magic {
            Some("wrong magic (a stray connection or a foreign peer)".to_owned())
        } else if hello.version != u16::from(VERSION) {
            Some(format!(
                "protocol version {} (expected {VERSION})",
                hello.version
            ))
        } else if usize::from(hello.count) != self.count || hello.index >= hello.count {
            Some(format!(
                "connection {} of {} (this listen expects {})",
                hello.index, hello.count, self.count
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            nccl_warn!("cclkit-socket: closed connection from {}: {reason}", h.peer);
            return;
        }
        let pos = match self.groups.iter().position(|g| g.nonce == hello.nonce) {
            Some(p) => p,
            None => {
                self.groups.push(Group {
                    nonce: hello.nonce,
                    socks: (0..self.count).map(|_| None).collect(),
                    have: 0,
                    since: h.since,
                    peer: h.peer,
                });
                self.groups.len() - 1
            }
        };
        let g = &mut self.groups[pos];
        let slot = &mut g.socks[usize::from(hello.index)];
        if slot.is_some() {
            nccl_warn!(
                "cclkit-socket: closed connection from {}: duplicate stream {}",
                h.peer,
                hello.index
            );
            return;
        }
        if hello.index == 0 {
            g.peer = h.peer;
        }
        *slot = Some(h.sock);
        g.have += 1;
    }

    /// Drops handshakes and partial comms older than the connect timeout.
    fn expire(&mut self) {
        let timeout = self.timeout;
        self.handshakes.retain(|h| {
            let keep = h.since.elapsed() <= timeout;
            if !keep {
                nccl_warn!(
                    "cclkit-socket: closed connection from {}: no hello within {} ms",
                    h.peer,
                    timeout.as_millis()
                );
            }
            keep
        });
        self.groups.retain(|g| {
            let keep = g.since.elapsed() <= timeout;
            if !keep {
                nccl_warn!(
                    "cclkit-socket: dropped a partial connection from {}: {} of {} streams \
                     arrived within {} ms",
                    g.peer,
                    g.have,
                    g.socks.len(),
                    timeout.as_millis()
                );
            }
            keep
        });
    }
}
