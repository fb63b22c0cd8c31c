//! `cclkit check` catches real mistakes: C plugins compiled here against
//! abi/include/cclkit_abi.h (fixtures/broken/), each with one bug switched on, must fail
//! exactly the check that names the bug, with a clear message; the same sources without
//! bugs pass everything (so a vendor's C plugin works with the suite too).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

fn source(name: &str) -> PathBuf {
    common::fixture(&format!("broken/{name}"))
}

/// Compiles a fixture with `-D` defines against the committed ABI header.
fn build(p: &common::Plugins, out: &str, src: &str, defines: &[&str]) -> String {
    let include = common::abi_include();
    let mut args = vec![format!("-I{}", include.display()), "-std=gnu11".to_owned()];
    args.extend(defines.iter().map(|d| format!("-D{d}")));
    common::s(&p.cc(out, &[source(src)], &args))
}

/// `cclkit check LIB --json ARGS`: exit code and report.
fn check(lib: &str, args: &[&str]) -> (i32, Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args(["check", lib, "--json", "--jobs", "2", "--seed", "12345"])
        .args(args)
        .env_remove("NCCL_DEBUG");
    let out = common::run_bounded(cmd, Duration::from_secs(180));
    let text = String::from_utf8_lossy(&out.stdout);
    let r = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (out.status.code().unwrap_or(-1), r)
}

