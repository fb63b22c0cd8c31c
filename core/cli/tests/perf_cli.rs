//! `cclkit perf` as users run it: `--np N` local ranks over the built-in socket
//! transport, nccl-tests' text format, the data check, `--json`, and clear errors.
//! Every run is bounded: the launcher's process group is killed after 120 s.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

/// Runs `cclkit perf ARGS` (built-in transport, bounded timeouts); kills the whole
/// process group (the launcher and its ranks) if it takes over 120 s.
fn perf(args: &[&str]) -> Output {
    perf_env(args, &[])
}

/// [`perf`] with extra environment variables.
fn perf_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.arg("perf")
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("NCCL_NET_PLUGIN", "none")
        .env("NCCL_TUNER_PLUGIN", "none")
        .env("CCLKIT_OP_TIMEOUT", "60")
        .env("CCLKIT_BOOTSTRAP_TIMEOUT", "60");
    common::run_bounded(cmd, Duration::from_secs(120))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One parsed result row.
#[derive(Debug)]
struct Row {
    size: u64,
    count: u64,
    dtype: String,
    redop: String,
    root: i64,
    /// (time µs, algbw, busbw, #wrong) out of place, then in place.
    m: [(f64, f64, f64, String); 2],
}

/// The rows of one `Collective test starting: NAME` section.
fn section(out: &str, name: &str) -> Vec<Row> {
    let start = format!("# Collective test starting: {name}");
    let body = out
        .split(&start)
        .nth(1)
        .unwrap_or_else(|| panic!("no section {name} in:\n{out}"));
    let body = body
        .split("# Collective test concluded")
        .next()
        .unwrap_or("");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 13, "13 columns in {l:?}");
            let m = |i: usize| {
                (
                    f[i].parse::<f64>().unwrap(),
                    f[i + 1].parse::<f64>().unwrap(),
                    f[i + 2].parse::<f64>().unwrap(),
                    f[i + 3].to_string(),
                )
            };
            Row {
                size: f[0].parse().unwrap(),
                count: f[1].parse().unwrap(),
                dtype: f[2].into(),
                redop: f[3].into(),
                root: f[4].parse().unwrap(),
                m: [m(5), m(9)],
            }
        })
        .collect()
}

#[test]
fn all_reduce_on_two_ranks_prints_nccl_tests_format() {
    let out = perf(&[
        "--np", "2", "-b", "8", "-e", "4K", "-f", "4", "-n", "3", "-w", "1",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for needle in [
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 4096 step: 4(factor) warmup iters: 1 iters: 3 agg iters: 1 validation: 1 graph: 0",
        "# Using devices",
        "# Collective test starting: all_reduce_perf",
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
        "# Out of bounds values : 0 OK",
        "# Collective test concluded: all_reduce_perf",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
    // One device line per rank naming the transport and the tuner.
    for r in 0..2 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("#  Rank {r:>2} Group  0 Pid")))
            .unwrap_or_else(|| panic!("no device line for rank {r}:\n{stdout}"));
        assert!(line.contains("net 'cclkit-socket' v12"), "{line}");
        assert!(line.contains("tuner 'built-in cost model'"), "{line}");
    }
    let rows = section(&stdout, "all_reduce_perf");
    let sizes: Vec<u64> = rows.iter().map(|r| r.size).collect();
    assert_eq!(sizes, [8, 32, 128, 512, 2048]);
    let mut busbw = Vec::new();
    for r in &rows {
        assert_eq!(r.count, r.size / 4);
        assert_eq!(
            (r.dtype.as_str(), r.redop.as_str(), r.root),
            ("float", "sum", -1)
        );
        for (t, alg, bus, wrong) in &r.m {
            assert_eq!(wrong, "0", "{r:?}");
            assert!(*t > 0.0, "{r:?}");
            // algbw = size / time (GB/s from bytes and µs); busbw = algbw × 2(n-1)/n = algbw.
            let want = r.size as f64 / t / 1e3;
            assert!((alg - want).abs() <= 0.006 + want * 0.01, "{r:?}");
            assert!((bus - alg).abs() <= 0.011, "{r:?}");
            busbw.push(*bus);
        }
    }
    let avg = stdout
        .lines()
        .find_map(|l| l.strip_prefix("# Avg bus bandwidth    : "))
        .unwrap_or_else(|| panic!("no average line:\n{stdout}"));
    let avg: f64 = avg.trim().parse().unwrap();
    let mean = busbw.iter().sum::<f64>() / busbw.len() as f64;
    assert!((avg - mean).abs() <= 0.01, "avg {avg} vs rows {mean}");
}

