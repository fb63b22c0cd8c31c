//! The plugin side of the stream benchmark, used by the `stream` scenario and by
//! `mixed` (the side `benches/ofi_stream.rs` runs): `count` messages of one size,
//! `window` in flight over registered round-robin buffers, ended by the receiver's
//! one-byte reply.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use cclkit_host::net::{Mr, RecvBuffer, Request};

use crate::flows::{self, Link, check_deadline, fin};
use crate::net::{R, Side, err};

/// Registered buffers of one side of a stream.
pub struct PluginStream {
    sender: bool,
    size: usize,
    bufs: Vec<Vec<u8>>,
    mrs: Vec<Mr>,
}

impl PluginStream {
    /// The link's comm this side of the stream uses.
    fn side<'a>(&self, link: &'a mut Link) -> Side<'a> {
        if self.sender {
            Side::Send(&mut link.send)
        } else {
            Side::Recv(&mut link.recv)
        }
    }

    /// Registers `window` buffers of `size` bytes on the link's send or receive comm.
    pub fn new(link: &mut Link, sender: bool, size: usize, window: usize) -> R<Self> {
        let mut s = Self {
            sender,
            size,
            bufs: (0..window).map(|_| vec![3u8; size]).collect(),
            mrs: Vec::with_capacity(window),
        };
        let mut side = s.side(link);
        for b in &mut s.bufs {
            // SAFETY: the buffers stay in `s` (their heap memory never moves) until
            // `close` deregisters them.
            s.mrs.push(unsafe { side.reg_mr(b) }?);
        }
        Ok(s)
    }

    /// Moves `count` messages and waits for the receiver's reply; returns the time.
    pub fn phase(&mut self, link: &mut Link, count: usize) -> R<Duration> {
        let window = self.bufs.len();
        let start = Instant::now();
        let mut inflight: VecDeque<Request> = VecDeque::new();
        let (mut posted, mut done) = (0, 0);
        let deadline = start + flows::WAIT;
        while done < count {
            while inflight.len() < window && posted < count {
                let k = posted % window;
                let (b, mr) = (self.bufs[k].as_mut_ptr(), Some(&self.mrs[k]));
                // SAFETY: buffer k is reused only after its previous request completed
                // (completion is in order and at most `window` are in flight).
                let req = unsafe {
                    if self.sender {
                        link.send.isend(b, self.size, 0, mr)
                    } else {
                        let one = RecvBuffer {
                            data: b,
                            size: self.size,
                            tag: 0,
                            mr,
                        };
                        link.recv.irecv(&[one], false)
                    }
                }
                .map_err(err)?;
                let Some(req) = req else { break };
                inflight.push_back(req);
                posted += 1;
            }
            // Completion is in order per comm; test the oldest first. Like NCCL's
            // proxy thread, yield the CPU when a pass made no progress.
            let mut progressed = false;
            if let Some(req) = inflight.front_mut() {
                let complete = if self.sender {
                    link.send.test(req)
                } else {
                    link.recv.test(req)
                }
                .map_err(err)?;
                if complete.is_some() {
                    inflight.pop_front();
                    done += 1;
                    progressed = true;
                }
            }
            if !progressed {
                std::thread::yield_now();
            }
            check_deadline(deadline, "stream phase")?;
        }
        fin(link, !self.sender)?;
        Ok(start.elapsed())
    }

    /// Deregisters the buffers.
    pub fn close(mut self, link: &mut Link) -> R<()> {
        let mut side = self.side(link);
        self.mrs.drain(..).try_for_each(|mr| side.dereg_mr(mr))
    }
}
