//! What a child process does, selected by `CCLKIT_TEST_ROLE`, and the parent-side
//! helpers that start a pair of children and relay their handles.
//!
//! Child settings come from the environment: `CCLKIT_TEST_VER` (8/11/12),
//! `CCLKIT_TEST_SEED`, `CCLKIT_TEST_SIDE` (0/1), `CCLKIT_TEST_GROUPED` (buffers per
//! grouped receive in the exchange; unset = no grouped part).

use std::ffi::c_int;
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::NcclResult;

use super::child::{Child, hear, hex, say, unhex};
use super::script::{exchange, grouped, singles};
use super::{Plugin, Ptr, SIZES, Ver, pattern, send_now, truncate};

const SETUP: Duration = Duration::from_secs(30);
const RUN: Duration = Duration::from_secs(120);
const BIG: usize = 16 << 20;

fn env_u64(name: &str) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Listens, publishes the handle, takes the peer's, and connects both ways.
fn connect_both(p: &Plugin) -> (Ptr, Ptr) {
    let (handle, lc) = p.listen(0).expect("listen");
    let props = p.properties(0).expect("properties");
    say(&format!("DEVICE {}", props.name));
    say(&format!("HANDLE {}", hex(&handle)));
    let mut peer = unhex(&hear());
    let deadline = Instant::now() + SETUP;
    let (mut s, mut r): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
    while s.is_null() || r.is_null() {
        assert!(Instant::now() < deadline, "connection setup timed out");
        if s.is_null() {
            s = p.connect(0, &mut peer).expect("connect");
        }
        if r.is_null() {
            r = p.accept(lc).expect("accept");
        }
    }
    p.close_listen(lc);
    say("CONNECTED");
    (s, r)
}

/// Runs this process's role; called first by every multi-process test.
pub fn run(role: &str) {
    let ver = Ver::parse(&std::env::var("CCLKIT_TEST_VER").unwrap_or_default());
    let seed = env_u64("CCLKIT_TEST_SEED");
    let me = env_u64("CCLKIT_TEST_SIDE");
    let p = Plugin::open(ver);
    let (send, recv) = connect_both(&p);
    match role {
        "exchange" => {
            let grouping = env_u64("CCLKIT_TEST_GROUPED") as usize;
            exchange(&p, send, recv, &singles(&SIZES), seed, me, 1 - me, 32, RUN);
            let sizes: Vec<usize> = (0..80)
                .map(|i| (pattern(seed, i, 3)[0] as usize) << (i % 17))
                .collect();
            exchange(&p, send, recv, &singles(&sizes), seed, me, 1 - me, 32, RUN);
            if grouping > 1 {
                exchange(
                    &p,
                    send,
                    recv,
                    &grouped(20, grouping, seed),
                    seed,
                    me,
                    1 - me,
                    32,
                    RUN,
                );
            }
            // A message larger than the receive fails it, on both processes, and the
            // next messages still arrive intact. The sender only knows when the peer
            // receives in grouped mode.
            let (rcv, snd) = truncate(&p, send, recv, 10, 100_000);
            assert_eq!(rcv, NcclResult::INVALID_USAGE, "truncated receive");
            assert!(
                matches!(snd, NcclResult::SUCCESS | NcclResult::INVALID_USAGE),
                "{snd:?}"
            );
            exchange(
                &p,
                send,
                recv,
                &singles(&[7, 1 << 20]),
                seed,
                me,
                1 - me,
                4,
                RUN,
            );
            // Both sides finish before either closes: the last receives need the peer.
            say("DONE");
            assert_eq!(hear(), "CLOSE");
        }
        "victim-send" | "survivor-send" => {
            let mut buf = pattern(seed, 0, BIG);
            let mut n = 0;
            let err = loop {
                // SAFETY: buf outlives each request (waited on before reuse).
                let req = match unsafe { send_now(&p, send, buf.as_mut_ptr(), BIG, 0) } {
                    Ok(r) => r,
                    Err(e) => break e,
                };
                if let Err(e) = wait(&p, req) {
                    break e;
                }
                n += 1;
                say(&format!("SENT {n}"));
            };
            say(&format!("ERROR {}", err.0));
        }
        "victim-recv" | "survivor-recv" => {
            let mut buf = vec![0u8; BIG];
            let mut n = 0;
            let err = loop {
                // SAFETY: buf outlives each request (waited on before reuse).
                let req = match unsafe {
                    p.irecv(
                        recv,
                        &[(buf.as_mut_ptr(), BIG)],
                        &[0],
                        &[std::ptr::null_mut()],
                    )
                } {
                    Ok(r) => r,
                    Err(e) => break e,
                };
                if let Err(e) = wait(&p, req) {
                    break e;
                }
                n += 1;
                say(&format!("GOT {n}"));
            };
            say(&format!("ERROR {}", err.0));
        }
        other => panic!("unknown role {other}"),
    }
    p.close_send(send);
    p.close_recv(recv);
}

