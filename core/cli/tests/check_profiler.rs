//! `cclkit check` on profilers: the correct fixture, the packaged trace profiler and
//! the profiler template pass every check in every exported version; each broken
//! fixture (`tests/fixtures/profiler/broken_profiler.c`) fails exactly the check
//! its defect belongs to, crashes and hangs included, and the other checks still run.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cclkit_tests::cplugin::{Plugins, s};
use serde_json::Value;

/// Every profiler check, as the suite names them.
const CHECKS: [&str; 7] = [
    "symbol",
    "table",
    "init",
    "events",
    "null-parents",
    "pool",
    "threads",
];

/// Profiler results by (version, check): (status, message).
type Results = BTreeMap<(u64, String), (String, String)>;

/// `cclkit check --json LIB` (4 s per check): exit status and the profiler results.
fn check(lib: &Path) -> (i32, Results) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args(["check", "--json", "--timeout", "4", "--jobs", "2", &s(lib)])
        .env("CCLKIT_PROFILE_SUMMARY", "0");
    let out = common::run_bounded(cmd, Duration::from_secs(180));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let results = v["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|r| r["family"] == "profiler")
        .map(|r| {
            (
                (
                    r["version"].as_u64().expect("version"),
                    r["check"].as_str().expect("check").to_owned(),
                ),
                (
                    r["status"].as_str().expect("status").to_owned(),
                    r["message"].as_str().unwrap_or_default().to_owned(),
                ),
            )
        })
        .collect();
    (out.status.code().unwrap_or(-1), results)
}

fn all_pass(lib: &Path, versions: &[u64]) -> Results {
    let (code, r) = check(lib);
    for &v in versions {
        for c in CHECKS {
            let got = r.get(&(v, c.to_owned()));
            assert!(
                got.is_some_and(|(st, _)| st == "PASS"),
                "{} v{v} {c}: {got:?}\n{r:#?}",
                lib.display()
            );
        }
    }
    assert_eq!(
        r.len(),
        versions.len() * CHECKS.len(),
        "{}: {r:#?}",
        lib.display()
    );
    assert_eq!(code, 0, "{}: {r:#?}", lib.display());
    r
}

/// Every check of version `v` passes on `lib` and its `events` check saw each of
/// `types` accepted at least once.
fn passes_accepting(lib: &Path, v: u64, types: &[&str]) {
    let r = all_pass(lib, &[v]);
    let got = accepted_types(&r, v);
    for t in types {
        assert!(got.iter().any(|g| g == t), "no {t} in {got:?}");
    }
}

/// The event types a passing `events` check accepted at least once, from its
/// message ("mask 0x…; CeBatch 3, CeColl 3, GroupApi 0 (3 NULL), …").
fn accepted_types(r: &Results, v: u64) -> Vec<String> {
    let (_, msg) = &r[&(v, "events".to_owned())];
    let (_, tally) = msg
        .split_once("; ")
        .unwrap_or_else(|| panic!("v{v}: {msg}"));
    tally
        .split(", ")
        .filter_map(|t| {
            let mut w = t.split(' ');
            let name = w.next()?;
            let ok: usize = w.next()?.parse().ok()?;
            (ok > 0).then(|| name.to_owned())
        })
        .collect()
}

#[test]
fn a_correct_profiler_passes_every_check_in_each_version() {
    let p = Plugins::new();
    // (version, copy-engine events sent, KernelPhase sent)
    for (v, ce, phase) in [(4u64, false, false), (6, true, false), (7, true, true)] {
        let lib = p.with_header(
            &format!("good_v{v}.so"),
            "profiler/broken_profiler.c",
            &[&format!("PROF_VERSION={v}")],
        );
        let r = all_pass(&lib, &[v]);
        let got = accepted_types(&r, v);
        for t in ["Group", "Coll", "P2p", "ProxyOp", "ProxyStep", "KernelCh"] {
            assert!(got.iter().any(|g| g == t), "v{v}: no {t} in {got:?}");
        }
        for t in ["CeColl", "CeSync", "CeBatch"] {
            assert_eq!(got.iter().any(|g| g == t), ce, "v{v} {t}: {got:?}");
        }
        let has_phase = got.iter().any(|g| g == "KernelPhase");
        assert_eq!(has_phase, phase, "v{v} KernelPhase: {got:?}");
    }
}

/// NCCL's example profiler takes its mask from `NCCL_PROFILE_EVENT_MASK` through
/// `atoi`, so the check must ask in decimal: a hex mask reads as 0, no event is sent
/// and every event check would pass without testing anything.
#[test]
fn a_profiler_reading_its_mask_with_atoi_gets_every_event() {
    let p = Plugins::new();
    let lib = p.with_header(
        "mask_atoi_v7.so",
        "profiler/broken_profiler.c",
        &["PROF_VERSION=7", "MASK_ATOI"],
    );
    passes_accepting(
        &lib,
        7,
        &[
            "GroupApi",
            "Coll",
            "ProxyStep",
            "KernelCh",
            "CeColl",
            "KernelPhase",
        ],
    );
}

