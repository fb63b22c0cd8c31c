//! `--cuda-standin`: CUDA-linked net plugins (tests/fixtures/cuda/) pass `cclkit
//! check` against the host-memory CUDA stand-in (kernels/cuda-standin/), fail
//! cleanly without it, and a CUDA call the stand-in lacks is a named failure.
//!
//! The stand-in is built here, from the repository's sources, into a temporary
//! directory that CCLKIT_CUDA_STANDIN_DIR points `cclkit` at.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use common::standin::{fixture, standin};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `cclkit ARGS` with a clean library path, the stand-in at `standin_dir` and `env`.
fn cclkit(args: &[&str], standin_dir: &Path, env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args(args)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("CCLKIT_CUDA_STANDIN_ACTIVE")
        .env_remove("CCLKIT_CUDA_STANDIN_TRACE")
        .env_remove("NCCL_DEBUG")
        .env("CCLKIT_CUDA_STANDIN_DIR", standin_dir)
        .envs(env.iter().copied());
    let out = common::run_bounded(cmd, Duration::from_secs(240));
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn json(r: &Run) -> Value {
    serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", r.stdout, r.stderr))
}

/// (status, message) of one check.
fn result(report: &Value, check: &str) -> (String, String) {
    let x = report["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|x| x["check"] == check)
        .unwrap_or_else(|| panic!("no {check} in {report:#}"));
    (
        x["status"].as_str().unwrap_or("").to_owned(),
        x["message"].as_str().unwrap_or("").to_owned(),
    )
}

fn seed() -> String {
    rand::random::<u64>().to_string()
}

#[test]
fn both_fixtures_pass_check_against_the_stand_in() {
    let p = common::Plugins::new();
    for (src, lib) in [("net_cudart.c", "cudart"), ("net_cuda.c", "cuda")] {
        let plugin = fixture(&p, src, lib, &[]);
        let seed = seed();
        let r = cclkit(
            &[
                "check",
                &plugin,
                "--cuda-standin",
                "--json",
                "--jobs",
                "2",
                "--seed",
                &seed,
            ],
            standin(),
            &[],
        );
        let report = json(&r);
        let not_passed: Vec<String> = report["results"]
            .as_array()
            .expect("results")
            .iter()
            .filter(|x| x["status"] != "PASS")
            .map(|x| format!("{} {}: {}", x["check"], x["status"], x["message"]))
            .collect();
        assert!(
            not_passed.is_empty(),
            "{src} (seed {seed}): {not_passed:#?}\nstderr: {}",
            r.stderr
        );
        assert_eq!(r.code, 0, "{src}: {}", r.stderr);
        for check in [
            "init",
            "regmr",
            "sendrecv",
            "two-process",
            "cuda-regmr",
            "cuda-sendrecv",
            "cuda-flush",
        ] {
            assert_eq!(result(&report, check).0, "PASS", "{src}: {check}");
        }
        // JSON keeps stdout; the banner goes to stderr, before and after.
        let banners = r.stderr.matches("cclkit --cuda-standin").count();
        assert_eq!(banners, 2, "{src}: {}", r.stderr);
        assert!(r.stderr.contains(&standin().display().to_string()));
    }
}

#[test]
fn the_cuda_checks_catch_device_memory_bugs() {
    let p = common::Plugins::new();
    for (bug, check, needle) in [
        ("BUG_CUDA_RECV_DROPPED", "cuda-sendrecv", "device to device"),
        ("BUG_FLUSH_NEVER_DONE", "cuda-flush", "iflush request"),
    ] {
        let plugin = fixture(&p, "net_cudart.c", "cudart", &[bug]);
        let r = cclkit(
            &[
                "check",
                &plugin,
                "--cuda-standin",
                "--json",
                "--jobs",
                "2",
                "--timeout",
                "30",
            ],
            standin(),
            &[],
        );
        let report = json(&r);
        let (status, message) = result(&report, check);
        assert_eq!(status, "FAIL", "{bug}: {message}");
        assert!(message.contains(needle), "{bug}: {message}");
        assert_eq!(result(&report, "cuda-regmr").0, "PASS", "{bug}");
        assert_eq!(
            result(&report, "sendrecv").0,
            "PASS",
            "{bug}: host memory is unaffected"
        );
        assert_eq!(r.code, 1);
    }
}

#[test]
fn the_banner_frames_text_output() {
    let p = common::Plugins::new();
    let plugin = fixture(&p, "net_cuda.c", "cuda", &[]);
    let r = cclkit(
        &[
            "check",
            &plugin,
            "--cuda-standin",
            "--only",
            "init",
            "--jobs",
            "1",
        ],
        standin(),
        &[],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let lines: Vec<&str> = r.stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.contains("cclkit --cuda-standin")),
        "{}",
        r.stdout
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.contains("cclkit --cuda-standin")),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("PASS  net v12   init"), "{}", r.stdout);
}