#[test]
fn several_collectives_on_three_ranks_check_clean() {
    let out = perf(&[
        "--np",
        "3",
        "--coll",
        "all_gather,broadcast,reduce_scatter,alltoall,gather,scatter,sendrecv",
        "-d",
        "int32",
        "-b",
        "96",
        "-e",
        "9600",
        "-f",
        "10",
        "-n",
        "2",
        "-r",
        "2",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for (name, per_rank_divided, rooted, redop) in [
        ("all_gather_perf", true, false, "none"),
        ("broadcast_perf", false, true, "none"),
        ("reduce_scatter_perf", true, false, "sum"),
        ("alltoall_perf", true, false, "none"),
        ("gather_perf", true, true, "none"),
        ("scatter_perf", true, true, "none"),
        ("sendrecv_perf", false, false, "none"),
    ] {
        let rows = section(&stdout, name);
        assert_eq!(rows.len(), 3, "{name}: 96, 960, 9600");
        for r in &rows {
            assert_eq!(r.redop, redop, "{name} {r:?}");
            assert_eq!(r.root, if rooted { 2 } else { -1 }, "{name} {r:?}");
            assert!(r.m.iter().all(|m| m.3 == "0"), "{name} {r:?}");
            if per_rank_divided {
                // count = requested/3 rounded down to 4 int32 (16 bytes); size = 3 × count × 4.
                let req = [96u64, 960, 9600]
                    .into_iter()
                    .find(|q| (q / 4 / 3) / 4 * 4 == r.count)
                    .unwrap_or_else(|| panic!("{name}: odd count {r:?}"));
                assert_eq!(r.size, 3 * r.count * 4, "{name} {r:?} (requested {req})");
            } else {
                assert_eq!(r.size, r.count * 4, "{name} {r:?}");
            }
        }
    }
    assert_eq!(stdout.matches("# Out of bounds values : 0 OK").count(), 7);
}

#[test]
fn every_type_op_and_root_of_reduce_checks_clean() {
    let out = perf(&[
        "--np", "3", "--coll", "reduce", "-d", "all", "-o", "all", "-r", "all", "-b", "64", "-e",
        "640", "-f", "10", "-n", "1", "-w", "0", "-c", "2",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let rows = section(&stdout, "reduce_perf");
    // 12 types × 5 ops × 3 roots × 2 sizes.
    assert_eq!(rows.len(), 12 * 5 * 3 * 2);
    assert!(rows.iter().all(|r| r.m.iter().all(|m| m.3 == "0")));
    assert!(
        rows.iter()
            .any(|r| r.dtype == "f8e5m2" && r.redop == "avg" && r.root == 1)
    );
}

#[test]
fn json_report_parses_and_no_check_shows_na() {
    let out = perf(&[
        "--np", "2", "-b", "1K", "-e", "2K", "-f", "2", "-n", "2", "-c", "0", "--json",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("stdout is one JSON report");
    assert_eq!(v["config"]["nranks"], 2);
    assert_eq!(v["devices"].as_array().unwrap().len(), 2);
    let t = &v["tests"][0];
    assert_eq!(t["name"], "all_reduce_perf");
    let rows = t["results"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        for place in ["out_of_place", "in_place"] {
            assert!(r[place]["time"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r[place]["nwrong"].is_null(), "-c 0: not checked: {r}");
            assert!(r[place]["algo"].is_string(), "{r}");
        }
    }
    // To a file: the table still goes to stdout, with N/A in #wrong.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    let p = path.to_str().unwrap();
    let out = perf(&[
        "--np", "2", "-b", "1K", "-e", "1K", "-n", "2", "-c", "0", "--json", p,
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let rows = section(&stdout, "all_reduce_perf");
    assert_eq!(rows[0].m[0].3, "N/A");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["tests"][0]["results"][0]["size"], 1024);
}

#[test]
fn progress_goes_to_stderr_only() {
    let out = perf(&["-b", "8", "-e", "64", "-f", "8", "-n", "1", "--progress"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("cclkit perf: all_reduce float sum 8 B [1/2]"),
        "{stderr}"
    );
    assert!(stderr.contains("[2/2]"), "{stderr}");
    assert!(!stdout.contains("cclkit perf: all_reduce"), "{stdout}");
    // One rank without a launcher: sizes 8 and 64 only.
    assert_eq!(section(&stdout, "all_reduce_perf").len(), 2);
}

#[test]
fn bad_flags_are_clear_errors() {
    for (args, needle) in [
        (&["-d", "float128"][..], "unknown data type 'float128'"),
        (&["-o", "xor"][..], "unknown op 'xor'"),
        (
            &["--coll", "allgatherx"][..],
            "unknown collective 'allgatherx'",
        ),
        (&["-b", "1Q"][..], "unknown size suffix 'Q'"),
        (&["-b", "64", "-e", "8"][..], "smaller than the minimum"),
        (&["-n", "0"][..], "-n/--iters must be at least 1"),
        (&["--frobnicate"][..], "--frobnicate"),
        (&["-o", "mulsum"][..], "PreMulSum"),
    ] {
        let out = perf(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: want {needle:?} in {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
    // A root that is not a rank is found once the ranks are known.
    let out = perf(&[
        "--np",
        "2",
        "--coll",
        "broadcast",
        "-r",
        "5",
        "-b",
        "8",
        "-e",
        "8",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("root 5 is not a rank (there are 2)"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn halving_doubling_all_reduce_checks_clean_in_pieces() {
    // PAT at or above one slice is recursive halving then doubling; 64 KiB buffers
    // make slices of 16 KiB and pieces of 32 KiB, so every step is cut in several.
    for np in ["4", "6"] {
        let out = perf_env(
            &[
                "--np",
                np,
                "-b",
                "100K",
                "-e",
                "400K",
                "-f",
                "4",
                "-n",
                "1",
                "-w",
                "0",
                "-c",
                "1",
                "-d",
                "float,int64,bfloat16",
                "-o",
                "sum,avg,max",
                "--json",
            ],
            &[("NCCL_ALGO", "pat"), ("NCCL_BUFFSIZE", "65536")],
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let rows = v["tests"][0]["results"].as_array().unwrap();
        assert_eq!(rows.len(), 3 * 3 * 2, "np {np}");
        for r in rows {
            for place in ["out_of_place", "in_place"] {
                assert_eq!(r[place]["nwrong"], 0, "np {np}: {r}");
                assert_eq!(r[place]["algo"], "PAT", "np {np}: {r}");
            }
        }
    }
}

#[test]
fn recursive_doubling_all_reduce_checks_clean_on_odd_rank_counts() {
    // PAT (recursive doubling, with the ranks beyond a power of two folded in and
    // served last) for every type and op, in and out of place, on 3 and 5 ranks.
    for np in ["3", "5"] {
        let out = perf_env(
            &[
                "--np", np, "-b", "40", "-e", "4000", "-f", "10", "-n", "1", "-w", "0", "-c", "2",
                "-d", "all", "-o", "all", "--json",
            ],
            &[("NCCL_ALGO", "pat")],
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let rows = v["tests"][0]["results"].as_array().unwrap();
        assert_eq!(rows.len(), 12 * 5 * 3, "np {np}");
        for r in rows {
            for place in ["out_of_place", "in_place"] {
                assert_eq!(r[place]["nwrong"], 0, "np {np}: {r}");
                assert_eq!(r[place]["algo"], "PAT", "np {np}: {r}");
            }
        }
    }
}
