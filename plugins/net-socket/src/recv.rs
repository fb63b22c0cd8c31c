//! The receiving side: `irecv` and the control stream's incoming state machine.
//!
//! The control stream is read through a staging buffer, so one `recv` usually
//! brings a header and its inline payload (and often the next ones). A header is
//! consumed only together with the state needed to finish its message (the payload
//! still to copy, or the chunks handed to helper threads), so the stream position
//! is never lost, whatever arrives when (the desync NCCL's socket transport had).
//!
//! Messages match posted receives in order; in grouped mode the header names the
//! buffer (the sender matched it by tag against our clear-to-send record). A
//! message larger than its buffer fails that receive with a clear error, and its
//! bytes are drained so the comm stays usable.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

use cclkit_abi::net::RecvBuf;
use cclkit_abi::{Error, Result};

use crate::comm::{Control, Core, Task};
use crate::slots::{Request, SlotPtr};
use crate::sys;
use crate::wire::{self, Cts, FLAG_INLINE, FLAG_TRUNCATED, Header, MAX_RECVS};

/// Staging buffer for the control stream.
const STAGE: usize = 64 * 1024;
/// Payload reads at least this large bypass the staging buffer.
const DIRECT: usize = 16 * 1024;
/// Reads that brought data between two requests for delayed ACKs (see
/// [`sys::delay_acks`]): the kernel leaves that mode after an idle spell, and
/// one `setsockopt` per 64 reads costs nothing measurable.
const DELAY_ACKS_EVERY: u32 = 64;

/// A posted receive still waiting for (some of) its messages.
struct Posted {
    slot: SlotPtr,
    n: usize,
    bufs: [(usize, usize, i32); MAX_RECVS],
    filled: u8,
}

/// Where the control stream is inside the current message.
enum In {
    /// Expecting a header.
    Header,
    /// Copying (or, with a null `dst`, dropping) an inline payload.
    Payload {
        dst: *mut u8,
        left: usize,
        slot: Option<SlotPtr>,
    },
}

// SAFETY: `dst` is NCCL's receive buffer, valid until the request completes, which
// needs this payload to be finished first; only the proxy thread writes it.
unsafe impl Send for In {}

/// A clear-to-send record not yet fully written.
struct CtsOut {
    bytes: [u8; Cts::MAX_LEN],
    len: usize,
    sent: usize,
}

/// The control stream state of a receive comm.
pub struct RecvCtl {
    sock: TcpStream,
    stage: Box<[u8]>,
    start: usize,
    end: usize,
    posted: VecDeque<Posted>,
    state: In,
    cursor: usize,
    max_recvs: usize,
    cts: Option<VecDeque<CtsOut>>,
    /// `recv` calls made on the control stream (the batching tests count them).
    reads: u64,
    /// The last inline payload was large: read the next header alone and payload
    /// tails straight into NCCL's buffer, so no large payload passes through
    /// `stage` (a stream of 1 MiB messages would otherwise copy 64 KiB of each
    /// twice). Small messages keep reading ahead.
    large: bool,
    /// Payload bytes copied out of `stage` (the read-ahead tests bound them).
    staged: u64,
    /// Small-message reads left before delayed ACKs are asked for again (0: at
    /// the next one, as after bulk data revoked them).
    rearm_in: u32,
    /// Delayed ACKs were asked for and not revoked since.
    acks_delayed: bool,
}

impl RecvCtl {
    /// Control state over `sock`; grouped mode when `max_recvs > 1`.
    pub fn new(sock: TcpStream, max_recvs: usize, slots: usize) -> Self {
        Self {
            sock,
            stage: vec![0u8; STAGE].into_boxed_slice(),
            start: 0,
            end: 0,
            posted: VecDeque::with_capacity(slots),
            state: In::Header,
            cursor: 0,
            max_recvs,
            cts: (max_recvs > 1).then(|| VecDeque::with_capacity(slots)),
            reads: 0,
            large: false,
            staged: 0,
            rearm_in: 0,
            acks_delayed: false,
        }
    }

    /// `recv` calls made so far on the control stream.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Payload bytes that went through the staging buffer so far.
    pub fn staged(&self) -> u64 {
        self.staged
    }

    /// Whether this stream asked for delayed ACKs and has not revoked them.
    #[cfg(test)]
    pub fn acks_delayed(&self) -> bool {
        self.acks_delayed
    }

    /// The control socket (tests look at what is waiting in it).
    #[cfg(test)]
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Writes pending clear-to-send records and reads what has arrived.
    pub fn progress(&mut self, core: &Core) -> std::result::Result<(), String> {
        self.flush_cts(core)?;
        self.read(core)
    }

