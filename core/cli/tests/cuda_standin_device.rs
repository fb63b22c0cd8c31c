//! `cclkit perf --device cuda --cuda-standin`: the runtime's CUDA device path end to
//! end on the host-memory CUDA stand-in (kernels/cuda-standin/), whose libcuda runs
//! cclkit's own kernels (kernels/cuda/cclkit_kernels.ptx, loaded through the driver
//! API) as their host build. Every collective must check out exactly; with a
//! CUDA-linked plugin the GDR rule decides between regMr(NCCL_PTR_CUDA) with
//! iflush and host staging, which the fixtures' counters show.

mod common;

use std::process::Command;
use std::time::Duration;

/// Limit of one `cclkit perf` run (its operations time out after 60 s each).
const LIMIT: Duration = Duration::from_secs(240);

use common::standin::{fixture, standin};

struct Run {
    stdout: String,
    stderr: String,
}

/// `cclkit perf --device cuda --cuda-standin ARGS` with `env`, checked to succeed.
fn perf(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args(["perf", "--device", "cuda", "--cuda-standin", "-T", "60"])
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("CCLKIT_DEVICE")
        .env_remove("CCLKIT_CUDA_EMULATE")
        .env_remove("CCLKIT_CUDA_STANDIN_ACTIVE")
        .env_remove("CCLKIT_CUDA_STANDIN_TRACE")
        .env_remove("CCLKIT_CUDA_STANDIN_THREADS")
        .env_remove("CUDA_FIXTURE_COUNTERS")
        .env_remove("NCCL_NET_GDR_LEVEL")
        .env_remove("NCCL_NET_GDR_READ")
        .env_remove("NCCL_NET_FORCE_FLUSH")
        .env_remove("NCCL_GDR_FLUSH_DISABLE")
        .env_remove("NCCL_DEBUG")
        .env("CCLKIT_CUDA_STANDIN_DIR", standin())
        .envs(env.iter().copied());
    let out = common::run_bounded(cmd, LIMIT);
    let run = Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        out.status.success(),
        "perf {args:?} {env:?} failed:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    run
}

/// Checks that every collective of `--coll all` ran and that every row of the table
/// has 0 in both `#wrong` columns (out of place, in place); returns the rows.
fn assert_exact(r: &Run, what: &str) -> usize {
    let rows: Vec<Vec<&str>> = r
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.first().is_some_and(|x| x.parse::<u64>().is_ok()))
        .collect();
    assert!(!rows.is_empty(), "{what}: no rows\n{}", r.stdout);
    for w in &rows {
        assert!(
            w.len() == 13 && w[8] == "0" && w[12] == "0",
            "{what}: a row with wrong elements: {w:?}\n{}",
            r.stdout
        );
    }
    for coll in [
        "all_reduce",
        "all_gather",
        "broadcast",
        "reduce",
        "reduce_scatter",
        "alltoall",
        "gather",
        "scatter",
        "sendrecv",
    ] {
        assert!(
            r.stdout
                .contains(&format!("Collective test concluded: {coll}_perf")),
            "{what}: {coll} did not run\n{}",
            r.stdout
        );
    }
    assert_eq!(
        r.stdout.matches("# Out of bounds values : 0 OK").count(),
        9,
        "{what}\n{}",
        r.stdout
    );
    rows.len()
}

