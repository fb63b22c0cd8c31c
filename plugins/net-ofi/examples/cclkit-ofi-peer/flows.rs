//! Connection setup and message pumps shared by the scenarios.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use cclkit_host::net::{ConnectHandle, ListenComm, Mr, RecvBuffer, RecvComm, Request, SendComm};

use crate::net::{Net, R, Side, err};
use crate::pattern;

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
pub fn unhex(s: &str) -> R<ConnectHandle> {
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
    pub send: SendComm,
    /// Receive comm from the peer.
    pub recv: RecvComm,
}

/// Fails with `what` once `deadline` has passed.
pub fn check_deadline(deadline: Instant, what: &str) -> R<()> {
    if Instant::now() > deadline {
        return Err(format!("timed out: {what}"));
    }
    Ok(())
}

/// Connects to `peer` and accepts from `listen`, interleaving the non-blocking
/// calls as NCCL's proxy does.
pub fn join(net: Net, mut listen: ListenComm, peer: ConnectHandle) -> R<Link> {
    let deadline = Instant::now() + WAIT;
    let mut connecting = net.connect(0, &peer);
    let (mut send, mut recv) = (None, None);
    loop {
        if send.is_none() {
            send = connecting.poll().map_err(err)?;
        }
        if recv.is_none() {
            recv = listen.accept().map_err(err)?;
        }
        if let (Some(_), Some(_)) = (&send, &recv)
            && let (Some(send), Some(recv)) = (send.take(), recv.take())
        {
            listen.close().map_err(err)?;
            return Ok(Link { net, send, recv });
        }
        check_deadline(deadline, "connect/accept")?;
    }
}

/// Listens, swaps handles with the peer through the parent, and connects both ways.
pub fn link(net: Net) -> R<Link> {
    let (handle, listen) = net.listen(0)?;
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
    req: Request,
    mrs: Vec<Mr>,
    bufs: Vec<Vec<u8>>,
    msgs: Vec<Msg>,
}

/// Sends `msgs` in order with at most `window` in flight.
pub fn send_all(comm: &mut SendComm, seed: u64, msgs: &[Msg], window: usize) -> R<()> {
    let groups: Vec<Vec<Msg>> = msgs.iter().map(|m| vec![*m]).collect();
    pump(Side::Send(comm), seed, &groups, window)
}

/// Receives `groups` (one `irecv` per group) with at most `window` in flight and
/// checks every size and byte.
pub fn recv_all(comm: &mut RecvComm, seed: u64, groups: &[Vec<Msg>], window: usize) -> R<()> {
    pump(Side::Recv(comm), seed, groups, window)
}

/// Posts one flight: an `isend` of its single message or an `irecv` of its group.
/// `None` = the plugin cannot take it now (its registrations are released).
fn post(side: &mut Side<'_>, seed: u64, msgs: &[Msg]) -> R<Option<Flight>> {
    let send = side.is_send();
    let mut bufs = Vec::new();
    let mut mrs = Vec::new();
    for m in msgs {
        let mut b = if send {
            let mut b = vec![0u8; m.size];
            pattern::fill(seed, m.id, &mut b);
            b
        } else {
            vec![SENTINEL; m.size + SLACK]
        };
        // SAFETY: the buffer lives in the flight (its heap memory does not move when
        // the Vec does) until the registration is released in `finish`.
        mrs.push(unsafe { side.reg_mr(&mut b) }?);
        bufs.push(b);
    }
    // SAFETY: the buffers stay in the flight, untouched, until its request completed.
    let req = unsafe {
        match side {
            Side::Send(c) => c.isend(bufs[0].as_ptr(), msgs[0].size, msgs[0].tag, Some(&mrs[0])),
            Side::Recv(c) => {
                let spec: Vec<RecvBuffer<'_>> = bufs
                    .iter_mut()
                    .zip(msgs)
                    .zip(&mrs)
                    .map(|((b, m), mr)| RecvBuffer {
                        data: b.as_mut_ptr(),
                        size: b.len(),
                        tag: m.tag,
                        mr: Some(mr),
                    })
                    .collect();
                c.irecv(&spec, false)
            }
        }
    }
    .map_err(err)?;
    match req {
        Some(req) => Ok(Some(Flight {
            req,
            mrs,
            bufs,
            msgs: msgs.to_vec(),
        })),
        None => {
            mrs.into_iter().try_for_each(|mr| side.dereg_mr(mr))?;
            Ok(None)
        }
    }
}

