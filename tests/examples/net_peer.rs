//! One side of a two-process net transfer, driven through `cclkit-host` (the loader
//! and host adapter NCCL's own shims are modelled on). Used by `tests/template_net.rs`;
//! an example rather than a binary so that it may use the host, a dev-dependency.
//!
//! ```text
//! net_peer listen  LIB VERSION SEED SIZES          # prints "HANDLE <hex>", receives, prints "OK <n>"
//! net_peer connect LIB VERSION SEED SIZES HANDLE   # connects, sends every message
//! ```
//! SIZES is a comma list; message i carries `message(SEED, i, size)`, so the
//! receiver checks every byte without the data crossing any other channel. Up to 32
//! requests are kept in flight, completed in posting order. Receive buffers are 13
//! bytes larger than the message: a larger receive must be accepted and the real
//! size reported.

use std::collections::VecDeque;
use std::io::Write;
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::ptr;
use cclkit_host::Library;
use cclkit_host::net::{CommConfig, ConnectHandle, NetContext, NetPlugin, RecvBuffer};
use cclkit_tests::message;

const IN_FLIGHT: usize = 32;
const SLACK: usize = 13;

type R<T> = Result<T, String>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> R<ConnectHandle> {
    if s.len() % 2 != 0 || !s.is_ascii() {
        return Err("handle must be hex".into());
    }
    let v: Result<Vec<u8>, _> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16))
        .collect();
    v.map_err(|e| e.to_string())?
        .try_into()
        .map_err(|_| "handle must be 128 bytes".to_string())
}

fn check_deadline(deadline: Instant, what: &str) -> R<()> {
    if Instant::now() > deadline {
        return Err(format!("{what} did not complete in time"));
    }
    Ok(())
}

/// Receives every message and checks sizes and bytes.
fn receive(ctx: &NetContext, seed: u64, sizes: &[usize], deadline: Instant) -> R<()> {
    let (handle, mut listen) = ctx.listen(0).map_err(|e| e.to_string())?;
    println!("HANDLE {}", hex(&handle));
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut comm = loop {
        if let Some(c) = listen.accept().map_err(|e| e.to_string())? {
            break c;
        }
        check_deadline(deadline, "accept")?;
    };
    listen.close().map_err(|e| e.to_string())?;
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0u8; s + SLACK]).collect();
    let mut posted = VecDeque::new();
    let (mut next, mut done) = (0, 0);
    while done < sizes.len() {
        while next < sizes.len() && posted.len() < IN_FLIGHT {
            let buf = &mut bufs[next];
            // SAFETY: `buf` is neither moved nor freed until deregistered below.
            let mr = unsafe { comm.reg_mr(buf.as_mut_ptr(), buf.len(), ptr::HOST) }
                .map_err(|e| e.to_string())?;
            let one = RecvBuffer {
                data: buf.as_mut_ptr(),
                size: buf.len(),
                tag: 0,
                mr: Some(&mr),
            };
            // SAFETY: as above; the request is tested to completion before `buf` is read.
            match unsafe { comm.irecv(&[one], false) }.map_err(|e| e.to_string())? {
                Some(req) => {
                    posted.push_back((next, req, mr));
                    next += 1;
                }
                None => {
                    comm.dereg_mr(mr).map_err(|e| e.to_string())?;
                    break;
                }
            }
        }
        let Some((i, req, _)) = posted.front_mut() else {
            check_deadline(deadline, "posting a receive")?;
            continue;
        };
        let i = *i;
        match comm.test(req).map_err(|e| e.to_string())? {
            Some(got) => {
                let (_, _, mr) = posted.pop_front().ok_or("request vanished")?;
                comm.dereg_mr(mr).map_err(|e| e.to_string())?;
                if got.as_slice() != [sizes[i]] {
                    return Err(format!(
                        "message {i}: test reported {got:?} bytes, sent {}",
                        sizes[i]
                    ));
                }
                if bufs[i][..sizes[i]] != message(seed, i, sizes[i])[..] {
                    return Err(format!("message {i} ({} bytes): data differs", sizes[i]));
                }
                done += 1;
            }
            None => check_deadline(deadline, &format!("receive {i}"))?,
        }
    }
    comm.close().map_err(|e| e.to_string())
}

/// Connects to the listener's `handle` and sends every message.
fn send(ctx: &NetContext, seed: u64, sizes: &[usize], handle: &str, deadline: Instant) -> R<()> {
    let mut connecting = ctx.connect(0, &unhex(handle)?);
    let mut comm = loop {
        if let Some(c) = connecting.poll().map_err(|e| e.to_string())? {
            break c;
        }
        check_deadline(deadline, "connect")?;
    };
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| message(seed, i, s))
        .collect();
    let mut posted = VecDeque::new();
    let mut next = 0;
    while next < msgs.len() || !posted.is_empty() {
        while next < msgs.len() && posted.len() < IN_FLIGHT {
            let m = &msgs[next];
            // SAFETY: `msgs` is not touched until every request completed.
            let mr = unsafe { comm.reg_mr(m.as_ptr().cast_mut(), m.len(), ptr::HOST) }
                .map_err(|e| e.to_string())?;
            // SAFETY: as above.
            match unsafe { comm.isend(m.as_ptr(), m.len(), 0, Some(&mr)) }
                .map_err(|e| e.to_string())?
            {
                Some(req) => {
                    posted.push_back((next, req, mr));
                    next += 1;
                }
                None => {
                    comm.dereg_mr(mr).map_err(|e| e.to_string())?;
                    break;
                }
            }
        }
        if let Some((i, req, _)) = posted.front_mut() {
            let i = *i;
            match comm.test(req).map_err(|e| e.to_string())? {
                Some(got) => {
                    let (_, _, mr) = posted.pop_front().ok_or("request vanished")?;
                    comm.dereg_mr(mr).map_err(|e| e.to_string())?;
                    if got.as_slice() != [sizes[i]] {
                        return Err(format!(
                            "send {i}: test reported {got:?} bytes, sent {}",
                            sizes[i]
                        ));
                    }
                }
                None => check_deadline(deadline, &format!("send {i}"))?,
            }
        } else {
            check_deadline(deadline, "posting a send")?;
        }
    }
    comm.close().map_err(|e| e.to_string())
}

fn run(args: &[String]) -> R<usize> {
    let [role, lib, version, seed, sizes, rest @ ..] = args else {
        return Err("usage: net_peer listen|connect LIB VERSION SEED SIZES [HANDLE]".into());
    };
    let version: u32 = version.parse().map_err(|_| "bad version")?;
    let seed: u64 = seed.parse().map_err(|_| "bad seed")?;
    let sizes: Vec<usize> = sizes
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| "bad sizes")?;
    let library = Library::open(Some(lib)).map_err(|e| e.to_string())?;
    let plugin = NetPlugin::load_version(library, version)
        .map_err(|e| format!("{lib}: ncclNetPlugin_v{version}: {e:?}"))?;
    let ctx = plugin
        .init(1, CommConfig::default())
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    match role.as_str() {
        "listen" => receive(&ctx, seed, &sizes, deadline)?,
        "connect" => send(
            &ctx,
            seed,
            &sizes,
            rest.first().ok_or("missing handle")?,
            deadline,
        )?,
        r => return Err(format!("unknown role {r}")),
    }
    ctx.finalize().map_err(|e| e.to_string())?;
    Ok(sizes.len())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(n) => println!("OK {n}"),
        Err(e) => {
            println!("ERR {e}");
            std::process::exit(1);
        }
    }
}
