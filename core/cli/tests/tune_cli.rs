//! `cclkit tune show|auto|diff` end to end, through the built binary.
//!
//! Needs the packaged Rust tuners (`make package`, or `CCLKIT_LIB_DIR` pointing at a
//! directory with `libnccl-tuner-cclkit.so` and `libnccl-tuner-template.so`) and a C
//! compiler. Every run of the binary is bounded: past its limit the whole process
//! group (the launcher and its ranks) is killed and the test fails.

mod common;

use common::tune::{RULES, SHORT, builtin, cclkit, cell, json};
use common::{Plugins, rust_plugin, s};

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
        t["tuner"].as_str().unwrap().starts_with("TemplateTuner v7"),
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
