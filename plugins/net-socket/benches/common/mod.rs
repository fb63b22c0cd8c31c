//! Shared pieces of the loopback benchmark: the plugin driven through its exported
//! `ncclNetPlugin_v12` table as NCCL's proxy drives it, the parent/peer command
//! channel, and the paired-round statistics.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::io::{BufRead, Write};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use cclkit_abi::raw::net::ncclNetCommConfig_v10_t;
use cclkit_net_socket::ncclNetPlugin_v12 as NET;

/// An opaque pointer of the C interface.
pub type Ptr = *mut c_void;

fn check(r: cclkit_abi::raw::common::NcclResult, what: &str) {
    assert!(r.is_ok(), "{what} failed: {r:?}");
}

/// The plugin side of one process: a send comm to the peer and a receive comm from it.
pub struct Plugin {
    ctx: Ptr,
    send: Ptr,
    recv: Ptr,
}

impl Plugin {
    /// Listens, swaps handles through `peer_io`, connects and accepts.
    pub fn connect(peer_io: &mut dyn FnMut(&str) -> String) -> Plugin {
        let mut ctx: Ptr = null_mut();
        let mut cfg = ncclNetCommConfig_v10_t { trafficClass: -1 };
        let mut handle = [0u8; 128];
        let mut lc: Ptr = null_mut();
        // SAFETY: NCCL's calling conventions for init and listen.
        unsafe {
            check(
                (NET.init.unwrap())(&mut ctx, 1, &mut cfg, None, None),
                "init",
            );
            check(
                (NET.listen.unwrap())(ctx, 0, handle.as_mut_ptr().cast(), &mut lc),
                "listen",
            );
        }
        let hex: String = handle.iter().map(|b| format!("{b:02x}")).collect();
        let theirs = peer_io(&hex);
        let mut peer = [0u8; 128];
        for (i, b) in peer.iter_mut().enumerate() {
            *b = u8::from_str_radix(&theirs[2 * i..2 * i + 2], 16).expect("handle hex");
        }
        let (mut send, mut recv): (Ptr, Ptr) = (null_mut(), null_mut());
        let deadline = Instant::now() + Duration::from_secs(30);
        while send.is_null() || recv.is_null() {
            assert!(Instant::now() < deadline, "connection setup timed out");
            let mut dev = null_mut();
            // SAFETY: the same handle buffer on every connect retry, as NCCL does.
            unsafe {
                if send.is_null() {
                    check(
                        (NET.connect.unwrap())(
                            ctx,
                            0,
                            peer.as_mut_ptr().cast(),
                            &mut send,
                            &mut dev,
                        ),
                        "connect",
                    );
                }
                if recv.is_null() {
                    check((NET.accept.unwrap())(lc, &mut recv, &mut dev), "accept");
                }
            }
        }
        // SAFETY: the listen comm is no longer needed.
        unsafe { check((NET.closeListen.unwrap())(lc), "closeListen") };
        Plugin { ctx, send, recv }
    }

    /// Posts a send of `buf`, retrying while the plugin answers NULL.
    pub fn isend(&self, buf: &mut [u8]) -> Ptr {
        let mut req: Ptr = null_mut();
        while req.is_null() {
            // SAFETY: the buffer outlives the request (callers wait before reuse).
            unsafe {
                check(
                    (NET.isend.unwrap())(
                        self.send,
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                        null_mut(),
                        null_mut(),
                        &mut req,
                    ),
                    "isend",
                )
            };
            if req.is_null() {
                std::thread::yield_now();
            }
        }
        req
    }

    /// Posts a receive into `buf`.
    pub fn irecv(&self, buf: &mut [u8]) -> Ptr {
        let mut data = buf.as_mut_ptr().cast::<c_void>();
        let mut size = buf.len();
        let mut tag: c_int = 0;
        let mut mh: Ptr = null_mut();
        let mut req: Ptr = null_mut();
        // SAFETY: one buffer that outlives the request.
        unsafe {
            check(
                (NET.irecv.unwrap())(
                    self.recv,
                    1,
                    &mut data,
                    &mut size,
                    &mut tag,
                    &mut mh,
                    null_mut(),
                    &mut req,
                ),
                "irecv",
            )
        };
        assert!(!req.is_null());
        req
    }

