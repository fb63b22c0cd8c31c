//! `mixed`: one side of the `ofi_stream` benchmark (`benches/ofi_stream.rs`).
//!
//! The process opens a plugin link (through `ncclNetPlugin_v12`) and a raw
//! libfabric tagged stream with the plugin's hints, then alternates bursts on each
//! so both see the same machine load; the sender prints
//! `RESULT raw=<MB/s> plugin=<MB/s> median=<ratio> low=<ratio> high=<ratio>
//! bundled=<share of its sends in bundles> per_bundle=<sends per bundle>
//! written=<share of its sends that went as RMA writes> tcp=<MB/s>`. A third
//! stream, the kernel's one-way TCP stream (`tcp.rs`), runs in the same rounds
//! as an indicator of the machine's TCP stack, not as a baseline.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cclkit_net_ofi::fabric::{Av, Cq, Domain, Endpoint, Fabric, Hints, MemIface, Mr, getinfo};
use cclkit_net_ofi::sys;

use crate::net::{Abi, Net, R};
use crate::tcp::{TcpListen, TcpOneWay};
use crate::{flows, stream};

/// In-flight transfers per direction (NCCL_STEPS).
const WINDOW: usize = 8;
/// Tag of the data messages on the raw endpoint.
const TAG_DATA: u64 = 1;
/// Tag of the receiver's one-byte end-of-burst reply.
const TAG_DONE: u64 = 2;

/// A raw endpoint name of any length from its hex (the plugin handle's is fixed).
fn unhex_name(s: &str) -> R<Vec<u8>> {
    (0..s.len() / 2)
        .map(|i| {
            let byte = s.get(2 * i..2 * i + 2).ok_or("odd hex")?;
            u8::from_str_radix(byte, 16).map_err(|e| format!("endpoint name: {e}"))
        })
        .collect()
}

/// One side: a plugin link and a raw endpoint, alternating bursts.
pub fn mixed_peer(args: &[String]) -> R<()> {
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
        flows::hex(&raw.ep.name().map_err(|e| e.to_string())?)
    ));
    let listen = if sender {
        None
    } else {
        let l = TcpListen::open()?;
        flows::say(&format!("TCPPORT {}", l.port()?));
        Some(l)
    };
    let mut link = flows::link(Net::init(Abi::V12)?)?;
    let line = flows::hear()?;
    raw.connect(&unhex_name(
        line.strip_prefix("RAWPEER ").ok_or("RAWPEER line")?,
    )?)?;
    let mut tcp = match listen {
        Some(l) => l.accept(size)?,
        None => {
            let line = flows::hear()?;
            let port = line.strip_prefix("TCPPEER ").ok_or("TCPPEER line")?;
            TcpOneWay::connect(port.parse().map_err(|e| format!("TCP port: {e}"))?, size)?
        }
    };
    let mut plugin = stream::PluginStream::new(&mut link, sender, size, WINDOW)?;

    raw.phase(WINDOW * 2)?;
    plugin.phase(&mut link, WINDOW * 2)?;
    tcp.phase(WINDOW * 2)?;
    let (mut t_raw, mut t_plugin, mut t_tcp) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let (r, p) = if round % 2 == 0 {
            let r = raw.phase(count)?;
            (r, plugin.phase(&mut link, count)?)
        } else {
            let p = plugin.phase(&mut link, count)?;
            (raw.phase(count)?, p)
        };
        t_raw += r;
        t_plugin += p;
        t_tcp += tcp.phase(count)?;
        ratios.push(r.as_secs_f64() / p.as_secs_f64());
    }
    if sender {
        ratios.sort_by(|a, b| a.total_cmp(b));
        let bytes = (size * count * rounds) as f64;
        // Every plugin send of this process after the warm-up was a data send.
        let b = cclkit_net_ofi::bundle_counts();
        let sends = (count * rounds + WINDOW * 2) as f64;
        flows::say(&format!(
            "RESULT raw={:.1} plugin={:.1} median={:.3} low={:.3} high={:.3} bundled={:.3} per_bundle={:.2} written={:.3} tcp={:.1}",
            bytes / t_raw.as_secs_f64() / 1e6,
            bytes / t_plugin.as_secs_f64() / 1e6,
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
            b.records as f64 / sends,
            if b.bundles > 0 {
                b.records as f64 / b.bundles as f64
            } else {
                0.0
            },
            cclkit_net_ofi::write_counts().writes as f64 / sends,
            bytes / t_tcp.as_secs_f64() / 1e6
        ));
    }
    plugin.close(&mut link)?;
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
