//! Issue 22: the `cclkit` command with plugins shaped like ones NCCL runs but cclkit
//! did not write.
//!
//! * item 0: a table holding only `name` and `init`, completed by `init`
//!   (`tests/fixtures/nccl22/net_wrap.c`), passes `cclkit check` in every version;
//! * item 1: plugins whose `test()` never writes the received size, or reports the
//!   posted size, run under `cclkit perf --np 2` with `#wrong` 0 and one WARN per
//!   connection; `CCLKIT_STRICT=1` makes the mismatch an error;
//! * item 2: a tuner inside a net library whose net part is rejected (0 devices) is
//!   found by `doctor` and used by the runtime, as NCCL does.
//!
//! Every run is bounded: the process group is killed after 120 s.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use cclkit_tests::cplugin::{Plugins, fixture, s};

/// `net_wrap.c` for `version` over the packaged socket transport.
fn wrap(p: &Plugins, name: &str, version: u32, sizes: u32) -> PathBuf {
    let inner = cclkit_tests::plugin("libnccl-net-cclkit-socket.so");
    p.cc(
        name,
        &[fixture("nccl22/net_wrap.c")],
        &[
            format!("-DNET_VERSION={version}"),
            format!("-DSIZES={sizes}"),
            format!("-DINNER_LIB=\"{}\"", inner.display()),
            "-ldl".to_owned(),
            "-lpthread".to_owned(),
        ],
    )
}

/// NCCL's mixed example as the issue saw it: net v12 with 0 devices + tuner v6.
fn mixed(p: &Plugins) -> PathBuf {
    p.cc(
        "mixed.so",
        &[fixture("net_mock.c"), fixture("tuner_mock.c")],
        &[
            "-DNET_VERSION=12".to_owned(),
            "-DTUNER_VERSION=6".to_owned(),
            "-DNDEV=0".to_owned(),
        ],
    )
}

/// `cclkit ARGS` with only `env` (and PATH) set, bounded to 120 s.
fn cclkit(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CCLKIT_OP_TIMEOUT", "60")
        .env("CCLKIT_BOOTSTRAP_TIMEOUT", "60")
        .envs(env.iter().copied());
    common::run_bounded(cmd, Duration::from_secs(120))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The `#wrong` columns (out of place, in place) of every result row.
fn wrong_columns(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 13, "13 columns in {l:?}");
            (f[8].to_owned(), f[12].to_owned())
        })
        .collect()
}

fn perf(lib: &Path, extra: &[(&str, &str)]) -> Output {
    let mut env = vec![
        ("NCCL_NET_PLUGIN", s(lib)),
        ("NCCL_TUNER_PLUGIN", "none".to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    cclkit(
        &[
            "perf", "--np", "2", "-b", "8", "-e", "96K", "-f", "7", "-n", "3",
        ],
        &env,
    )
}

#[test]
fn a_table_completed_by_init_passes_check_in_every_version() {
    let p = Plugins::new();
    for v in 6..=12u32 {
        let lib = wrap(&p, &format!("wrap{v}.so"), v, 0);
        let out = cclkit(&["check", &s(&lib)], &[]);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "v{v}: {}\n{stdout}\n{}",
            out.status,
            text(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("PASS  net v{v}"))
                && stdout.contains("name \"Wrap\"; every required function present"),
            "v{v}:\n{stdout}"
        );
        assert!(!stdout.contains("FAIL"), "v{v}:\n{stdout}");
    }
}

#[test]
fn misreported_receive_sizes_run_with_no_wrong_values_and_one_warn_per_connection() {
    let p = Plugins::new();
    for (mode, reported) in [(1, "reported 0 bytes"), (2, "reported 1")] {
        let lib = wrap(&p, &format!("sizes{mode}.so"), 6, mode);
        let out = perf(&lib, &[]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "SIZES={mode}: {stdout}\n{stderr}");
        assert!(stdout.contains("net 'Wrap' v6"), "{stdout}");
        let wrong = wrong_columns(&stdout);
        assert!(wrong.len() >= 3, "{stdout}");
        assert!(
            wrong.iter().all(|(a, b)| a == "0" && b == "0"),
            "SIZES={mode}: #wrong must be 0:\n{stdout}"
        );
        let warns: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("test() reported"))
            .collect();
        assert!(!warns.is_empty(), "SIZES={mode}: no WARN:\n{stderr}");
        for w in &warns {
            assert!(
                w.contains("plugin 'Wrap' (net v6)") && w.contains(reported),
                "SIZES={mode}: {w}"
            );
            assert!(w.contains("CCLKIT_STRICT=1"), "{w}");
        }
        // Once per connection: no connection label twice.
        let mut labels: Vec<&str> = warns
            .iter()
            .filter_map(|w| w.split(": plugin").next())
            .collect();
        let n = labels.len();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(
            labels.len(),
            n,
            "SIZES={mode}: a connection warned twice:\n{stderr}"
        );
    }
}

