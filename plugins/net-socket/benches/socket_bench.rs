//! Loopback benchmark: `cclkit-socket` (through its `ncclNetPlugin_v12` table, as
//! NCCL calls it) against a raw-TCP baseline (plain blocking send/recv of the same
//! sizes over one socket), between two processes, in one invocation.
//!
//! ```text
//! cargo bench -p cclkit-net-socket --bench socket_bench [-- --quick] [--rounds N] [--latency-only]
//! ```
//! The plugin's usual variables apply (`NCCL_SOCKET_NTHREADS`, …); the interface
//! defaults to `lo`. The driver loop tests every outstanding request and yields the
//! CPU when nothing progressed, as NCCL's proxy thread does.
//!
//! Each round measures the plugin and the baseline back to back (alternating which
//! goes first); the table shows medians over rounds, and the ratio column is the
//! median of the per-round ratios, which is robust to load drifting on a shared host.
//! CPU columns count user + system time of both processes (helper threads included).

use std::ffi::{c_int, c_void};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use cclkit_abi::raw::net::ncclNetCommConfig_v10_t;
use cclkit_net_socket::ncclNetPlugin_v12 as NET;

type Ptr = *mut c_void;

const ROLE: &str = "CCLKIT_BENCH_ROLE";
/// Requests in flight per direction in bandwidth runs.
const WINDOW: usize = 4;

fn check(r: cclkit_abi::raw::common::NcclResult, what: &str) {
    assert!(r.is_ok(), "{what} failed: {r:?}");
}

/// The plugin side of one process: a send comm to the peer and a receive comm from it.
struct Plugin {
    ctx: Ptr,
    send: Ptr,
    recv: Ptr,
}

