//! Stream benchmark: cclkit-ofi (driven through `ncclNetPlugin_v12`) against a
//! raw libfabric tagged stream written here, in the same two processes, same
//! provider, sizes, window (8, NCCL_STEPS) and registration rule.
//!
//! ```text
//! cargo bench -p cclkit-net-ofi --bench ofi_stream \
//!     [-- --quick] [--provider 'tcp;ofi_rxm'] [--size-mib 1] [--rounds 41]
//! ```
//! Each process opens both a plugin connection and a raw endpoint, then runs
//! bursts of about 64 MiB alternately on each (41 rounds, alternating which goes
//! first). On a shared machine the load changes from second to second; bursts
//! this short and this interleaved see the same load on both sides. A burst ends
//! with the receiver's one-byte reply. Both sides yield the CPU after a pass
//! without progress, as NCCL's proxy thread does.

use std::ffi::c_void;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use cclkit_net_ofi::fabric::{Av, Cq, Domain, Endpoint, Fabric, Hints, MemIface, Mr, getinfo};
use cclkit_net_ofi::sys;

#[allow(dead_code)]
#[path = "../src/bin/cclkit-ofi-peer/flows.rs"]
mod flows;
#[allow(dead_code)]
#[path = "../src/bin/cclkit-ofi-peer/pattern.rs"]
mod pattern;
#[allow(dead_code)]
#[path = "../src/bin/cclkit-ofi-peer/stream.rs"]
mod stream;
#[allow(dead_code)]
#[path = "../src/bin/cclkit-ofi-peer/table.rs"]
mod table;