#[test]
fn strict_mode_turns_a_size_mismatch_into_an_error() {
    let p = Plugins::new();
    let lib = wrap(&p, "strict.so", 6, 1);
    let out = perf(&lib, &[("CCLKIT_STRICT", "1")]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("CCLKIT_STRICT=1: ")
            && stderr.contains("plugin 'Wrap' (net v6) test() reported 0 bytes"),
        "{stderr}"
    );
    // An honest plugin is unaffected by strict mode.
    let honest = wrap(&p, "honest.so", 6, 0);
    let out = perf(&honest, &[("CCLKIT_STRICT", "1")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("test() reported"));
}

#[test]
fn a_tuner_in_a_rejected_net_library_is_shown_by_doctor_and_used_by_the_runtime() {
    let p = Plugins::new();
    let lib = mixed(&p);
    let env = [("NCCL_NET_PLUGIN", s(&lib))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = cclkit(&["doctor"], &env);
    let doc = text(&out.stdout);
    assert!(
        doc.contains("devices() reported 0 devices"),
        "the net part is rejected:\n{doc}"
    );
    let tuner = doc.split("\nTUNER").nth(1).unwrap_or_default();
    assert!(
        tuner.contains(&format!("tuner in net library {}", s(&lib)))
            && tuner.contains("[tuner searched inside the net plugin library]")
            && tuner.contains("-> selected 'MockTuner' (ncclTunerPlugin_v6)")
            && tuner.contains("=> TUNER uses 'MockTuner' v6"),
        "doctor must show the net-library step and its result:\n{doc}"
    );
    let run = cclkit(
        &[
            "perf", "--np", "2", "-b", "8", "-e", "4K", "-f", "8", "-n", "3",
        ],
        &env,
    );
    let stdout = text(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", text(&run.stderr));
    let ranks: Vec<&str> = stdout.lines().filter(|l| l.contains("Rank ")).collect();
    assert_eq!(ranks.len(), 2, "{stdout}");
    for r in ranks {
        assert!(
            r.contains("net 'cclkit-socket'") && r.contains("tuner 'MockTuner v6'"),
            "{r}"
        );
    }
    assert!(
        wrong_columns(&stdout)
            .iter()
            .all(|(a, b)| a == "0" && b == "0"),
        "{stdout}"
    );
}

/// `other_kinds.c` without its profiler tables (profilers are checked since issue
/// 20): env v2 (and GIN v14, RMA v15 with `WITH_GIN`).
fn other_kinds(p: &Plugins) -> PathBuf {
    let defines = ["-DNO_PROFILER", "-DNO_ENV", "-DWITH_GIN"].map(str::to_owned);
    p.cc("other_gin.so", &[fixture("nccl22/other_kinds.c")], &defines)
}

/// `other_kinds.c` with its profiler v5/v6 tables, whose slots are all NULL.
fn other_kinds_with_profiler(p: &Plugins) -> PathBuf {
    p.cc(
        "other_prof.so",
        &[fixture("nccl22/other_kinds.c")],
        &["-DNO_ENV".to_owned()],
    )
}

/// `other_kinds.c` with only its all-NULL env v2 table.
fn other_kinds_env_only(p: &Plugins) -> PathBuf {
    p.cc(
        "other_env.so",
        &[fixture("nccl22/other_kinds.c")],
        &["-DNO_PROFILER".to_owned()],
    )
}

#[test]
fn info_and_check_name_kinds_cclkit_does_not_check_and_exit_2() {
    let p = Plugins::new();
    let lib = other_kinds(&p);
    let expected = [
        "kind GIN v14: not checked by cclkit",
        "kind RMA v15: not checked by cclkit",
    ];
    for cmd in ["info", "check"] {
        let out = cclkit(&[cmd, &s(&lib)], &[]);
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{cmd}: nothing could be checked:\n{stdout}{}",
            text(&out.stderr)
        );
        for line in &expected {
            assert!(stdout.contains(line), "{cmd}: no {line:?} in:\n{stdout}");
        }
        assert!(
            !stdout.contains("net v0") && !stdout.contains("FAIL"),
            "{cmd}:\n{stdout}"
        );
    }
    let info = text(&cclkit(&["info", &s(&lib)], &[]).stdout);
    assert!(info.contains("plugin kinds: GIN v14, RMA v15"), "{info}");
    assert!(
        !info.contains("ERROR"),
        "nothing was called or failed:\n{info}"
    );
    let out = cclkit(&["check", "--json", &s(&lib)], &[]);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let kinds: Vec<(String, u64)> = v["exports"]["kinds"]
        .as_array()
        .expect("kinds")
        .iter()
        .map(|k| {
            (
                k["kind"].as_str().unwrap_or_default().to_owned(),
                k["version"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(kinds, [("gin".to_owned(), 14), ("rma".to_owned(), 15)]);
}

/// Env plugins are checked (issue 19): the all-NULL env v2 table of `other_kinds.c`
/// fails the env table check, is no longer listed as unchecked, and nothing crashes.
#[test]
fn an_env_plugin_is_checked_and_null_slots_fail_its_table() {
    let p = Plugins::new();
    let out = cclkit(&["check", &s(&other_kinds_env_only(&p))], &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.lines().any(|l| l.starts_with("FAIL")
            && l.contains("env v2")
            && l.contains("table")
            && l.contains("is NULL")),
        "{stdout}"
    );
    assert!(!stdout.contains("not checked by cclkit"), "{stdout}");
    assert!(!stdout.contains("killed by"), "nothing crashed:\n{stdout}");
}

/// Profilers are checked (issue 20): the all-NULL profiler tables of
/// `other_kinds.c` fail the profiler table check in both versions, are no longer
/// listed as unchecked, and nothing crashes.
#[test]
fn a_profiler_is_checked_and_null_slots_fail_its_table() {
    let p = Plugins::new();
    let lib = other_kinds_with_profiler(&p);
    let out = cclkit(
        &[
            "check",
            "--only",
            "profiler.symbol,profiler.table",
            &s(&lib),
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    for v in [6, 5] {
        assert!(
            stdout.lines().any(|l| l.starts_with("PASS")
                && l.contains(&format!("profiler v{v}"))
                && l.contains("symbol")),
            "v{v}:\n{stdout}"
        );
        assert!(
            stdout.lines().any(|l| l.starts_with("FAIL")
                && l.contains(&format!("profiler v{v}"))
                && l.contains("table")
                && l.contains("is NULL")),
            "v{v}:\n{stdout}"
        );
    }
    assert!(!stdout.contains("kind profiler"), "{stdout}");
}

#[test]
fn a_net_plugin_with_a_profiler_is_checked_and_names_the_profiler() {
    let p = Plugins::new();
    let inner = cclkit_tests::plugin("libnccl-net-cclkit-socket.so");
    let lib = p.cc(
        "net_and_profiler.so",
        &[
            fixture("nccl22/net_wrap.c"),
            fixture("nccl22/other_kinds.c"),
        ],
        &[
            "-DNET_VERSION=12".to_owned(),
            format!("-DINNER_LIB=\"{}\"", inner.display()),
            "-ldl".to_owned(),
            "-lpthread".to_owned(),
        ],
    );
    let out = cclkit(&["check", "--only", "net.table,net.init", &s(&lib)], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        !stdout.contains("kind profiler")
            && stdout
                .lines()
                .any(|l| l.starts_with("PASS") && l.contains("net v12") && l.contains("table")),
        "{stdout}"
    );
    let info = cclkit(&["info", "--no-init", &s(&lib)], &[]);
    let text_info = text(&info.stdout);
    assert!(
        text_info.contains("plugin kinds: net v12, profiler v6, profiler v5, env v2"),
        "{text_info}"
    );
}