    /// One `test` call.
    pub fn test(&self, req: Ptr) -> bool {
        let mut done: c_int = 0;
        let mut sizes = [0 as c_int; 64];
        // SAFETY: a live request.
        unsafe {
            check(
                (NET.test.unwrap())(req, &mut done, sizes.as_mut_ptr()),
                "test",
            )
        };
        done == 1
    }

    /// Tests until `req` completes, yielding the CPU between tries like NCCL's proxy.
    pub fn wait(&self, req: Ptr) {
        while !self.test(req) {
            std::thread::yield_now();
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // SAFETY: comms and context from this process's init/connect/accept.
        unsafe {
            check((NET.closeSend.unwrap())(self.send), "closeSend");
            check((NET.closeRecv.unwrap())(self.recv), "closeRecv");
            check((NET.finalize.unwrap())(self.ctx), "finalize");
        }
    }
}

/// Keeps `window` operations (one per buffer of `bufs`, reused round-robin) in
/// flight until `count` are done, testing the oldest one each round like NCCL's
/// proxy (which polls steps in order) and yielding when it is not done yet.
pub fn stream(p: &Plugin, bufs: &mut [Vec<u8>], count: usize, sending: bool) {
    let window = bufs.len();
    let mut inflight: VecDeque<Ptr> = VecDeque::with_capacity(window);
    let (mut posted, mut done) = (0, 0);
    while done < count {
        while posted < count && inflight.len() < window {
            let slot = posted % window;
            let req = if sending {
                p.isend(&mut bufs[slot])
            } else {
                p.irecv(&mut bufs[slot])
            };
            inflight.push_back(req);
            posted += 1;
        }
        match inflight.front() {
            Some(&req) if p.test(req) => {
                inflight.pop_front();
                done += 1;
            }
            _ => std::thread::yield_now(),
        }
    }
}

/// Per-round results of the plugin and baselines, paired by round.
#[derive(Default)]
pub struct Paired {
    /// The plugin's result per round.
    pub ours: Vec<f64>,
    /// Each baseline's result per round.
    pub base: Vec<Vec<f64>>,
}

impl Paired {
    /// A record for `n` baselines.
    pub fn new(n: usize) -> Self {
        Self {
            ours: Vec::new(),
            base: vec![Vec::new(); n],
        }
    }

    /// Median of ours, median of baseline `b`, median of the per-round ratios.
    pub fn against(&self, b: usize) -> [f64; 3] {
        let mut ratio: Vec<f64> = self
            .ours
            .iter()
            .zip(&self.base[b])
            .map(|(o, b)| o / b)
            .collect();
        [
            median(&mut self.ours.clone()),
            median(&mut self.base[b].clone()),
            median(&mut ratio),
        ]
    }
}

/// CPU seconds (user + system, all threads) this process has used.
pub fn cpu() -> f64 {
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Tells the peer `cmd`, runs our side, and returns our result with the CPU both
/// processes spent on it.
pub fn timed(
    to: &mut impl Write,
    from: &mut impl BufRead,
    cmd: &str,
    ours: impl FnOnce() -> f64,
) -> (f64, f64) {
    tell(to, cmd);
    let c0 = cpu();
    let v = ours();
    let mine = cpu() - c0;
    let reply = read(from);
    let theirs: f64 = reply
        .strip_prefix("ok ")
        .and_then(|c| c.parse().ok())
        .expect("peer reply");
    (v, mine + theirs)
}

/// The median (sorts `v`).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The value after `name` on the command line.
pub fn arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

/// Whether `flag` is on the command line.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// Sends one command line.
pub fn tell(to: &mut impl Write, line: &str) {
    writeln!(to, "{line}").expect("to peer");
    to.flush().expect("flush");
}

/// Reads one line.
pub fn read(from: &mut impl BufRead) -> String {
    let mut s = String::new();
    from.read_line(&mut s).expect("from peer");
    s.trim().to_owned()
}

/// `8 B`, `4 KiB`, `16 MiB`.
pub fn human(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else if size >= 1 << 10 {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}
