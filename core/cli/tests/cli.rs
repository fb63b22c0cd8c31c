//! `cclkit doctor` and `cclkit info` as users run them: child processes with a clean
//! environment (the dynamic linker reads `LD_LIBRARY_PATH` only at process start, so
//! search-path rules can only be tested this way).

mod common;

use std::path::Path;
use std::process::Output;

use common::{Plugins, s};

/// Runs `cclkit ARGS` with only `env` set; kills it after 60 s.
fn cclkit(args: &[&str], env: &[(&str, &str)]) -> Output {
    common::cclkit_clean(args, env)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn assert_has(out: &str, needles: &[&str]) {
    for n in needles {
        assert!(out.contains(n), "missing {n:?} in:\n{out}");
    }
}

#[test]
fn doctor_on_a_good_setup_explains_every_step_and_exits_zero() {
    let p = Plugins::new();
    p.net_and_tuner("libnccl-net-mock.so", 12, 6);
    let dir = s(p.dir.path());
    let out = cclkit(
        &["doctor"],
        &[("LD_LIBRARY_PATH", &dir), ("NCCL_NET_PLUGIN", "mock")],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let lib = format!("{dir}/libnccl-net-mock.so");
    assert_has(
        &stdout,
        &[
            "NCCL_NET_PLUGIN=mock",
            "dlopen(\"mock\") [value as given]: not found",
            &format!("dlopen(\"libnccl-net-mock.so\") [<prefix>-<value>.so form]: loaded {lib}"),
            "symbols: ncclNetPlugin_v12 (176 B), ncclTunerPlugin_v6 (40 B)",
            "NCCL picks (net): 2.19 - | 2.20–2.23 - | 2.24–2.25 - | 2.26–2.27 - | 2.28–2.29 - | 2.30 v12",
            "NCCL picks (tuner): 2.19–2.20 - | 2.21 - | 2.22–2.23 - | 2.24–2.27 - | 2.28–2.29 - | 2.30 v6",
            "dependencies: all",
            "-> selected 'Mock' (ncclNetPlugin_v12)",
            "dev 0: mockdev0 speed=25Gb/s ptr=HOST type=HOST maxRecvs=8",
            &format!("[2] tuner in net library {lib}"),
            "-> selected 'MockTuner' (ncclTunerPlugin_v6)",
            "AllReduce 1048576 B -> RING/SIMPLE, 4 channels",
            &format!("Verdict: OK: NET 'Mock' v12 ({lib}, 1 device); TUNER 'MockTuner' v6 ({lib})"),
        ],
    );
    assert!(!stdout.contains("Problems:"), "{stdout}");
    assert!(
        text(&out.stderr).is_empty(),
        "no warnings on a good setup: {}",
        text(&out.stderr)
    );

    let out = cclkit(
        &["doctor", "--json"],
        &[("LD_LIBRARY_PATH", &dir), ("NCCL_NET_PLUGIN", "mock")],
    );
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["problems"].as_array().map(Vec::len), Some(0));
    assert_eq!(v["net"]["steps"][0]["outcome"]["result"], "selected");
    assert_eq!(v["net"]["steps"][0]["outcome"]["version"], 12);
    assert_eq!(v["net"]["devices"][0]["name"], "mockdev0");
    assert_eq!(
        v["net"]["steps"][0]["file"]["symbols"][0]["symbol"],
        "ncclNetPlugin_v12"
    );
    assert!(v["verdict"].as_str().is_some_and(|s| s.starts_with("OK:")));
}

#[test]
fn doctor_on_a_missing_dependency_names_it_and_exits_non_zero() {
    let p = Plugins::new();
    let dep = p.c_source(
        "libcclkitdep.so",
        "int cclkit_dep_value(void) { return 7; }\n",
        &[],
    );
    let dir = s(p.dir.path());
    p.cc(
        "libnccl-net-dep.so",
        &[common::fixture("net_mock.c")],
        &[
            "-DNET_VERSION=12".into(),
            "-Wl,--no-as-needed".into(),
            format!("-L{dir}"),
            "-lcclkitdep".into(),
        ],
    );
    std::fs::remove_file(&dep).expect("remove the dependency");
    let out = cclkit(
        &["doctor"],
        &[("LD_LIBRARY_PATH", &dir), ("NCCL_NET_PLUGIN", "dep")],
    );
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert_has(
        &stdout,
        &[
            "dlopen(\"dep\") [value as given]: not found",
            "dlopen(\"libnccl-net-dep.so\") [<prefix>-<value>.so form]: FAILED: libcclkitdep.so: cannot open shared object file",
            &format!("the file exists: {dir}/libnccl-net-dep.so (via LD_LIBRARY_PATH)"),
            &format!("MISSING dependency: libcclkitdep.so (needed by {dir}/libnccl-net-dep.so)"),
            "[2] built-in cclkit-socket",
            "(FALLBACK)",
            "Problems:",
            "Verdict: PROBLEM: NET: NCCL_NET_PLUGIN=dep cannot be used; the job would fall back to 'cclkit-socket' v12 (built into cclkit",
        ],
    );
    // Loud by default: the fallback is a WARN even without NCCL_DEBUG.
    assert_has(
        &stderr,
        &[
            "NCCL WARN NET plugin dep: could not load the library",
            "falling back to 'built-in cclkit-socket'",
        ],
    );
}

#[test]
fn doctor_follows_rccl_naming_with_rccl() {
    let p = Plugins::new();
    p.net("librccl-net-mock.so", 11, &[]);
    let dir = s(p.dir.path());
    let env = [("LD_LIBRARY_PATH", dir.as_str())];
    let out = cclkit(&["doctor", "--rccl", "--net", "mock"], &env);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_has(
        &stdout,
        &[
            "resolution RCCL 2.30",
            "dlopen(\"librccl-net-mock.so\")",
            "-> selected 'Mock' (ncclNetPlugin_v11)",
        ],
    );
    let out = cclkit(&["doctor", "--net", "mock"], &env);
    assert_eq!(out.status.code(), Some(1));
    assert_has(
        &text(&out.stdout),
        &["dlopen(\"libnccl-net-mock.so\") [<prefix>-<value>.so form]: not found"],
    );
    let out = cclkit(
        &["doctor", "--net", "mock"],
        &[("LD_LIBRARY_PATH", &dir), ("CCLKIT_FLAVOR", "rccl")],
    );
    assert!(out.status.success(), "CCLKIT_FLAVOR=rccl");
}

#[test]
fn doctor_full_library_names_go_through_the_search_path_once() {
    let p = Plugins::new();
    p.net("libnccl-net-mock.so", 9, &[]);
    let dir = s(p.dir.path());
    let out = cclkit(
        &["doctor", "--net", "libnccl-net-mock.so"],
        &[("LD_LIBRARY_PATH", &dir)],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_has(
        &stdout,
        &["dlopen(\"libnccl-net-mock.so\") [value as given]: loaded"],
    );
    assert!(
        !stdout.contains("prefix>-<value>"),
        "no prefix form for lib*.so:\n{stdout}"
    );
}

#[test]
fn doctor_reports_a_broken_tuner_and_strict_notes() {
    let p = Plugins::new();
    let t = p.tuner("badtuner.so", 6, &["TUNER_INIT_RC=5"]);
    let out = cclkit(&["doctor", "--tuner", &s(&t)], &[("CCLKIT_STRICT", "1")]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert_has(
        &stdout,
        &[
            "-> FAILED: TUNER plugin 'MockTuner' (v6): init failed: ncclInvalidUsage (5); the plugin said: \"mock tuner: init failed on purpose (code 5)\"",
            "TUNER uses built-in cost model (FALLBACK)",
            "CCLKIT_STRICT=1: cclkit would refuse to start with this setup",
        ],
    );
}

#[test]
fn doctor_suggests_the_installed_plugin_for_a_typo() {
    let p = Plugins::new();
    let installed = p.tuner("libnccl-tuner-template.so", 6, &[]);
    let dir = s(p.dir.path());
    let out = cclkit(
        &["doctor", "--tuner", "tmplate"],
        &[("LD_LIBRARY_PATH", &dir)],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_has(
        &text(&out.stdout),
        &[&format!(
            "hint: did you mean NCCL_TUNER_PLUGIN=template? ({} is installed)",
            s(&installed)
        )],
    );
}

#[test]
fn nccl_debug_info_shows_plugin_messages_by_subsystem() {
    let p = Plugins::new();
    let lib = p.net("m.so", 12, &[]);
    let env = |subsys: &'static str| vec![("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", subsys)];
    let out = cclkit(&["doctor", "--net", &s(&lib)], &env("NET"));
    assert_has(&text(&out.stderr), &["NCCL INFO [plugin] mock: init v12"]);
    let out = cclkit(&["doctor", "--net", &s(&lib)], &env("^NET"));
    assert!(
        !text(&out.stderr).contains("mock: init v12"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn info_lists_every_device_and_table() {
    let p = Plugins::new();
    let lib = p.net("three.so", 9, &["NDEV=3", "PLUGIN_NAME=\"Three\""]);
    let out = cclkit(&["info", &s(&lib)], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_has(
        &stdout,
        &[
            "symbols: ncclNetPlugin_v9 (160 B)",
            "ncclNetPlugin_v9 name: \"Three\"",
            "net plugin 'Three' through ncclNetPlugin_v9",
            "3 device(s)",
            "dev 0: mockdev0",
            "dev 2: mockdev2 speed=25Gb/s ptr=HOST type=HOST maxRecvs=8 maxComms=64 latency=1.5us regIsGlobal=1 forceFlush=0 maxP2pBytes=8GiB maxCollBytes=512MiB vdevs=[2] guid=0x102",
            "verdict: OK",
        ],
    );
    let out = cclkit(&["info", "--json", &s(&lib)], &[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["net"]["devices"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["net"]["devices"][1]["guid"], 0x101);

    let nosym = p.c_source("nosym.so", "int cclkit_nothing = 1;\n", &[]);
    let out = cclkit(&["info", &s(&nosym)], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_has(
        &text(&out.stdout),
        &[
            "exports no net, CollNet or tuner table",
            "exports none of ncclNetPlugin_v12",
        ],
    );
    let out = cclkit(&["info", "/nonexistent/libx.so"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_has(
        &text(&out.stdout),
        &["dlopen: FAILED: /nonexistent/libx.so: cannot open shared object file"],
    );
}

#[test]
fn info_on_the_packaged_rust_plugins() {
    for (name, kind) in [
        (
            "libnccl-net-template.so",
            "net plugin 'Template' through ncclNetPlugin_v12",
        ),
        ("libnccl-tuner-template.so", "through ncclTunerPlugin_v7"),
        // Profiler- and env-only libraries are described as what they are, with no
        // net plugin problem (a profiler's mask: the events its init asks for).
        (
            "libnccl-profiler-template.so",
            "profiler 'TemplateProfiler' through ncclProfiler_v7\n    init mask 0x9e: Coll, P2p, ProxyOp, ProxyStep, NetPlugin\n",
        ),
        (
            "libnccl-env-template.so",
            "env plugin 'TemplateEnv' through ncclEnvPlugin_v2: init and finalize ok",
        ),
    ] {
        let path = common::rust_plugin(name);
        let out = cclkit(&["info", &s(&path)], &[]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{name}:\n{stdout}");
        assert_has(&stdout, &[kind, "verdict: OK"]);
        assert!(Path::new(&path).exists());
    }
}

/// Sample decisions start from the built-in model's cost table, as NCCL hands its
/// own model's times to a tuner: a tuner that leaves the table alone gets the
/// model's choice (on 2 host-memory ranks, PAT/Simple up to 2 MiB), not the first
/// entry of a flat table (TREE/LL); one that changes it is shown next to the model.
#[test]
fn doctor_sample_decisions_start_from_the_model() {
    let p = Plugins::new();
    let leave = p.tuner("libnccl-tuner-leave.so", 6, &["LEAVE_TABLE"]);
    let pick = p.tuner("libnccl-tuner-pick.so", 6, &[]);
    let run = |lib: &Path| {
        let out = cclkit(
            &["doctor", "--ranks", "2", "--nodes", "1"],
            &[("NCCL_TUNER_PLUGIN", &s(lib))],
        );
        text(&out.stdout)
    };
    let out = run(&leave);
    assert_has(
        &out,
        &[
            "    AllReduce 4096 B -> PAT/SIMPLE\n",
            "    AllReduce 1048576 B -> PAT/SIMPLE\n",
        ],
    );
    assert!(
        !out.contains("TREE/LL") && !out.contains("model alone"),
        "{out}"
    );
    assert_has(
        &run(&pick),
        &["    AllReduce 4096 B -> RING/SIMPLE, 4 channels (built-in model alone: PAT/SIMPLE)\n"],
    );
}

/// The PROFILER section: what NCCL_PROFILER_PLUGIN resolves to, the events the
/// profiler's init asks for (a profiler that asks for none is a note: its trace will
/// be empty), a requested profiler that is missing is a problem, and init/finalize
/// leave no file in the working directory (cclkit's trace plugin writes there).
#[test]
fn doctor_reports_the_profiler_and_its_event_mask() {
    let p = Plugins::new();
    let all = p.with_header("libprof_all.so", "profiler/profiler_mock.c", &["MASK=0x12"]);
    let none = p.with_header("libprof_none.so", "profiler/profiler_mock.c", &["MASK=0"]);
    let run = |setting: &str| {
        let out = cclkit(&["doctor"], &[("NCCL_PROFILER_PLUGIN", setting)]);
        (out.status.code(), text(&out.stdout))
    };
    let (code, out) = run(&s(&all));
    assert_has(
        &out,
        &[
            "=> PROFILER uses 'mock' (ncclProfiler_v7 in /",
            "init mask 0x12: Coll, ProxyStep\n",
            "; PROFILER 'mock' (ncclProfiler_v7 in /",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    let (_, out) = run(&s(&none));
    assert_has(
        &out,
        &[
            "init mask 0x0: none: it records nothing",
            "PROFILER: 'mock' asked for no events at init (mask 0)",
        ],
    );
    let (code, out) = run("no-such-profiler");
    assert_has(
        &out,
        &[
            "tries: no-such-profiler, libnccl-profiler-no-such-profiler.so",
            "PROFILER: no profiler library found",
        ],
    );
    assert_eq!(code, Some(1), "a requested profiler that is missing: {out}");

    let cwd = tempfile::tempdir().expect("tempdir");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.arg("doctor")
        .env_clear()
        .env(
            "NCCL_PROFILER_PLUGIN",
            cclkit_tests::plugin("libnccl-profiler-cclkit.so"),
        )
        .current_dir(cwd.path());
    let out = common::run_bounded(cmd, std::time::Duration::from_secs(60));
    assert_has(
        &text(&out.stdout),
        &["=> PROFILER uses 'cclkit-trace' (ncclProfiler_v7 in /"],
    );
    let left: Vec<_> = std::fs::read_dir(cwd.path())
        .expect("read cwd")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "doctor left files behind: {left:?}");
}
