//! Plugins whose constructor crashes, aborts, hangs or calls `_exit(0)` (issue 16),
//! under every tool that loads plugins: `perf` (one rank and two; net, tuner and
//! profiler), `doctor`, `info` and `check` must each end within a bounded time,
//! non-zero, with a line naming the plugin, the step and how it ended; never a
//! crash of the tool, a hang, or exit 0 without a result. Ranks under an external
//! launcher are in adversarial_preflight.rs.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Every hostile constructor, built once per test.
fn hostile(p: &common::Plugins) -> Vec<(&'static str, String)> {
    ["SEGV", "ABORT", "EXIT0", "HANG"]
        .into_iter()
        .map(|m| {
            let lib = p.cc(
                &format!("libnccl-net-hostile{}.so", m.to_lowercase()),
                &[common::fixture("hostile/ctor.c")],
                &[format!("-DCTOR_{m}")],
            );
            (m, common::s(&lib))
        })
        .collect()
}

/// Runs `cclkit ARGS` with `env`; returns its output and how long it took.
fn cclkit(args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let t = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args(args)
        .env_remove("NCCL_DEBUG")
        .env_remove("NCCL_NET_PLUGIN")
        .env_remove("NCCL_TUNER_PLUGIN")
        .env("CCLKIT_BOOTSTRAP_TIMEOUT", "2")
        .env("CCLKIT_OP_TIMEOUT", "10")
        .env("CCLKIT_DIAG_TIMEOUT", "4")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = cclkit_tests::run_with_timeout(&mut cmd, Duration::from_secs(30));
    (out, t.elapsed())
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// What the report must say for each constructor.
fn expected(mode: &str) -> &'static str {
    match mode {
        "SEGV" => "signal 11",
        "ABORT" => "signal 6",
        "EXIT0" => "0",
        _ => "",
    }
}

#[test]
fn perf_fails_loudly_on_every_hostile_constructor() {
    let p = common::Plugins::new();
    for (mode, lib) in hostile(&p) {
        for np in ["1", "2"] {
            let args = [
                "perf", "--np", np, "-b", "8", "-e", "8", "-n", "1", "-w", "0",
            ];
            // The preflight's limit below the bootstrap's: the rank itself reports
            // the hang, naming the plugin, before the launcher gives up on it.
            let env = [
                ("NCCL_NET_PLUGIN", lib.as_str()),
                ("CCLKIT_DIAG_TIMEOUT", "1"),
            ];
            let (out, took) = cclkit(&args, &env);
            let t = text(&out);
            assert!(
                took < Duration::from_secs(15),
                "{mode} np={np}: {took:?}\n{t}"
            );
            assert!(!out.status.success(), "{mode} np={np}: exit 0\n{t}");
            assert!(t.contains("cclkit perf: rank "), "{mode} np={np}: {t}");
            assert!(
                t.contains("hostile"),
                "{mode} np={np}: the plugin is named: {t}"
            );
            assert!(
                t.contains(" during: net plugin NCCL_NET_PLUGIN="),
                "{mode} np={np}: the step is named: {t}"
            );
            assert!(
                t.contains(preflight_end(mode)),
                "{mode} np={np}: want {:?} in {t}",
                preflight_end(mode)
            );
        }
    }
}

/// How the preflight says the process that loaded the plugin ended.
fn preflight_end(mode: &str) -> &'static str {
    match mode {
        "SEGV" => "killed by signal 11",
        "ABORT" => "killed by signal 6",
        "EXIT0" => "exited with status 0 before it was done",
        _ => "did not finish within",
    }
}

#[test]
fn perf_names_a_hostile_tuner_or_profiler_and_its_step() {
    let p = common::Plugins::new();
    let libs = hostile(&p);
    for (var, step) in [
        ("NCCL_TUNER_PLUGIN", " during: tuner NCCL_TUNER_PLUGIN="),
        (
            "NCCL_PROFILER_PLUGIN",
            " during: profiler NCCL_PROFILER_PLUGIN=",
        ),
    ] {
        // Exit 0 (the false pass) and a crash; the other two behave alike.
        for (mode, lib) in libs.iter().filter(|(m, _)| ["EXIT0", "SEGV"].contains(m)) {
            let args = [
                "perf", "--np", "1", "-b", "8", "-e", "8", "-n", "1", "-w", "0",
            ];
            let (out, took) = cclkit(&args, &[(var, lib.as_str()), ("CCLKIT_DIAG_TIMEOUT", "2")]);
            let t = text(&out);
            assert!(
                took < Duration::from_secs(15),
                "{var} {mode}: {took:?}\n{t}"
            );
            assert!(!out.status.success(), "{var} {mode}: exit 0\n{t}");
            assert!(
                t.contains("hostile") && t.contains(step),
                "{var} {mode}: {t}"
            );
            assert!(t.contains(preflight_end(mode)), "{var} {mode}: {t}");
        }
    }
}

