//! `cclkit perf --device cuda` end to end: on the emulated GPU (`CCLKIT_CUDA_EMULATE`)
//! every element checks out; without a CUDA driver it fails at once with the reason.
//! (The runtime's device path itself is tested in `cclkit-runtime`'s `cuda` tests.)

/// Seconds coreutils `timeout` gives `cclkit perf` before killing it (exit 124).
const PERF_LIMIT: &str = "180";

/// `cclkit perf` with `args`, bounded by coreutils `timeout` ([`PERF_LIMIT`]).
fn perf(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new("timeout")
        .args(["-k", "5", PERF_LIMIT, env!("CARGO_BIN_EXE_cclkit"), "perf"])
        .args(args)
        .env_remove("CCLKIT_DEVICE")
        .env_remove("CCLKIT_CUDA_EMULATE")
        .env("NCCL_NET_PLUGIN", "none")
        .envs(env.iter().copied())
        .output()
        .expect("run cclkit perf")
}

#[test]
fn perf_device_cuda_runs_and_checks_on_the_emulated_gpu() {
    let out = perf(
        &[
            "--device",
            "cuda",
            "--np",
            "2",
            "-b",
            "4",
            "-e",
            "256K",
            "-f",
            "16",
            "-d",
            "float,f8e4m3",
            "-o",
            "all",
            "-n",
            "1",
        ],
        &[("CCLKIT_CUDA_EMULATE", "1")],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    // Each device line names the rank's GPU; the emulator is no GPU that time-slices,
    // so two ranks on it get no warning about sharing one.
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("#  Rank ")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("] GPU 0 (cclkit emulated device")),
        "{text}"
    );
    assert!(!text.contains("share GPU"), "{text}");
}

#[test]
fn perf_device_cuda_without_a_driver_fails_at_once() {
    if cclkit_tests::cuda_driver_present() {
        cclkit_tests::skip(
            "perf_device_cuda_without_a_driver_fails_at_once",
            "a CUDA driver is installed, so its absence cannot be tested here (the GPU \
             path is kernels/cuda/gpu-check.sh)",
        );
        return;
    }
    // Long bootstrap and operation timeouts: "at once" means the driver check stops
    // the run before any rank waits on a peer, so no deadline can be what ended it
    // (a run that waited would be killed by `timeout` and exit 124, not 1).
    let out = perf(
        &["--device", "cuda", "--np", "2"],
        &[
            ("CCLKIT_BOOTSTRAP_TIMEOUT", "600"),
            ("CCLKIT_OP_TIMEOUT", "600"),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(124),
        "still running after {PERF_LIMIT} s: it waited instead of failing at once\n{err}"
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no CUDA driver: libcuda.so.1 not found"),
        "{err}"
    );
    assert!(
        !err.contains("TIMEOUT"),
        "a deadline fired instead of the driver check: {err}"
    );
}