    fn flush_cts(&mut self, core: &Core) -> std::result::Result<(), String> {
        let Some(queue) = self.cts.as_mut() else {
            return Ok(());
        };
        while let Some(c) = queue.front_mut() {
            match sys::send(self.sock.as_raw_fd(), &c.bytes[c.sent..c.len]) {
                Ok(n) => c.sent += n,
                Err(e) if sys::would_block(&e) => return Ok(()),
                Err(e) => return Err(format!("sending to peer {} failed: {e}", core.peer)),
            }
            if c.sent == c.len {
                queue.pop_front();
            }
        }
        Ok(())
    }

    /// Reads more control bytes into the staging buffer: `Ok(false)` = none now.
    /// `header_only`: read no further than the end of the header being staged.
    fn refill(&mut self, core: &Core, header_only: bool) -> std::result::Result<bool, String> {
        if self.start > 0 {
            self.stage.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.stage.len() {
            // Unreachable: we refill only with less than a header staged. A zero-length
            // recv would read as end of file, so say what really happened.
            return Err("internal error: control staging buffer full".to_owned());
        }
        let want = if header_only {
            // Less than a header is staged here; never ask for zero bytes (EOF).
            Header::LEN.max(self.end + 1).min(self.stage.len())
        } else {
            self.stage.len()
        };
        self.reads += 1;
        match sys::recv(self.sock.as_raw_fd(), &mut self.stage[self.end..want]) {
            Ok(0) => Err(eof(core)),
            Ok(n) => {
                self.end += n;
                if !self.large {
                    if self.rearm_in == 0 {
                        // Best effort: a socket that refuses keeps quick ACKs, which
                        // costs time, never correctness (and is asked again only
                        // DELAY_ACKS_EVERY reads later).
                        self.acks_delayed = sys::delay_acks(self.sock.as_raw_fd()).is_ok();
                        self.rearm_in = DELAY_ACKS_EVERY;
                    }
                    self.rearm_in -= 1;
                }
                Ok(true)
            }
            Err(e) if sys::would_block(&e) => Ok(false),
            Err(e) => Err(format!("receiving from peer {} failed: {e}", core.peer)),
        }
    }

    fn read(&mut self, core: &Core) -> std::result::Result<(), String> {
        loop {
            match &mut self.state {
                In::Header => {
                    if self.posted.is_empty() {
                        // Nothing to match: leave the bytes in the kernel (back-pressure).
                        return Ok(());
                    }
                    if self.end - self.start < Header::LEN {
                        if !self.refill(core, self.large)? {
                            return Ok(());
                        }
                        continue;
                    }
                    let head = Header::decode(&self.stage[self.start..self.start + Header::LEN]);
                    self.start += Header::LEN;
                    self.on_header(core, head)?;
                }
                In::Payload { dst, left, slot } => {
                    if *left == 0 {
                        if let Some(s) = slot {
                            s.get().finish_part();
                        }
                        self.state = In::Header;
                        continue;
                    }
                    let staged = self.end - self.start;
                    if staged > 0 {
                        let n = staged.min(*left);
                        if !dst.is_null() {
                            // SAFETY: `dst` has `left` writable bytes (see `In`).
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    self.stage.as_ptr().add(self.start),
                                    *dst,
                                    n,
                                );
                                *dst = dst.add(n);
                            }
                        }
                        self.start += n;
                        self.staged += n as u64;
                        *left -= n;
                    } else if (*left >= DIRECT || self.large) && !dst.is_null() {
                        self.reads += 1;
                        // SAFETY: as above; reads at most `left` bytes into it.
                        match unsafe { sys::recv_raw(self.sock.as_raw_fd(), *dst, *left) } {
                            Ok(0) => return Err(eof(core)),
                            Ok(n) => {
                                // SAFETY: n ≤ left.
                                *dst = unsafe { dst.add(n) };
                                *left -= n;
                            }
                            Err(e) if sys::would_block(&e) => return Ok(()),
                            Err(e) => {
                                return Err(format!(
                                    "receiving from peer {} failed: {e}",
                                    core.peer
                                ));
                            }
                        }
                    } else if !self.refill(core, false)? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Matches a header to the oldest posted receive and sets up its payload.
    fn on_header(&mut self, core: &Core, head: Header) -> std::result::Result<(), String> {
        let protocol = |what: String| format!("protocol error from peer {}: {what}", core.peer);
        let Some(p) = self.posted.front_mut() else {
            return Err(protocol("message without a posted receive".into()));
        };
        let idx = usize::from(head.index);
        if idx >= p.n || p.filled & (1 << idx) != 0 {
            return Err(protocol(format!(
                "message for buffer {idx} of a {}-buffer receive (filled mask {:#x})",
                p.n, p.filled
            )));
        }
        let (addr, cap, tag) = p.bufs[idx];
        if self.max_recvs > 1 && tag != head.tag {
            return Err(protocol(format!(
                "message with tag {} for buffer {idx} which expects tag {tag}",
                head.tag
            )));
        }
        p.filled |= 1 << idx;
        let slot = p.slot;
        if u32::from(p.filled).count_ones() as usize == p.n {
            self.posted.pop_front();
        }
        let size = usize::try_from(head.size)
            .map_err(|_| protocol(format!("message size {}", head.size)))?;
        let inline = head.flags & FLAG_INLINE != 0;
        self.large = inline && head.size >= DIRECT as u64;
        if self.large && self.acks_delayed && sys::quick_acks(self.sock.as_raw_fd()).is_ok() {
            // Bulk data wants every ACK at once (measured: 1 MiB streams lost up
            // to half their rate with delayed ACKs): the sender's window grows on
            // them. The next small message asks for delayed ACKs again.
            self.acks_delayed = false;
            self.rearm_in = 0;
        }
        let count = usize::from(head.chunks);
        let nlanes = core.lanes.len();
        if !inline && head.flags & FLAG_TRUNCATED == 0 && (count == 0 || count > nlanes) {
            return Err(protocol(format!(
                "{size}-byte message striped over {count} of {nlanes} streams"
            )));
        }
        if head.flags & FLAG_TRUNCATED != 0 || size > cap {
            slot.get().set_error(format!(
                "message truncated: peer {} sent {size} bytes (tag {}) but the posted \
                 receive holds only {cap} bytes",
                core.peer, head.tag
            ));
            if head.flags & FLAG_TRUNCATED == 0 {
                // Drain the payload so the next message starts where it should.
                if inline {
                    self.state = In::Payload {
                        dst: std::ptr::null_mut(),
                        left: size,
                        slot: None,
                    };
                } else {
                    self.stripe(core, size, count, std::ptr::null_mut(), None);
                }
            }
            slot.get().finish_part();
            return Ok(());
        }
        slot.get().set_size(idx, size);
        if inline {
            self.state = In::Payload {
                dst: addr as *mut u8,
                left: size,
                slot: Some(slot),
            };
        } else {
            slot.get().add_parts(wire::chunks(size, count).count());
            self.stripe(core, size, count, addr as *mut u8, Some(slot));
            slot.get().finish_part();
        }
        Ok(())
    }

    /// Hands the chunks of a striped payload to the helper threads (a null `base`
    /// with no slot discards them).
    fn stripe(
        &mut self,
        core: &Core,
        size: usize,
        count: usize,
        base: *mut u8,
        slot: Option<SlotPtr>,
    ) {
        let nlanes = core.lanes.len();
        let mut wake = 0u64;
        for (i, (off, len)) in wire::chunks(size, count).enumerate() {
            let ptr = if base.is_null() {
                base
            } else {
                // SAFETY: `off < size ≤ cap`, inside NCCL's buffer.
                unsafe { base.add(off) }
            };
            wake |= 1 << core.post((self.cursor + i) % nlanes, Task { slot, ptr, len });
        }
        self.cursor = (self.cursor + count) % nlanes;
        core.wake(wake);
    }
}

fn eof(core: &Core) -> String {
    format!(
        "peer {} closed the connection (end of file on the control stream)",
        core.peer
    )
}

/// Posts a (grouped) receive on the comm `core`.
pub fn irecv<M>(core: &Core, bufs: &[RecvBuf<'_, M>]) -> Result<Option<Request>> {
    if let Some(e) = core.refuse() {
        return Err(e);
    }
    let mut guard = core.control();
    let Control::Recv(ctl) = &mut *guard else {
        return Err(Error::internal("irecv on a send comm"));
    };
    let n = bufs.len();
    if n == 0 || n > ctl.max_recvs {
        return Err(Error::invalid_argument(format!(
            "irecv with {n} buffers; this comm takes 1..={} (maxRecvs)",
            ctl.max_recvs
        )));
    }
    let Some(req) = core.pool.acquire(n, n) else {
        return Err(Error::invalid_usage(format!(
            "more than {} receives in flight from {}",
            core.pool.capacity(),
            core.peer
        )));
    };
    let mut posted = Posted {
        slot: req.ptr(),
        n,
        bufs: [(0, 0, 0); MAX_RECVS],
        filled: 0,
    };
    for (i, b) in bufs.iter().enumerate() {
        posted.bufs[i] = (b.buf.as_ptr() as usize, b.buf.len(), b.tag);
    }
    ctl.posted.push_back(posted);
    if let Some(queue) = ctl.cts.as_mut() {
        let mut cts = Cts {
            n,
            ..Cts::default()
        };
        for (i, b) in bufs.iter().enumerate() {
            cts.tags[i] = b.tag;
            cts.sizes[i] = b.buf.len() as u64;
        }
        let mut out = CtsOut {
            bytes: [0; Cts::MAX_LEN],
            len: 0,
            sent: 0,
        };
        out.len = cts.encode(&mut out.bytes);
        queue.push_back(out);
    }
    // Only the clear-to-send goes out now; reading waits for `test`, so a receive
    // posted ahead of its data costs no system call on the critical path.
    if let Err(message) = ctl.flush_cts(core) {
        drop(guard);
        core.fail(message);
    }
    Ok(Some(req))
}