/// Whether the system's loader cache has `lib` (a machine with CUDA installed).
fn system_has(lib: &str) -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{lib} ")))
        })
        .unwrap_or(false)
}

#[test]
fn without_the_stand_in_the_fixtures_fail_cleanly() {
    // On a machine with a CUDA driver the fixtures would find the real one: what
    // this test states ("fails cleanly without a GPU driver") does not apply there.
    if system_has("libcuda.so.1") || system_has("libcudart.so.12") {
        eprintln!("a CUDA driver or runtime is installed here: nothing to test without one");
        return;
    }
    let p = common::Plugins::new();
    let cudart = fixture(&p, "net_cudart.c", "cudart", &[]);
    let cuda = fixture(&p, "net_cuda.c", "cuda", &[]);
    // Nothing on the library path: the loader names the missing CUDA library.
    for (plugin, missing) in [(&cudart, "libcudart.so.12"), (&cuda, "libcuda.so.1")] {
        let r = cclkit(&["check", plugin, "--json", "--jobs", "2"], standin(), &[]);
        let report = json(&r);
        let (status, message) = result(&report, "init");
        assert_eq!(status, "FAIL", "{message}");
        assert!(message.contains(missing), "{message}");
        assert_ne!(r.code, 0);
        assert!(
            !r.stderr.contains("cclkit --cuda-standin"),
            "no banner when off"
        );
    }
    // The runtime without a driver (a machine with the CUDA toolkit but no GPU):
    // init fails with the plugin's own message, a skip unless devices are required.
    let runtime_only = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        standin().join("libcudart.so.12"),
        runtime_only.path().join("libcudart.so.12"),
    )
    .expect("copy the runtime");
    let ld = runtime_only.path().display().to_string();
    let env = [("LD_LIBRARY_PATH", ld.as_str())];
    let r = cclkit(
        &["check", &cudart, "--json", "--only", "init"],
        standin(),
        &env,
    );
    let (status, message) = result(&json(&r), "init");
    assert_eq!(status, "SKIP", "{message}");
    assert!(message.contains("no CUDA driver"), "{message}");
    let r = cclkit(
        &[
            "check",
            &cudart,
            "--json",
            "--only",
            "init",
            "--require-devices",
        ],
        standin(),
        &env,
    );
    let (status, message) = result(&json(&r), "init");
    assert_eq!(status, "FAIL", "{message}");
    assert!(message.contains("no CUDA driver"), "{message}");
    assert_eq!(r.code, 1);
}

#[test]
fn an_unimplemented_call_is_a_named_failure() {
    let p = common::Plugins::new();
    let plugin = fixture(&p, "net_cuda.c", "cuda", &["CALL_UNIMPLEMENTED"]);
    let r = cclkit(
        &[
            "check",
            &plugin,
            "--cuda-standin",
            "--json",
            "--only",
            "init",
        ],
        standin(),
        &[],
    );
    let (status, message) = result(&json(&r), "init");
    assert_eq!(
        status, "FAIL",
        "under the stand-in a failed init fails: {message}"
    );
    assert!(
        message.contains("cuMemGetAllocationGranularity is not implemented"),
        "{message}"
    );
    assert_eq!(r.code, 1);
}

