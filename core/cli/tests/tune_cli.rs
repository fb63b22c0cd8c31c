//! `cclkit tune show|auto|diff` end to end, through the built binary.
//!
//! Needs the packaged Rust tuners (`make package`, or `CCLKIT_LIB_DIR` pointing at a
//! directory with `libnccl-tuner-cclkit.so` and `libnccl-tuner-template.so`) and a C
//! compiler. Every run of the binary is bounded: past its limit the whole process
//! group (the launcher and its ranks) is killed and the test fails.

mod common;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::Func;
use cclkit_tuner::config::{self, Format, Query};
use common::{Plugins, rust_plugin, s};
use serde_json::Value;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Variables that would change what the binary does, removed from every run.
const SCRUB: [&str; 9] = [
    "CCLKIT_UNIQUE_ID",
    "CCLKIT_RANK",
    "CCLKIT_NRANKS",
    "NCCL_TUNER_PLUGIN",
    "NCCL_TUNER_CONFIG_FILE",
    "CCLKIT_TUNER_MODE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "CCLKIT_STRICT",
];

/// Runs `cclkit args` with `env`, killing its process group after `limit`.
fn cclkit(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    for v in SCRUB {
        cmd.env_remove(v);
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .env("CCLKIT_OP_TIMEOUT", "60")
        .env("CCLKIT_BOOTSTRAP_TIMEOUT", "60")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().expect("start cclkit");
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = pipe(Box::new(child.stdout.take().expect("stdout")));
    let err = pipe(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let pgid = i32::try_from(child.id()).expect("pid");
            // SAFETY: signals the process group this test created for the child.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let _ = child.wait();
            panic!(
                "cclkit {args:?} ran past {limit:?}\n--- stdout\n{}--- stderr\n{}",
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The launcher's ranks are gone when it exits; a stray one would keep the pipes
    // open, so make sure nothing of the group is left.
    let pgid = i32::try_from(child.id()).expect("pid");
    // SAFETY: as above; the group may already be empty (ESRCH).
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    Run {
        code: status.code(),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

const SHORT: Duration = Duration::from_secs(60);
const RANKS: Duration = Duration::from_secs(120);

fn json(r: &Run) -> Value {
    assert_eq!(r.code, Some(0), "{r}");
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("JSON: {e}\n{r}"))
}

/// `(algo/proto/channels, source, changed)` of the cell for `coll` and `bytes`.
fn cell(t: &Value, coll: &str, bytes: u64) -> (String, String, bool) {
    let c = t["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .find(|c| c["collective"] == coll && c["bytes"] == bytes)
        .unwrap_or_else(|| panic!("no cell {coll} {bytes} in {t}"));
    let d = &c["decision"];
    (
        format!(
            "{}/{}/{}",
            d["algo"].as_str().expect("algo"),
            d["proto"].as_str().expect("proto"),
            d["channels"]
        ),
        d["source"].as_str().expect("source").to_owned(),
        c["changed"].as_bool().expect("changed"),
    )
}

fn builtin(t: &Value, coll: &str, bytes: u64) -> String {
    let c = t["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .find(|c| c["collective"] == coll && c["bytes"] == bytes)
        .expect("cell");
    let b = &c["builtin"];
    format!(
        "{}/{}/{}",
        b["algo"].as_str().unwrap_or("?"),
        b["proto"].as_str().unwrap_or("?"),
        b["channels"]
    )
}

#[test]
fn show_template_tuner_switches_at_its_threshold() {
    let lib = s(&rust_plugin("libnccl-tuner-template.so"));
    let args = [
        "tune",
        "show",
        "--tuner",
        &lib,
        "-b",
        "1K",
        "-e",
        "16K",
        "-f",
        "2",
        "--colls",
        "allreduce,broadcast",
        "--json",
    ];
    let t = json(&cclkit(
        &args,
        &[("CCLKIT_TEMPLATE_THRESHOLD", "4096")],
        SHORT,
    ));
    assert!(
        t["tuner"].as_str().unwrap().starts_with("TemplateTuner v6"),
        "{t}"
    );
    for b in [1024, 2048] {
        assert_eq!(
            cell(&t, "allreduce", b),
            ("tree/ll/1".into(), "tuner".into(), true)
        );
        // Tree is not offered for broadcast: the template leaves the table alone.
        let (d, _, changed) = cell(&t, "broadcast", b);
        assert_eq!((d, changed), (builtin(&t, "broadcast", b), false));
    }
    for b in [4096, 8192, 16384] {
        for coll in ["allreduce", "broadcast"] {
            assert_eq!(cell(&t, coll, b).0, "ring/simple/1", "{coll} {b}");
        }
    }
    // The text table marks what the tuner changed.
    let txt = cclkit(
        &args[..args.len() - 1],
        &[("CCLKIT_TEMPLATE_THRESHOLD", "4096")],
        SHORT,
    );
    assert_eq!(txt.code, Some(0), "{txt}");
    assert!(txt.stdout.contains("tree/ll/1*"), "{txt}");
    assert!(
        txt.stdout
            .lines()
            .any(|l| l.trim_start().starts_with("16K")),
        "{txt}"
    );
}

const RULES: &str = "\
# steering by size
allreduce,0,8191,ring,ll,1,-1,-1
allreduce,8192,-1,tree,simple,2,-1,-1
allgather,0,-1,ring,ll128,2,-1,8
";

#[test]
fn show_cclkit_tuner_follows_its_rule_file_and_config_shows_the_same() {
    let dir = tempfile::tempdir().expect("tmp");
    let rules = dir.path().join("rules.conf");
    std::fs::write(&rules, RULES).expect("write");
    let lib = s(&rust_plugin("libnccl-tuner-cclkit.so"));
    let common = [
        "-b",
        "4K",
        "-e",
        "64K",
        "-f",
        "2",
        "--colls",
        "allreduce,allgather",
        "--json",
    ];
    let mut by_lib = vec!["tune", "show", "--tuner", &lib];
    by_lib.extend(common);
    let a = json(&cclkit(
        &by_lib,
        &[("NCCL_TUNER_CONFIG_FILE", &s(&rules))],
        SHORT,
    ));
    let rules_s = s(&rules);
    let mut by_file = vec!["tune", "show", "--config", &rules_s];
    by_file.extend(common);
    let b = json(&cclkit(&by_file, &[], SHORT));
    assert!(
        a["chunk_size"].as_bool().unwrap(),
        "cclkit's tuner has getChunkSize: {a}"
    );
    assert!(
        b["tuner"].as_str().unwrap().contains("3 rule(s) from"),
        "{b}"
    );
    for t in [&a, &b] {
        // The rule decides 4K (the built-in model would run PAT/Simple there).
        assert_eq!(
            cell(t, "allreduce", 4096),
            ("ring/ll/1".into(), "tuner".into(), true)
        );
        assert_eq!(
            cell(t, "allreduce", 8192),
            ("tree/simple/2".into(), "tuner".into(), true)
        );
        assert_eq!(cell(t, "allreduce", 65536).0, "tree/simple/2");
        // Eight ranks: the allgather rule holds.
        assert_eq!(cell(t, "allgather", 16384).0, "ring/ll128/2");
    }
    assert_eq!(
        a["cells"], b["cells"],
        "the linked-in tuner and the library differ"
    );
    // Another communicator size: the allgather rule no longer holds.
    let mut other = by_file.clone();
    other.extend(["--nranks", "4"]);
    let c = json(&cclkit(&other, &[], SHORT));
    assert_ne!(cell(&c, "allgather", 16384).0, "ring/ll128/2", "{c}");
}

#[test]
fn show_drives_every_tuner_abi_version_of_a_c_tuner() {
    let p = Plugins::new();
    for v in 1..=6 {
        let lib = p.tuner(&format!("mock{v}.so"), v, &[]);
        let lib_s = s(&lib);
        let args = [
            "tune", "show", "--tuner", &lib_s, "-b", "1K", "-e", "1M", "-f", "32", "--json",
        ];
        let t = json(&cclkit(&args, &[], SHORT));
        let label = t["tuner"].as_str().unwrap();
        assert!(
            label.starts_with(&format!("MockTuner v{v} (ncclTunerPlugin_v{v})")),
            "{label}"
        );
        // The mock selects RING/SIMPLE and asks for 4 channels (clamped to the 2 the
        // communicator has); its v6 getChunkSize answers 64 KiB.
        for c in t["cells"].as_array().unwrap() {
            let d = &c["decision"];
            assert_eq!(
                (
                    d["algo"].as_str(),
                    d["proto"].as_str(),
                    d["channels"].as_u64()
                ),
                (Some("ring"), Some("simple"), Some(2)),
                "v{v}: {c}"
            );
            assert_eq!(d["source"], "tuner", "v{v}: {c}");
            if v == 6 {
                assert_eq!(d["chunk"], 65536, "{c}");
            }
        }
        assert_eq!(t["chunk_size"].as_bool(), Some(v == 6));
    }
    // A tuner that writes past the table: every call falls back, loudly.
    let bad = s(&p.tuner("overrun.so", 4, &["TABLE_OVERRUN"]));
    let r = cclkit(
        &[
            "tune",
            "show",
            "--tuner",
            &bad,
            "-b",
            "1K",
            "-e",
            "4K",
            "-f",
            "4",
            "--colls",
            "allreduce",
        ],
        &[],
        SHORT,
    );
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.stdout.contains("the tuner failed 2 time(s)"), "{r}");
    assert!(r.stdout.contains('!'), "{r}");
    // Not a tuner at all.
    let r = cclkit(
        &["tune", "show", "--tuner", "/nonexistent/libx.so"],
        &[],
        SHORT,
    );
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stderr.contains("/nonexistent/libx.so"), "{r}");
}

/// The shape of NVIDIA's example tuner: v4 table, `float (*)[NCCL_NUM_PROTOCOLS]`
/// view of the cost table, `*nChannels = 1` before deciding.
const EXAMPLE_STYLE: &str = r#"
#include <stddef.h>
typedef int ncclResult_t;
typedef void (*ncclDebugLogger_t)(int, unsigned long, const char *, int, const char *, ...);
#define NCCL_NUM_PROTOCOLS 3
#define NCCL_ALGO_RING 1
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_SIMPLE 2
#define NCCL_ALGO_PROTO_IGNORE -1.0
typedef struct {
  const char *name;
  ncclResult_t (*init)(size_t, size_t, ncclDebugLogger_t, void **);
  ncclResult_t (*getCollInfo)(void *, int, size_t, int, float **, int, int, int, int *);
  ncclResult_t (*destroy)(void *);
} ncclTuner_v4_t;
static int ctx;
static ncclResult_t init(size_t r, size_t n, ncclDebugLogger_t l, void **c) {
  (void)r; (void)n; (void)l; *c = &ctx; return 0;
}
static ncclResult_t get(void *c, int coll, size_t nBytes, int pipe, float **costTable,
                        int numAlgo, int numProto, int regBuff, int *nChannels) {
  (void)c; (void)coll; (void)pipe; (void)numAlgo; (void)numProto; (void)regBuff;
  float (*table)[NCCL_NUM_PROTOCOLS] = (float (*)[NCCL_NUM_PROTOCOLS])costTable;
  *nChannels = 1;
  int proto = nBytes <= 16384 ? NCCL_PROTO_LL : NCCL_PROTO_SIMPLE;
  if (table[NCCL_ALGO_RING][proto] != NCCL_ALGO_PROTO_IGNORE) {
    table[NCCL_ALGO_RING][proto] = 0.0;
    if (proto == NCCL_PROTO_SIMPLE) *nChannels = 2;
  }
  return 0;
}
static ncclResult_t destroy(void *c) { (void)c; return 0; }
const ncclTuner_v4_t ncclTunerPlugin_v4 = {"ExampleStyle", init, get, destroy};
"#;

#[test]
fn show_c_tuner_in_the_style_of_nvidias_example() {
    let p = Plugins::new();
    let lib = s(&p.c_source("example.so", EXAMPLE_STYLE, &[]));
    let args = [
        "tune", "show", "--tuner", &lib, "-b", "4K", "-e", "1M", "-f", "4", "--json",
    ];
    let t = json(&cclkit(&args, &[], SHORT));
    assert!(
        t["tuner"].as_str().unwrap().starts_with("ExampleStyle v4"),
        "{t}"
    );
    for coll in [
        "broadcast",
        "reduce",
        "allgather",
        "reducescatter",
        "allreduce",
    ] {
        assert_eq!(cell(&t, coll, 4096).0, "ring/ll/1", "{coll}");
        assert_eq!(cell(&t, coll, 16384).0, "ring/ll/1", "{coll}");
        assert_eq!(cell(&t, coll, 65536).0, "ring/simple/2", "{coll}");
        assert_eq!(cell(&t, coll, 1 << 20).0, "ring/simple/2", "{coll}");
    }
}

/// Every rule line as NVIDIA's example reads it: 8 to 10 fields, known names in
/// lower case, plain decimal integers, `-1` only as a wildcard or the largest size.
fn assert_nvidia_csv(text: &str) {
    let mut rules = 0;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        rules += 1;
        let f: Vec<&str> = line.split(',').collect();
        assert!((8..=10).contains(&f.len()), "field count: {line}");
        assert!(
            [
                "broadcast",
                "reduce",
                "allgather",
                "reducescatter",
                "allreduce"
            ]
            .contains(&f[0]),
            "{line}"
        );
        assert!(f[1].parse::<u64>().is_ok(), "{line}");
        assert!(f[2] == "-1" || f[2].parse::<u64>().is_ok(), "{line}");
        assert!(["tree", "ring", "pat"].contains(&f[3]), "{line}");
        assert!(["ll", "ll128", "simple"].contains(&f[4]), "{line}");
        assert!(
            f[5].parse::<u32>().is_ok_and(|c| c >= 1),
            "channels: {line}"
        );
        assert_eq!((f[6], f[7]), ("1", "2"), "one node, two ranks: {line}");
    }
    assert!(rules >= 2, "{text}");
}

/// Parses `text`, writes it in the other format, parses that: same decisions.
fn assert_round_trip(text: &str, format: Format) {
    let a = config::parse(text, "auto", format);
    assert!(a.is_ok(), "{:?}", a.diagnostics);
    let (other, fmt2) = match format {
        Format::Csv => (a.rules.to_toml(), Format::Toml),
        Format::Toml => {
            let (csv, notes) = a.rules.to_csv();
            assert!(notes.is_empty(), "{notes:?}");
            assert_nvidia_csv(&csv);
            (csv, Format::Csv)
        }
    };
    let b = config::parse(&other, "converted", fmt2);
    assert!(b.is_ok(), "{:?}\n{other}", b.diagnostics);
    assert!(
        config::diff(&a.rules, &b.rules).is_empty(),
        "{text}\n->\n{other}"
    );
    let back = match fmt2 {
        Format::Csv => b.rules.to_toml(),
        Format::Toml => b.rules.to_csv().0,
    };
    let c = config::parse(&back, "back", format);
    assert!(
        config::diff(&a.rules, &c.rules).is_empty(),
        "{text}\n->\n{back}"
    );
    // Every measured collective is decided at every size, for this shape only.
    for func in [Func::ALL_REDUCE, Func::ALL_GATHER] {
        for n_bytes in [0, 1, 511, 512, 8191, 8192, 131_072, u64::MAX] {
            let q = |n_ranks| Query {
                func,
                n_bytes,
                n_nodes: 1,
                n_ranks,
                num_pipe_ops: 1,
                reg_buff: Some(false),
            };
            let (_, ra) = a.rules.first_match(&q(2)).expect("a rule at every size");
            let (_, rb) = b.rules.first_match(&q(2)).expect("converted");
            assert_eq!(
                (ra.algorithm, ra.protocol, ra.channels),
                (rb.algorithm, rb.protocol, rb.channels)
            );
            assert!(
                a.rules.first_match(&q(3)).is_none(),
                "measured on 2 ranks only"
            );
        }
    }
}

fn verify(file: &Path, tuner: &str) -> Run {
    let f = s(file);
    cclkit(
        &[
            "tune", "auto", "--np", "2", "-b", "512", "-e", "128K", "-f", "16", "--verify", &f,
            "--tuner", tuner,
        ],
        &[],
        RANKS,
    )
}

#[test]
fn auto_writes_csv_and_toml_that_round_trip_and_a_second_run_honours() {
    let dir = tempfile::tempdir().expect("tmp");
    let cclkit_tuner = s(&rust_plugin("libnccl-tuner-cclkit.so"));
    for (name, format) in [("rules.conf", Format::Csv), ("rules.toml", Format::Toml)] {
        let out = dir.path().join(name);
        let out_s = s(&out);
        // 512 B, 8 KiB, 128 KiB: the last runs on two channels when allowed two.
        let r = cclkit(
            &[
                "tune",
                "auto",
                "--np",
                "2",
                "-b",
                "512",
                "-e",
                "128K",
                "-f",
                "16",
                "--colls",
                "allreduce,allgather",
                "--iters",
                "2",
                "--out",
                &out_s,
            ],
            &[],
            RANKS,
        );
        assert_eq!(r.code, Some(0), "{r}");
        assert!(r.stdout.contains("2 rank(s) on 1 node(s)"), "{r}");
        // allreduce: tree and ring x 3 protocols; allgather: ring only.
        assert!(r.stdout.contains("9 algorithm/protocol pair(s)"), "{r}");
        let points: Vec<&str> = r
            .stdout
            .lines()
            .filter(|l| l.starts_with("  all"))
            .collect();
        assert_eq!(points.len(), 6, "{r}");
        let text = std::fs::read_to_string(&out).expect("rules written");
        if format == Format::Csv {
            assert_nvidia_csv(&text);
        } else {
            assert!(text.contains("[[rule]]"), "{text}");
        }
        assert_round_trip(&text, format);
        let v = verify(&out, &cclkit_tuner);
        assert_eq!(v.code, Some(0), "{v}");
        assert!(
            v.stdout
                .contains("every decision followed the rules (6 checked)"),
            "{v}"
        );
        assert!(!v.stdout.contains("MISMATCH"), "{v}");
    }
}

#[test]
fn verify_fails_when_the_tuner_does_not_follow_the_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("ring.conf");
    std::fs::write(&file, "allreduce,0,-1,ring,ll128,1,-1,-1\n").expect("write");
    // The template tuner ignores rule files: tree/LL below 64 KiB, ring/Simple above.
    let v = verify(&file, &s(&rust_plugin("libnccl-tuner-template.so")));
    assert_eq!(v.code, Some(1), "{v}");
    assert!(v.stdout.contains("MISMATCH"), "{v}");
    assert!(
        v.stdout
            .contains("3 of 3 decision(s) did not follow the rules"),
        "{v}"
    );
    // The cclkit tuner does.
    let cclkit_tuner = s(&rust_plugin("libnccl-tuner-cclkit.so"));
    let v = verify(&file, &cclkit_tuner);
    assert_eq!(v.code, Some(0), "{v}");
    assert!(v.stdout.contains("(3 checked)"), "{v}");
    // Rules for another communicator verify nothing: that is a failure, not a pass.
    let other = dir.path().join("three.conf");
    std::fs::write(&other, "allreduce,0,-1,ring,ll128,1,1,3\n").expect("write");
    let v = verify(&other, &cclkit_tuner);
    assert_eq!(v.code, Some(1), "{v}");
    assert!(
        v.stdout
            .contains("nothing checked: no rule of the file holds for 2 rank(s)"),
        "{v}"
    );
}

#[test]
fn diff_of_rule_files_lists_the_regions_that_differ() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = dir.path().join("a.conf");
    let b = dir.path().join("b.toml");
    std::fs::write(&a, RULES).expect("write");
    std::fs::write(
        &b,
        r#"
[[rule]]
collective = "allreduce"
size = "0..8K"
algorithm = "ring"
protocol = "ll"
channels = 1

[[rule]]
collective = "allreduce"
size = "8K..1M"
algorithm = "tree"
protocol = "simple"
channels = 2

[[rule]]
collective = "allreduce"
size = "1M.."
algorithm = "ring"
protocol = "simple"
"#,
    )
    .expect("write");
    let (sa, sb) = (s(&a), s(&b));
    let r = cclkit(&["tune", "diff", &sa, &sb], &[], SHORT);
    assert_eq!(r.code, Some(1), "{r}");
    let regions: Vec<&str> = r.stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        regions,
        [
            "allgather size * nodes * ranks 8: ring/ll128 channels=2 (line 4) -> no rule",
            "allreduce size 1M.. nodes * ranks *: tree/simple channels=2 (line 3) -> ring/simple (line 16)",
        ],
        "{r}"
    );
    // Restricted to a communicator the allgather rule does not hold for.
    let r = cclkit(&["tune", "diff", &sa, &sb, "--nranks", "4"], &[], SHORT);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(
        r.stdout.lines().filter(|l| !l.starts_with('#')).count(),
        1,
        "{r}"
    );
    let r = cclkit(&["tune", "diff", &sa, &sa], &[], SHORT);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(
        r.stdout.contains("the rules decide the same everywhere"),
        "{r}"
    );
    // A bad file is trouble (2), with its line.
    let bad = dir.path().join("bad.conf");
    std::fs::write(&bad, "allreduce,0,64K,ring,ll,1,-1,-1\n").expect("write");
    let r = cclkit(&["tune", "diff", &sa, &s(&bad)], &[], SHORT);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stderr.contains("bad.conf:1:"), "{r}");
    let gone = dir.path().join("gone.conf");
    let r = cclkit(&["tune", "diff", &sa, &s(&gone)], &[], SHORT);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stderr.contains("gone.conf: No such file"), "{r}");
}

