//! `cclkit perf` ranks started by an external launcher (issue 16), simulated as
//! torchrun does it: two processes with RANK, WORLD_SIZE, MASTER_ADDR and
//! MASTER_PORT. No `--np` launcher watches them, so a plugin constructor that
//! calls `_exit(0)` used to end each rank with status 0: a false pass. The plugin
//! preflight makes each rank fail, naming the plugin, the step and how it ended.

mod common;

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs a 2-rank job, one process per rank, with `env` on top of a clean
/// environment; returns each rank's output and how long the job took.
fn job(env: &[(&str, &str)]) -> (Vec<Output>, Duration) {
    // The bootstrap root listens on MASTER_PORT + 1 (torchrun's store owns MASTER_PORT).
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let master_port = (port - 1).to_string();
    let t = Instant::now();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
            cmd.args(["perf", "-b", "8", "-e", "8", "-n", "1", "-w", "0"])
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env(
                    "CCLKIT_LIB_DIR",
                    std::env::var("CCLKIT_LIB_DIR").unwrap_or_default(),
                )
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &master_port)
                .env("CCLKIT_BOOTSTRAP_TIMEOUT", "10")
                .env("CCLKIT_OP_TIMEOUT", "10")
                .env("CCLKIT_DIAG_TIMEOUT", "3")
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            std::thread::spawn(move || common::run_bounded(cmd, Duration::from_secs(40)))
        })
        .collect();
    let outs = ranks
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect();
    (outs, t.elapsed())
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn hostile(p: &common::Plugins, mode: &str) -> String {
    let lib = p.cc(
        &format!("libnccl-net-hostile{}.so", mode.to_lowercase()),
        &[common::fixture("hostile/ctor.c")],
        &[format!("-DCTOR_{mode}")],
    );
    common::s(&lib)
}

#[test]
fn a_constructor_that_exits_0_fails_every_rank_of_an_external_launch() {
    let p = common::Plugins::new();
    for (mode, how) in [
        ("EXIT0", "exited with status 0 before it was done"),
        ("SEGV", "killed by signal 11"),
        ("HANG", "did not finish within 3s"),
    ] {
        let lib = hostile(&p, mode);
        let (outs, took) = job(&[("NCCL_NET_PLUGIN", lib.as_str())]);
        assert!(took < Duration::from_secs(20), "{mode}: {took:?}");
        for (r, o) in outs.iter().enumerate() {
            let t = text(o);
            assert_eq!(o.status.code(), Some(3), "{mode} rank {r}: {t}");
            assert!(
                t.contains(&format!("cclkit perf: rank {r}: plugin preflight: ")),
                "{mode} rank {r}: {t}"
            );
            assert!(
                t.contains(&format!(
                    " during: net plugin NCCL_NET_PLUGIN={lib}: loading and init"
                )),
                "{mode} rank {r}: the plugin and the step are named: {t}"
            );
            assert!(t.contains(how), "{mode} rank {r}: want {how:?} in {t}");
        }
    }
}

#[test]
fn without_the_preflight_the_same_job_passes_falsely() {
    // The control: what the preflight exists for. Switched off, `_exit(0)` in the
    // constructor ends each rank with status 0 and no result line.
    let p = common::Plugins::new();
    let lib = hostile(&p, "EXIT0");
    let (outs, _) = job(&[
        ("NCCL_NET_PLUGIN", lib.as_str()),
        ("CCLKIT_PERF_PREFLIGHT", "0"),
    ]);
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
        assert!(!text(o).contains("Avg bus bandwidth"), "{}", text(o));
    }
}

#[test]
fn healthy_ranks_of_an_external_launch_still_run() {
    let (outs, _) = job(&[("NCCL_NET_PLUGIN", "none"), ("NCCL_TUNER_PLUGIN", "none")]);
    for (r, o) in outs.iter().enumerate() {
        let t = text(o);
        assert!(o.status.success(), "rank {r}: {t}");
        assert!(!t.contains("preflight"), "rank {r}: {t}");
    }
    assert!(
        text(&outs[0]).contains("Avg bus bandwidth"),
        "rank 0 prints the results: {}",
        text(&outs[0])
    );
}

#[test]
fn a_bad_preflight_switch_is_refused_by_name() {
    for bad in ["abc", "2", "", "yes please"] {
        let (outs, took) = job(&[("CCLKIT_PERF_PREFLIGHT", bad), ("NCCL_NET_PLUGIN", "none")]);
        assert!(took < Duration::from_secs(20), "{bad:?}: {took:?}");
        for o in &outs {
            let t = text(o);
            assert!(!o.status.success(), "{bad:?}: {t}");
            assert!(t.contains("CCLKIT_PERF_PREFLIGHT"), "{bad:?}: {t}");
        }
    }
}
