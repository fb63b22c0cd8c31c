//! `cclkit perf --profile DIR` with the packaged trace profiler
//! (`libnccl-profiler-cclkit.so`): every rank's Chrome-trace JSON parses and holds,
//! for each collective, the tree NCCL builds — GroupApi → CollApi → Coll → ProxyOp →
//! ProxyStep, with Group as `parentGroup` — with exact step numbering, step states
//! and byte counts; with a net plugin, its events nest under send and receive
//! steps, and ProxyCtrl events report the proxy's appends, activity and sleeps.

mod common;

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::Duration;

use rand::Rng;
use serde_json::Value;

fn perf_env(args: &[&str], lib_dir: &std::path::Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.arg("perf")
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CCLKIT_LIB_DIR", lib_dir)
        .env("NCCL_NET_PLUGIN", "none")
        .env("NCCL_TUNER_PLUGIN", "none")
        .env("CCLKIT_PROFILE_SUMMARY", "0")
        .env("CCLKIT_OP_TIMEOUT", "60")
        .env("CCLKIT_BOOTSTRAP_TIMEOUT", "60");
    common::run_bounded(cmd, Duration::from_secs(120))
}

/// One complete ("X") slice of a trace.
#[derive(Debug, Clone)]
struct Slice {
    cat: String,
    name: String,
    args: Value,
    /// End time in µs (`ts + dur`).
    end: f64,
}

