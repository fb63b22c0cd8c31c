//! Probe `stray-connections`: connections NCCL never makes, which a plugin on a real
//! network still meets.
//!
//! NCCL connects each handle exactly once, and only to a listen comm that is still
//! open (the receiver calls `closeListen` right after its `accept`). On a real
//! network a listening port also sees port scanners, health checks and peers of an
//! earlier job; NCCL's own socket layer checks a magic number on every accepted
//! connection for that reason. This probe, before the real connect, opens raw TCP
//! connections to every TCP socket the plugin listens on (one closed at once, one
//! that sends random bytes and closes, one that sends random bytes and stays open);
//! then, after the real accept, connects a second time to the same handle (never
//! accepted), and once more after `closeListen`. Every call must return at once, the
//! real connection must carry data intact, and the context must still connect.

use std::collections::HashSet;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::setup::{self, CALL_LIMIT, Flow, OP_LIMIT, Ready, blocked};
use super::timing::timed;
use crate::check::child::{Env, step, within};
use crate::check::rng::Rng;
use crate::check::{Checked, Stop, fail};
use cclkit_host::net::{Connecting, NetContext, RecvComm, SendComm};

/// Listening sockets to send strays to, at most.
const MAX_TARGETS: usize = 4;
/// Polls of a stray `connect` (with a short pause between them).
const STRAY_POLLS: usize = 20;

/// Runs the probe.
pub(crate) fn stray_connections(env: &Env) -> Checked {
    let r = Ready::for_data(env)?;
    let mut rng = Rng::new(env.seed, 1300);
    let before = listening_tcp();
    step("listen on device 0");
    let (handle, listen) = r.ctx.listen(0)?;
    let mut listen = Some(listen);
    let after = listening_tcp();
    // Sockets that appeared with this listen; else every one the plugin holds (a
    // transport may listen once per device, at init).
    let mut targets: Vec<SocketAddr> = after.difference(&before).copied().collect();
    if targets.is_empty() {
        targets = after.into_iter().collect();
    }
    targets.sort();
    targets.truncate(MAX_TARGETS);
    step(format!(
        "stray TCP connections to {} listening socket(s): {targets:?}",
        targets.len()
    ));
    let mut kept = Vec::new();
    let mut strays = 0;
    for addr in &targets {
        for kind in 0..3 {
            let Ok(mut s) = TcpStream::connect_timeout(addr, Duration::from_secs(1)) else {
                continue;
            };
            strays += 1;
            if kind > 0 {
                let _ = s.write_all(&rng.bytes(64));
            }
            if kind == 2 {
                kept.push(s);
            }
        }
    }
    // Let the strays reach the listening socket before the real connect.
    std::thread::sleep(Duration::from_millis(20));
    step("the real connect/accept after the strays");
    let mut connecting = r.ctx.connect(0, &handle);
    let (mut send, mut recv): (Option<SendComm>, Option<RecvComm>) = (None, None);
    let deadline = Instant::now() + OP_LIMIT;
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = within(CALL_LIMIT, blocked("connect"), || {
                timed("connect", || connecting.poll())
            })?
            .map_err(|e| {
                Stop::Fail(format!(
                    "after {strays} stray connections, connect failed: {e}"
                ))
            })?;
        }
        if recv.is_none()
            && let Some(l) = listen.as_mut()
        {
            recv = within(CALL_LIMIT, blocked("accept"), || {
                timed("accept", || l.accept())
            })?
            .map_err(|e| {
                Stop::Fail(format!(
                    "after {strays} stray connections, accept failed: {e}"
                ))
            })?;
        }
        if Instant::now() > deadline {
            return fail!(
                "after {strays} stray TCP connections to its listening socket(s), the real \
                 connect/accept did not complete within {} s ({} done)",
                OP_LIMIT.as_secs(),
                match (send.is_some(), recv.is_some()) {
                    (true, false) => "connect",
                    (false, true) => "accept",
                    _ => "neither",
                }
            );
        }
        std::thread::yield_now();
    }
    let (Some(send), Some(recv)) = (send, recv) else {
        return fail!("connect/accept ended without both comms");
    };
    step("a second connect to the same handle, never accepted");
    let mut second = r.ctx.connect(0, &handle);
    let mut second_end = poll_stray(&mut second, "second connect")?;
    step("closeListen with the second connection pending");
    if let Some(l) = listen.take() {
        within(CALL_LIMIT, blocked("closeListen"), || {
            timed("closeListen", || l.close())
        })??;
    }
    if second_end.is_none() {
        second_end = poll_stray(&mut second, "second connect")?;
    }
    step("a connect to the handle after closeListen");
    let mut late = r.ctx.connect(0, &handle);
    let late_end = poll_stray(&mut late, "connect after closeListen")?;
    step("data over the real connection");
    let mut flow = Flow::new((send, recv), env.version);
    for len in [0usize, 1, 70_001] {
        let data = rng.bytes(len);
        let (got, _, n) = setup::transfer(&mut flow, &data, len, 4, false).map_err(|e| {
            e.context(&format!(
                "after {strays} stray TCP connections, a {len}-byte message over the real \
                 connection"
            ))
        })?;
        if n != len || got[..len] != data[..] {
            return fail!(
                "after {strays} stray TCP connections, a {len}-byte message over the real \
                 connection arrived wrong ({n} bytes)"
            );
        }
    }
    flow.close()?;
    drop(kept);
    step("a new connection on the same context");
    new_connection(&r.ctx, &mut rng, env.version)?;
    Ok(format!(
        "{strays} stray TCP connections to {} listening socket(s) before the real connect; a \
         second connect to the handle (never accepted): {}; a connect after closeListen: {}; \
         every call returned at once, the real connection and a new one carried data intact",
        targets.len(),
        second_end.unwrap_or_else(|| "still pending".into()),
        late_end.unwrap_or_else(|| "still pending".into()),
    ))
}

