//! One side of a two-process net transfer, for tests.
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

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use cclkit_tests::host::{Close, NetHost};
use cclkit_tests::message;

const IN_FLIGHT: usize = 32;
const SLACK: usize = 13;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Result<[u8; 128], String> {
    let v: Result<Vec<u8>, _> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16))
        .collect();
    v.map_err(|e| e.to_string())?
        .try_into()
        .map_err(|_| "handle must be 128 bytes".to_string())
}

fn run(args: &[String]) -> Result<usize, String> {
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
    let net = NetHost::open(Path::new(lib), version)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    match role.as_str() {
        "listen" => {
            let (handle, lc) = net.listen()?;
            println!("HANDLE {}", hex(&handle));
            std::io::stdout().flush().map_err(|e| e.to_string())?;
            let rc = net.accept(lc, deadline)?;
            net.close(Close::Listen, lc)?;
            let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0u8; s + SLACK]).collect();
            let mut posted = Vec::new();
            let mut next = 0;
            let mut done = 0;
            while done < sizes.len() {
                while next < sizes.len() && posted.len() < IN_FLIGHT {
                    let mh = net.reg_mr(rc, &mut bufs[next])?;
                    match net.irecv(rc, &mut bufs[next], 0, mh)? {
                        Some(req) => {
                            posted.push((next, req, mh));
                            next += 1;
                        }
                        None => {
                            net.dereg_mr(rc, mh)?;
                            break;
                        }
                    }
                }
                let (i, req, mh) = posted[0];
                if let Some(got) = net.test(req)? {
                    posted.remove(0);
                    net.dereg_mr(rc, mh)?;
                    if got != sizes[i] {
                        return Err(format!(
                            "message {i}: test reported {got} bytes, sent {}",
                            sizes[i]
                        ));
                    }
                    if bufs[i][..got] != message(seed, i, got)[..] {
                        return Err(format!("message {i} ({got} bytes): data differs"));
                    }
                    done += 1;
                } else if Instant::now() > deadline {
                    return Err(format!("receive {i} did not complete in time"));
                }
            }
            net.close(Close::Recv, rc)?;
        }
        "connect" => {
            let mut handle = unhex(rest.first().ok_or("missing handle")?)?;
            let sc = net.connect(&mut handle, deadline)?;
            let mut msgs: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &s)| message(seed, i, s))
                .collect();
            let mut posted = std::collections::VecDeque::new();
            let mut next = 0;
            while next < msgs.len() || !posted.is_empty() {
                while next < msgs.len() && posted.len() < IN_FLIGHT {
                    let mh = net.reg_mr(sc, &mut msgs[next])?;
                    match net.isend(sc, &msgs[next], 0, mh)? {
                        Some(req) => {
                            posted.push_back((next, req, mh));
                            next += 1;
                        }
                        None => {
                            net.dereg_mr(sc, mh)?;
                            break;
                        }
                    }
                }
                if let Some(&(i, req, mh)) = posted.front() {
                    if let Some(got) = net.test(req)? {
                        posted.pop_front();
                        net.dereg_mr(sc, mh)?;
                        if got != sizes[i] {
                            return Err(format!(
                                "send {i}: test reported {got} bytes, sent {}",
                                sizes[i]
                            ));
                        }
                    } else if Instant::now() > deadline {
                        return Err(format!("send {i} did not complete in time"));
                    }
                }
            }
            net.close(Close::Send, sc)?;
        }
        r => return Err(format!("unknown role {r}")),
    }
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
