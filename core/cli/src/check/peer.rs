//! Two-process checks: two peer processes (`cclkit check LIB --peer RANK`) each listen,
//! swap handles through the check process (standing in for NCCL's bootstrap), connect
//! to each other both ways, exchange random data and verify it.
//!
//! Peer protocol, one line each way: the peer prints `@cclkit-peer handle <hex>`,
//! reads `handle <hex>` (the other's), transfers, prints `@cclkit-peer done <summary>`,
//! reads `close`, closes everything and prints `@cclkit-peer ok`. A peer that cannot
//! run prints `@cclkit-peer skip <why>` or `@cclkit-peer fail <why>`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use cclkit_abi::raw::net::NCCL_NET_HANDLE_MAXSIZE;

use super::child::{Env, RESULT_PREFIX, after, line, step, within};
use super::net::flow::{RecvPost, Region, SendPost};
use super::net::setup::{self, CALL_LIMIT, Flow, OP_LIMIT, blocked};
use super::net::timing::timed;
use super::rng::Rng;
use super::{Checked, Stop, fail};
use cclkit_host::net::RecvBuffer;

/// Prefix of a peer's protocol lines.
const PEER_PREFIX: &str = "@cclkit-peer ";
/// Messages each peer sends the other.
const MESSAGES: usize = 16;

/// Writes a protocol line.
pub(crate) fn say(text: &str) {
    line(&format!("{PEER_PREFIX}{text}"));
}

/// The peer process: see the module docs.
pub(crate) fn run(env: &Env, rank: usize) -> ExitCode {
    match peer(env, rank) {
        Ok(summary) => {
            say(&format!("ok {summary}"));
            ExitCode::SUCCESS
        }
        Err(Stop::Skip(m)) => {
            say(&format!("skip {m}"));
            ExitCode::SUCCESS
        }
        Err(Stop::Fail(m)) => {
            say(&format!("fail {m}"));
            ExitCode::FAILURE
        }
    }
}

fn peer(env: &Env, rank: usize) -> Checked {
    let plugin = setup::load_plugin(env)?;
    let ctx = setup::init(env, &plugin, 0x5000 + rank as u64)?;
    if ctx.devices()? == 0 {
        return Err(setup::no_device(env, "devices() reported 0 devices".into()));
    }
    step("listen");
    let (handle, listen) = ctx.listen(0)?;
    say(&format!("handle {}", hex(&handle)));
    let mut input = std::io::stdin().lock();
    let mut other = String::new();
    input
        .read_line(&mut other)
        .map_err(|e| Stop::Fail(format!("reading the other peer's handle: {e}")))?;
    let other = other
        .trim()
        .strip_prefix("handle ")
        .and_then(unhex)
        .ok_or_else(|| Stop::Fail(format!("bad handle line from the check: {other:?}")))?;
    step("connect to the other peer and accept its connection");
    let mut connecting = ctx.connect(0, &other);
    let mut listen = Some(listen);
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + OP_LIMIT;
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = within(CALL_LIMIT, blocked("connect"), || {
                timed("connect", || connecting.poll())
            })??;
        }
        if recv.is_none()
            && let Some(l) = listen.as_mut()
        {
            recv = within(CALL_LIMIT, blocked("accept"), || {
                timed("accept", || l.accept())
            })??;
            if recv.is_some()
                && let Some(l) = listen.take()
            {
                l.close()?;
            }
        }
        if Instant::now() > deadline {
            return fail!(
                "rank {rank}: no connection to the other process within {} s ({} done)",
                OP_LIMIT.as_secs(),
                if send.is_some() {
                    "connect"
                } else if recv.is_some() {
                    "accept"
                } else {
                    "neither"
                }
            );
        }
        std::thread::yield_now();
    }
    let (Some(send), Some(recv)) = (send, recv) else {
        return fail!("connection setup ended without both comms");
    };
    let mut flow = Flow::new((send, recv), env.version);
    let summary = exchange(env, rank, &mut flow)?;
    say(&format!("done {summary}"));
    let mut cmd = String::new();
    let _ = input.read_line(&mut cmd);
    step("close");
    flow.close()?;
    drop(ctx);
    Ok(summary)
}

/// The sizes and bytes rank `from` sends.
fn messages(seed: u64, from: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed, 2000 + from as u64);
    (0..MESSAGES)
        .map(|i| {
            let len = match i {
                0 => 0,
                1 => 1,
                2 => 4097,
                3 => (1 << 20) + 3,
                _ => rng.range(0, 300_000),
            };
            rng.bytes(len)
        })
        .collect()
}

