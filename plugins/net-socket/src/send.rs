//! The sending side: `isend` and the control stream's outgoing state machine.
//!
//! Every message gets a header on the control stream. A payload of up to
//! `NCCL_SOCKET_INLINE` bytes (or any payload when the comm has no data streams)
//! follows its header there, written by the proxy thread itself; larger payloads are
//! striped over the data streams. Partial writes are kept in the queue, never lost.
//!
//! Small messages cost one system call per batch, not per message: `isend` of an
//! inline message only queues it (as NCCL's own socket transport does, whose
//! `isend` does no I/O either), and the next `test` gathers every queued header and
//! payload into one `sendmsg`. A caller streaming small messages thus posts several
//! and pays one write for all of them. A striped message's header is written at once
//! (its receiver must learn where the data streams' bytes go), and a queue of
//! [`FLUSH_AT`] messages is written without waiting for `test`.
//!
//! In grouped mode the receiver's clear-to-send records arrive on the same socket;
//! a send is only posted once it matches a buffer of the oldest open record by tag
//! (NCCL's IB semantics), so the sender also learns the receive size and can report
//! a truncation itself.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

use cclkit_abi::net::Buf;
use cclkit_abi::{Error, Result};

use crate::comm::{Control, Core, Task};
use crate::slots::{Request, SlotPtr};
use crate::sys;
use crate::wire::{self, Cts, FLAG_INLINE, FLAG_TRUNCATED, Header};

/// Most queued messages one `sendmsg` covers (two iovecs each, well under `IOV_MAX`).
const BATCH: usize = 64;
/// Queue length at which `isend` writes without waiting for `test` (NCCL keeps at
/// most 8 steps per connection in flight, so its sends wait for `test`).
pub const FLUSH_AT: usize = 16;

/// A header (and maybe its inline payload) not yet fully written.
struct Out {
    head: [u8; Header::LEN],
    payload: *const u8,
    len: usize,
    /// Bytes of header + payload already written.
    sent: usize,
    slot: Option<SlotPtr>,
}

// SAFETY: `payload` is NCCL's send buffer, valid and unmodified until the request
// completes, which requires this entry to be fully written first.
unsafe impl Send for Out {}

/// Clear-to-send records received from the peer (grouped mode).
struct CtsIn {
    buf: Box<[u8]>,
    end: usize,
    open: VecDeque<(Cts, u8)>,
}

/// The control stream state of a send comm.
pub struct SendCtl {
    sock: TcpStream,
    out: VecDeque<Out>,
    /// The last write found the socket full.
    full: bool,
    cursor: usize,
    inline_bytes: usize,
    min_chunk: usize,
    cts: Option<CtsIn>,
    /// `sendmsg` calls made on the control stream (the batching tests count them).
    writes: u64,
}

impl SendCtl {
    /// Control state over `sock`; `grouped` = the receiver sends clear-to-send records.
    pub fn new(
        sock: TcpStream,
        inline_bytes: usize,
        min_chunk: usize,
        grouped: bool,
        slots: usize,
    ) -> Self {
        Self {
            sock,
            out: VecDeque::with_capacity(slots * 2),
            full: false,
            cursor: 0,
            inline_bytes,
            min_chunk,
            cts: grouped.then(|| CtsIn {
                buf: vec![0u8; 64 * Cts::MAX_LEN].into_boxed_slice(),
                end: 0,
                open: VecDeque::with_capacity(slots),
            }),
            writes: 0,
        }
    }

    /// `sendmsg` calls made so far on the control stream.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Messages queued and not yet fully written.
    pub fn queued(&self) -> usize {
        self.out.len()
    }

    /// Writes what the socket takes of the queued headers and inline payloads (from
    /// `test`: a no-op without queued bytes). `Err` carries a message naming the peer.
    pub fn progress(&mut self, core: &Core) -> std::result::Result<(), String> {
        self.flush(core)
    }

