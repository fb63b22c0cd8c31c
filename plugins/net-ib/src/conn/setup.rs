//! Non-blocking connection setup over the TCP side channel.
//!
//! NCCL calls `connect`/`accept` again and again until they return a comm, so each
//! side is a resumable state: [`Connecting`] lives in the listen handle between calls
//! (`NetHandle::set_pending`), the accepts in progress live in the [`Listener`].
//! Every step is non-blocking: partial reads and writes resume on the next call.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;

use cclkit_abi::net::NetHandle;
use cclkit_abi::{Error, Result, nccl_warn};

use super::sock::{Outgoing, connect_done, connect_start, read_until};
use super::wire::{
    HELLO_HEADER, MAX_META, READY, decode_meta, encode_meta, handle_devs, read_handle, write_handle,
};
use crate::nic::Nic;
use crate::proto::endpoint::{AcceptOpts, ConnectOpts, SenderHalf, accept};
use crate::proto::recv::Receiver;
use crate::proto::send::Sender;

fn io_err(what: &str, peer: SocketAddr, e: io::Error) -> Error {
    Error::remote(format!("NET/cclkit-ib: {what} {peer}: {e}"))
}

/// A connect in progress (kept in the handle between NCCL's calls).
pub struct Connecting<N: Nic> {
    peer: SocketAddr,
    stream: Option<TcpStream>,
    connected: bool,
    hello: Outgoing,
    reply: Vec<u8>,
    half: Option<SenderHalf<N>>,
    sender: Option<Sender<N>>,
    ready: Outgoing,
}

impl<N: Nic> Connecting<N> {
    /// Reads the peer's handle, starts the TCP connect and creates the sender's QPs
    /// on the physical devices `nics` of the (virtual) device.
    pub fn start(nics: Vec<Arc<N>>, handle: &NetHandle, opts: ConnectOpts) -> Result<Self> {
        let (magic, peer) = read_handle(handle)?;
        let remote_devs = handle_devs(handle)?;
        let stream = connect_start(peer).map_err(|e| io_err("connect to", peer, e))?;
        let half = SenderHalf::new(nics, remote_devs, opts)?;
        let meta = encode_meta(&half.meta());
        let mut hello = Vec::with_capacity(HELLO_HEADER + meta.len());
        hello.extend_from_slice(&magic.to_le_bytes());
        hello.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        hello.extend_from_slice(&meta);
        Ok(Self {
            peer,
            stream: Some(stream),
            connected: false,
            hello: Outgoing::new(hello),
            reply: Vec::new(),
            half: Some(half),
            sender: None,
            ready: Outgoing::new(vec![READY]),
        })
    }

    /// One non-blocking step; the connected sender (and its side channel) when done.
    pub fn step(&mut self) -> Result<Option<(Sender<N>, TcpStream)>> {
        let peer = self.peer;
        let stream = self
            .stream
            .as_mut()
            .ok_or_else(|| Error::internal("connect state reused after completion"))?;
        if !self.connected {
            if !connect_done(stream).map_err(|e| io_err("connect to", peer, e))? {
                return Ok(None);
            }
            self.connected = true;
        }
        if !self
            .hello
            .progress(stream)
            .map_err(|e| io_err("send to", peer, e))?
        {
            return Ok(None);
        }
        if self.sender.is_none() {
            let reply = &mut self.reply;
            if !read_until(stream, reply, 4).map_err(|e| io_err("receive from", peer, e))? {
                return Ok(None);
            }
            let len = u32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]) as usize;
            if len > MAX_META {
                return Err(Error::remote(format!(
                    "NET/cclkit-ib: {peer} answered with {len} bytes of metadata; not a cclkit-ib listener?"
                )));
            }
            if !read_until(stream, reply, 4 + len).map_err(|e| io_err("receive from", peer, e))? {
                return Ok(None);
            }
            let meta = decode_meta(&reply[4..])?;
            let half = self
                .half
                .take()
                .ok_or_else(|| Error::internal("connect state lost its QPs"))?;
            self.sender = Some(half.connect(&meta)?);
        }
        if !self
            .ready
            .progress(stream)
            .map_err(|e| io_err("send to", peer, e))?
        {
            return Ok(None);
        }
        match (self.sender.take(), self.stream.take()) {
            (Some(s), Some(t)) => Ok(Some((s, t))),
            _ => Err(Error::internal("connect state incomplete")),
        }
    }
}

/// Why an incoming side-channel connection was not accepted.
enum Reject {
    /// Not one of ours (wrong magic, garbage, closed early): drop it, keep listening.
    Drop(String),
    /// Our own resources failed: report to NCCL.
    Fatal(Error),
}

/// An accept in progress.
struct Accepting<N: Nic> {
    stream: TcpStream,
    peer: SocketAddr,
    hello: Vec<u8>,
    reply: Option<Outgoing>,
    receiver: Option<Receiver<N>>,
    ready: Vec<u8>,
}