#[test]
fn every_collective_is_exact_on_two_and_three_ranks() {
    // Odd sizes; three ranks with a non-zero root and one emulated thread per launch
    // (the kernels' grid-stride loops then run every element in one thread).
    for (np, root, threads) in [("2", "0", "4096"), ("3", "2", "1")] {
        let r = perf(
            &[
                "--np",
                np,
                "-r",
                root,
                "-b",
                "1001",
                "-e",
                "40K",
                "-f",
                "6",
                "-n",
                "1",
                "-w",
                "0",
                "--coll",
                "all",
                "-d",
                "int8,int32,float,bfloat16",
                "-o",
                "sum,avg,min",
            ],
            &[
                ("NCCL_NET_PLUGIN", "none"),
                ("CCLKIT_CUDA_STANDIN_TRACE", "1"),
                ("CCLKIT_CUDA_STANDIN_THREADS", threads),
            ],
        );
        let what = format!("--np {np}");
        let rows = assert_exact(&r, &what);
        assert!(rows >= 9 * 3, "{what}: {rows} rows\n{}", r.stdout);
        // The device path ran through the stand-in's driver: cclkit's module loaded
        // in every rank, its kernels launched (reductions and copies), nothing missing.
        let np: usize = np.parse().expect("np");
        assert!(
            r.stderr
                .matches("cuModuleLoadData: cclkit's kernels, 73 entries")
                .count()
                >= np,
            "{what}: {}",
            r.stderr
        );
        for kernel in [
            "cclkit_copy",
            "cclkit_sum_i8",
            "cclkit_sumpostdiv_i32",
            "cclkit_premulsum_f32",
            "cclkit_min_bf16",
        ] {
            assert!(
                r.stderr
                    .contains(&format!("cuLaunchKernel({kernel}, grid=")),
                "{what}: {kernel} never launched"
            );
        }
        if threads == "1" {
            assert!(
                r.stderr.contains("on the host as 1 threads"),
                "{what}: CCLKIT_CUDA_STANDIN_THREADS=1 not applied"
            );
        }
        assert!(
            !r.stderr.contains("is not implemented"),
            "{what}: {}",
            r.stderr
        );
        assert_eq!(r.stdout.matches("cclkit --cuda-standin").count(), 2);
    }
}

