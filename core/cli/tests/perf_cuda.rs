//! `cclkit perf --device cuda` end to end: on the emulated GPU (`CCLKIT_CUDA_EMULATE`)
//! every element checks out; without a CUDA driver it fails at once with the reason.
//! (The runtime's device path itself is tested in `cclkit-runtime`'s `cuda` tests.)

use std::time::Duration;

/// Whether this machine has the CUDA driver library.
fn cclkit_kernels_driver_present() -> bool {
    ["libcuda.so.1", "libcuda.so"]
        .iter()
        // SAFETY: only probes whether the NVIDIA driver library can be loaded.
        .any(|n| unsafe { libloading::Library::new(*n) }.is_ok())
}

/// `cclkit perf` with `args`, bounded by coreutils `timeout`.
fn perf(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new("timeout")
        .args(["-k", "5", "180", env!("CARGO_BIN_EXE_cclkit"), "perf"])
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
}

#[test]
fn perf_device_cuda_without_a_driver_fails_at_once() {
    if cclkit_kernels_driver_present() {
        return;
    }
    let t = std::time::Instant::now();
    let out = perf(&["--device", "cuda", "--np", "2"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no CUDA driver: libcuda.so.1 not found"),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
}
