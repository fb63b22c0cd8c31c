//! `cclkit check` on env plugins: a C fixture (tests/fixtures/env/env_broken.c) with
//! one bug switched on per build fails exactly the check that names the bug (a crash
//! or a hang fails one check, the run goes on); the same source without bugs, and the
//! packaged env plugins (cclkit's TOML plugin and the template), pass every check.

mod common;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

fn build(p: &common::Plugins, out: &str, defines: &[&str]) -> String {
    common::s(&p.with_header(out, "env/env_broken.c", defines))
}

/// `cclkit check LIB --json ARGS` with `env` added: exit code and report.
fn check(lib: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args(["check", lib, "--json", "--jobs", "2", "--seed", "4242"])
        .args(args)
        .env_remove("NCCL_DEBUG")
        .env_remove("CCLKIT_ENV_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = common::run_bounded(cmd, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout);
    let r = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (out.status.code().unwrap_or(-1), r)
}

/// `(check, status, message)` of every env result of version `v`.
fn results(r: &Value, v: u64) -> Vec<(String, String, String)> {
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|x| x["family"] == "env" && x["version"] == v)
        .map(|x| {
            (
                x["check"].as_str().unwrap_or("").to_owned(),
                x["status"].as_str().unwrap_or("").to_owned(),
                x["message"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

const ALL: [&str; 6] = [
    "table",
    "init",
    "get-env",
    "process-env",
    "null-name",
    "long-name",
];

/// Asserts every check of `v` ran, `bad` has `status` with every needle in its
/// message, and the checks not in `skip_others` passed.
fn assert_only(r: &Value, v: u64, bad: &str, status: &str, needles: &[&str], others: &[&str]) {
    let res = results(r, v);
    let names: Vec<&str> = res.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(names, ALL, "{r:#}");
    for (check, st, msg) in &res {
        if check == bad {
            assert_eq!(st, status, "{check}: {msg}");
            for n in needles {
                assert!(msg.contains(n), "{check}: {msg:?} lacks {n:?}");
            }
        } else if others.contains(&check.as_str()) {
            assert_eq!(st, "PASS", "{check}: {msg}");
        }
    }
}

#[test]
fn a_correct_c_env_plugin_passes_every_check_in_both_versions() {
    let p = common::Plugins::new();
    for (v, lib) in [
        (2u64, build(&p, "env2.so", &[])),
        (1, build(&p, "env1.so", &["ENV_VERSION=1"])),
    ] {
        let (code, r) = check(&lib, &[], &[]);
        assert_eq!(code, 0, "{r:#}");
        let res = results(&r, v);
        assert_eq!(res.len(), ALL.len(), "{r:#}");
        assert!(res.iter().all(|x| x.1 == "PASS"), "{r:#}");
        // NCCL_DEBUG is answered by the plugin even though the process has none.
        let get = res.iter().find(|x| x.0 == "get-env").expect("get-env");
        assert!(get.2.starts_with("16 names (1 set)"), "{}", get.2);
    }
}

#[test]
fn each_bug_fails_the_check_that_names_it() {
    let p = common::Plugins::new();
    let unstable = build(&p, "unstable.so", &["UNSTABLE"]);
    let (code, r) = check(&unstable, &[], &[]);
    assert_eq!(code, 1);
    assert_only(
        &r,
        2,
        "get-env",
        "FAIL",
        &["getEnv(NCCL_DEBUG) answered \"TRACE", "assumes one value"],
        &["table", "init", "process-env", "null-name", "long-name"],
    );

    let null_get = build(&p, "nullget.so", &["NULL_GETENV"]);
    let (code, r) = check(&null_get, &[], &[]);
    assert_eq!(code, 1);
    assert_only(
        &r,
        2,
        "table",
        "FAIL",
        &["ncclEnvPlugin_v2.getEnv is NULL"],
        &["init"],
    );

    let hide = build(&p, "hide.so", &["HIDE_PROCESS"]);
    let (code, r) = check(&hide, &[], &[]);
    assert_eq!(code, 0, "a probe only warns");
    assert_only(
        &r,
        2,
        "process-env",
        "WARN",
        &["answered NULL (unset) although the job set it"],
        &["table", "init", "get-env", "null-name", "long-name"],
    );
}

#[test]
fn crashes_and_hangs_fail_one_check_and_the_run_goes_on() {
    let p = common::Plugins::new();
    let crash = build(&p, "crash.so", &["CRASH_NULL"]);
    let (code, r) = check(&crash, &[], &[]);
    assert_eq!(code, 0, "a crashing probe only warns: {r:#}");
    assert_only(
        &r,
        2,
        "null-name",
        "WARN",
        &["SIGSEGV", "getEnv(NULL)"],
        &["table", "init", "get-env", "process-env", "long-name"],
    );
    let (code, r) = check(&crash, &["--strict"], &[]);
    assert_eq!(code, 1);
    assert_only(&r, 2, "null-name", "FAIL", &["SIGSEGV"], &["get-env"]);

    let hang = build(&p, "hang.so", &["HANG_INIT"]);
    let (code, r) = check(&hang, &["--timeout", "2"], &[]);
    assert_eq!(code, 1);
    assert_only(
        &r,
        2,
        "init",
        "FAIL",
        &["did not finish within 2 s", "init(2, 30, 7"],
        &["table"],
    );
}

#[test]
fn packaged_env_plugins_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("env.toml");
    std::fs::write(
        &file,
        "[env]\nNCCL_SOCKET_IFNAME = \"eth7\"\nNCCL_BUFFSIZE = 8388608\n\n\
         [pinned]\nNCCL_NET_PLUGIN = \"cclkit-socket\"\n",
    )
    .expect("write");
    let toml = common::rust_plugin("libnccl-env-cclkit.so");
    let (code, r) = check(
        &common::s(&toml),
        &[],
        &[("CCLKIT_ENV_FILE", &common::s(&file))],
    );
    assert_eq!(code, 0, "{r:#}");
    for v in [2, 1] {
        let res = results(&r, v);
        assert_eq!(res.len(), ALL.len(), "{r:#}");
        assert!(res.iter().all(|x| x.1 == "PASS"), "{r:#}");
        let get = res.iter().find(|x| x.0 == "get-env").expect("get-env");
        assert!(get.2.starts_with("16 names (3 set)"), "{}", get.2);
    }
    let template = common::rust_plugin("libnccl-env-template.so");
    let (code, r) = check(&common::s(&template), &[], &[]);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(results(&r, 2).len(), ALL.len());
}