    fn flush(&mut self, core: &Core) -> std::result::Result<(), String> {
        if self.full && !self.out.is_empty() {
            // The socket was full: wait until the kernel calls it writable (a third of
            // the send buffer free) instead of trickling out whatever space each poll
            // from `test` finds; big writes keep both ends' CPU cost per byte low.
            let mut fd = [sys::pollfd(self.sock.as_raw_fd(), libc::POLLOUT)];
            sys::poll(&mut fd, 0)
                .map_err(|e| format!("poll on the connection to {}: {e}", core.peer))?;
            if fd[0].revents == 0 {
                return Ok(());
            }
            self.full = false;
        }
        while !self.out.is_empty() {
            // Left uninitialised: most writes carry one or two messages, and zeroing
            // all 2 KiB of entries cost more than building the ones used.
            let mut iov = [const { MaybeUninit::<IoSlice<'_>>::uninit() }; 2 * BATCH];
            let mut n = 0;
            for o in self.out.iter().take(BATCH) {
                if o.sent < Header::LEN {
                    iov[n].write(IoSlice::new(&o.head[o.sent..]));
                    n += 1;
                }
                let done = o.sent.saturating_sub(Header::LEN);
                if done < o.len {
                    // SAFETY: see `Out`: the payload is valid for `len` bytes.
                    let p =
                        unsafe { std::slice::from_raw_parts(o.payload.add(done), o.len - done) };
                    iov[n].write(IoSlice::new(p));
                    n += 1;
                }
            }
            // SAFETY: entries 0..n were written above (at most two per message, and at
            // most BATCH messages), and MaybeUninit<T> has T's layout.
            let iov = unsafe { std::slice::from_raw_parts(iov.as_ptr().cast::<IoSlice<'_>>(), n) };
            self.writes += 1;
            let mut written = match sys::send_vectored(self.sock.as_raw_fd(), iov) {
                Ok(w) => w,
                Err(e) if sys::would_block(&e) => {
                    self.full = true;
                    return Ok(());
                }
                Err(e) => return Err(format!("sending to peer {} failed: {e}", core.peer)),
            };
            while let Some(o) = self.out.front_mut() {
                let left = Header::LEN + o.len - o.sent;
                if written < left {
                    o.sent += written;
                    break;
                }
                written -= left;
                if let Some(slot) = o.slot {
                    slot.get().finish_part();
                }
                self.out.pop_front();
            }
        }
        Ok(())
    }

    fn read_cts(&mut self, core: &Core) -> std::result::Result<(), String> {
        let Some(cts) = self.cts.as_mut() else {
            return Ok(());
        };
        loop {
            let room = cts.buf.len() - cts.end;
            if room == 0 {
                return Ok(());
            }
            let n = match sys::recv(self.sock.as_raw_fd(), &mut cts.buf[cts.end..]) {
                Ok(0) => {
                    return Err(format!(
                        "peer {} closed the connection (end of file on the control stream)",
                        core.peer
                    ));
                }
                Ok(n) => n,
                Err(e) if sys::would_block(&e) => return Ok(()),
                Err(e) => return Err(format!("receiving from peer {} failed: {e}", core.peer)),
            };
            cts.end += n;
            let mut start = 0;
            while let Some((rec, len)) =
                Cts::decode(&cts.buf[start..cts.end]).map_err(|e| e.message().to_owned())?
            {
                cts.open.push_back((rec, 0));
                start += len;
            }
            cts.buf.copy_within(start..cts.end, 0);
            cts.end -= start;
            if n < room {
                return Ok(());
            }
        }
    }
}

impl CtsIn {
    /// Claims the buffer for `tag` in the oldest open record: `(index, size)`.
    fn claim(&mut self, tag: i32) -> Option<(usize, u64)> {
        let (rec, posted) = self.open.front_mut()?;
        let idx = (0..rec.n).find(|&i| rec.tags[i] == tag && *posted & (1 << i) == 0)?;
        *posted |= 1 << idx;
        let size = rec.sizes[idx];
        if u32::from(*posted).count_ones() as usize == rec.n {
            self.open.pop_front();
        }
        Some((idx, size))
    }
}

/// Posts a send of `buf` with `tag` on the comm `core`.
pub fn isend(core: &Core, buf: Buf, tag: i32) -> Result<Option<Request>> {
    if let Some(e) = core.refuse() {
        return Err(e);
    }
    let mut guard = core.control();
    let Control::Send(ctl) = &mut *guard else {
        return Err(Error::internal("isend on a receive comm"));
    };
    let size = buf.len();
    let nlanes = core.lanes.len();
    let inline = size <= ctl.inline_bytes || nlanes == 0;
    let count = if inline {
        0
    } else {
        wire::stripe(size, nlanes, ctl.min_chunk)
    };
    let Some(req) = core.pool.acquire(1, 1 + count) else {
        return Err(Error::invalid_usage(format!(
            "more than {} sends in flight to {}",
            core.pool.capacity(),
            core.peer
        )));
    };
    // Grouped mode: read clear-to-send records only when the ones already read
    // hold no buffer for this tag, so a run of sends costs no read each.
    let claimed = match ctl.cts.as_mut().map(|c| c.claim(tag)) {
        Some(None) => {
            if let Err(message) = ctl.read_cts(core) {
                drop(guard);
                core.fail(message);
                return Err(core
                    .refuse()
                    .unwrap_or_else(|| Error::remote("connection failed")));
            }
            ctl.cts.as_mut().map(|c| c.claim(tag))
        }
        other => other,
    };
    let index = match claimed {
        None => 0,
        Some(claim) => match claim {
            None => return Ok(None),
            Some((idx, cap)) if size as u64 > cap => {
                // Tell the receiver too, so both sides fail instead of the receiver hanging.
                let head = Header {
                    size: size as u64,
                    tag,
                    index: idx as u8,
                    flags: FLAG_TRUNCATED,
                    chunks: 0,
                };
                ctl.out.push_back(Out {
                    head: head.encode(),
                    payload: std::ptr::null(),
                    len: 0,
                    sent: 0,
                    slot: None,
                });
                if let Err(message) = ctl.flush(core) {
                    drop(guard);
                    core.fail(message);
                }
                return Err(Error::invalid_usage(format!(
                    "message truncated: sending {size} bytes (tag {tag}) to {} but the \
                     matching receive holds only {cap} bytes",
                    core.peer
                )));
            }
            Some((idx, _)) => idx,
        },
    };
    req.slot().set_size(0, size);
    let mut wake = 0u64;
    if count > 0 {
        for (i, (off, len)) in wire::chunks(size, count).enumerate() {
            let lane = (ctl.cursor + i) % nlanes;
            let task = Task {
                slot: Some(req.ptr()),
                // SAFETY: `off < size`, inside NCCL's buffer.
                ptr: unsafe { buf.as_ptr().add(off) },
                len,
            };
            wake |= 1 << core.post(lane, task);
        }
        ctl.cursor = (ctl.cursor + count) % nlanes;
        core.wake(wake);
    }
    let head = Header {
        size: size as u64,
        tag,
        index: index as u8,
        flags: if inline { FLAG_INLINE } else { 0 },
        chunks: count as u8,
    };
    ctl.out.push_back(Out {
        head: head.encode(),
        payload: if inline {
            buf.as_ptr()
        } else {
            std::ptr::null()
        },
        len: if inline { size } else { 0 },
        sent: 0,
        slot: Some(req.ptr()),
    });
    // Inline messages wait for `test` (or a full batch) to share one `sendmsg`.
    if !inline || ctl.out.len() >= FLUSH_AT {
        if let Err(message) = ctl.flush(core) {
            drop(guard);
            core.fail(message);
        }
    }
    Ok(Some(req))
}