/// (status, message) of one check of version `v`.
fn get(r: &Value, v: u64, check: &str) -> (String, String) {
    let x = r["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|x| x["version"] == v && x["check"] == check)
        .unwrap_or_else(|| panic!("no v{v} {check} in {r:#}"));
    (
        x["status"].as_str().unwrap_or("").to_owned(),
        x["message"].as_str().unwrap_or("").to_owned(),
    )
}

/// The names of the failed checks.
fn failed(r: &Value) -> Vec<String> {
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|x| x["status"] == "FAIL")
        .map(|x| x["check"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Asserts `check` of version `v` failed with a message containing every needle.
fn assert_fails(r: &Value, v: u64, check: &str, needles: &[&str]) {
    let (status, msg) = get(r, v, check);
    assert_eq!(status, "FAIL", "v{v} {check}: {msg}");
    for n in needles {
        assert!(msg.contains(n), "v{v} {check}: missing {n:?} in: {msg}");
    }
}

#[test]
fn correct_c_plugins_pass_every_check() {
    let p = common::Plugins::new();
    for v in [12u64, 11] {
        let lib = build(
            &p,
            &format!("libcnet{v}.so"),
            "cnet.c",
            &[&format!("NET_VERSION={v}")],
        );
        let (code, r) = check(&lib, &[]);
        assert_eq!(code, 0, "cnet v{v}: {:?}", failed(&r));
        assert_eq!(r["warned"], 0, "cnet v{v}: {r:#}");
        assert_eq!(r["verdict"], "passed");
        assert_eq!(
            get(&r, v, "grouped").0,
            "PASS",
            "{}",
            get(&r, v, "grouped").1
        );
        assert!(
            get(&r, v, "grouped")
                .1
                .contains("receives of 4, 2 and 4 buffers")
        );
        assert!(
            get(&r, v, "sizes")
                .1
                .contains("cnet: message truncated: 4096 bytes sent")
        );
    }
    for v in [6u64, 5, 4] {
        let lib = build(
            &p,
            &format!("libctuner{v}.so"),
            "ctuner.c",
            &[&format!("TUNER_VERSION={v}")],
        );
        let (code, r) = check(&lib, &[]);
        assert_eq!(code, 0, "ctuner v{v}: {:?}", failed(&r));
        assert_eq!(get(&r, v, "finalize").0, "PASS");
    }
}

/// NCCL's topology reads a speed of 0 or less as 10000 Mb/s ("some NICs define
/// speed = -1"): a plugin that does not know its NIC's speed is not failed for it;
/// the properties line says what NCCL will assume.
#[test]
fn an_unknown_speed_passes_with_a_note() {
    let p = common::Plugins::new();
    for speed in [0, -1] {
        let lib = build(
            &p,
            &format!("libcnet_speed{}.so", speed + 1),
            "cnet.c",
            &[&format!("SPEED={speed}")],
        );
        let (_, r) = check(&lib, &["--only", "properties"]);
        let (status, msg) = get(&r, 12, "properties");
        assert_eq!(status, "PASS", "speed {speed}: {msg}");
        assert!(
            msg.contains(&format!("{speed} Mb/s (NCCL assumes 10000)")),
            "{msg}"
        );
    }
}

/// A plugin that sets every property field one by one, hands out a fresh copy of
/// its name on every call and writes only the `vProps.devs` its `ndevs` counts (as
/// aws-ofi-nccl does) writes everything NCCL reads: `props-written` passes.
#[test]
fn field_by_field_properties_with_a_fresh_name_pass_props_written() {
    let p = common::Plugins::new();
    for v in [12u64, 11] {
        let lib = build(
            &p,
            &format!("libcnet_fields{v}.so"),
            "cnet.c",
            &["FIELD_BY_FIELD", &format!("NET_VERSION={v}")],
        );
        let (_, r) = check(&lib, &["--only", "props-written"]);
        let (status, msg) = get(&r, v, "props-written");
        assert_eq!(status, "PASS", "v{v}: {msg}");
    }
}

#[test]
fn v12_properties_into_a_v11_caller_fail_the_properties_check() {
    let p = common::Plugins::new();
    let lib = build(
        &p,
        "libprops.so",
        "cnet.c",
        &["NET_VERSION=11", "BUG_PROPS_V12"],
    );
    let (code, r) = check(&lib, &[]);
    assert_eq!(code, 1);
    assert_fails(
        &r,
        11,
        "properties",
        &[
            "getProperties",
            "wrote at least 16 bytes past the end of the 112-byte struct (ncclNetProperties_v11_t)",
            "built against a different net ABI version",
        ],
    );
    for c in ["symbol", "table", "init", "devices"] {
        assert_eq!(get(&r, 11, c).0, "PASS", "{c}: {}", get(&r, 11, c).1);
    }
}

#[test]
fn a_blocking_connect_fails_the_connect_check() {
    let p = common::Plugins::new();
    let lib = build(&p, "libblocking.so", "cnet.c", &["BUG_BLOCKING_CONNECT"]);
    let (code, r) = check(&lib, &["--only", "symbol,listen,connect"]);
    assert_eq!(code, 1);
    assert_fails(
        &r,
        12,
        "connect",
        &[
            "connect call 1 did not return within 5 s while the peer had not called accept yet",
            "connect must be non-blocking",
        ],
    );
    assert_eq!(get(&r, 12, "listen").0, "PASS");
    assert_eq!(failed(&r), ["connect"]);
}

#[test]
fn a_truncating_receive_warns_in_the_sizes_probe_and_fails_it_under_strict() {
    let p = common::Plugins::new();
    let lib = build(&p, "libtruncate.so", "cnet.c", &["BUG_TRUNCATE"]);
    // NCCL never posts a receive smaller than its send: a probe, so a warning only.
    let (code, r) = check(&lib, &[]);
    assert_eq!(code, 0, "{:?}", failed(&r));
    let (status, msg) = get(&r, 12, "sizes");
    assert_eq!(status, "WARN", "{msg}");
    assert!(msg.contains("the receive reported 1024 bytes"), "{msg}");
    assert_eq!(
        (r["warned"].as_u64(), r["failed"].as_u64()),
        (Some(1), Some(0))
    );
    let (code, r) = check(&lib, &["--strict"]);
    assert_eq!(code, 1);
    assert_fails(
        &r,
        12,
        "sizes",
        &[
            "a 4096-byte send into a 1024-byte receive completed without error",
            "the receive reported 1024 bytes",
            "message truncated",
        ],
    );
    assert_eq!(failed(&r), ["sizes"]);
    assert_eq!(r["strict"], true);
}

#[test]
fn a_crash_in_isend_fails_with_its_signal_and_the_run_goes_on() {
    let p = common::Plugins::new();
    let lib = build(&p, "libcrash.so", "cnet.c", &["BUG_ISEND_CRASH"]);
    let (code, r) = check(&lib, &["--only", "sendrecv,sizes,null-retry,reload"]);
    assert_eq!(code, 1);
    assert_fails(
        &r,
        12,
        "sendrecv",
        &[
            "killed by SIGSEGV (signal 11)",
            "during: isend/irecv 1048589 B",
        ],
    );
    for c in ["sizes", "null-retry", "reload"] {
        assert_eq!(
            get(&r, 12, c).0,
            "PASS",
            "{c} after the crash: {}",
            get(&r, 12, c).1
        );
    }
}

#[test]
fn leaking_requests_fail_the_request_reuse_check_only() {
    let p = common::Plugins::new();
    let lib = build(&p, "libleak.so", "cnet.c", &["BUG_REQUEST_LEAK"]);
    let (code, r) = check(&lib, &[]);
    assert_eq!(code, 1);
    assert_fails(
        &r,
        12,
        "request-reuse",
        &[
            "transfer 129 (after 128 completed, nothing else in flight)",
            "completed requests must be released by test()",
            "irecv returned a NULL request",
        ],
    );
    assert_eq!(failed(&r), ["request-reuse"]);
}

#[test]
fn v4_tuner_shapes_exported_as_v5_crash_the_init_check() {
    let p = common::Plugins::new();
    let lib = build(
        &p,
        "libv4as5.so",
        "ctuner.c",
        &["TUNER_VERSION=5", "BUG_V4_AS_V5"],
    );
    let (code, r) = check(&lib, &["--only", "symbol,table,init"]);
    assert_eq!(code, 1);
    assert_fails(
        &r,
        5,
        "init",
        &[
            "killed by SIGSEGV (signal 11)",
            "init(&ctx, commId, nRanks, nNodes, logger, nvl, constants): context first",
            "another version's shapes",
        ],
    );
    assert_eq!(get(&r, 5, "table").0, "PASS");
}

#[test]
fn a_tuner_enabling_an_unsupported_entry_fails_the_cost_table_check() {
    let p = common::Plugins::new();
    let lib = build(&p, "libunsup.so", "ctuner.c", &["BUG_ENABLE_UNSUPPORTED"]);
    let (code, r) = check(&lib, &["--only", "init,cost-table,chunk-size,finalize"]);
    assert_eq!(code, 1);
    assert_fails(
        &r,
        6,
        "cost-table",
        &["the tuner enabled NVLS/SIMPLE that NCCL left at -1 (unsupported for this call)"],
    );
    assert_eq!(failed(&r), ["cost-table"]);
}

#[test]
fn a_tuner_that_leaks_its_context_fails_the_finalize_check_with_and_without_valgrind() {
    let p = common::Plugins::new();
    let lib = build(&p, "libctxleak.so", "ctuner.c", &["BUG_LEAK"]);
    let (_, r) = check(&lib, &["--only", "finalize", "--no-valgrind"]);
    assert_fails(
        &r,
        6,
        "finalize",
        &[
            "the heap grew by",
            "finalize does not free what init allocated",
        ],
    );
    let has_valgrind = Command::new("valgrind").arg("--version").output().is_ok();
    if has_valgrind {
        let (_, r) = check(&lib, &["--only", "finalize"]);
        assert_fails(
            &r,
            6,
            "finalize",
            &[
                "valgrind, after 20 init/finalize cycles",
                "in 20 blocks",
                "init_v5",
            ],
        );
    }
}

#[test]
fn a_call_that_never_returns_fails_its_check_by_timeout_and_the_run_goes_on() {
    let p = common::Plugins::new();
    let lib = build(&p, "libhang.so", "cnet.c", &["BUG_BLOCKING_RECV"]);
    let (code, r) = check(&lib, &["--only", "grouped,sendrecv", "--timeout", "5"]);
    assert_eq!(code, 1);
    assert_fails(
        &r,
        12,
        "grouped",
        &[
            "did not finish within 5 s",
            "stuck in: grouped receive of 4 buffers (round 0)",
        ],
    );
    assert_eq!(get(&r, 12, "sendrecv").0, "PASS");
}

#[test]
fn a_library_with_a_net_plugin_and_a_tuner_gets_both_suites() {
    let p = common::Plugins::new();
    let include = common::abi_include();
    let lib = common::s(&p.cc(
        "libboth.so",
        &[source("cnet.c"), source("ctuner.c")],
        &[format!("-I{}", include.display()), "-std=gnu11".to_owned()],
    ));
    let (code, r) = check(&lib, &["--only", "symbol,table,init,sendrecv,cost-table"]);
    assert_eq!(code, 0, "{:?}", failed(&r));
    assert_eq!(r["exports"]["net"], serde_json::json!([12]));
    assert_eq!(r["exports"]["tuner"], serde_json::json!([6]));
    assert_eq!(r["passed"], 8);
}
