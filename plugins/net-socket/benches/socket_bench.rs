//! Loopback benchmark: `cclkit-socket` (through its `ncclNetPlugin_v12` table, as
//! NCCL calls it) against raw TCP between two processes, in one invocation.
//!
//! ```text
//! cargo bench -p cclkit-net-socket --bench socket_bench -- [--quick] [--rounds N]
//!     [--small-only | --large-only] [--full] [--plugin-only] [--size N]
//! ```
//! `--plugin-only` runs just the plugin's streaming runs and `--size N` just one
//! size, for profiling (`strace -f -c`, `perf`) without the baselines mixed in.
//! Small messages (8 B, 64 B, 1 KiB, 4 KiB): the plugin streams with 8 requests in
//! flight per side (NCCL's `NCCL_STEPS`) next to two raw TCP streams of the same
//! messages, one written with one `write` per message (the floor: what a transport
//! doing one system call per message gets) and one with 8 messages per `writev`
//! (the ceiling of batching), each read the same way; then the round trip of one
//! message, plugin against a blocking raw ping-pong.
//! Large messages (1, 4, 16 MiB; `--full` adds 64 KiB, 64 and 256 MiB): the plugin
//! with 4 in flight against a blocking raw stream (one `write_all`/`read_exact` of
//! each message).
//!
//! Each round runs every variant back to back, rotating which goes first; the
//! tables show medians over rounds, and ratio columns are medians of per-round
//! ratios, robust to load drifting on a shared host. The plugin's variables apply
//! (`NCCL_SOCKET_NTHREADS`, …); the interface defaults to `lo`.

mod common;

