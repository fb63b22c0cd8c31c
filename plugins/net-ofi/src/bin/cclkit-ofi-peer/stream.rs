//! The plugin side of the stream benchmark, shared by the `stream` scenario and
//! `benches/ofi_stream.rs` (which includes this file): `count` messages of one
//! size, `window` in flight over registered round-robin buffers, ended by the
//! receiver's one-byte reply.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use crate::flows::{self, Link, check_deadline, fin};
use crate::table::R;

/// Registered buffers of one side of a stream.
pub struct PluginStream {
    comm: *mut c_void,
    sender: bool,
    size: usize,
    bufs: Vec<Vec<u8>>,
    mhs: Vec<*mut c_void>,
}

impl PluginStream {
    /// Registers `window` buffers of `size` bytes on the link's send or receive comm.
    pub fn new(link: &Link, sender: bool, size: usize, window: usize) -> R<Self> {
        let comm = if sender { link.send } else { link.recv };
        let mut bufs: Vec<Vec<u8>> = (0..window).map(|_| vec![3u8; size]).collect();
        let mhs = bufs
            .iter_mut()
            .map(|b| link.net.reg_mr(comm, b.as_mut_ptr(), b.len()))
            .collect::<R<Vec<_>>>()?;
        Ok(Self {
            comm,
            sender,
            size,
            bufs,
            mhs,
        })
    }

    /// Moves `count` messages and waits for the receiver's reply; returns the time.
    pub fn phase(&mut self, link: &Link, count: usize) -> R<Duration> {
        let window = self.bufs.len();
        let start = Instant::now();
        let mut inflight: VecDeque<*mut c_void> = VecDeque::new();
        let (mut posted, mut done) = (0, 0);
        let deadline = start + flows::WAIT;
        while done < count {
            while inflight.len() < window && posted < count {
                let k = posted % window;
                let b = self.bufs[k].as_mut_ptr();
                let req = if self.sender {
                    link.net.isend(self.comm, b, self.size, 0, self.mhs[k])?
                } else {
                    link.net
                        .irecv(self.comm, &[(b, self.size, 0, self.mhs[k])])?
                };
                if req.is_null() {
                    break;
                }
                inflight.push_back(req);
                posted += 1;
            }
            // Completion is in order per comm; test the oldest first. Like NCCL's
            // proxy thread, yield the CPU when a pass made no progress.
            let mut progressed = false;
            if let Some(&req) = inflight.front() {
                if link.net.test(req, 1)?.is_some() {
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
    pub fn close(self, link: &Link) -> R<()> {
        self.mhs
            .into_iter()
            .try_for_each(|mh| link.net.dereg_mr(self.comm, mh))
    }
}
