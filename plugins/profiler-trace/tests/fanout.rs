//! `CCLKIT_PROFILERS`: every event reaches a second profiler — here a C profiler
//! compiled from `tests/fixtures/forward_v5.c` against cclkit's generated header,
//! exporting only `ncclProfiler_v5`, so events are also re-encoded to an older
//! version — with that profiler's own handles as parents. A name that does not
//! load is skipped. Its own test binary: libraries load once per process.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;

use cclkit_abi::raw::profiler::{self as raw, ProfilerEventState, event as bit};
use common::*;

fn build_fixture(dir: &std::path::Path) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let so = dir.join("libnccl-profiler-fixture.so");
    let out = Command::new("cc")
        .args([
            "-shared", "-fPIC", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I",
        ])
        .arg(root.join("../../abi/include"))
        .arg(root.join("tests/fixtures/forward_v5.c"))
        .arg("-o")
        .arg(&so)
        .output()
        .expect("run cc (a C compiler is needed for this test)");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

#[test]
fn every_event_reaches_the_forwarded_profiler_with_its_own_parents() {
    let dir = temp_dir("fanout");
    let so = build_fixture(&dir);
    let log = dir.join("fixture.log");
    // SAFETY: the only test in this binary; set before any profiler runs.
    unsafe {
        std::env::set_var("CCLKIT_PROFILE_DIR", &dir);
        std::env::set_var("CCLKIT_PROFILE_SUMMARY", "0");
        std::env::set_var(
            "CCLKIT_PROFILERS",
            format!("cclkit-no-such-profiler,{}", so.display()),
        );
        std::env::set_var("FIXTURE_OUT", &log);
    }
    let count = (rand_u64() % 5000) as usize + 1;
    let (ctx, mask) = init(0xABC, 0, 4);
    // Our default mask, plus what the fixture asked for (nothing new here).
    assert_eq!(mask as u64, cclkit_profiler_trace::config::DEFAULT_MASK);

    let group = start(ctx, &mut descr(bit::GROUP, std::ptr::null_mut(), 0));
    let c = start(ctx, &mut coll(group, c"ReduceScatter", count, 1));
    stop(c);
    stop(group);
    let op = start(ctx, &mut proxy_op(c, 5, 2, false));
    let mut sd = descr(bit::PROXY_STEP, op, 0);
    sd.u.proxyStep.step = 4;
    let step = start(ctx, &mut sd);
    step_state(step, ProfilerEventState::PROXY_STEP_RECV_WAIT, count * 4);
    let mut sock = raw::ncclProfilerNetSockDescr_v1_t {
        type_: 1,
        sock: raw::ncclProfilerNetSockSockDescr_v1_t {
            fd: 4,
            op: 1,
            length: count * 4,
        },
    };
    let mut n = descr(bit::NET_PLUGIN, step, 0);
    n.u.netPlugin.id = i64::from(raw::NCCL_PROFILER_NET_TYPE_SOCK | 1);
    n.u.netPlugin.data = (&mut sock as *mut raw::ncclProfilerNetSockDescr_v1_t).cast();
    let net = start(ctx, &mut n);
    stop(net);
    stop(step);
    stop(op);
    finalize(ctx);

    let got = std::fs::read_to_string(&log).unwrap();
    let want = format!(
        "init abc bench 0/4\n\
         start 100 coll ReduceScatter {count} ncclFloat32 parent 0\n\
         stop 100\n\
         start 101 proxyop ch5 peer2 parent 100\n\
         start 102 step 4 parent 101\n\
         state 102 {} {}\n\
         start 103 net 20001 {} parent 102\n\
         stop 103\n\
         stop 102\n\
         stop 101\n\
         finalize ok\n",
        ProfilerEventState::PROXY_STEP_RECV_WAIT.0,
        count * 4,
        count * 4
    );
    assert_eq!(
        got, want,
        "the Group is outside the fixture's mask: its Coll has no parent there"
    );
    // This profiler's own trace is unaffected by forwarding.
    let v = read_json(&dir.join("cclkit-trace-0000000000000abc-rank0.json"));
    assert_eq!(spans(&v).len(), 5);
}