/// Sends this rank's messages and receives the other's, all in flight together.
fn exchange(env: &Env, rank: usize, flow: &mut Flow) -> Checked {
    let mine = messages(env.seed, rank);
    let theirs = messages(env.seed, 1 - rank);
    step(format!("exchange {MESSAGES} messages each way"));
    let total = |ms: &[Vec<u8>]| ms.iter().map(Vec::len).sum::<usize>();
    let (mut rreg, rmr) = Region::on_recv(&mut flow.recv, total(&theirs))?;
    let (mut sreg, smr) = Region::on_send(&mut flow.send, total(&mine))?;
    let mut rbufs: Vec<&'static [u8]> = Vec::new();
    let mut recvs = Vec::new();
    for m in &theirs {
        let b = rreg.take(m.len());
        recvs.push(RecvPost {
            bufs: vec![RecvBuffer {
                data: b.as_mut_ptr(),
                size: b.len(),
                tag: 1 - rank as i32,
                mr: Some(&rmr),
            }],
            optional: false,
        });
        rbufs.push(b);
    }
    let mut sends = Vec::new();
    for m in &mine {
        let b = sreg.take(m.len());
        b.copy_from_slice(m);
        sends.push(SendPost {
            data: b,
            tag: rank as i32,
            mr: Some(&smr),
        });
    }
    let tokens = flow.post(&recvs, &sends, OP_LIMIT)?;
    let done = flow.wait_ok(&tokens, OP_LIMIT)?;
    let mut bytes = 0;
    for (i, m) in theirs.iter().enumerate() {
        let n = done[i].first().copied().unwrap_or(usize::MAX);
        if n != m.len() || rbufs[i][..] != m[..] {
            return fail!(
                "rank {rank}: message {i} from the other process: {n} bytes reported for {}, or \
                 the data differs",
                m.len()
            );
        }
        bytes += n;
    }
    drop((recvs, sends));
    flow.send.dereg_mr(smr)?;
    flow.recv.dereg_mr(rmr)?;
    Ok(format!(
        "{MESSAGES} messages ({bytes} bytes) received intact"
    ))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; NCCL_NET_HANDLE_MAXSIZE]> {
    let mut out = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    if s.len() != 2 * NCCL_NET_HANDLE_MAXSIZE {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The check side: runs two peers from `commands`, relays their handles, and turns
/// what they print into the check's result.
pub(crate) fn orchestrate(mut commands: [Command; 2], what: &str) -> Checked {
    let mut peers = Vec::new();
    for (rank, cmd) in commands.iter_mut().enumerate() {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let child = cmd
            .spawn()
            .map_err(|e| Stop::Fail(format!("cannot start peer {rank}: {e}")))?;
        peers.push(Peer::new(child, rank)?);
    }
    let result = relay(&mut peers, what);
    for p in &mut peers {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    result
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    rank: usize,
}

impl Peer {
    fn new(mut child: Child, rank: usize) -> Result<Self, Stop> {
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, o),
            _ => return fail!("peer {rank} has no pipes"),
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            stdin,
            lines: rx,
            rank,
        })
    }

    /// The peer's next protocol line, until `deadline`.
    fn next(&mut self, deadline: Instant, waiting_for: &str) -> Result<(String, String), Stop> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = match self.lines.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(l) => l,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return fail!("peer {} sent no {waiting_for} in time", self.rank);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                    return fail!(
                        "peer {} ended ({status}) before its {waiting_for}",
                        self.rank
                    );
                }
            };
            if let Some(r) = after(&l, RESULT_PREFIX) {
                return fail!("peer {}: {r}", self.rank);
            }
            if let Some(body) = after(&l, PEER_PREFIX) {
                let (verb, rest) = body.split_once(' ').unwrap_or((body, ""));
                match verb {
                    "fail" => return fail!("peer {}: {rest}", self.rank),
                    "skip" => return Err(Stop::Skip(format!("peer {}: {rest}", self.rank))),
                    _ => return Ok((verb.to_owned(), rest.to_owned())),
                }
            }
        }
    }

    fn send(&mut self, text: &str) -> Result<(), Stop> {
        writeln!(self.stdin, "{text}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| Stop::Fail(format!("writing to peer {}: {e}", self.rank)))
    }
}

fn relay(peers: &mut [Peer], what: &str) -> Checked {
    let deadline = Instant::now() + OP_LIMIT * 2;
    step("wait for both peers' handles");
    let mut handles = Vec::new();
    for p in peers.iter_mut() {
        let (verb, rest) = p.next(deadline, "handle")?;
        if verb != "handle" {
            return fail!("peer {} said '{verb}' instead of its handle", p.rank);
        }
        handles.push(rest);
    }
    peers[0].send(&format!("handle {}", handles[1]))?;
    peers[1].send(&format!("handle {}", handles[0]))?;
    step("wait for both peers' transfers");
    let mut summaries = Vec::new();
    for p in peers.iter_mut() {
        let (verb, rest) = p.next(deadline, "transfer result")?;
        if verb != "done" {
            return fail!(
                "peer {} said '{verb}' instead of its transfer result",
                p.rank
            );
        }
        summaries.push(rest);
    }
    step("close both peers");
    for p in peers.iter_mut() {
        p.send("close")?;
    }
    for p in peers.iter_mut() {
        let (verb, _) = p.next(deadline, "close result")?;
        if verb != "ok" {
            return fail!("peer {} said '{verb}' after close", p.rank);
        }
    }
    Ok(format!(
        "{what}: both connected both ways; rank 0: {}; rank 1: {}",
        summaries[0], summaries[1]
    ))
}

/// Runs one side of a two-process check: the child process `cclkit check --peer`
/// starts (see `orchestrate`).
pub fn run_peer(args: &super::child::ChildArgs, rank: usize) -> std::process::ExitCode {
    super::child::start_watchdog(args.timeout, "peer");
    match Env::new(args, super::Family::Net) {
        Ok(env) => run(&env, rank),
        Err(e) => {
            say(&format!("fail {e}"));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_as_hex() {
        let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        h[0] = 0xab;
        h[127] = 7;
        assert_eq!(unhex(&hex(&h)), Some(h));
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn both_ranks_agree_on_the_messages() {
        let a = messages(9, 0);
        assert_eq!(a, messages(9, 0));
        assert_ne!(a, messages(9, 1));
        assert_eq!(a[3].len(), (1 << 20) + 3);
    }
}