/// Declining events is a profiler's right: one that tracks only large operations
/// (NVIDIA's inspector skips collectives under 8 KiB) still has its tree checked on
/// the large ones, and one that declines everything is not failed: its `events`
/// check is skipped with the reason, and the run passes.
#[test]
fn declined_events_are_never_a_failure() {
    let p = Plugins::new();
    let lib = p.with_header(
        "decline_small_v7.so",
        "profiler/broken_profiler.c",
        &["PROF_VERSION=7", "DECLINE_UNDER=8192"],
    );
    passes_accepting(
        &lib,
        7,
        &["Coll", "P2p", "ProxyOp", "ProxyStep", "KernelCh"],
    );
    let lib = p.with_header(
        "decline_all_v7.so",
        "profiler/broken_profiler.c",
        &["PROF_VERSION=7", "DECLINE_ALL"],
    );
    let (code, r) = check(&lib);
    for c in CHECKS {
        let (status, msg) = &r[&(7, c.to_owned())];
        let want = if c == "events" { "SKIP" } else { "PASS" };
        assert_eq!(status, want, "{c}: {msg}");
    }
    let (_, msg) = &r[&(7, "events".to_owned())];
    assert!(msg.contains("declined every one"), "{msg}");
    assert_eq!(code, 0, "{r:#?}");
}

#[test]
fn the_trace_profiler_and_the_template_pass_every_exported_version() {
    for name in ["libnccl-profiler-cclkit.so", "libnccl-profiler-template.so"] {
        let r = all_pass(&cclkit_tests::plugin(name), &[7, 6, 5, 4, 3, 2, 1]);
        if name.contains("template") {
            // Its default mask has no copy-engine or phase bits: NCCL sends none.
            continue;
        }
        // The trace profiler asks for every type the check names in
        // CCLKIT_PROFILE_MASK, so it accepts the copy-engine events where the
        // version defines them (v6+) and KernelPhase in v7.
        for v in [6, 7] {
            let got = accepted_types(&r, v);
            for t in ["CeColl", "CeSync", "CeBatch"] {
                assert!(got.iter().any(|g| g == t), "{name} v{v}: no {t} in {got:?}");
            }
            let has_phase = got.iter().any(|g| g == "KernelPhase");
            assert_eq!(has_phase, v == 7, "{name} v{v}: {got:?}");
        }
    }
}

#[test]
fn each_broken_profiler_fails_its_own_check() {
    let p = Plugins::new();
    let all = &CHECKS[..];
    let calls = &CHECKS[2..];
    let trees = &["events", "null-parents", "pool", "threads"][..];
    // (define, the checks that fail, the check whose message is read, words it holds)
    let cases: [(&str, &[&str], &str, &str); 11] = [
        // Nothing can be called through a 16-byte table.
        ("SMALL_TABLE", all, "symbol", "bytes"),
        (
            "NULL_RECORD",
            &CHECKS[1..],
            "table",
            "recordEventState is NULL",
        ),
        // Every check after `table` needs a communicator.
        ("INIT_FAILS", calls, "init", "init"),
        // Each check that starts proxy steps crashes, and only those.
        ("CRASH_STEP", trees, "events", "SIGSEGV"),
        ("HANG_STOP", trees, "events", "stopEvent(Coll)"),
        // A full pool declines Colls too, so their ProxyOps get NULL parents there.
        (
            "DEREF_PARENT",
            &["null-parents", "pool"],
            "null-parents",
            "SIGSEGV",
        ),
        ("RECORD_ERR", trees, "events", "ProxyStepRecvFlushWait"),
        ("OVERRUN_POOL", &["pool"], "pool", "SIGABRT"),
        ("LEAK_POOL", &["pool"], "pool", "not returned to the pool"),
        // Phases are sent under a NULL KernelCh too, so null-parents fails as well.
        (
            "PHASE_ONESHOT",
            trees,
            "events",
            "recordEventState(KernelPhase, KernelPhaseStop)",
        ),
        // CE children are never sent without their CeColl, so null-parents passes.
        (
            "CE_STOPS_PARENT",
            &["events", "pool", "threads"],
            "events",
            "stopEvent(CeColl)",
        ),
    ];
    for (define, failing, read, words) in cases {
        let lib = p.with_header(
            &format!("broken_{define}.so"),
            "profiler/broken_profiler.c",
            &[define],
        );
        let (code, r) = check(&lib);
        assert_eq!(code, 1, "{define}: {r:#?}");
        let (_, msg) = &r[&(7, read.to_owned())];
        assert!(msg.contains(words), "{define}: {msg}");
        for c in CHECKS {
            let (st, _) = r
                .get(&(7, c.to_owned()))
                .unwrap_or_else(|| panic!("{define}: no {c}"));
            let want = if failing.contains(&c) { "FAIL" } else { "PASS" };
            assert_eq!(st, want, "{define} {c}: {r:#?}");
        }
    }
}
