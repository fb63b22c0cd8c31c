//! The trace plugin driven through its exported C table: JSON that parses, the event
//! tree NCCL's parents describe, NULL parents, the summary, and the event cap.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Mutex;

use cclkit_abi::raw::profiler::{ProfilerEventState, event as bit};
use common::*;

/// The tests set process-wide environment variables: one at a time.
static ENV: Mutex<()> = Mutex::new(());

fn set_env(dir: &std::path::Path, max: Option<&str>) {
    // SAFETY: tests hold ENV, so no other thread of this binary reads the environment now.
    unsafe {
        std::env::set_var("CCLKIT_PROFILE_DIR", dir);
        std::env::set_var("CCLKIT_PROFILE_SUMMARY", "0");
        match max {
            Some(m) => std::env::set_var("CCLKIT_PROFILE_MAX_EVENTS", m),
            None => std::env::remove_var("CCLKIT_PROFILE_MAX_EVENTS"),
        }
    }
}

#[test]
fn trace_holds_the_event_tree_and_the_summary_the_numbers() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("tree");
    set_env(&dir, None);
    let r = rand_u64();
    let count = (r % 100_000) as usize * 2 + 1; // odd element count
    let step_bytes = [(r >> 20) as usize % 9000 + 1, (r >> 40) as usize % 9000 + 1];
    eprintln!("count {count} steps {step_bytes:?}");
    let (ctx, mask) = init(0xC0FFEE, 1, 2);
    assert_eq!(mask as u64, cclkit_profiler_trace::config::DEFAULT_MASK);

    let group = start(ctx, &mut descr(bit::GROUP, std::ptr::null_mut(), 1));
    let mut c = coll(group, c"AllReduce", count, 7);
    let coll_h = start(ctx, &mut c);
    // NCCL stops Group and Coll once enqueued; the proxy work follows.
    stop(coll_h);
    stop(group);
    let op = start(ctx, &mut proxy_op(coll_h, 3, 0, true));
    let mut steps = Vec::new();
    for (i, b) in step_bytes.iter().enumerate() {
        let mut d = descr(bit::PROXY_STEP, op, 1);
        d.u.proxyStep.step = i as i32;
        let s = start(ctx, &mut d);
        step_state(s, ProfilerEventState::PROXY_STEP_SEND_GPU_WAIT, 0);
        step_state(s, ProfilerEventState::PROXY_STEP_SEND_WAIT, *b);
        steps.push(s);
    }
    let mut sock = cclkit_abi::raw::profiler::ncclProfilerNetSockDescr_v1_t {
        type_: 1,
        sock: cclkit_abi::raw::profiler::ncclProfilerNetSockSockDescr_v1_t {
            fd: 9,
            op: 0,
            length: step_bytes[0],
        },
    };
    let mut n = descr(bit::NET_PLUGIN, steps[0], 1);
    n.u.netPlugin.id = i64::from(cclkit_abi::raw::profiler::NCCL_PROFILER_NET_TYPE_SOCK | 1);
    n.u.netPlugin.data =
        (&mut sock as *mut cclkit_abi::raw::profiler::ncclProfilerNetSockDescr_v1_t).cast();
    let net = start(ctx, &mut n);
    std::thread::sleep(std::time::Duration::from_millis(2));
    stop(net);
    for s in steps {
        stop(s);
    }
    stop(op);
    // ProxyCtrl is not in the default mask: declined, and its NULL handle is fine.
    let ctrl = start(ctx, &mut descr(bit::PROXY_CTRL, std::ptr::null_mut(), 1));
    assert!(ctrl.is_null());
    stop(ctrl);
    // A P2p whose parent was declined has no parent.
    let mut p = descr(bit::P2P, ctrl, 1);
    p.u.p2p.func = c"Send".as_ptr();
    p.u.p2p.count = 5;
    p.u.p2p.datatype = c"ncclInt8".as_ptr();
    p.u.p2p.peer = 0;
    let p2p = start(ctx, &mut p);
    stop(p2p);
    finalize(ctx);

    let file = dir.join("cclkit-trace-0000000000c0ffee-rank1.json");
    let v = read_json(&file);
    assert_eq!(v["otherData"]["rank"], 1);
    assert_eq!(v["otherData"]["nRanks"], 2);
    assert_eq!(v["otherData"]["commName"], "bench");
    assert_eq!(v["otherData"]["droppedEvents"], 0);
    let spans = spans(&v);
    let by_cat = |c: &str| {
        spans
            .iter()
            .filter(|s| s["cat"] == c)
            .cloned()
            .collect::<Vec<_>>()
    };
    let (g, c, o, st, ne, pp) = (
        by_cat("Group"),
        by_cat("Coll"),
        by_cat("ProxyOp"),
        by_cat("ProxyStep"),
        by_cat("NetPlugin"),
        by_cat("P2p"),
    );
    assert_eq!(
        (g.len(), c.len(), o.len(), st.len(), ne.len(), pp.len()),
        (1, 1, 1, 2, 1, 1)
    );
    assert_eq!(spans.len(), 7);
    assert!(g[0]["args"].get("parent").is_none());
    assert_eq!(c[0]["name"], "AllReduce");
    assert_eq!(c[0]["args"]["parent"], g[0]["args"]["id"]);
    assert_eq!(c[0]["args"]["bytes"], count as u64 * 4);
    assert_eq!(c[0]["args"]["seq"], 7);
    assert_eq!(
        o[0]["args"]["parent"], c[0]["args"]["id"],
        "proxy op nests under its stopped collective"
    );
    assert_eq!(o[0]["args"]["channel"], 3);
    for (i, s) in st.iter().enumerate() {
        assert_eq!(s["args"]["parent"], o[0]["args"]["id"]);
        assert_eq!(s["args"]["bytes"], step_bytes[i] as u64);
        let states: Vec<_> = s["args"]["states"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["state"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(states, ["ProxyStepSendGPUWait", "ProxyStepSendWait"]);
    }
    assert_eq!(ne[0]["args"]["parent"], st[0]["args"]["id"]);
    assert_eq!(ne[0]["args"]["bytes"], step_bytes[0] as u64);
    assert!(
        ne[0]["dur"].as_f64().unwrap() >= 2000.0,
        "net event lasted ≥ 2 ms: {}",
        ne[0]["dur"]
    );
    assert!(
        pp[0]["args"].get("parent").is_none(),
        "declined parent ⇒ none"
    );
    // Proxy-side spans sit on a channel track, and each track nests properly.
    let names: Vec<_> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(names.iter().any(|n| n == "proxy ch3 send"), "{names:?}");
    assert_tracks_nest(&spans);

    let summary = std::fs::read_to_string(file.with_extension("txt")).unwrap();
    eprintln!("{summary}");
    let line = summary
        .lines()
        .find(|l| l.trim_start().starts_with("AllReduce"))
        .unwrap();
    let cols: Vec<_> = line.split_whitespace().collect();
    assert_eq!(
        (cols[1], cols[2]),
        (&*(count * 4).to_string(), "1"),
        "{line}"
    );
    assert!(
        summary.contains(&format!(
            "proxy steps: 2 (2 send, 0 recv), {} bytes",
            step_bytes[0] + step_bytes[1]
        )),
        "{summary}"
    );
    assert!(
        summary.contains(&format!("network: 1 events, {} bytes", step_bytes[0])),
        "{summary}"
    );
    assert!(summary.contains("SendGPUWait") && summary.contains("SendWait"));
    // The collective's time runs to the end of its last descendant, not its enqueue.
    let coll_total_ms: f64 = cols[3].parse().unwrap();
    assert!(coll_total_ms >= 2.0, "{line}");
}

/// Slices on one (pid, tid) must be disjoint or nested, as the viewers require.
fn assert_tracks_nest(spans: &[serde_json::Value]) {
    let mut by_tid: std::collections::BTreeMap<u64, Vec<(f64, f64)>> = Default::default();
    for s in spans {
        let ts = s["ts"].as_f64().unwrap();
        by_tid
            .entry(s["tid"].as_u64().unwrap())
            .or_default()
            .push((ts, ts + s["dur"].as_f64().unwrap()));
    }
    // The file holds exact microseconds since the epoch (~1.8e15); parsed as f64 (as
    // the viewers do) they resolve 0.25 µs, so containment is judged within two ULPs.
    const EPS: f64 = 0.5;
    for (tid, v) in by_tid {
        for a in &v {
            for b in &v {
                let overlap = a.0 + EPS < b.1 && b.0 + EPS < a.1;
                let within = |o: &(f64, f64), i: &(f64, f64)| o.0 <= i.0 + EPS && i.1 <= o.1 + EPS;
                let nested = within(a, b) || within(b, a);
                assert!(
                    !overlap || nested,
                    "tid {tid}: {a:?} and {b:?} overlap without nesting"
                );
            }
        }
    }
}

#[test]
fn the_event_cap_bounds_the_trace_and_the_summary_says_so() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("cap");
    set_env(&dir, Some("5"));
    let extra = (rand_u64() % 17) as usize + 3;
    let (ctx, _) = init(42, 0, 1);
    for i in 0..5 + extra {
        let h = start(
            ctx,
            &mut coll(std::ptr::null_mut(), c"Broadcast", 10 + i, i as u64),
        );
        // Beyond the cap nothing is recorded or forwarded: the event is declined.
        assert_eq!(h.is_null(), i >= 5, "event {i}");
        stop(h);
    }
    finalize(ctx);
    let file = dir.join("cclkit-trace-000000000000002a-rank0.json");
    let v = read_json(&file);
    assert_eq!(spans(&v).len(), 5);
    assert_eq!(v["otherData"]["droppedEvents"], extra as u64);
    let summary = std::fs::read_to_string(file.with_extension("txt")).unwrap();
    assert!(
        summary.contains(&format!("{extra} events and 0 states DROPPED")),
        "{summary}"
    );
    // Bad settings fail init with a message, not a crash.
    set_env(&dir, Some("lots"));
    let mut ctx = std::ptr::null_mut();
    let mut mask = 0;
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    let rc = unsafe {
        (cclkit_profiler_trace::ncclProfiler_v7.init.unwrap())(
            &mut ctx,
            1,
            &mut mask,
            std::ptr::null(),
            1,
            1,
            0,
            None,
        )
    };
    assert_eq!(rc, cclkit_abi::raw::common::NcclResult::INVALID_ARGUMENT);
}