fn pump(mut side: Side<'_>, seed: u64, groups: &[Vec<Msg>], window: usize) -> R<()> {
    let mut q: VecDeque<Flight> = VecDeque::new();
    let mut next = 0;
    let mut deadline = Instant::now() + WAIT;
    while next < groups.len() || !q.is_empty() {
        while q.len() < window && next < groups.len() {
            let Some(f) = post(&mut side, seed, &groups[next])? else {
                break;
            };
            q.push_back(f);
            next += 1;
        }
        let mut i = 0;
        while i < q.len() {
            match side.test(&mut q[i].req)? {
                None => i += 1,
                Some(sizes) => {
                    let f = q.remove(i).ok_or("flight vanished")?;
                    finish(&mut side, seed, f, &sizes)?;
                    deadline = Instant::now() + WAIT;
                }
            }
        }
        let what = if side.is_send() { "sends" } else { "receives" };
        check_deadline(deadline, what)?;
    }
    Ok(())
}

fn finish(side: &mut Side<'_>, seed: u64, f: Flight, sizes: &[usize]) -> R<()> {
    if sizes.len() != f.msgs.len() {
        return Err(format!(
            "test reported {} sizes for {} buffers",
            sizes.len(),
            f.msgs.len()
        ));
    }
    for (j, m) in f.msgs.iter().enumerate() {
        if sizes[j] != m.size {
            return Err(format!(
                "message {} (tag {}): test reported {} bytes, expected {}",
                m.id, m.tag, sizes[j], m.size
            ));
        }
        if !side.is_send() {
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
    f.mrs.into_iter().try_for_each(|mr| side.dereg_mr(mr))
}

/// Posts one receive of `buf` with `tag` on `l`'s receive comm. The caller keeps
/// `buf` alive until the request completed.
pub fn post_one(l: &mut Link, buf: &mut [u8], tag: i32) -> R<Request> {
    let one = RecvBuffer {
        data: buf.as_mut_ptr(),
        size: buf.len(),
        tag,
        mr: None,
    };
    // SAFETY: every caller keeps `buf` alive until the request completed.
    unsafe { l.recv.irecv(&[one], false) }
        .map_err(err)?
        .ok_or_else(|| "irecv not accepted".to_owned())
}

/// Posts one send of `buf` with `tag` on `l`'s send comm, calling `isend` again
/// while it returns no request (as NCCL does). The caller keeps `buf` alive
/// until the request completed.
pub fn send_one(l: &mut Link, buf: &[u8], tag: i32) -> R<Request> {
    let deadline = Instant::now() + WAIT;
    loop {
        // SAFETY: every caller keeps `buf` alive until the request completed.
        if let Some(r) = unsafe { l.send.isend(buf.as_ptr(), buf.len(), tag, None) }.map_err(err)? {
            return Ok(r);
        }
        check_deadline(deadline, "isend to accept the send")?;
    }
}

/// Waits until `req` completes, returning its sizes.
pub fn wait(mut side: Side<'_>, mut req: Request) -> R<Vec<usize>> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(s) = side.test(&mut req)? {
            return Ok(s);
        }
        check_deadline(deadline, "request")?;
    }
}

/// One-byte handshake: the receiving side of `data` tells the sender it is done,
/// so the sender never tears down before its data has arrived.
pub fn fin(link: &mut Link, i_am_receiver: bool) -> R<()> {
    let mut byte = [1u8; 1];
    if i_am_receiver {
        let req = send_one(link, &byte, 999)?;
        return wait(Side::Send(&mut link.send), req).map(drop);
    }
    let req = post_one(link, &mut byte, 999)?;
    wait(Side::Recv(&mut link.recv), req).map(drop)
}

/// Closes both comms and finalizes.
pub fn close(link: Link) -> R<()> {
    link.send.close().map_err(err)?;
    link.recv.close().map_err(err)?;
    link.net.finalize()
}