use std::io::{BufReader, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Instant;

use common::{Paired, Plugin, arg, flag, human, read, stream, tell, timed};

const ROLE: &str = "CCLKIT_BENCH_ROLE";
/// Requests in flight per side for small messages (NCCL_STEPS).
const SMALL_WINDOW: usize = 8;
/// Requests in flight per side for large messages.
const LARGE_WINDOW: usize = 4;
/// Messages per `writev` (and per read) of the batched raw stream.
const RAW_BATCH: usize = 8;

/// Sends `count` messages from `bufs` (round-robin, one request in flight per
/// buffer); returns bytes/s measured until the peer's acknowledgement.
fn bw_plugin(p: &Plugin, bufs: &mut [Vec<u8>], count: usize) -> f64 {
    let size = bufs[0].len();
    let mut ack = [0u8; 1];
    let start = Instant::now();
    stream(p, bufs, count, true);
    let r = p.irecv(&mut ack);
    p.wait(r);
    (size * count) as f64 / start.elapsed().as_secs_f64()
}

/// Writes all of `bufs` with as few `writev` calls as the socket allows.
fn write_all_vectored(s: &mut TcpStream, mut bufs: &mut [IoSlice<'_>]) {
    while !bufs.is_empty() {
        let n = s.write_vectored(bufs).expect("raw writev");
        assert!(n > 0, "raw writev wrote nothing");
        IoSlice::advance_slices(&mut bufs, n);
    }
}

/// Sends `count` messages from `bufs` (round-robin, the plugin's buffers: the same
/// memory footprint), `batch` per system call (1 = `write_all`); returns bytes/s
/// measured until the peer's acknowledgement.
fn bw_raw(s: &mut TcpStream, bufs: &[Vec<u8>], count: usize, batch: usize) -> f64 {
    let size = bufs[0].len();
    let mut ack = [0u8; 1];
    let start = Instant::now();
    let mut sent = 0;
    while sent < count {
        let n = (count - sent).min(batch);
        if n == 1 {
            s.write_all(&bufs[sent % bufs.len()]).expect("raw send");
        } else {
            let mut iov = [IoSlice::new(&[]); RAW_BATCH];
            for (j, v) in iov[..n].iter_mut().enumerate() {
                *v = IoSlice::new(&bufs[(sent + j) % bufs.len()]);
            }
            write_all_vectored(s, &mut iov[..n]);
        }
        sent += n;
    }
    s.read_exact(&mut ack).expect("raw ack");
    (size * count) as f64 / start.elapsed().as_secs_f64()
}

/// Ping-pong of `size`-byte messages; returns the mean round trip in µs. A receive
/// is always posted ahead, as NCCL keeps receives posted.
fn lat_plugin(p: &Plugin, size: usize, iters: usize, initiator: bool) -> f64 {
    let mut out = vec![1u8; size];
    let mut inb = [vec![0u8; size], vec![0u8; size]];
    let start = Instant::now();
    let mut next = p.irecv(&mut inb[0]);
    for i in 0..iters {
        if initiator {
            let s = p.isend(&mut out);
            p.wait(s);
            p.wait(next);
            next = p.irecv(&mut inb[(i + 1) % 2]);
        } else {
            p.wait(next);
            next = p.irecv(&mut inb[(i + 1) % 2]);
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

fn lat_raw(s: &mut TcpStream, size: usize, iters: usize, initiator: bool) -> f64 {
    let mut buf = vec![0u8; size];
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

fn num(s: &str) -> usize {
    s.parse().expect("number")
}

/// The peer process: runs the receiving half of each command from the parent.
fn peer() {
    let mut stdin = BufReader::new(std::io::stdin());
    let port: u16 = read(&mut stdin).parse().expect("port");
    let mut raw = TcpStream::connect(("127.0.0.1", port)).expect("raw connect");
    raw.set_nodelay(true).expect("nodelay");
    let theirs = read(&mut stdin);
    let p = Plugin::connect(&mut |mine: &str| {
        println!("{mine}");
        theirs.clone()
    });
    // Receive buffers persist across commands and are touched once up front, so
    // neither side pays page faults inside a timed run.
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; 1]];
    let mut rawbuf: Vec<u8> = Vec::new();
    loop {
        let cmd = read(&mut stdin);
        let cpu0 = common::cpu();
        let mut verify = false;
        let f: Vec<&str> = cmd.split_whitespace().collect();
        match f.as_slice() {
            ["prep", size, window, batch] => {
                // Untimed: the buffers of the coming runs, allocated and touched now.
                let (size, window, batch) = (num(size), num(window), num(batch));
                bufs = (0..window).map(|_| vec![0xffu8; size]).collect();
                rawbuf = vec![0xffu8; size * batch];
            }
            ["bw", "plugin", count] => {
                stream(&p, &mut bufs, num(count), false);
                let s = p.isend(&mut [1u8]);
                p.wait(s);
                verify = true;
            }
            ["bw", "raw", count, batch] => {
                let (count, batch) = (num(count), num(batch));
                let (window, size) = (bufs.len(), bufs[0].len());
                let mut got = 0;
                while got < count {
                    let n = (count - got).min(batch);
                    // One message per read into the plugin's buffers, or `n` at once.
                    let dst = if n == 1 {
                        &mut bufs[got % window][..]
                    } else {
                        &mut rawbuf[..n * size]
                    };
                    raw.read_exact(dst).expect("raw recv");
                    got += n;
                }
                raw.write_all(&[1]).expect("raw ack");
            }
            ["lat", "plugin", size, iters] => {
                lat_plugin(&p, num(size), num(iters), false);
            }
            ["lat", "raw", size, iters] => {
                lat_raw(&mut raw, num(size), num(iters), false);
            }
            ["quit"] => break,
            other => panic!("unknown command {other:?}"),
        }
        let used = common::cpu() - cpu0;
        // After the acknowledgement and outside the CPU count: every byte arrived.
        if verify {
            for (i, b) in bufs.iter().enumerate() {
                assert!(b.iter().all(|&x| x == i as u8 + 1), "payload damaged");
            }
        }
        println!("ok {used}");
    }
}

/// The parent's connections: the command channel, the raw socket and the plugin.
struct Bench {
    to: std::process::ChildStdin,
    from: BufReader<std::process::ChildStdout>,
    raw: TcpStream,
    p: Plugin,
    rounds: usize,
    quick: bool,
    plugin_only: bool,
    /// `--size N`: run only this message size.
    only: Option<usize>,
}

impl Bench {
    /// Has the peer allocate and touch its buffers for the coming runs (untimed).
    fn prep(&mut self, size: usize, window: usize, batch: usize) {
        tell(&mut self.to, &format!("prep {size} {window} {batch}"));
        assert!(read(&mut self.from).starts_with("ok "), "peer prep failed");
    }

    /// Streaming rate and round trip at small sizes.
    fn small(&mut self) {
        println!(
            "\nSmall messages: streaming rate (MB/s; the plugin keeps {SMALL_WINDOW} in flight), \
             one message per write() vs {RAW_BATCH} per writev() on raw TCP; round trip of one \
             message (us); CPU (user + system of both processes) per streamed message (us)\n"
        );
        println!(
            "| size | cclkit-socket MB/s | raw 1/write MB/s | raw {RAW_BATCH}/writev MB/s | \
             vs raw 1/write | vs raw {RAW_BATCH}/writev | RTT cclkit-socket | RTT raw | RTT ratio \
             | CPU/msg cclkit-socket | raw 1/write | raw {RAW_BATCH}/writev |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let div = if self.quick { 4 } else { 1 };
        for size in [8usize, 64, 1024, 4096] {
            if self.only.is_some_and(|o| o != size) {
                continue;
            }
            let count = ((256usize << 20) / size).clamp(20_000, 200_000) / div;
            let mut bufs: Vec<Vec<u8>> =
                (0..SMALL_WINDOW).map(|i| vec![i as u8 + 1; size]).collect();
            self.prep(size, SMALL_WINDOW, RAW_BATCH);
            let (mut m, mut c) = (Paired::new(2), Paired::new(2));
            for r in 0..self.rounds {
                for k in 0..3 {
                    let variant = (r + k) % 3;
                    if self.plugin_only && variant != 0 {
                        continue;
                    }
                    let (to, from, raw, p) = (&mut self.to, &mut self.from, &mut self.raw, &self.p);
                    let (rate, cpu) = match variant {
                        0 => {
                            let cmd = format!("bw plugin {count}");
                            timed(to, from, &cmd, || bw_plugin(p, &mut bufs, count))
                        }
                        _ => {
                            let batch = if variant == 1 { 1 } else { RAW_BATCH };
                            let cmd = format!("bw raw {count} {batch}");
                            timed(to, from, &cmd, || bw_raw(raw, &bufs, count, batch))
                        }
                    };
                    let per_msg = cpu * 1e6 / count as f64;
                    if variant == 0 {
                        m.ours.push(rate / 1e6);
                        c.ours.push(per_msg);
                    } else {
                        m.base[variant - 1].push(rate / 1e6);
                        c.base[variant - 1].push(per_msg);
                    }
                }
            }
            if self.plugin_only {
                let (o, oc) = (common::median(&mut m.ours), common::median(&mut c.ours));
                println!("| {} | {o:.1} | | | | | | | | {oc:.2} | | |", human(size));
                continue;
            }
            let ([o, b1, r1], [_, b8, r8]) = (m.against(0), m.against(1));
            let ([oc, c1, _], [_, c8, _]) = (c.against(0), c.against(1));
            let iters = if self.quick { 3_000 } else { 10_000 };
            let [lo, lb, lr] = self.latency(size, iters).against(0);
            println!(
                "| {} | {o:.1} | {b1:.1} | {b8:.1} | {r1:.2} | {r8:.2} | {lo:.1} | {lb:.1} | \
                 {lr:.2} | {oc:.2} | {c1:.2} | {c8:.2} |",
                human(size)
            );
        }
    }

    /// Paired round trips of `size`-byte messages.
    fn latency(&mut self, size: usize, iters: usize) -> Paired {
        let mut m = Paired::new(1);
        for r in 0..self.rounds {
            for ours_now in [r % 2 == 0, r % 2 != 0] {
                let (to, from, raw, p) = (&mut self.to, &mut self.from, &mut self.raw, &self.p);
                if ours_now {
                    let cmd = format!("lat plugin {size} {iters}");
                    m.ours
                        .push(timed(to, from, &cmd, || lat_plugin(p, size, iters, true)).0);
                } else {
                    let cmd = format!("lat raw {size} {iters}");
                    m.base[0].push(timed(to, from, &cmd, || lat_raw(raw, size, iters, true)).0);
                }
            }
        }
        m
    }

    /// Bandwidth of large messages against a blocking raw stream.
    fn large(&mut self, full: bool) {
        println!(
            "\nLarge messages: GB/s, the plugin keeps {LARGE_WINDOW} in flight; raw TCP is one \
             blocking write_all/read_exact per message. CPU: user + system seconds of both \
             processes per GB\n"
        );
        println!(
            "| size | cclkit-socket GB/s | raw TCP GB/s | ratio | CPU s/GB cclkit-socket | CPU s/GB raw TCP |"
        );
        println!("|---:|---:|---:|---:|---:|---:|");
        let sizes: &[usize] = if full {
            &[64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
        } else {
            &[1 << 20, 4 << 20, 16 << 20]
        };
        for &size in sizes {
            if self.only.is_some_and(|o| o != size) {
                continue;
            }
            let count = ((1usize << 30) / size).clamp(8, 4096) / if self.quick { 2 } else { 1 };
            let gb = (size * count) as f64 / 1e9;
            // Touched once here, outside the timed runs, and shared by both variants.
            let mut bufs: Vec<Vec<u8>> =
                (0..LARGE_WINDOW).map(|i| vec![i as u8 + 1; size]).collect();
            self.prep(size, LARGE_WINDOW, 1);
            let (mut m, mut c) = (Paired::new(1), Paired::new(1));
            for r in 0..self.rounds {
                for ours_now in [r % 2 == 0, r % 2 != 0] {
                    if self.plugin_only && !ours_now {
                        continue;
                    }
                    let (to, from, raw, p) = (&mut self.to, &mut self.from, &mut self.raw, &self.p);
                    if ours_now {
                        let cmd = format!("bw plugin {count}");
                        let (v, cpu) = timed(to, from, &cmd, || bw_plugin(p, &mut bufs, count));
                        m.ours.push(v / 1e9);
                        c.ours.push(cpu / gb);
                    } else {
                        let cmd = format!("bw raw {count} 1");
                        let (v, cpu) = timed(to, from, &cmd, || bw_raw(raw, &bufs, count, 1));
                        m.base[0].push(v / 1e9);
                        c.base[0].push(cpu / gb);
                    }
                }
            }
            if self.plugin_only {
                let (o, oc) = (common::median(&mut m.ours), common::median(&mut c.ours));
                println!("| {} | {o:.2} | | | {oc:.3} | |", human(size));
                continue;
            }
            let [o, b, ratio] = m.against(0);
            let [oc, bc, _] = c.against(0);
            println!(
                "| {} | {o:.2} | {b:.2} | {ratio:.2} | {oc:.3} | {bc:.3} |",
                human(size)
            );
        }
    }
}

fn main() {
    if std::env::var_os(ROLE).is_some() {
        peer();
        return;
    }
    let quick = flag("--quick");
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
    let (raw, _) = listener.accept().expect("raw accept");
    raw.set_nodelay(true).expect("nodelay");
    let p = Plugin::connect(&mut |mine: &str| {
        tell(&mut to, mine);
        read(&mut from)
    });
    let rounds: usize = arg("--rounds").unwrap_or(if quick { 3 } else { 5 });
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
    println!("{rounds} rounds, medians of values and of per-round ratios");
    let mut b = Bench {
        to,
        from,
        raw,
        p,
        rounds,
        quick,
        plugin_only: flag("--plugin-only"),
        only: arg("--size"),
    };
    if !flag("--large-only") {
        b.small();
    }
    if !flag("--small-only") {
        b.large(flag("--full"));
    }
    tell(&mut b.to, "quit");
    drop(b);
    let _ = child.wait();
}