impl<N: Nic> Accepting<N> {
    fn step(&mut self, l: &ListenerShared<N>) -> std::result::Result<bool, Reject> {
        let drop_io = |e: io::Error| Reject::Drop(e.to_string());
        if !read_until(&mut self.stream, &mut self.hello, HELLO_HEADER).map_err(drop_io)? {
            return Ok(false);
        }
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&self.hello[..8]);
        let magic = u64::from_le_bytes(magic);
        if magic != l.magic {
            return Err(Reject::Drop(format!(
                "wrong magic {magic:#018x} (expected this listener's handle magic)"
            )));
        }
        let len = u32::from_le_bytes([self.hello[8], self.hello[9], self.hello[10], self.hello[11]])
            as usize;
        if len > MAX_META {
            return Err(Reject::Drop(format!("{len} bytes of metadata announced")));
        }
        if !read_until(&mut self.stream, &mut self.hello, HELLO_HEADER + len).map_err(drop_io)? {
            return Ok(false);
        }
        if self.receiver.is_none() {
            let meta = decode_meta(&self.hello[HELLO_HEADER..])
                .map_err(|e| Reject::Drop(e.message().to_owned()))?;
            let (receiver, mine) = accept(l.nics.clone(), &meta, l.opts).map_err(Reject::Fatal)?;
            let body = encode_meta(&mine);
            let mut out = (body.len() as u32).to_le_bytes().to_vec();
            out.extend_from_slice(&body);
            self.reply = Some(Outgoing::new(out));
            self.receiver = Some(receiver);
        }
        if let Some(reply) = self.reply.as_mut() {
            if !reply.progress(&mut self.stream).map_err(drop_io)? {
                return Ok(false);
            }
        }
        if !read_until(&mut self.stream, &mut self.ready, 1).map_err(drop_io)? {
            return Ok(false);
        }
        if self.ready[0] != READY {
            return Err(Reject::Drop(format!("bad ready byte {:#x}", self.ready[0])));
        }
        Ok(true)
    }
}

struct ListenerShared<N: Nic> {
    nics: Vec<Arc<N>>,
    magic: u64,
    opts: AcceptOpts,
}

/// A listening side channel and the accepts in progress on it.
pub struct Listener<N: Nic> {
    listener: TcpListener,
    shared: ListenerShared<N>,
    pending: Vec<Accepting<N>>,
}

impl<N: Nic> Listener<N> {
    /// Listens on `ip` (any port) for connections to the physical devices `nics` of
    /// a (virtual) device and fills `handle` for the peer.
    pub fn new(
        nics: Vec<Arc<N>>,
        ip: IpAddr,
        opts: AcceptOpts,
        handle: &mut NetHandle,
    ) -> Result<Self> {
        let listener = TcpListener::bind((ip, 0))
            .map_err(|e| Error::io(&format!("NET/cclkit-ib: bind side channel on {ip}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("NET/cclkit-ib: set_nonblocking", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("NET/cclkit-ib: local_addr", e))?;
        let shared_devs = nics.len();
        let magic = random_magic();
        write_handle(handle, magic, addr, shared_devs);
        Ok(Self {
            listener,
            shared: ListenerShared { nics, magic, opts },
            pending: Vec::new(),
        })
    }

    /// Accepts new TCP connections and advances every accept in progress; the first
    /// finished receiver (and its side channel), if any.
    pub fn accept(&mut self) -> Result<Option<(Receiver<N>, TcpStream)>> {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    stream
                        .set_nonblocking(true)
                        .and_then(|()| stream.set_nodelay(true))
                        .map_err(|e| Error::io("NET/cclkit-ib: side channel setup", e))?;
                    self.pending.push(Accepting {
                        stream,
                        peer,
                        hello: Vec::new(),
                        reply: None,
                        receiver: None,
                        ready: Vec::new(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("NET/cclkit-ib: accept", e)),
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            match self.pending[i].step(&self.shared) {
                Ok(false) => i += 1,
                Ok(true) => {
                    let a = self.pending.swap_remove(i);
                    let receiver = a
                        .receiver
                        .ok_or_else(|| Error::internal("accept finished without a receiver"))?;
                    return Ok(Some((receiver, a.stream)));
                }
                Err(Reject::Drop(why)) => {
                    let a = self.pending.swap_remove(i);
                    nccl_warn!(
                        "NET/cclkit-ib: dropped side-channel connection from {}: {why}",
                        a.peer
                    );
                }
                Err(Reject::Fatal(e)) => {
                    self.pending.swap_remove(i);
                    return Err(e);
                }
            }
        }
        Ok(None)
    }

    /// Accepts in progress (tests).
    #[cfg(test)]
    pub fn in_progress(&self) -> usize {
        self.pending.len()
    }
}

/// A per-listener secret so that stray connections cannot attach to a comm.
fn random_magic() -> u64 {
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