#[test]
fn old_hosts_without_rank_get_numbered_files() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("v1");
    set_env(&dir, None);
    let mut ctx = std::ptr::null_mut();
    let mut mask = 0;
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    let rc = unsafe { (cclkit_profiler_trace::ncclProfiler_v1.init.unwrap())(&mut ctx, &mut mask) };
    assert_eq!(rc, cclkit_abi::raw::common::NcclResult::SUCCESS);
    assert_eq!(
        mask, 0x1F,
        "v1 hosts see only the v1 bits of the default mask"
    );
    // SAFETY: plain C data; zero is valid.
    let mut d: cclkit_abi::raw::profiler::v1::ncclProfilerEventDescr_v1_t =
        // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
        unsafe { std::mem::zeroed() };
    d.type_ = bit::COLL as u8;
    d.u.coll.func = 2; // AllGather
    d.u.coll.datatype = 8; // double
    d.u.coll.count = 3;
    let mut h = std::ptr::null_mut();
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    unsafe {
        assert!(
            (cclkit_profiler_trace::ncclProfiler_v1.startEvent.unwrap())(ctx, &mut h, &mut d)
                .is_ok()
        );
        assert!((cclkit_profiler_trace::ncclProfiler_v1.stopEvent.unwrap())(h).is_ok());
        assert!((cclkit_profiler_trace::ncclProfiler_v1.finalize.unwrap())(ctx).is_ok());
    }
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(files.len(), 1);
    let name = files[0].file_name().unwrap().to_str().unwrap().to_owned();
    assert!(
        name.starts_with(&format!("cclkit-trace-pid{}-", std::process::id())),
        "{name}"
    );
    let s = spans(&read_json(&files[0]));
    assert_eq!(
        (s[0]["name"].as_str(), s[0]["args"]["bytes"].as_u64()),
        (Some("AllGather"), Some(24))
    );
}