/// Polls a stray `connect` a few times; `Some(outcome)` once it ended (a comm it
/// returned is closed at once).
fn poll_stray(c: &mut Connecting, what: &'static str) -> Result<Option<String>, Stop> {
    for _ in 0..STRAY_POLLS {
        match within(CALL_LIMIT, blocked("connect"), || timed(what, || c.poll()))? {
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Ok(Some(comm)) => {
                within(CALL_LIMIT, blocked("closeSend"), || comm.close())?;
                return Ok(Some("returned a comm (closed again)".into()));
            }
            Err(e) => return Ok(Some(format!("failed ({})", e.code_text()))),
        }
    }
    Ok(None)
}

/// A fresh connection on `ctx` carries a message intact.
fn new_connection(ctx: &NetContext, rng: &mut Rng, version: u32) -> Result<(), Stop> {
    let mut flow = Flow::new(setup::pair(ctx, ctx, 0)?, version);
    let data = rng.bytes(9_999);
    let (got, _, n) = setup::transfer(&mut flow, &data, data.len(), 5, false)?;
    if n != data.len() || got[..data.len()] != data[..] {
        return fail!("after stray connections, a new connection delivered wrong data");
    }
    flow.close()
}

/// TCP sockets of this process in the LISTEN state (from /proc), with an unspecified
/// address replaced by loopback so they can be connected to.
fn listening_tcp() -> HashSet<SocketAddr> {
    let inodes: HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    let mut out = HashSet::new();
    for file in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st queues timer retr uid timeout inode
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            if *state != "0A" || !inode.parse().is_ok_and(|i: u64| inodes.contains(&i)) {
                continue;
            }
            if let Some(a) = parse_addr(local) {
                out.insert(a);
            }
        }
    }
    out
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6), as /proc prints them:
/// the address as 32-bit words in this machine's byte order, the port as a number.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(
            u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
                .ok()?
                .to_ne_bytes(),
        )
    };
    let ip = match ip.len() {
        8 => {
            let v4 = Ipv4Addr::from(word(0)?);
            IpAddr::V4(if v4.is_unspecified() {
                Ipv4Addr::LOCALHOST
            } else {
                v4
            })
        }
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(b);
            IpAddr::V6(if v6.is_unspecified() {
                Ipv6Addr::LOCALHOST
            } else {
                v6
            })
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_addresses_parse_in_machine_byte_order() {
        let v4 = Ipv4Addr::new(10, 99, 0, 7);
        let hex = format!("{:08X}", u32::from_ne_bytes(v4.octets()));
        assert_eq!(
            parse_addr(&format!("{hex}:1F91")),
            Some(SocketAddr::new(IpAddr::V4(v4), 0x1F91))
        );
        assert_eq!(
            parse_addr("00000000:0050"),
            Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 80))
        );
        let v6: Ipv6Addr = "fe80::1:2:3".parse().expect("v6");
        let o = v6.octets();
        let hex: String = (0..4)
            .map(|i| {
                let w = [o[i * 4], o[i * 4 + 1], o[i * 4 + 2], o[i * 4 + 3]];
                format!("{:08X}", u32::from_ne_bytes(w))
            })
            .collect();
        assert_eq!(
            parse_addr(&format!("{hex}:FFFF")),
            Some(SocketAddr::new(IpAddr::V6(v6), 65535))
        );
        assert_eq!(parse_addr("xyz"), None);
        assert_eq!(parse_addr("0100007F"), None);
    }

    #[test]
    fn a_listening_socket_of_this_process_is_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        assert!(
            listening_tcp()
                .iter()
                .any(|a| a.port() == port && a.ip().is_loopback()),
            "port {port} not in {:?}",
            listening_tcp()
        );
        drop(l);
        assert!(!listening_tcp().iter().any(|a| a.port() == port));
    }
}
