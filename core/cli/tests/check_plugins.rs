//! `cclkit check` on every packaged cclkit plugin and template: each passes every
//! check it can run here, and the ones it cannot run are skipped with the reason.
//! Also the command's own contract: exit codes, the summary line, `--json`, errors.
//!
//! Needs the packaged plugins (`make package`, or `CCLKIT_LIB_DIR`).

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

/// Runs `cclkit ARGS` with extra environment; kills it after `limit`.
pub fn cclkit(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args(args).env_remove("NCCL_DEBUG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::run_bounded(cmd, limit)
}

/// `cclkit check LIB --json ARGS`: the exit code and the parsed report.
fn check_json(lib: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
    let mut all = vec!["check", lib, "--json", "--jobs", "2"];
    all.extend_from_slice(args);
    let out = cclkit(&all, env, Duration::from_secs(420));
    let text = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{text}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

/// The result row of one check and version.
fn row<'a>(r: &'a Value, version: u64, check: &str) -> &'a Value {
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|x| x["version"] == version && x["check"] == check)
        .unwrap_or_else(|| panic!("no result for v{version} {check} in {r:#}"))
}

fn status<'a>(r: &'a Value, version: u64, check: &str) -> &'a str {
    row(r, version, check)["status"].as_str().unwrap_or("?")
}

