//! Connection setup and message pumps shared by the scenarios.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use crate::pattern;
use crate::table::{Close, Net, R};

/// How long any single wait may take before the peer gives up.
pub const WAIT: Duration = Duration::from_secs(60);

/// Prints one protocol line to the parent.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Reads the next line from the parent (the parent kills us if it never comes).
pub fn hear() -> R<String> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("reading stdin: {e}"))?;
    if line.is_empty() {
        return Err("parent closed stdin".into());
    }
    Ok(line.trim_end().to_owned())
}

/// Hex of a handle.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Inverse of [`hex`].
pub fn unhex(s: &str) -> R<[u8; 128]> {
    let mut out = [0u8; 128];
    if s.len() != 256 {
        return Err(format!("handle hex of {} chars", s.len()));
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// A pair of comms to one peer (send and receive), like one NCCL connection pair.
pub struct Link {
    /// The plugin.
    pub net: Net,
    /// Send comm to the peer.
    pub send: *mut c_void,
    /// Receive comm from the peer.
    pub recv: *mut c_void,
}

// SAFETY: NCCL may drive different comms of one plugin from different threads;
// the pointers are opaque handles only the plugin dereferences.
unsafe impl Sync for Link {}
// SAFETY: as above.
unsafe impl Send for Link {}

/// Fails with `what` once `deadline` has passed.
pub fn check_deadline(deadline: Instant, what: &str) -> R<()> {
    if Instant::now() > deadline {
        return Err(format!("timed out: {what}"));
    }
    Ok(())
}

/// Connects to `peer` and accepts from `listen`, interleaving the non-blocking
/// calls as NCCL's proxy does.
pub fn join(net: Net, listen: *mut c_void, mut peer: [u8; 128]) -> R<Link> {
    let deadline = Instant::now() + WAIT;
    let (mut send, mut recv): (*mut c_void, *mut c_void) =
        (std::ptr::null_mut(), std::ptr::null_mut());
    while send.is_null() || recv.is_null() {
        if send.is_null() {
            send = net.connect(0, &mut peer)?;
        }
        if recv.is_null() {
            recv = net.accept(listen)?;
        }
        check_deadline(deadline, "connect/accept")?;
    }
    net.close(Close::Listen, listen)?;
    Ok(Link { net, send, recv })
}

/// Listens, swaps handles with the peer through the parent, and connects both ways.
pub fn link(net: Net) -> R<Link> {
    let mut handle = [0u8; 128];
    let listen = net.listen(0, &mut handle)?;
    say(&format!("HANDLE {}", hex(&handle)));
    let line = hear()?;
    let peer = unhex(line.strip_prefix("PEER ").ok_or("expected PEER line")?)?;
    join(net, listen, peer)
}

/// One message: content id, size, NCCL tag.
#[derive(Debug, Clone, Copy)]
pub struct Msg {
    /// Content id (pattern seed).
    pub id: u64,
    /// Bytes sent.
    pub size: usize,
    /// NCCL tag.
    pub tag: i32,
}

/// Bytes the receiver posts beyond each message, to catch overruns.
const SLACK: usize = 13;
const SENTINEL: u8 = 0xee;

struct Flight {
    req: *mut c_void,
    mhs: Vec<*mut c_void>,
    bufs: Vec<Vec<u8>>,
    msgs: Vec<Msg>,
}

/// Sends `msgs` in order with at most `window` in flight.
pub fn send_all(net: &Net, comm: *mut c_void, seed: u64, msgs: &[Msg], window: usize) -> R<()> {
    let groups: Vec<Vec<Msg>> = msgs.iter().map(|m| vec![*m]).collect();
    pump(net, comm, seed, &groups, window, true)
}

/// Receives `groups` (one `irecv` per group) with at most `window` in flight and
/// checks every size and byte.
pub fn recv_all(
    net: &Net,
    comm: *mut c_void,
    seed: u64,
    groups: &[Vec<Msg>],
    window: usize,
) -> R<()> {
    pump(net, comm, seed, groups, window, false)
}

fn pump(
    net: &Net,
    comm: *mut c_void,
    seed: u64,
    groups: &[Vec<Msg>],
    window: usize,
    send: bool,
) -> R<()> {
    let mut q: VecDeque<Flight> = VecDeque::new();
    let mut next = 0;
    let mut deadline = Instant::now() + WAIT;
    while next < groups.len() || !q.is_empty() {
        while q.len() < window && next < groups.len() {
            let msgs = groups[next].clone();
            let mut bufs = Vec::new();
            let mut mhs = Vec::new();
            for m in &msgs {
                let mut b = if send {
                    let mut b = vec![0u8; m.size];
                    pattern::fill(seed, m.id, &mut b);
                    b
                } else {
                    vec![SENTINEL; m.size + SLACK]
                };
                mhs.push(net.reg_mr(comm, b.as_mut_ptr(), b.len())?);
                bufs.push(b);
            }
            let req = if send {
                net.isend(
                    comm,
                    bufs[0].as_mut_ptr(),
                    msgs[0].size,
                    msgs[0].tag,
                    mhs[0],
                )?
            } else {
                let spec: Vec<_> = bufs
                    .iter_mut()
                    .zip(&msgs)
                    .zip(&mhs)
                    .map(|((b, m), mh)| (b.as_mut_ptr(), b.len(), m.tag, *mh))
                    .collect();
                net.irecv(comm, &spec)?
            };
            if req.is_null() {
                for mh in mhs {
                    net.dereg_mr(comm, mh)?;
                }
                break;
            }
            q.push_back(Flight {
                req,
                mhs,
                bufs,
                msgs,
            });
            next += 1;
        }
        let mut i = 0;
        while i < q.len() {
            let n = q[i].msgs.len();
            match net.test(q[i].req, n)? {
                None => i += 1,
                Some(sizes) => {
                    let f = q.remove(i).ok_or("flight vanished")?;
                    finish(net, comm, seed, f, &sizes, send)?;
                    deadline = Instant::now() + WAIT;
                }
            }
        }
        check_deadline(deadline, if send { "sends" } else { "receives" })?;
    }
    Ok(())
}

fn finish(net: &Net, comm: *mut c_void, seed: u64, f: Flight, sizes: &[i32], send: bool) -> R<()> {
    for (j, m) in f.msgs.iter().enumerate() {
        if sizes[j] != m.size as i32 {
            return Err(format!(
                "message {} (tag {}): test reported {} bytes, expected {}",
                m.id, m.tag, sizes[j], m.size
            ));
        }
        if !send {
            let b = &f.bufs[j];
            if let Some(at) = pattern::first_mismatch(seed, m.id, &b[..m.size]) {
                return Err(format!(
                    "message {} (tag {}, {} bytes, buffer {j}): wrong byte at {at}",
                    m.id, m.tag, m.size
                ));
            }
            if b[m.size..].iter().any(|&x| x != SENTINEL) {
                return Err(format!(
                    "message {}: bytes written past its {} bytes",
                    m.id, m.size
                ));
            }
        }
    }
    for mh in f.mhs {
        net.dereg_mr(comm, mh)?;
    }
    Ok(())
}

/// Waits until `req` completes, returning its sizes.
pub fn wait(net: &Net, req: *mut c_void, n: usize) -> R<Vec<i32>> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(s) = net.test(req, n)? {
            return Ok(s);
        }
        check_deadline(deadline, "request")?;
    }
}

/// One-byte handshake: the receiving side of `data` tells the sender it is done,
/// so the sender never tears down before its data has arrived.
pub fn fin(link: &Link, i_am_receiver: bool) -> R<()> {
    let mut byte = [1u8; 1];
    let req = if i_am_receiver {
        link.net
            .isend(link.send, byte.as_mut_ptr(), 1, 999, std::ptr::null_mut())?
    } else {
        link.net.irecv(
            link.recv,
            &[(byte.as_mut_ptr(), 1, 999, std::ptr::null_mut())],
        )?
    };
    if req.is_null() {
        return Err("fin: request not accepted".into());
    }
    wait(&link.net, req, 1).map(drop)
}

/// Closes both comms and finalizes.
pub fn close(link: Link) -> R<()> {
    link.net.close(Close::Send, link.send)?;
    link.net.close(Close::Recv, link.recv)?;
    link.net.finalize()
}
