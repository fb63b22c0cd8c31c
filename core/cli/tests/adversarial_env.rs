//! Bad values for the environment variables `cclkit perf --np 2` reads (issue 16):
//! every run ends within 15 s; a value the runtime or the launcher reads is refused
//! with a message naming the variable (and the value cut to about 80 characters),
//! never a hang, a panic or a silent default. Variables read by plugins are only
//! held to the time bound and to "no crash".

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `cclkit perf --np 2` (one tiny size) with `env` on top of a clean environment.
fn perf(env: &[(&str, &str)], extra: &[&str]) -> (Output, Duration) {
    let t = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args([
        "perf", "--np", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0",
    ])
    .args(extra)
    .env_clear()
    .env("PATH", std::env::var("PATH").unwrap_or_default())
    .env("NCCL_NET_PLUGIN", "none")
    .env("NCCL_TUNER_PLUGIN", "none")
    .env("CCLKIT_BOOTSTRAP_TIMEOUT", "5")
    .envs(env.iter().copied())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let out = cclkit_tests::run_with_timeout(&mut cmd, Duration::from_secs(30));
    (out, t.elapsed())
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `cases` four at a time (the machine may be small; runs are short).
fn each<T: Sync>(cases: &[T], f: impl Fn(&T) + Sync) {
    for chunk in cases.chunks(4) {
        std::thread::scope(|s| {
            for c in chunk {
                s.spawn(|| f(c));
            }
        });
    }
}

#[test]
fn every_bad_runtime_value_is_refused_naming_its_variable() {
    let huge = "7".repeat(4000);
    let cases: Vec<(&str, &str)> = vec![
        ("NCCL_MIN_NCHANNELS", "abc"),
        ("NCCL_MAX_NCHANNELS", "-1"),
        ("NCCL_IB_TC", "abc"),
        ("CCLKIT_TRAFFIC_CLASS", "1e3"),
        ("CCLKIT_GROUPED_RECV", "-1"),
        ("CCLKIT_DIRECT", "maybe"),
        ("CCLKIT_TUNER_REPORT", "abc"),
        ("CCLKIT_STRICT", "abc"),
        ("CCLKIT_DEVICE", "x"),
        ("CCLKIT_OP_TIMEOUT", ""),
        ("CCLKIT_OP_TIMEOUT", "0"),
        ("CCLKIT_OP_TIMEOUT", "-5"),
        ("CCLKIT_OP_TIMEOUT", "18446744073709551616"),
        ("CCLKIT_BOOTSTRAP_TIMEOUT", "1e20"),
        ("CCLKIT_BOOTSTRAP_TIMEOUT", "nan"),
        ("CCLKIT_BOOTSTRAP_TIMEOUT", huge.as_str()),
        ("NCCL_ALGO", "abc"),
        ("NCCL_PROTO", "LL,warp"),
        ("CCLKIT_BOOTSTRAP_IP", "not-an-ip"),
    ];
    each(&cases, |(name, value)| {
        let (out, took) = perf(&[(name, value)], &[]);
        let err = text(&out);
        assert!(took < Duration::from_secs(15), "{name}: {took:?}");
        assert!(!out.status.success(), "{name}={value}: exit 0\n{err}");
        assert!(err.contains(name), "{name}={value}: not named in\n{err}");
        assert!(err.len() < 2000, "{name}: {} bytes of stderr", err.len());
        if name == &"NCCL_ALGO" {
            assert!(err.contains("unknown name 'abc'"), "{err}");
        }
    });
}

#[test]
fn bad_launch_values_are_refused_naming_their_variable() {
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        // A crafted rank count: no huge allocation, no abort.
        (
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "4294967295"),
                ("MASTER_PORT", "29411"),
            ],
            "WORLD_SIZE=4294967295",
        ),
        (
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "4294967296"),
                ("MASTER_PORT", "29411"),
            ],
            "WORLD_SIZE=4294967296",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "0"), ("MASTER_PORT", "29411")],
            "WORLD_SIZE=0",
        ),
        (
            vec![("RANK", "3"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29411")],
            "RANK=3",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "99999")],
            "MASTER_PORT",
        ),
        (
            vec![("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "")],
            "OMPI_COMM_WORLD_SIZE",
        ),
        (vec![("CCLKIT_UNIQUE_ID", "garbage")], "unique id"),
        (
            vec![
                ("CCLKIT_ROOT_ADDR", "no-port"),
                ("PMI_RANK", "0"),
                ("PMI_SIZE", "1"),
            ],
            "CCLKIT_ROOT_ADDR",
        ),
    ];
    each(&cases, |(env, want)| {
        let (out, took) = perf(env, &[]);
        let err = text(&out);
        assert!(took < Duration::from_secs(15), "{env:?}: {took:?}");
        assert!(!out.status.success(), "{env:?}: exit 0\n{err}");
        assert!(err.contains(want), "{env:?}: want {want:?} in\n{err}");
    });
}

#[test]
fn bad_flag_values_are_refused() {
    let cases: Vec<(&[&str], &str)> = vec![
        (&["-T", "1e20"], "-T/--timeout"),
        (&["-T", "0"], "-T/--timeout"),
        (&["--timeout=-1"], "-T/--timeout"),
        (&["--iter-time", "inf"], "--iter-time"),
        (&["--np", "0"], "--np"),
        (&["--np", "4294967296"], "--np"),
    ];
    each(&cases, |(args, want)| {
        let (out, _) = perf(&[], args);
        let err = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?} in\n{err}");
    });
}

#[test]
fn values_read_by_plugins_never_hang_or_crash_the_launcher() {
    let cases: Vec<(&str, &str)> = vec![
        ("NCCL_SOCKET_IFNAME", "nonexistent0"),
        ("NCCL_BUFFSIZE", "abc"),
        ("NCCL_LL_BUFFSIZE", "-1"),
        ("NCCL_LL128_BUFFSIZE", "1e99"),
        ("NCCL_STEPS", "abc"),
        ("NCCL_SOCKET_NTHREADS", "-1"),
        ("NCCL_NSOCKS_PERTHREAD", "abc"),
        ("NCCL_NET_GDR_LEVEL", "abc"),
        ("NCCL_DEBUG", "abc"),
        ("NCCL_TUNER_CONFIG_FILE", "/nonexistent/tuner.conf"),
        ("CCLKIT_PROFILE_MAX_EVENTS", "abc"),
        ("NCCL_NET", "nonexistent"),
    ];
    each(&cases, |(name, value)| {
        let (out, took) = perf(&[(name, value)], &[]);
        assert!(took < Duration::from_secs(15), "{name}={value}: {took:?}");
        assert!(
            out.status.code().is_some(),
            "{name}={value}: killed: {:?}",
            out.status
        );
        if !out.status.success() {
            // A failure names a rank (the launcher's summary) or the variable.
            let err = text(&out);
            assert!(err.contains("cclkit perf: "), "{name}={value}: {err}");
        }
    });
}
