//! The connecting side: opens `1 + nstreams` non-blocking TCP connections and sends
//! each its hello, one step per `connect` call. The progress lives in a box whose
//! pointer NCCL keeps for us in the handle ([`NetHandle::set_pending`]), because
//! NCCL calls `connect` again with the same handle until it returns a comm.
//!
//! [`NetHandle::set_pending`]: cclkit_abi::net::NetHandle::set_pending

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use cclkit_abi::{Error, Result};

use crate::sys;
use crate::wire::{HandleInfo, Hello, VERSION};

/// One connection being set up.
struct Link {
    sock: TcpStream,
    hello: [u8; Hello::LEN],
    sent: usize,
    connected: bool,
}

/// A connect in progress.
pub struct Connecting {
    /// What the peer's handle said.
    pub info: HandleInfo,
    links: Vec<Link>,
    started: Instant,
    timeout: Duration,
}

impl Connecting {
    /// Starts every connection to the listener described by `info`.
    pub fn start(info: HandleInfo, timeout: Duration) -> Result<Self> {
        let nonce = cclkit_abi::sock::random_u64().map_err(|e| Error::io("getrandom", e))?;
        let count = 1 + info.nstreams;
        let mut links = Vec::with_capacity(count);
        for index in 0..count {
            let sock = sys::start_connect(&info.addr).map_err(|e| {
                Error::remote(format!("cclkit-socket: connect to {}: {e}", info.addr))
            })?;
            let hello = Hello {
                magic: info.magic,
                nonce,
                index: index as u16,
                count: count as u16,
                version: u16::from(VERSION),
            };
            links.push(Link {
                sock,
                hello: hello.encode(),
                sent: 0,
                connected: false,
            });
        }
        Ok(Self {
            info,
            links,
            started: Instant::now(),
            timeout,
        })
    }

    /// Moves every connection forward without blocking: `Ok(true)` once all are
    /// connected and have sent their hello.
    pub fn progress(&mut self) -> Result<bool> {
        let addr = self.info.addr;
        let mut fds: Vec<libc::pollfd> = self
            .links
            .iter()
            .map(|l| {
                let events = if l.sent < Hello::LEN {
                    libc::POLLOUT
                } else {
                    0
                };
                sys::pollfd(l.sock.as_raw_fd(), events)
            })
            .collect();
        sys::poll(&mut fds, 0).map_err(|e| Error::io("poll", e))?;
        let mut all = true;
        for (link, fd) in self.links.iter_mut().zip(&fds) {
            if link.sent == Hello::LEN {
                continue;
            }
            if fd.revents == 0 {
                all = false;
                continue;
            }
            if !link.connected {
                sys::take_socket_error(&link.sock)
                    .map_err(|e| Error::remote(format!("cclkit-socket: connect to {addr}: {e}")))?;
                link.connected = true;
            }
            match sys::send(link.sock.as_raw_fd(), &link.hello[link.sent..]) {
                Ok(n) => link.sent += n,
                Err(e) if sys::would_block(&e) => {}
                Err(e) => {
                    return Err(Error::remote(format!(
                        "cclkit-socket: connect to {addr}: sending the hello: {e}"
                    )));
                }
            }
            all &= link.sent == Hello::LEN;
        }
        if !all && self.started.elapsed() > self.timeout {
            return Err(Error::remote(format!(
                "cclkit-socket: connect to {addr} did not complete within {} ms \
                 (CCLKIT_SOCKET_CONNECT_TIMEOUT_MS)",
                self.timeout.as_millis()
            )));
        }
        Ok(all)
    }

    /// The connected sockets: control first, then the data streams.
    pub fn into_sockets(self) -> Vec<TcpStream> {
        self.links.into_iter().map(|l| l.sock).collect()
    }
}