fn message(r: &Value, version: u64, check: &str) -> String {
    row(r, version, check)["message"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// Every FAIL row, for assertion messages.
fn failures(r: &Value) -> Vec<String> {
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|x| x["status"] == "FAIL")
        .map(|x| format!("v{} {}: {}", x["version"], x["check"], x["message"]))
        .collect()
}

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Checks that must PASS for a working host-memory transport, per version.
const NET_MUST_PASS: &[&str] = &[
    "symbol",
    "table",
    "init",
    "devices",
    "properties",
    "props-written",
    "listen",
    "connect",
    "accept-first",
    "regmr",
    "sendrecv",
    "inflight",
    "request-reuse",
    "null-retry",
    "close-inflight",
    "reload",
    "two-process",
    // Probes: cclkit's own plugins pass them too (zero warnings).
    "sizes",
    "out-of-order",
    "null-mhandle",
    "stray-connections",
    "test-after-close",
];

/// Asserts a net plugin passed everything for versions 6..12 (grouped receives only
/// when `max_recvs > 1`).
fn assert_net_passes(r: &Value, grouped: bool) {
    assert_eq!(r["failed"], 0, "{:#?}", failures(r));
    assert_eq!(r["warned"], 0, "{r:#}");
    assert_eq!(r["verdict"], "passed");
    for v in 6..=12 {
        for c in NET_MUST_PASS {
            assert_eq!(status(r, v, c), "PASS", "v{v} {c}: {}", message(r, v, c));
        }
        let oc = status(r, v, "optional-completion");
        if v >= 9 {
            assert_eq!(oc, "PASS", "v{v}: {}", message(r, v, "optional-completion"));
        } else {
            assert_eq!(oc, "SKIP");
            assert!(message(r, v, "optional-completion").contains("shims clear it"));
        }
        if grouped {
            assert_eq!(
                status(r, v, "grouped"),
                "PASS",
                "{}",
                message(r, v, "grouped")
            );
        } else {
            assert_eq!(status(r, v, "grouped"), "SKIP");
            assert!(message(r, v, "grouped").starts_with("maxRecvs = 1"));
        }
        // Root runs it; without root, or in a container that may not create
        // namespaces, or without iproute2, it is skipped with the reason.
        let (netns, why) = (status(r, v, "netns"), message(r, v, "netns"));
        match netns {
            "PASS" => assert!(root(), "{why}"),
            "SKIP" => assert!(
                !root()
                    || why.contains("cannot create network namespaces")
                    || why.contains("no `ip` command"),
                "{why}"
            ),
            other => panic!("v{v} netns {other}: {why}"),
        }
    }
    assert!(message(r, 12, "init").contains("2 contexts alive at once"));
    assert!(message(r, 8, "init").contains("init ran once for 2 communicators"));
}

#[test]
fn socket_plugin_passes_every_check_of_every_version() {
    let lib = common::s(&common::rust_plugin("libnccl-net-cclkit-socket.so"));
    let (code, r) = check_json(&lib, &[], &[]);
    assert_net_passes(&r, false);
    assert_eq!(code, 0);
    assert_eq!(
        r["exports"]["net"],
        serde_json::json!([12, 11, 10, 9, 8, 7, 6])
    );
}

#[test]
fn template_net_passes_every_check_of_every_version() {
    let lib = common::s(&common::rust_plugin("libnccl-net-template.so"));
    let (code, r) = check_json(&lib, &[], &[]);
    assert_net_passes(&r, false);
    assert_eq!(code, 0);
}

#[test]
fn ofi_plugin_passes_on_the_tcp_provider() {
    let lib = common::s(&common::rust_plugin("libnccl-net-cclkit-ofi.so"));
    let (code, r) = check_json(&lib, &[], &[("CCLKIT_OFI_PROVIDER", "tcp")]);
    assert_net_passes(&r, true);
    assert_eq!(code, 0);
    assert!(message(&r, 12, "grouped").contains("receives of 8, 2 and 8 buffers"));
}

#[test]
fn ib_plugin_without_rdma_skips_with_the_init_reason_unless_devices_are_required() {
    let lib = common::s(&common::rust_plugin("libnccl-net-cclkit-ib.so"));
    let (code, r) = check_json(&lib, &[], &[]);
    // Nothing failed, but nothing beyond the symbols could be exercised: exit 3.
    assert_eq!(code, 3, "{:#?}", failures(&r));
    assert_eq!(r["failed"], 0);
    assert_eq!(r["verdict"], "nothing-tested");
    for v in 6..=12 {
        assert_eq!(status(&r, v, "symbol"), "PASS");
        assert_eq!(status(&r, v, "table"), "PASS");
        for c in ["init", "sendrecv", "two-process"] {
            assert_eq!(status(&r, v, c), "SKIP", "v{v} {c}");
            let m = message(&r, v, c);
            assert!(
                m.contains("init failed") && m.contains("--require-devices"),
                "{m}"
            );
        }
    }
    let (code, r) = check_json(
        &lib,
        &[
            "--version",
            "12",
            "--only",
            "init,sendrecv",
            "--require-devices",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert_eq!(status(&r, 12, "init"), "FAIL");
    assert!(message(&r, 12, "sendrecv").ends_with("(--require-devices)"));
}

#[test]
fn tuners_pass_every_check_of_every_version() {
    for (name, chunk) in [
        ("libnccl-tuner-cclkit.so", true),
        ("libnccl-tuner-template.so", false),
    ] {
        let lib = common::s(&common::rust_plugin(name));
        let (code, r) = check_json(&lib, &[], &[]);
        assert_eq!(code, 0, "{name}: {:#?}", failures(&r));
        assert_eq!(r["failed"], 0);
        for v in 1..=6 {
            for c in [
                "symbol",
                "table",
                "init",
                "cost-table",
                "channels",
                "latency",
                "finalize",
                "reload",
            ] {
                assert_eq!(
                    status(&r, v, c),
                    "PASS",
                    "{name} v{v} {c}: {}",
                    message(&r, v, c)
                );
            }
        }
        assert!(message(&r, 6, "init").contains("constants stayed inside their canaries"));
        assert_eq!(
            status(&r, 6, "chunk-size"),
            if chunk { "PASS" } else { "SKIP" },
            "{name}"
        );
        assert_eq!(status(&r, 5, "chunk-size"), "SKIP");
    }
}

#[test]
fn text_output_ends_with_the_counts_and_exit_codes_follow_failures() {
    let lib = common::s(&common::rust_plugin("libnccl-tuner-template.so"));
    let out = cclkit(
        &["check", &lib, "--version", "6", "--only", "symbol,table"],
        &[],
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // Only the symbol and the table were checked: nothing tested, exit 3.
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains("exports: net - | collnet - | tuner v7 v6 v5 v4 v3 v2 v1"),
        "{text}"
    );
    assert!(text.contains("PASS  tuner v6  symbol"), "{text}");
    let last = text.lines().last().unwrap_or("");
    assert!(
        last.starts_with("2 passed, 0 failed, 0 skipped, 0 probe warnings")
            && last.ends_with(": nothing tested"),
        "{text}"
    );
    let out = cclkit(
        &["check", &lib, "--version", "6", "--only", "symbol,init"],
        &[],
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.trim_end().ends_with(": passed"), "{text}");

    // A library without plugin symbols fails (and says why); exit code 1.
    let out = cclkit(&["check", "libc.so.6"], &[], Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("exports no ncclNetPlugin_vN or ncclTunerPlugin_vN"),
        "{text}"
    );

    // Usage errors: exit code 2 with the reason.
    for (args, needle) in [
        (
            vec!["check", "/nonexistent/libx.so"],
            "/nonexistent/libx.so",
        ),
        (
            vec!["check", &lib, "--only", "nope"],
            "unknown check 'nope'",
        ),
        (vec!["check", &lib, "--version", "9"], "--version 9"),
    ] {
        let out = cclkit(&args, &[], Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