impl Plugin {
    fn connect(peer_io: &mut dyn FnMut(&str) -> String) -> Plugin {
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

    fn isend(&self, buf: &mut [u8]) -> Ptr {
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

    fn irecv(&self, buf: &mut [u8]) -> Ptr {
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

    fn test(&self, req: Ptr) -> bool {
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
    fn wait(&self, req: Ptr) {
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

/// Keeps `WINDOW` operations of `size` bytes in flight until `count` are done.
/// Keeps `WINDOW` operations in flight until `count` are done, testing the oldest
/// one each round like NCCL's proxy (which polls steps in order) and yielding when
/// it is not done yet.
fn stream(p: &Plugin, bufs: &mut [Vec<u8>], count: usize, sending: bool) {
    let mut inflight: std::collections::VecDeque<Ptr> =
        std::collections::VecDeque::with_capacity(WINDOW);
    let (mut posted, mut done) = (0, 0);
    while done < count {
        while posted < count && inflight.len() < WINDOW {
            let slot = posted % bufs.len();
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

fn bw_plugin(p: &Plugin, bufs: &mut [Vec<u8>], count: usize) -> f64 {
    let size = bufs[0].len();
    let mut ack = [0u8; 1];
    let start = Instant::now();
    stream(p, bufs, count, true);
    let r = p.irecv(&mut ack);
    p.wait(r);
    (size * count) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn bw_raw(s: &mut TcpStream, buf: &[u8], count: usize) -> f64 {
    let size = buf.len();
    let mut ack = [0u8; 1];
    let start = Instant::now();
    for _ in 0..count {
        s.write_all(buf).expect("raw send");
    }
    s.read_exact(&mut ack).expect("raw ack");
    (size * count) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// 8-byte ping-pong; returns the mean round trip in µs. A receive is always
/// posted ahead, as NCCL keeps receives posted.
fn lat_plugin(p: &Plugin, iters: usize, initiator: bool) -> f64 {
    let mut out = [1u8; 8];
    let mut inb = [[0u8; 8]; 2];
    let start = Instant::now();
    let [a, b] = &mut inb;
    let bufs = [a, b];
    let mut next = p.irecv(bufs[0]);
    for i in 0..iters {
        if initiator {
            let s = p.isend(&mut out);
            p.wait(s);
            p.wait(next);
            next = p.irecv(bufs[(i + 1) % 2]);
        } else {
            p.wait(next);
            next = p.irecv(bufs[(i + 1) % 2]);
            let s = p.isend(&mut out);
            p.wait(s);
        }
    }
    let elapsed = start.elapsed();
    // The last posted receive: the peer sends one more message to complete it.
    if initiator {
        let s = p.isend(&mut out);
        p.wait(s);
    }
    p.wait(next);
    if !initiator {
        let s = p.isend(&mut out);
        p.wait(s);
    }
    elapsed.as_secs_f64() * 1e6 / iters as f64
}

fn lat_raw(s: &mut TcpStream, iters: usize, initiator: bool) -> f64 {
    let mut buf = [0u8; 8];
    let start = Instant::now();
    for _ in 0..iters {
        if initiator {
            s.write_all(&buf).expect("raw send");
            s.read_exact(&mut buf).expect("raw recv");
        } else {
            s.read_exact(&mut buf).expect("raw recv");
            s.write_all(&buf).expect("raw send");
        }
    }
    start.elapsed().as_secs_f64() * 1e6 / iters as f64
}

fn peer() {
    let mut stdin = BufReader::new(std::io::stdin());
    let mut line = String::new();
    let mut hear = |line: &mut String| {
        line.clear();
        stdin.read_line(line).expect("stdin");
        line.trim().to_owned()
    };
    let port: u16 = hear(&mut line).parse().expect("port");
    let mut raw = TcpStream::connect(("127.0.0.1", port)).expect("raw connect");
    raw.set_nodelay(true).expect("nodelay");
    let theirs = hear(&mut line);
    let p = Plugin::connect(&mut |mine: &str| {
        println!("{mine}");
        theirs.clone()
    });
    // Receive buffers persist across commands and are touched once up front, so
    // neither side pays page faults inside a timed run.
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    let mut rawbuf: Vec<u8> = Vec::new();
    loop {
        let cmd = hear(&mut line);
        let cpu0 = cpu();
        let f: Vec<&str> = cmd.split_whitespace().collect();
        match f.as_slice() {
            ["bw", "plugin", size, count] => {
                let (size, count): (usize, usize) =
                    (size.parse().expect("size"), count.parse().expect("count"));
                if bufs.first().map(Vec::len) != Some(size) {
                    bufs = (0..WINDOW).map(|_| vec![0xffu8; size]).collect();
                }
                stream(&p, &mut bufs, count, false);
                assert!(
                    bufs.iter().all(|b| b.first() == b.last()),
                    "payload damaged"
                );
                let s = p.isend(&mut [1u8]);
                p.wait(s);
            }
            ["bw", "raw", size, count] => {
                let (size, count): (usize, usize) =
                    (size.parse().expect("size"), count.parse().expect("count"));
                if rawbuf.len() != size {
                    rawbuf = vec![0xffu8; size];
                }
                for _ in 0..count {
                    raw.read_exact(&mut rawbuf).expect("raw recv");
                }
                raw.write_all(&[1]).expect("raw ack");
            }
            ["lat", "plugin", iters] => {
                lat_plugin(&p, iters.parse().expect("iters"), false);
            }
            ["lat", "raw", iters] => {
                lat_raw(&mut raw, iters.parse().expect("iters"), false);
            }
            ["quit"] => break,
            other => panic!("unknown command {other:?}"),
        }
        println!("ok {}", cpu() - cpu0);
    }
}

fn main() {
    if std::env::var_os(ROLE).is_some() {
        peer();
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let ifname = std::env::var("NCCL_SOCKET_IFNAME").unwrap_or_else(|_| "lo".to_owned());
    // SAFETY: single-threaded at this point; the plugin reads the variable at init.
    unsafe { std::env::set_var("NCCL_SOCKET_IFNAME", &ifname) };
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .env(ROLE, "peer")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn peer");
    let mut to = child.stdin.take().expect("stdin");
    let mut from = BufReader::new(child.stdout.take().expect("stdout"));
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    tell(
        &mut to,
        &listener.local_addr().expect("addr").port().to_string(),
    );
    let (mut raw, _) = listener.accept().expect("raw accept");
    raw.set_nodelay(true).expect("nodelay");
    let p = Plugin::connect(&mut |mine: &str| {
        tell(&mut to, mine);
        read(&mut from)
    });
    let sizes: &[usize] = if std::env::args().any(|a| a == "--latency-only") {
        &[]
    } else if quick {
        &[1 << 20, 64 << 20]
    } else {
        &[64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
    };
    let rounds: usize = arg("--rounds").unwrap_or(if quick { 3 } else { 7 });
    println!("cclkit-socket vs raw TCP, loopback, 2 processes, NCCL_SOCKET_IFNAME={ifname}");
    for var in [
        "NCCL_SOCKET_NTHREADS",
        "NCCL_NSOCKS_PERTHREAD",
        "NCCL_SOCKET_INLINE",
        "NCCL_SOCKET_MIN_TASKSIZE",
        "CCLKIT_SOCKET_MAX_RECVS",
    ] {
        if let Ok(v) = std::env::var(var) {
            println!("  {var}={v}");
        }
    }
    println!("{rounds} paired rounds, medians; the plugin keeps {WINDOW} requests in flight\n");
    println!(
        "| size | cclkit-socket GB/s | raw TCP GB/s | ratio | CPU s/GB cclkit-socket | CPU s/GB raw TCP |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for &size in sizes {
        let count = ((1usize << 30) / size).clamp(8, 4096) / if quick { 2 } else { 1 };
        let gb = (size * count) as f64 / 1e9;
        let mut bufs: Vec<Vec<u8>> = (0..WINDOW).map(|i| vec![i as u8 + 1; size]).collect();
        let rawbuf = vec![7u8; size];
        let mut m = Paired::default();
        for r in 0..rounds {
            for ours_now in [r % 2 == 0, r % 2 != 0] {
                if ours_now {
                    let (v, c) = timed(
                        &mut to,
                        &mut from,
                        &format!("bw plugin {size} {count}"),
                        || bw_plugin(&p, &mut bufs, count),
                    );
                    m.ours.push(v);
                    m.ours_cpu.push(c / gb);
                } else {
                    let (v, c) = timed(
                        &mut to,
                        &mut from,
                        &format!("bw raw {size} {count}"),
                        || bw_raw(&mut raw, &rawbuf, count),
                    );
                    m.base.push(v);
                    m.base_cpu.push(c / gb);
                }
            }
        }
        let [o, b, ratio, oc, bc] = m.medians();
        println!(
            "| {} | {o:.2} | {b:.2} | {ratio:.2} | {oc:.3} | {bc:.3} |",
            human(size)
        );
    }
    let iters = if quick { 5_000 } else { 20_000 };
    let mut m = Paired::default();
    for r in 0..rounds {
        for ours_now in [r % 2 == 0, r % 2 != 0] {
            if ours_now {
                let (v, c) = timed(&mut to, &mut from, &format!("lat plugin {iters}"), || {
                    lat_plugin(&p, iters, true)
                });
                m.ours.push(v);
                m.ours_cpu.push(c * 1e6 / iters as f64);
            } else {
                let (v, c) = timed(&mut to, &mut from, &format!("lat raw {iters}"), || {
                    lat_raw(&mut raw, iters, true)
                });
                m.base.push(v);
                m.base_cpu.push(c * 1e6 / iters as f64);
            }
        }
    }
    let [o, b, ratio, oc, bc] = m.medians();
    println!(
        "\n8-byte round trip (median): cclkit-socket {o:.1} us, raw TCP {b:.1} us, ratio {ratio:.2}; \
         CPU per round trip (both processes) {oc:.1} us vs {bc:.1} us"
    );
    tell(&mut to, "quit");
    drop(p);
    let _ = child.wait();
}

/// Per-round results of the plugin and the baseline.
#[derive(Default)]
struct Paired {
    ours: Vec<f64>,
    base: Vec<f64>,
    ours_cpu: Vec<f64>,
    base_cpu: Vec<f64>,
}

impl Paired {
    /// Medians of: ours, baseline, per-round ratio, our CPU, baseline CPU.
    fn medians(&mut self) -> [f64; 5] {
        let mut ratio: Vec<f64> = self
            .ours
            .iter()
            .zip(&self.base)
            .map(|(o, b)| o / b)
            .collect();
        [
            median(&mut self.ours),
            median(&mut self.base),
            median(&mut ratio),
            median(&mut self.ours_cpu),
            median(&mut self.base_cpu),
        ]
    }
}

/// CPU seconds (user + system, all threads) this process has used.
fn cpu() -> f64 {
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Tells the peer `cmd`, runs our side, and returns our result with the CPU both
/// processes spent on it.
fn timed(
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

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn tell(to: &mut impl Write, line: &str) {
    writeln!(to, "{line}").expect("to peer");
    to.flush().expect("flush");
}

fn read(from: &mut impl BufRead) -> String {
    let mut s = String::new();
    from.read_line(&mut s).expect("from peer");
    s.trim().to_owned()
}

fn human(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}