/// Tests until done or failed (bounded).
fn wait(p: &Plugin, req: Ptr) -> Result<(), NcclResult> {
    let deadline = Instant::now() + RUN;
    loop {
        let mut sizes = [0 as c_int; 64];
        if p.test(req, &mut sizes)? {
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "request neither completed nor failed"
        );
    }
}

/// Starts two children of `test` in `roles`, relays their handles, and returns them
/// connected (after both printed CONNECTED). `wrap[i]` prefixes child `i`'s command.
pub fn start_pair(
    test: &str,
    roles: [&str; 2],
    vers: [Ver; 2],
    envs: [&[(&str, String)]; 2],
    wrap: [&[&str]; 2],
    seed: u64,
) -> ([Child; 2], [String; 2], [String; 2]) {
    let mk = |i: usize| {
        let mut e: Vec<(&str, String)> = envs[i].to_vec();
        e.push(("CCLKIT_TEST_VER", vers[i].num().to_owned()));
        e.push(("CCLKIT_TEST_SEED", seed.to_string()));
        e.push(("CCLKIT_TEST_SIDE", i.to_string()));
        Child::spawn(&format!("{}#{i}", roles[i]), test, roles[i], &e, wrap[i])
    };
    let mut kids = [mk(0), mk(1)];
    let devs = [
        kids[0].expect("DEVICE ", SETUP),
        kids[1].expect("DEVICE ", SETUP),
    ];
    let handles = [
        kids[0].expect("HANDLE ", SETUP),
        kids[1].expect("HANDLE ", SETUP),
    ];
    kids[0].send(&handles[1]);
    kids[1].send(&handles[0]);
    kids[0].expect("CONNECTED", SETUP);
    kids[1].expect("CONNECTED", SETUP);
    (kids, devs, handles)
}

/// Runs the full exchange between two children and checks both succeed.
pub fn exchange_pair(
    test: &str,
    vers: [Ver; 2],
    envs: [&[(&str, String)]; 2],
    wrap: [&[&str]; 2],
    seed: u64,
) -> [String; 2] {
    let (mut kids, devs, _) = start_pair(test, ["exchange", "exchange"], vers, envs, wrap, seed);
    kids[0].expect("DONE", RUN);
    kids[1].expect("DONE", RUN);
    kids[0].send("CLOSE");
    kids[1].send("CLOSE");
    kids[0].wait_ok(SETUP);
    kids[1].wait_ok(SETUP);
    devs
}

/// Kills child `victim` after the survivor moved two messages; the survivor's pending
/// request must fail with ncclRemoteError. The plugin has no data-path timeout, so any
/// error at all comes from the dead peer's closed sockets; `bound` only keeps a hang
/// from lasting and should be generous (a loaded machine is slow, not wrong).
pub fn kill_mid_transfer(test: &str, roles: [&str; 2], progress: &str, seed: u64, bound: Duration) {
    let none: &[(&str, String)] = &[];
    let (mut kids, _, _) = start_pair(
        test,
        roles,
        [Ver::V12, Ver::V11],
        [none, none],
        [&[], &[]],
        seed,
    );
    let (survivor, victim) = if roles[0].starts_with("survivor") {
        (0, 1)
    } else {
        (1, 0)
    };
    kids[survivor].expect(&format!("{progress} 2"), RUN);
    kids[victim].kill();
    let code = kids[survivor].expect("ERROR ", bound);
    assert_eq!(
        code,
        NcclResult::REMOTE_ERROR.0.to_string(),
        "survivor's error code"
    );
    kids[survivor].wait_ok(SETUP);
}