#[test]
fn a_missing_stand_in_is_a_usage_error_that_says_how_to_build_it() {
    let p = common::Plugins::new();
    let plugin = fixture(&p, "net_cuda.c", "cuda", &[]);
    let empty = tempfile::tempdir().expect("tempdir");
    let r = cclkit(&["check", &plugin, "--cuda-standin"], empty.path(), &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("no CUDA stand-in found"), "{}", r.stderr);
    assert!(r.stderr.contains("make cuda-standin"), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
}

#[test]
fn trace_logs_every_call_and_info_runs_the_plugin_in_process() {
    let p = common::Plugins::new();
    let plugin = fixture(&p, "net_cudart.c", "cudart", &[]);
    let r = cclkit(
        &["info", &plugin, "--cuda-standin"],
        standin(),
        &[("CCLKIT_CUDA_STANDIN_TRACE", "1")],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    for call in [
        "libcudart: cudaDriverGetVersion()",
        "libcudart: cudaGetDeviceCount()",
        "libcuda: cuInit(flags=0)",
        "libcudart: cudaGetDriverEntryPoint(\"cuPointerGetAttributes\"",
        "libcuda: cuGetProcAddress_v2(\"cuMemGetAddressRange\"",
        "libcuda: cuDeviceGetAttribute(attr=116, dev=0) = 0",
    ] {
        assert!(r.stderr.contains(call), "no trace of {call}:\n{}", r.stderr);
    }
    assert!(r.stdout.contains("cclkit --cuda-standin"), "{}", r.stdout);
}

#[test]
fn the_stand_in_answers_as_documented() {
    // A program linked against both libraries (rpath to the stand-in), run with two
    // devices: tests/fixtures/cuda/standin_probe.c states every expectation.
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = dir.path().join("standin_probe");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let lib_dir = standin().display().to_string();
    let status = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(common::fixture("cuda/standin_probe.c"))
        .args([
            format!("-L{lib_dir}"),
            "-lcuda".into(),
            "-lcudart".into(),
            format!("-Wl,-rpath,{lib_dir}"),
        ])
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "compiling standin_probe.c failed");
    let out = Command::new(&exe)
        .env("CCLKIT_CUDA_STANDIN_DEVICES", "2")
        .env_remove("CCLKIT_CUDA_STANDIN_TRACE")
        .output()
        .expect("run the probe");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("ok: 0 failures"), "{stdout}");
    // Called twice, reported once, by name, with the error it returns.
    assert_eq!(
        stderr
            .matches("cuLaunchCooperativeKernel is not implemented by the stand-in: returning CUDA_ERROR_NOT_SUPPORTED (801)")
            .count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("cudaLaunchKernel is not implemented"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cuNoSuchCall (looked up by entry point)"),
        "{stderr}"
    );
}

#[test]
fn perf_ranks_and_doctor_see_the_stand_in() {
    let p = common::Plugins::new();
    let plugin = fixture(&p, "net_cudart.c", "cudart", &[]);
    // perf: the relaunched process starts the ranks, which inherit the library path
    // (the plugin's init would fail in a rank without it) and print no banner.
    let r = cclkit(
        &[
            "perf",
            "--cuda-standin",
            "--net",
            &plugin,
            "--np",
            "2",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "2",
            "-w",
            "1",
        ],
        standin(),
        &[],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("Out of bounds values : 0 OK"),
        "{}",
        r.stdout
    );
    assert_eq!(
        r.stdout.matches("cclkit --cuda-standin").count(),
        2,
        "{}",
        r.stdout
    );
    // doctor: the stand-in's device is the GPU its GDR decision is about.
    let no_mps = standin().join("no-mps-here");
    let r = cclkit(
        &["doctor", "--cuda-standin", "--net", &plugin, "--json"],
        standin(),
        &[(
            "CUDA_MPS_PIPE_DIRECTORY",
            no_mps.to_str().unwrap_or("/nonexistent"),
        )],
    );
    let report = json(&r);
    let gpu = report["gpu"]["decisions"][0]["gpu"].as_str().unwrap_or("");
    assert!(
        gpu.contains("cclkit CUDA stand-in") && gpu.contains("0000:18:00.0"),
        "{report:#}"
    );
    // The stand-in says compute capability 9.0: the kernels would come from the
    // sm_90 PTX; and no MPS daemon answers in a pipe directory that does not exist.
    assert!(gpu.contains("sm_90, sm_90 PTX"), "{report:#}");
    let summary = report["gpu"]["summary"].as_str().unwrap_or("");
    assert!(
        summary.ends_with("; no CUDA MPS control daemon found (ranks sharing a GPU time-slice it)"),
        "{report:#}"
    );
    assert_eq!(
        r.stderr.matches("cclkit --cuda-standin").count(),
        2,
        "{}",
        r.stderr
    );
}