#[test]
fn diff_of_a_tuner_and_rules_that_mimic_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let lib = s(&rust_plugin("libnccl-tuner-template.so"));
    let env = [
        ("CCLKIT_TEMPLATE_THRESHOLD", "4096"),
        ("CCLKIT_TUNER_MODE", "rules"),
    ];
    let mimic = |threshold: u64| {
        let p = dir.path().join(format!("t{threshold}.conf"));
        let mut text = format!("allreduce,0,{},tree,ll,-1,-1,-1\n", threshold - 1);
        for c in [
            "broadcast",
            "reduce",
            "allgather",
            "reducescatter",
            "allreduce",
        ] {
            text.push_str(&format!("{c},{threshold},-1,ring,simple,-1,-1,-1\n"));
        }
        std::fs::write(&p, text).expect("write");
        s(&p)
    };
    let sweep = ["-b", "1K", "-e", "16K", "-f", "2"];
    let same = mimic(4096);
    let mut args = vec!["tune", "diff", &lib, &same];
    args.extend(sweep);
    let r = cclkit(&args, &env, SHORT);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(
        r.stdout
            .contains("the same decision for every collective and size"),
        "{r}"
    );
    let later = mimic(8192);
    let mut args = vec!["tune", "diff", &lib, &later];
    args.extend(sweep);
    let r = cclkit(&args, &env, SHORT);
    assert_eq!(r.code, Some(1), "{r}");
    let regions: Vec<&str> = r.stdout.lines().filter(|l| !l.starts_with('#')).collect();
    // Below the rules' threshold the other collectives fall to the built-in choice,
    // which at 4K is ring/simple like the template's: only AllReduce differs.
    assert_eq!(regions.len(), 1, "only allreduce differs at 4K: {r}");
    let ar = regions
        .iter()
        .find(|l| l.starts_with("allreduce size 4K: "))
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        ar.contains("ring/simple/1") && ar.contains("-> tree/ll/1"),
        "{r}"
    );
}