#[test]
fn check_turns_every_hostile_constructor_into_a_failed_check() {
    let p = common::Plugins::new();
    for mode in ["SEGV", "ABORT", "EXIT0", "HANG"] {
        // With a net plugin symbol: `check` reads the exports before loading.
        let lib = common::s(&p.cc(
            &format!("libnccl-net-hostiletable{}.so", mode.to_lowercase()),
            &[common::fixture("hostile/ctor.c")],
            &[format!("-DCTOR_{mode}"), "-DCTOR_NET_TABLE".to_owned()],
        ));
        let args = ["check", lib.as_str(), "--only", "init", "--timeout", "2"];
        let (out, took) = cclkit(&args, &[]);
        let t = text(&out);
        assert!(
            took < Duration::from_secs(15),
            "check {mode}: {took:?}\n{t}"
        );
        assert_eq!(out.status.code(), Some(1), "check {mode}: {t}");
        assert!(
            t.contains("hostiletable"),
            "check {mode}: the plugin is named: {t}"
        );
        // A hang is reported by whichever deadline fires first: the check process's
        // own watchdog ("stuck in: STEP") or the parent's kill ("during: STEP").
        let step = "dlopen and read the table";
        assert!(
            t.contains("FAIL  net v8    init")
                && (t.contains(&format!(" during: {step}"))
                    || (mode == "HANG" && t.contains(&format!("stuck in: {step}")))),
            "check {mode}: the check and the step are named: {t}"
        );
        let how: &[&str] = match mode {
            "SEGV" => &["killed by SIGSEGV (signal 11)"],
            "ABORT" => &["killed by SIGABRT (signal 6)"],
            "EXIT0" => &["exited without a result"],
            _ => &["timed out after 2 s", "did not finish within 2 s"],
        };
        assert!(
            how.iter().any(|h| t.contains(h)),
            "check {mode}: want one of {how:?} in {t}"
        );
    }
}

/// A command line and its environment.
type Run<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>);

#[test]
fn doctor_and_info_report_the_plugin_the_step_and_how_it_ended() {
    let p = common::Plugins::new();
    for (mode, lib) in hostile(&p) {
        let runs: [Run; 2] = [
            (vec!["doctor"], vec![("NCCL_NET_PLUGIN", lib.as_str())]),
            (vec!["info", lib.as_str()], vec![]),
        ];
        for (args, env) in runs {
            let (out, took) = cclkit(&args, &env);
            let t = text(&out);
            let tool = args[0];
            assert!(
                took < Duration::from_secs(15),
                "{tool} {mode}: {took:?}\n{t}"
            );
            assert_eq!(out.status.code(), Some(3), "{tool} {mode}: {t}");
            assert!(
                t.contains(&format!("cclkit {tool}: plugin ")),
                "{tool} {mode}: {t}"
            );
            assert!(
                t.contains("hostile"),
                "{tool} {mode}: the plugin is named: {t}"
            );
            assert!(
                t.contains(" during: "),
                "{tool} {mode}: the step is named: {t}"
            );
            let how = match mode {
                "EXIT0" => "exited with status 0 before its report was complete",
                "HANG" => "did not finish within",
                m => expected(m),
            };
            assert!(t.contains(how), "{tool} {mode}: want {how:?} in {t}");
        }
    }
    // JSON stays JSON.
    let (_, lib) = &hostile(&p)[0];
    let (out, _) = cclkit(&["info", lib.as_str(), "--json"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        v["problems"][0].as_str().unwrap().contains("signal 11"),
        "{v}"
    );
}

#[test]
fn healthy_plugins_still_pass_doctor_and_info_through_the_child() {
    let p = common::Plugins::new();
    let lib = common::s(&p.net("libnccl-net-mock.so", 10, &[]));
    let (out, _) = cclkit(&["info", lib.as_str()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !text(&out).contains("@cclkit-diag"),
        "protocol lines are not shown"
    );
}