/// The fixture counters of the ranks that registered memory:
/// (regMr(NCCL_PTR_CUDA), regMr(NCCL_PTR_HOST), iflush(device)) per rank.
fn counters(stderr: &str) -> Vec<(u64, u64, u64)> {
    let num = |line: &str, key: &str| -> u64 {
        line.split(key)
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    stderr
        .lines()
        .filter(|l| l.contains(" counters: regMr("))
        .map(|l| {
            (
                num(l, "regMr(NCCL_PTR_CUDA)="),
                num(l, "regMr(NCCL_PTR_HOST)="),
                num(l, "iflush(device)="),
            )
        })
        .filter(|&(c, h, _)| c + h > 0)
        .collect()
}

#[test]
fn a_cuda_plugin_gets_the_memory_the_gdr_rule_decides() {
    let p = common::Plugins::new();
    let cuda = fixture(&p, "net_cuda.c", "cuda", &[]);
    let cudart_flush = fixture(&p, "net_cudart.c", "cudart", &["FORCE_FLUSH=1"]);
    // A PCI path is unknown (the fixtures report no pciPath), so the GPU-NIC distance is SYS:
    // beyond NCCL's default NCCL_NET_GDR_LEVEL (PXB), within NCCL_NET_GDR_LEVEL=SYS.
    // It is compute capability 9.0: no flush unless the plugin or NCCL_NET_FORCE_FLUSH
    // asks. `expect` sees (regMr(CUDA), regMr(HOST), device iflushes) of one rank.
    struct Case<'a> {
        what: &'a str,
        plugin: &'a str,
        env: &'a [(&'a str, &'a str)],
        expect: fn(u64, u64, u64) -> bool,
    }
    let cases = [
        Case {
            what: "net_cuda default: host staging",
            plugin: &cuda,
            env: &[],
            expect: |c, h, f| c == 0 && h > 0 && f == 0,
        },
        Case {
            what: "net_cuda GDR, sm_90: no flush",
            plugin: &cuda,
            env: &[("NCCL_NET_GDR_LEVEL", "SYS")],
            expect: |c, h, f| c > 0 && h == 0 && f == 0,
        },
        Case {
            what: "net_cuda GDR, NCCL_NET_FORCE_FLUSH=1",
            plugin: &cuda,
            env: &[("NCCL_NET_GDR_LEVEL", "SYS"), ("NCCL_NET_FORCE_FLUSH", "1")],
            expect: |c, h, f| c > 0 && h == 0 && f > 0,
        },
        Case {
            what: "net_cudart forceFlush, GDR for receives only",
            plugin: &cudart_flush,
            env: &[("NCCL_NET_GDR_LEVEL", "5"), ("NCCL_NET_GDR_READ", "0")],
            expect: |c, h, f| c > 0 && h > 0 && f > 0,
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let Case {
            what,
            plugin,
            env,
            expect,
        } = case;
        let np = if i == 2 { "3" } else { "2" };
        let mut env = env.to_vec();
        env.push(("CUDA_FIXTURE_COUNTERS", "1"));
        let r = perf(
            &[
                "--net",
                plugin,
                "--np",
                np,
                "-b",
                "999",
                "-e",
                "24K",
                "-f",
                "5",
                "-n",
                "1",
                "-w",
                "0",
                "--coll",
                "all",
                "-d",
                "int32,float",
                "-o",
                "sum,max",
            ],
            &env,
        );
        assert_exact(&r, what);
        let per_rank = counters(&r.stderr);
        assert_eq!(
            per_rank.len().to_string(),
            np,
            "{what}: one counter line per rank: {per_rank:?}\n{}",
            r.stderr
        );
        for &(c, h, f) in &per_rank {
            assert!(
                expect(c, h, f),
                "{what}: regMr(CUDA)={c} regMr(HOST)={h} iflush={f}\n{}",
                r.stderr
            );
        }
    }
}

#[test]
fn modules_and_launches_fail_as_a_gpu_would() {
    // tests/fixtures/cuda/module_probe.c states every expectation: cclkit's PTX loads
    // and its kernels give exact results on random data; foreign modules, faulting
    // pointers and launch shapes the kernels cannot take are named failures.
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = dir.path().join("module_probe");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let lib_dir = standin().display().to_string();
    let status = Command::new(&cc)
        .args([
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-ffp-contract=off",
            "-o",
        ])
        .arg(&exe)
        .arg(common::fixture("cuda/module_probe.c"))
        .args([
            format!("-L{lib_dir}"),
            "-lcuda".into(),
            format!("-Wl,-rpath,{lib_dir}"),
        ])
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "compiling module_probe.c failed");
    let seed = rand::random::<u64>().to_string();
    let ptx = cclkit_tests::cplugin::workspace().join("kernels/cuda/cclkit_kernels.ptx");
    let mut cmd = Command::new(&exe);
    cmd.arg(&ptx)
        .arg(&seed)
        .env_remove("CCLKIT_CUDA_STANDIN_TRACE");
    let out = common::run_bounded(cmd, Duration::from_secs(60));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "seed {seed}\n{stdout}\n{stderr}");
    assert!(stdout.contains("ok: 0 failures"), "seed {seed}\n{stdout}");
    for reason in [
        "PTX without the `make ptx` header",
        "entry cclkit_evil is not one of cclkit's kernels",
        "entry cclkit_copy takes 2 parameters; the host kernel decodes 3",
        "entry cclkit_copy takes 3 parameters (not all .u64)",
        "no .entry at all",
        "a cubin (ELF) image",
    ] {
        assert!(
            stderr.contains(&format!("this module is not cclkit's kernels ({reason}")),
            "{reason}:\n{stderr}"
        );
    }
    for fault in [
        "parameter 0 (dst)",
        "is not inside one CUDA allocation or registration: returning CUDA_ERROR_ILLEGAL_ADDRESS (700)",
        "parameter 1 (a)",
        "is not aligned to its 4-byte elements: returning CUDA_ERROR_MISALIGNED_ADDRESS (716)",
        "cuLaunchKernel with a y or z grid or block dimension is not implemented",
    ] {
        assert!(stderr.contains(fault), "{fault}:\n{stderr}");
    }
}