impl Slice {
    fn id(&self) -> u64 {
        self.args["id"].as_u64().expect("every slice has args.id")
    }
    fn parent(&self) -> Option<u64> {
        self.args["parent"].as_u64()
    }
    fn states(&self) -> Vec<String> {
        self.args["states"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s["state"].as_str().unwrap_or("?").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn slices(path: &std::path::Path) -> Vec<Slice> {
    let text = std::fs::read_to_string(path).expect("read trace");
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    v["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| Slice {
            cat: e["cat"].as_str().unwrap_or_default().to_owned(),
            name: e["name"].as_str().unwrap_or_default().to_owned(),
            args: e["args"].clone(),
            end: e["ts"].as_f64().unwrap_or(0.0) + e["dur"].as_f64().unwrap_or(0.0),
        })
        .collect()
}

#[test]
fn two_rank_trace_holds_the_event_tree_of_each_collective() {
    let lib = cclkit_tests::plugin("libnccl-profiler-cclkit.so");
    let lib_dir = lib.parent().expect("lib dir").to_owned();
    let dir = tempfile::tempdir().expect("tempdir");
    // A random number of floats, the same for every collective; a multiple of 128 so
    // each rank's AllGather half survives perf's element alignment unchanged.
    let count: usize = rand::rng().random_range(3..64) * 128;
    let size = (count * 4).to_string();
    let prof = dir.path().join("prof");
    // The trace plugin's default mask and KernelCh.
    let mask = format!("{:#x}", 0x7f9f | 0x40);
    let out = perf_env(
        &[
            "--np",
            "2",
            "all_reduce,broadcast,all_gather",
            "-b",
            &size,
            "-e",
            &size,
            "-n",
            "2",
            "-w",
            "1",
            "--profile",
            prof.to_str().expect("utf-8"),
        ],
        &lib_dir,
        &[("CCLKIT_PROFILE_MASK", &mask)],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cclkit perf failed: {err}");
    // The header's device lines name the profiler each rank reports to.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let named = stdout
        .lines()
        .filter(|l| l.starts_with("#  Rank") && l.contains(", profiler 'cclkit-trace v7',"))
        .count();
    assert_eq!(named, 2, "{stdout}");
    let mut files: Vec<_> = std::fs::read_dir(&prof)
        .expect("profile dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "one trace per rank: {files:?}");
    for (rank, f) in files.iter().enumerate() {
        assert!(
            f.to_string_lossy().ends_with(&format!("-rank{rank}.json")),
            "{f:?}"
        );
        check_rank(rank, &slices(f), count);
    }
}

fn check_rank(rank: usize, all: &[Slice], count: usize) {
    let by_id: HashMap<u64, &Slice> = all.iter().map(|s| (s.id(), s)).collect();
    let children = |id: u64, cat: &str| -> Vec<&Slice> {
        all.iter()
            .filter(|s| s.cat == cat && s.parent() == Some(id))
            .collect()
    };
    // Bytes per Coll (count × datatype size: the runtime's broadcast moves bytes).
    for (func, expect_bytes) in [
        ("AllReduce", count * 4),
        ("Broadcast", count * 4),
        // perf's size is the gathered buffer: each rank contributes half.
        ("AllGather", count * 2),
    ] {
        let colls: Vec<&Slice> = all
            .iter()
            .filter(|s| s.cat == "Coll" && s.name == func)
            .collect();
        assert!(!colls.is_empty(), "rank {rank}: no {func} Coll event");
        for c in colls {
            assert_eq!(
                c.args["bytes"].as_u64(),
                Some(expect_bytes as u64),
                "rank {rank}: {c:?}"
            );
            // Coll → CollApi → GroupApi (profiler v7: NCCL's hierarchy).
            let api = by_id[&c.parent().expect("Coll has a parent")];
            assert_eq!(
                (api.cat.as_str(), &api.args["count"]),
                ("CollApi", &c.args["count"])
            );
            let group_api = by_id[&api.parent().expect("CollApi has a parent")];
            assert_eq!(group_api.cat, "GroupApi");
            assert_eq!(
                group_api.states(),
                ["GroupStartApiStop", "GroupEndApiStart"]
            );
            // One kernel launch per group here (one batch), under the GroupApi.
            assert_eq!(
                children(group_api.id(), "KernelLaunch").len(),
                1,
                "rank {rank}: {func}"
            );
            let ops = children(c.id(), "ProxyOp");
            // One KernelCh per channel the collective's ProxyOps use, each ended
            // with KernelChStop.
            let mut op_channels: Vec<u64> = ops
                .iter()
                .map(|o| o.args["channel"].as_u64().expect("ProxyOp channel"))
                .collect();
            op_channels.sort_unstable();
            op_channels.dedup();
            let kernels = children(c.id(), "KernelCh");
            let mut k_channels: Vec<u64> = kernels
                .iter()
                .map(|k| {
                    assert_eq!(k.states(), ["KernelChStop"], "{k:?}");
                    let ch = k.name.strip_prefix("kernel ch ").expect("KernelCh name");
                    ch.parse().expect("KernelCh channel")
                })
                .collect();
            k_channels.sort_unstable();
            assert_eq!(k_channels, op_channels, "rank {rank}: {func}");
            assert!(
                ops.iter()
                    .any(|o| o.args["peer"].as_u64() == Some(1 - rank as u64)),
                "rank {rank}: {func} has no ProxyOp to the peer"
            );
            let mut bytes = [0u64; 2];
            for op in &ops {
                let send = op.name.starts_with("ProxyOp send");
                let steps = children(op.id(), "ProxyStep");
                assert_eq!(
                    steps.len() as u64,
                    op.args["nSteps"].as_u64().expect("nSteps"),
                    "{op:?}"
                );
                for (i, st) in steps.iter().enumerate() {
                    assert_eq!(st.args["step"].as_u64(), Some(i as u64));
                    // NCCL's order (src/transport/net.cc); a receive step starts
                    // when its irecv is posted.
                    let want: &[&str] = if send {
                        &["ProxyStepSendGPUWait", "ProxyStepSendWait"]
                    } else {
                        &[
                            "ProxyStepRecvWait",
                            "ProxyStepRecvFlushWait",
                            "ProxyStepRecvGPUWait",
                        ]
                    };
                    assert_eq!(st.states(), want, "{st:?}");
                    bytes[usize::from(send)] += st.args["bytes"].as_u64().expect("bytes");
                }
            }
            let total = (count * 4) as u64;
            match func {
                // Two ranks: the root sends the whole buffer, the other receives it.
                "Broadcast" if rank == 0 => assert_eq!(bytes, [0, total]),
                "Broadcast" => assert_eq!(bytes, [total, 0]),
                // Each rank sends its half and receives the other half.
                "AllGather" => assert_eq!(bytes, [total / 2, total / 2]),
                _ => assert!(bytes[0] > 0 && bytes[1] > 0, "{func}: {bytes:?}"),
            }
        }
    }
    // Every task has a Group event beside it.
    assert!(
        all.iter().any(|s| s.cat == "Group"),
        "rank {rank}: no Group event"
    );
}

/// A profiler that declines every event (NULL handles everywhere), and one whose
/// `init` fails: the runtime runs on with correct results either way.
#[test]
fn null_handles_and_failed_init_are_tolerated() {
    let plugins = cclkit_tests::cplugin::Plugins::new();
    let size = (rand::rng().random_range(100..3000usize) * 4).to_string();
    for (name, define) in [
        ("libdecline.so", "DECLINE=0xffff"),
        ("libfail.so", "FAIL_INIT"),
    ] {
        let lib = plugins.with_header(name, "profiler/profiler_mock.c", &[define]);
        let out = perf_env(
            &[
                "--np",
                "2",
                "all_reduce,all_gather",
                "-b",
                &size,
                "-e",
                &size,
                "-n",
                "2",
                "-w",
                "1",
            ],
            std::path::Path::new("/nonexistent"),
            &[("NCCL_PROFILER_PLUGIN", lib.to_str().expect("utf-8"))],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{define}: {err}");
        assert!(
            text.contains("Out of bounds values : 0 OK"),
            "{define}: {text}"
        );
        if define == "FAIL_INIT" {
            assert!(
                err.contains("init returned"),
                "{define}: the failed init is reported: {err}"
            );
        }
    }
}

/// With the packaged socket plugin (net v10+, which gets the profiler callback), every
/// send and receive proxy step of a 2-rank run carries the socket's own network
/// event: one NetPlugin event per `isend`/`irecv`, nested under the step that posted
/// it, with the bytes that step moved (Simple protocol: wire bytes = data bytes).
/// ProxyCtrl is asked for too: each batch is an Append, the passes report Active and
/// Idle, and the background thread's sleeps end with a Wakeup.
#[test]
fn socket_net_events_nest_under_send_and_receive_proxy_steps() {
    let lib = cclkit_tests::plugin("libnccl-profiler-cclkit.so");
    let net = cclkit_tests::plugin("libnccl-net-cclkit-socket.so");
    let lib_dir = lib.parent().expect("lib dir").to_owned();
    let dir = tempfile::tempdir().expect("tempdir");
    let size = (rand::rng().random_range(100..5000usize) * 4).to_string();
    let prof = dir.path().join("prof");
    let out = perf_env(
        &[
            "--np",
            "2",
            "all_reduce",
            "-b",
            &size,
            "-e",
            &size,
            "-n",
            "2",
            "-w",
            "1",
            "--net",
            net.to_str().expect("utf-8"),
            "--profile",
            prof.to_str().expect("utf-8"),
        ],
        &lib_dir,
        &[
            ("NCCL_PROTO", "Simple"),
            ("NCCL_SOCKET_IFNAME", "lo"),
            // The trace plugin's default mask plus ProxyCtrl (1 << 5).
            ("CCLKIT_PROFILE_MASK", "0x7fbf"),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cclkit perf failed: {err}");
    for rank in 0..2 {
        let f = std::fs::read_dir(&prof)
            .expect("profile dir")
            .map(|e| e.expect("entry").path())
            .find(|p| p.to_string_lossy().ends_with(&format!("-rank{rank}.json")))
            .unwrap_or_else(|| panic!("no trace for rank {rank}"));
        let all = slices(&f);
        let by_id: HashMap<u64, &Slice> = all.iter().map(|s| (s.id(), s)).collect();
        let nets: Vec<&Slice> = all.iter().filter(|s| s.cat == "NetPlugin").collect();
        let mut steps = [0usize; 2];
        for st in all.iter().filter(|s| s.cat == "ProxyStep") {
            let op = by_id[&st.parent().expect("ProxyStep has a parent")];
            let under: Vec<&&Slice> = nets
                .iter()
                .filter(|n| n.parent() == Some(st.id()))
                .collect();
            let send = op.name.starts_with("ProxyOp send");
            steps[usize::from(send)] += 1;
            // all_reduce links are not grouped: one request per step.
            assert_eq!(
                under.len(),
                1,
                "rank {rank}: one isend/irecv per {} step: {st:?}",
                if send { "send" } else { "receive" }
            );
            let (net_bytes, step_bytes) = (
                under[0].args["bytes"].as_u64().expect("net bytes"),
                st.args["bytes"].as_u64().expect("step bytes"),
            );
            if send {
                assert_eq!(
                    net_bytes, step_bytes,
                    "rank {rank}: the socket sent the step's bytes: {st:?} {:?}",
                    under[0]
                );
            } else {
                // The receive was posted for a whole FIFO slot; the socket reports
                // the posted or the received size, never less than the step's data.
                assert!(
                    net_bytes >= step_bytes && step_bytes > 0,
                    "rank {rank}: the socket's receive covers the step: {st:?} {:?}",
                    under[0]
                );
            }
        }
        assert!(
            steps[0] > 0 && steps[1] > 0,
            "rank {rank}: receive and send steps: {steps:?}"
        );
        check_proxy_ctrl(rank, &all);
        // A send step now ends when its send completes; its ProxyOp ends with the
        // last one, never before. Ends are `ts + dur` in µs since the epoch (~1.8e15):
        // an f64 there resolves 0.25 µs, so two ends one ULP apart are simultaneous.
        const ULP_US: f64 = 0.25;
        for op in all.iter().filter(|s| s.cat == "ProxyOp") {
            for st in all.iter().filter(|s| s.parent() == Some(op.id())) {
                assert!(
                    st.end <= op.end + 2.0 * ULP_US,
                    "rank {rank}: {st:?} ends after its op {op:?}"
                );
            }
        }
        // Every network event hangs under a proxy step (never a dangling parent).
        for n in &nets {
            let p = n.parent().and_then(|p| by_id.get(&p));
            assert!(
                p.is_some_and(|p| p.cat == "ProxyStep"),
                "rank {rank}: NetPlugin event without a ProxyStep parent: {n:?}"
            );
        }
    }
}

/// The packaged libfabric plugin (shm provider) reports one NetPlugin event per
/// request in NCCL's socket descriptor layout (`fd` = its connection id), nested
/// under the send or receive step that posted it, closed with the bytes moved.
#[test]
fn ofi_net_events_nest_under_send_and_receive_proxy_steps() {
    let lib = cclkit_tests::plugin("libnccl-profiler-cclkit.so");
    let net = cclkit_tests::plugin("libnccl-net-cclkit-ofi.so");
    let lib_dir = lib.parent().expect("lib dir").to_owned();
    let dir = tempfile::tempdir().expect("tempdir");
    let size = (rand::rng().random_range(100..5000usize) * 4).to_string();
    let prof = dir.path().join("prof");
    let out = perf_env(
        &[
            "--np",
            "2",
            "all_reduce",
            "-b",
            &size,
            "-e",
            &size,
            "-n",
            "2",
            "-w",
            "1",
            "--net",
            net.to_str().expect("utf-8"),
            "--profile",
            prof.to_str().expect("utf-8"),
        ],
        &lib_dir,
        &[("NCCL_PROTO", "Simple"), ("CCLKIT_OFI_PROVIDER", "shm")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cclkit perf failed: {err}");
    for rank in 0..2 {
        let f = std::fs::read_dir(&prof)
            .expect("profile dir")
            .map(|e| e.expect("entry").path())
            .find(|p| p.to_string_lossy().ends_with(&format!("-rank{rank}.json")))
            .unwrap_or_else(|| panic!("no trace for rank {rank}"));
        let all = slices(&f);
        let by_id: HashMap<u64, &Slice> = all.iter().map(|s| (s.id(), s)).collect();
        let mut steps = [0usize; 2];
        for st in all.iter().filter(|s| s.cat == "ProxyStep") {
            let send = by_id[&st.parent().expect("parent")]
                .name
                .starts_with("ProxyOp send");
            steps[usize::from(send)] += 1;
            let under: Vec<&Slice> = all
                .iter()
                .filter(|n| n.cat == "NetPlugin" && n.parent() == Some(st.id()))
                .collect();
            assert_eq!(under.len(), 1, "rank {rank}: {st:?}");
            let n = under[0];
            // NCCL_PROFILER_NET_TYPE_SOCK | version 1.
            assert_eq!(n.args["pluginId"].as_i64(), Some((2 << 16) | 1), "{n:?}");
            assert!(n.args["fd"].as_i64().is_some_and(|fd| fd >= 0), "{n:?}");
            assert_eq!(
                n.args["bytes"], st.args["bytes"],
                "rank {rank}: {st:?} {n:?}"
            );
        }
        assert!(
            steps[0] > 0 && steps[1] > 0,
            "rank {rank}: receive and send steps: {steps:?}"
        );
    }
}

/// ProxyCtrl events of one rank: no parent; each is an Append closed by AppendEnd,
/// a single Active or Idle transition, or a Sleep ended by a Wakeup; batches were
/// appended and the passes were both active and idle.
fn check_proxy_ctrl(rank: usize, all: &[Slice]) {
    let ctrl: Vec<&Slice> = all.iter().filter(|s| s.cat == "ProxyCtrl").collect();
    let mut seen: HashMap<Vec<String>, usize> = HashMap::new();
    for c in &ctrl {
        assert_eq!(c.parent(), None, "rank {rank}: {c:?}");
        *seen.entry(c.states()).or_default() += 1;
    }
    // A Sleep needs the background thread to go idle after the first batch brought
    // the profiler, which a short run may not give it: checked when present below.
    for want in [
        &["ProxyCtrlAppend", "ProxyCtrlAppendEnd"][..],
        &["ProxyCtrlActive"],
        &["ProxyCtrlIdle"],
    ] {
        let key: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
        assert!(
            seen.contains_key(&key),
            "rank {rank}: no ProxyCtrl event with states {want:?}: {seen:?}"
        );
    }
    assert!(
        seen.keys().all(|k| matches!(
            k.iter().map(String::as_str).collect::<Vec<_>>()[..],
            ["ProxyCtrlAppend", "ProxyCtrlAppendEnd"]
                | ["ProxyCtrlActive"]
                | ["ProxyCtrlIdle"]
                | ["ProxyCtrlSleep", "ProxyCtrlWakeup"]
        )),
        "rank {rank}: unexpected ProxyCtrl state sequences: {seen:?}"
    );
}

/// Profilers of NCCL 2.23–2.24 (v1–v3) get the communicator's hash in every Coll and
/// P2p descriptor, as NCCL puts it there: non-zero, and the same on every rank.
#[test]
fn v1_profilers_get_the_communicator_hash_in_task_events() {
    let plugins = cclkit_tests::cplugin::Plugins::new();
    let lib = plugins.with_header(
        "libprof_v1.so",
        "profiler/profiler_mock.c",
        &["PROF_VERSION=1"],
    );
    let logs = tempfile::tempdir().expect("tempdir");
    let size = (rand::rng().random_range(100..3000usize) * 4).to_string();
    let out = perf_env(
        &[
            "--np",
            "3",
            "all_reduce,sendrecv",
            "-b",
            &size,
            "-e",
            &size,
            "-n",
            "1",
            "-w",
            "0",
        ],
        std::path::Path::new("/nonexistent"),
        &[
            ("NCCL_PROFILER_PLUGIN", lib.to_str().expect("utf-8")),
            (
                "MOCK_PROFILER_LOG_DIR",
                logs.path().to_str().expect("utf-8"),
            ),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Per rank (one log per process): the hashes of its Coll and P2p events.
    let mut per_rank = Vec::new();
    for f in std::fs::read_dir(logs.path()).expect("log dir").flatten() {
        let text = std::fs::read_to_string(f.path()).expect("log");
        let mut hashes = std::collections::BTreeSet::new();
        for line in text
            .lines()
            .filter(|l| l.contains(" type=2 ") || l.contains(" type=4 "))
        {
            let hash = line
                .split_once(" hash=")
                .map(|(_, h)| h.split(' ').next().unwrap_or(""))
                .unwrap_or_else(|| panic!("no hash in {line}"));
            hashes.insert(hash.to_owned());
        }
        per_rank.push(hashes);
    }
    assert_eq!(per_rank.len(), 3, "one log per rank");
    assert!(
        !per_rank[0].is_empty() && !per_rank[0].contains("0"),
        "{per_rank:?}"
    );
    assert!(per_rank.iter().all(|h| *h == per_rank[0]), "{per_rank:?}");
}
