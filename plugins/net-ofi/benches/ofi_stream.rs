//! Stream benchmark: cclkit-ofi (through `ncclNetPlugin_v12`) against a raw
//! libfabric tagged stream written here, same provider, sizes, window and
//! registration, each in two processes; prints both rates and their ratio.
//!
//! ```text
//! cargo bench -p cclkit-net-ofi --bench ofi_stream [-- --quick]
//! ```
//! Each (provider, size) runs nine back-to-back raw/plugin pairs (alternating
//! which goes first) and reports the median rate of each side and the median of
//! the per-pair ratios: on a shared machine the load changes from minute to
//! minute, and a pair run back to back sees about the same load. The sender
//! times `iters` messages (after a warm-up round) up to the receiver's one-byte
//! "done" reply. Both sides yield the CPU after a pass without progress, as
//! NCCL's proxy thread does.

use std::ffi::c_void;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use cclkit_net_ofi::fabric::{Av, Cq, Domain, Endpoint, Fabric, Hints, MemIface, Mr, getinfo};
use cclkit_net_ofi::sys;

const PEER: &str = env!("CARGO_BIN_EXE_cclkit-ofi-peer");
const WINDOW: usize = 8;
const TOTAL_BYTES: usize = 128 << 20;
const TAG_DATA: u64 = 1;
const TAG_DONE: u64 = 2;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--raw-peer") {
        if let Err(e) = raw_peer(&args[1..]) {
            println!("FAIL {e}");
            std::process::exit(1);
        }
        println!("OK");
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let sizes: &[usize] = if quick {
        &[1 << 20]
    } else {
        &[1 << 20, 4 << 20, 16 << 20]
    };
    let reps = if quick { 1 } else { 9 };
    println!(
        "| provider | size | raw libfabric MB/s (median) | cclkit-ofi MB/s (median) | ratio (median of pairs) | ratio range |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    for provider in ["tcp;ofi_rxm", "shm"] {
        for &size in sizes {
            let iters = (TOTAL_BYTES / size).max(8);
            let (mut raw, mut plugin, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for rep in 0..reps {
                // Back-to-back pairs share the machine's momentary load; the order
                // alternates so neither side always runs first.
                let (r, p) = if rep % 2 == 0 {
                    let r = run_pair(provider, size, iters, true);
                    (r, run_pair(provider, size, iters, false))
                } else {
                    let p = run_pair(provider, size, iters, false);
                    (run_pair(provider, size, iters, true), p)
                };
                raw.push(r);
                plugin.push(p);
                ratios.push(p / r);
            }
            let (lo, hi) = (
                ratios.iter().copied().fold(f64::MAX, f64::min),
                ratios.iter().copied().fold(0.0, f64::max),
            );
            println!(
                "| {provider} | {} MiB | {:.0} | {:.0} | {:.2} | {lo:.2}–{hi:.2} |",
                size >> 20,
                median(&mut raw),
                median(&mut plugin),
                median(&mut ratios)
            );
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn env_for(provider: &str) -> Vec<(&'static str, String)> {
    let mut env = vec![("CCLKIT_OFI_PROVIDER", provider.to_owned())];
    if provider.starts_with("tcp") {
        env.push(("CCLKIT_OFI_IFACE", "lo".to_owned()));
    }
    env
}

struct Proc {
    child: Child,
    lines: Receiver<String>,
}

impl Proc {
    fn spawn(cmd: &str, args: &[String], env: &[(&str, String)]) -> Proc {
        let mut child = Command::new(cmd)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn benchmark peer");
        let (tx, lines) = channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Proc { child, lines }
    }

    fn expect(&mut self, prefix: &str) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|e| panic!("benchmark peer: no {prefix:?}: {e}"));
            if let Some(rest) = l.strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
            assert!(!l.starts_with("FAIL"), "benchmark peer failed: {l}");
        }
    }

    fn tell(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write");
        stdin.flush().expect("flush");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one sender/receiver pair; returns the sender's MB/s.
fn run_pair(provider: &str, size: usize, iters: usize, raw: bool) -> f64 {
    let env = env_for(provider);
    let common = [size.to_string(), iters.to_string(), WINDOW.to_string()];
    let (cmd, send_args, recv_args): (String, Vec<String>, Vec<String>) = if raw {
        let me = std::env::current_exe()
            .expect("current_exe")
            .to_string_lossy()
            .into_owned();
        let a = |side: &str| {
            let mut v = vec!["--raw-peer".into(), side.into(), provider.into()];
            v.extend(common.iter().cloned());
            v
        };
        (me, a("send"), a("recv"))
    } else {
        let a = |side: &str| {
            let mut v = vec!["stream".into(), "12".into(), side.into()];
            v.extend(common.iter().cloned());
            v
        };
        (PEER.into(), a("send"), a("recv"))
    };
    let mut s = Proc::spawn(&cmd, &send_args, &env);
    let mut r = Proc::spawn(&cmd, &recv_args, &env);
    let hs = s.expect("HANDLE ");
    let hr = r.expect("HANDLE ");
    s.tell(&format!("PEER {hr}"));
    r.tell(&format!("PEER {hs}"));
    let result = s.expect("RESULT ");
    s.expect("OK");
    r.expect("OK");
    result
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("MBps="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no MBps in {result:?}"))
}

// ---------------------------------------------------------------- raw baseline

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// One side of the raw stream: plain fi_tsend/fi_trecv on an RDM endpoint, the
/// same hints, loopback binding and registration rule as the plugin.
fn raw_peer(args: &[String]) -> Result<(), String> {
    let sender = args.first().map(String::as_str) == Some("send");
    let provider = args.get(1).ok_or("provider")?.clone();
    let num = |i: usize| -> Result<usize, String> {
        args.get(i)
            .ok_or("missing number")?
            .parse()
            .map_err(|e| format!("{e}"))
    };
    let (size, iters, window) = (num(2)?, num(3)?, num(4)?);
    let e = |x: cclkit_net_ofi::fabric::FiError| x.to_string();

    let mut h = Hints::new().map_err(e)?;
    h.caps(sys::FI_TAGGED as u64)
        .mode(sys::FI_CONTEXT | sys::FI_CONTEXT2)
        .ep_type(sys::FI_EP_RDM)
        .mr_mode(
            sys::FI_MR_LOCAL
                | sys::FI_MR_VIRT_ADDR
                | sys::FI_MR_ALLOCATED
                | sys::FI_MR_PROV_KEY
                | sys::FI_MR_ENDPOINT,
        )
        .threading(sys::FI_THREAD_SAFE);
    h.provider(&provider).map_err(e)?;
    let tcp = provider.starts_with("tcp");
    if tcp {
        h.domain("lo").map_err(e)?;
    }
    let list = if tcp {
        getinfo(Some("127.0.0.1"), None, sys::FI_SOURCE, &h)
    } else {
        getinfo(None, None, 0, &h)
    }
    .map_err(e)?;
    let info = list.iter().next().ok_or("no provider entry")?;
    let fabric = Fabric::open(info).map_err(e)?;
    let domain = Domain::open(&fabric, info).map_err(e)?;
    let cq = Cq::open(&domain).map_err(e)?;
    let av = Av::open(&domain).map_err(e)?;
    let ep = Endpoint::open(&domain, info, &cq, &av).map_err(e)?;
    println!("HANDLE {}", hex(&ep.name().map_err(e)?));
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|x| x.to_string())?;
    let peer = av
        .insert(&unhex(
            line.trim().strip_prefix("PEER ").ok_or("PEER line")?,
        ))
        .map_err(e)?;

    let need_mr = info.mr_mode() & sys::FI_MR_LOCAL != 0;
    let mut bufs: Vec<Vec<u8>> = (0..window).map(|_| vec![3u8; size]).collect();
    let mut done_buf = vec![0u8; 1];
    let mrs: Vec<Mr> = if need_mr {
        bufs.iter_mut()
            .chain(std::iter::once(&mut done_buf))
            // SAFETY: the buffers outlive the registrations (dropped first below).
            .map(|b| unsafe {
                Mr::register(
                    &domain,
                    b.as_mut_ptr().cast(),
                    b.len(),
                    (sys::FI_SEND | sys::FI_RECV) as u64,
                    0,
                    MemIface::System,
                )
            })
            .collect::<Result<_, _>>()
            .map_err(e)?
    } else {
        Vec::new()
    };
    let desc = |i: usize| mrs.get(i).map_or(std::ptr::null_mut(), |m| m.desc());
    let mut ctxs: Vec<sys::fi_context2> = vec![sys::fi_context2::default(); window + 1];
    let ctx_base = ctxs.as_mut_ptr();
    let raw = Raw { ep: &ep, cq: &cq };

    for (phase, count) in [("warmup", window * 2), ("timed", iters)] {
        let start = Instant::now();
        let (mut posted, mut done) = (0usize, 0usize);
        // Buffers in round-robin order, as NCCL's steps use them (and as the
        // plugin side of this benchmark does); a slot is reused once completed.
        let mut busy = vec![false; window];
        while done < count {
            while posted < count && !busy[posted % window] {
                let k = posted % window;
                // SAFETY: buffer k and context k stay valid until k's completion.
                let r = unsafe {
                    let ctx = ctx_base.add(k);
                    if sender {
                        ep.tsend(bufs[k].as_ptr().cast(), size, desc(k), peer, TAG_DATA, ctx)
                    } else {
                        ep.trecv(bufs[k].as_mut_ptr().cast(), size, desc(k), TAG_DATA, 0, ctx)
                    }
                };
                match r {
                    Ok(()) => {
                        busy[k] = true;
                        posted += 1;
                    }
                    Err(x) if x.is_again() => break,
                    Err(x) => return Err(x.to_string()),
                }
            }
            let before = done;
            raw.poll(|c| {
                let k = (c as usize - ctx_base as usize) / std::mem::size_of::<sys::fi_context2>();
                busy[k] = false;
                done += 1;
            })?;
            if done == before {
                // Same idle policy as the plugin side (and NCCL's proxy thread).
                std::thread::yield_now();
            }
            if start.elapsed() > Duration::from_secs(120) {
                return Err(format!("{phase}: timed out"));
            }
        }
        // The receiver's one-byte "done" ends the phase.
        // SAFETY: done_buf and the last context outlive the wait below.
        unsafe {
            let ctx = ctx_base.add(window);
            let p = done_buf.as_mut_ptr().cast::<c_void>();
            loop {
                let r = if sender {
                    ep.trecv(p, 1, desc(window), TAG_DONE, 0, ctx)
                } else {
                    ep.tsend(p, 1, desc(window), peer, TAG_DONE, ctx)
                };
                match r {
                    Ok(()) => break,
                    Err(x) if x.is_again() => {
                        raw.poll(|_| {})?;
                    }
                    Err(x) => return Err(x.to_string()),
                }
            }
        }
        let mut got = false;
        while !got {
            raw.poll(|_| got = true)?;
            if start.elapsed() > Duration::from_secs(120) {
                return Err("done message: timed out".into());
            }
        }
        if sender && phase == "timed" {
            let secs = start.elapsed().as_secs_f64();
            println!(
                "RESULT size={size} iters={iters} secs={secs:.6} MBps={:.1}",
                (size * iters) as f64 / secs / 1e6
            );
        }
    }
    drop(mrs);
    Ok(())
}

struct Raw<'a> {
    ep: &'a Endpoint,
    cq: &'a Arc<Cq>,
}

impl Raw<'_> {
    /// Reads completions, handing each one's context to `f`.
    fn poll(&self, mut f: impl FnMut(*mut c_void)) -> Result<(), String> {
        let _ = self.ep;
        let mut entries = [sys::fi_cq_tagged_entry::default(); 16];
        match self.cq.read(&mut entries) {
            Ok(n) => {
                entries[..n].iter().for_each(|e| f(e.op_context));
                Ok(())
            }
            Err(x) if x.code == sys::FI_EAVAIL as i32 => {
                let err = self.cq.read_err().map_err(|x| x.to_string())?;
                Err(format!("completion error: {err:?}"))
            }
            Err(x) => Err(x.to_string()),
        }
    }
}