const WINDOW: usize = 8;
const BURST_BYTES: usize = 64 << 20;
const ROUNDS: usize = 41;
const TAG_DATA: u64 = 1;
const TAG_DONE: u64 = 2;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--mixed-peer") {
        match mixed_peer(&args[1..]) {
            Ok(()) => println!("OK"),
            Err(e) => {
                println!("FAIL {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let mib: Option<usize> = opt("--size-mib").and_then(|v| v.parse().ok());
    let sizes: Vec<usize> = match mib {
        Some(m) => vec![m << 20],
        None if quick => vec![1 << 20],
        None => vec![1 << 20, 4 << 20, 16 << 20],
    };
    let rounds = opt("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 3 } else { ROUNDS });
    let providers: Vec<String> = match opt("--provider") {
        Some(p) => vec![p],
        None => vec!["tcp;ofi_rxm".into(), "shm".into()],
    };
    println!(
        "| provider | size | raw libfabric MB/s | cclkit-ofi MB/s | ratio | median round ratio (range) |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    for provider in providers.iter().map(String::as_str) {
        for &size in &sizes {
            let r = run(provider, size, rounds);
            println!(
                "| {provider} | {} MiB | {:.0} | {:.0} | {:.2} | {:.2} ({:.2}–{:.2}) |",
                size >> 20,
                r[0],
                r[1],
                r[1] / r[0],
                r[2],
                r[3],
                r[4]
            );
        }
    }
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
    fn spawn(args: &[String], env: &[(&str, String)]) -> Proc {
        let mut child = Command::new(std::env::current_exe().expect("current_exe"))
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
                .recv_timeout(Duration::from_secs(300))
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

/// One sender/receiver pair; returns [raw MB/s, plugin MB/s, median round
/// ratio, lowest, highest].
fn run(provider: &str, size: usize, rounds: usize) -> [f64; 5] {
    let count = (BURST_BYTES / size).max(4);
    let args = |side: &str| -> Vec<String> {
        ["--mixed-peer", side, provider]
            .iter()
            .map(|s| s.to_string())
            .chain([size, count, rounds].iter().map(|n| n.to_string()))
            .collect()
    };
    let env = env_for(provider);
    let mut s = Proc::spawn(&args("send"), &env);
    let mut r = Proc::spawn(&args("recv"), &env);
    let (rs, rr) = (s.expect("RAWADDR "), r.expect("RAWADDR "));
    let (hs, hr) = (s.expect("HANDLE "), r.expect("HANDLE "));
    s.tell(&format!("PEER {hr}"));
    r.tell(&format!("PEER {hs}"));
    s.tell(&format!("RAWPEER {rr}"));
    r.tell(&format!("RAWPEER {rs}"));
    let result = s.expect("RESULT ");
    s.expect("OK");
    r.expect("OK");
    let field = |k: &str| -> f64 {
        result
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {result:?}"))
    };
    [
        field("raw"),
        field("plugin"),
        field("median"),
        field("low"),
        field("high"),
    ]
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// One side: a plugin link and a raw endpoint, alternating bursts.
fn mixed_peer(args: &[String]) -> Result<(), String> {
    let sender = args.first().map(String::as_str) == Some("send");
    let provider = args.get(1).ok_or("provider")?.clone();
    let num = |i: usize| -> Result<usize, String> {
        args.get(i)
            .ok_or("missing number")?
            .parse()
            .map_err(|e| format!("{e}"))
    };
    let (size, count, rounds) = (num(2)?, num(3)?, num(4)?);

    let mut raw = RawStream::open(&provider, sender, size, WINDOW)?;
    flows::say(&format!(
        "RAWADDR {}",
        hex(&raw.ep.name().map_err(|e| e.to_string())?)
    ));
    let link = flows::link(table::Net::init(table::Abi::V12)?)?;
    let line = flows::hear()?;
    raw.connect(&unhex(line.strip_prefix("RAWPEER ").ok_or("RAWPEER line")?))?;
    let mut plugin = stream::PluginStream::new(&link, sender, size, WINDOW)?;

    raw.phase(WINDOW * 2)?;
    plugin.phase(&link, WINDOW * 2)?;
    let (mut t_raw, mut t_plugin) = (Duration::ZERO, Duration::ZERO);
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let (r, p) = if round % 2 == 0 {
            let r = raw.phase(count)?;
            (r, plugin.phase(&link, count)?)
        } else {
            let p = plugin.phase(&link, count)?;
            (raw.phase(count)?, p)
        };
        t_raw += r;
        t_plugin += p;
        ratios.push(r.as_secs_f64() / p.as_secs_f64());
    }
    if sender {
        ratios.sort_by(|a, b| a.total_cmp(b));
        let bytes = (size * count * rounds) as f64;
        flows::say(&format!(
            "RESULT raw={:.1} plugin={:.1} median={:.3} low={:.3} high={:.3}",
            bytes / t_raw.as_secs_f64() / 1e6,
            bytes / t_plugin.as_secs_f64() / 1e6,
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1]
        ));
    }
    plugin.close(&link)?;
    flows::close(link)
}

/// The raw baseline: plain fi_tsend/fi_trecv on an RDM endpoint, with the
/// plugin's hints, loopback binding and registration rule.
/// Field order is drop order: endpoint, then registrations, then the memory and
/// contexts they refer to.
struct RawStream {
    ep: Endpoint,
    mrs: Vec<Mr>,
    bufs: Vec<Vec<u8>>,
    done_buf: Vec<u8>,
    ctxs: Vec<sys::fi_context2>,
    sender: bool,
    size: usize,
    peer: u64,
    cq: Arc<Cq>,
    av: Arc<Av>,
    domain: Arc<Domain>,
}

impl RawStream {
    fn open(provider: &str, sender: bool, size: usize, window: usize) -> Result<Self, String> {
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
        h.provider(provider).map_err(e)?;
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
        let mut s = Self {
            sender,
            size,
            peer: 0,
            bufs: (0..window).map(|_| vec![3u8; size]).collect(),
            done_buf: vec![0u8; 1],
            mrs: Vec::new(),
            ctxs: vec![sys::fi_context2::default(); window + 1],
            ep,
            cq,
            av,
            domain,
        };
        if info.mr_mode() & sys::FI_MR_LOCAL != 0 {
            let access = (sys::FI_SEND | sys::FI_RECV) as u64;
            for b in s.bufs.iter_mut().chain(std::iter::once(&mut s.done_buf)) {
                // SAFETY: the buffers live in `s` next to the registrations, which
                // are dropped before them (field order).
                let mr = unsafe {
                    Mr::register(
                        &s.domain,
                        b.as_mut_ptr().cast(),
                        b.len(),
                        access,
                        0,
                        MemIface::System,
                    )
                }
                .map_err(e)?;
                s.mrs.push(mr);
            }
        }
        Ok(s)
    }

    fn connect(&mut self, addr: &[u8]) -> Result<(), String> {
        self.peer = self.av.insert(addr).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn desc(&self, i: usize) -> *mut c_void {
        self.mrs.get(i).map_or(std::ptr::null_mut(), |m| m.desc())
    }

    /// Reads completions, handing each context to `f`.
    fn poll(&self, mut f: impl FnMut(*mut c_void)) -> Result<(), String> {
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

    /// `count` messages through round-robin buffers, then the one-byte reply.
    fn phase(&mut self, count: usize) -> Result<Duration, String> {
        let window = self.bufs.len();
        let start = Instant::now();
        let ctx_base = self.ctxs.as_mut_ptr();
        let (mut posted, mut done) = (0usize, 0usize);
        let mut busy = vec![false; window];
        while done < count {
            while posted < count && !busy[posted % window] {
                let k = posted % window;
                // SAFETY: buffer k and context k stay valid until k's completion.
                let r = unsafe {
                    let ctx = ctx_base.add(k);
                    if self.sender {
                        let b = self.bufs[k].as_ptr().cast();
                        self.ep
                            .tsend(b, self.size, self.desc(k), self.peer, TAG_DATA, ctx)
                    } else {
                        let b = self.bufs[k].as_mut_ptr().cast();
                        self.ep.trecv(b, self.size, self.desc(k), TAG_DATA, 0, ctx)
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
            self.poll(|c| {
                let k = (c as usize - ctx_base as usize) / std::mem::size_of::<sys::fi_context2>();
                busy[k] = false;
                done += 1;
            })?;
            if done == before {
                std::thread::yield_now();
            }
            if start.elapsed() > Duration::from_secs(120) {
                return Err("raw phase timed out".into());
            }
        }
        // SAFETY: the reply buffer and the last context outlive the wait below.
        unsafe {
            let ctx = ctx_base.add(window);
            let p = self.done_buf.as_mut_ptr().cast::<c_void>();
            loop {
                let r = if self.sender {
                    self.ep.trecv(p, 1, self.desc(window), TAG_DONE, 0, ctx)
                } else {
                    self.ep
                        .tsend(p, 1, self.desc(window), self.peer, TAG_DONE, ctx)
                };
                match r {
                    Ok(()) => break,
                    Err(x) if x.is_again() => self.poll(|_| {})?,
                    Err(x) => return Err(x.to_string()),
                }
            }
        }
        let mut got = false;
        while !got {
            self.poll(|_| got = true)?;
            if start.elapsed() > Duration::from_secs(120) {
                return Err("raw reply timed out".into());
            }
        }
        Ok(start.elapsed())
    }
}
