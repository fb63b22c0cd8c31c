//! `cclkit doctor --nccl-version X.Y` / `--rccl-version X.Y`: each release rule in
//! cclkit_host::releases, seen as users see it (child processes, clean environment).

mod common;

use std::process::Output;

use common::{Plugins, s};
use serde_json::Value;

/// Runs `cclkit ARGS` with only `env` set; kills it after 60 s.
fn cclkit(args: &[&str], env: &[(&str, &str)]) -> Output {
    common::cclkit_clean(args, env)
}

fn doctor_json(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, Value) {
    let mut a = vec!["doctor", "--json"];
    a.extend_from_slice(args);
    let out = cclkit(&a, env);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

fn problems(v: &Value) -> Vec<String> {
    v["problems"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn tries(v: &Value, kind: &str) -> Value {
    v["release"]["kinds"]
        .as_array()
        .and_then(|a| a.iter().find(|k| k["kind"] == kind))
        .map_or(Value::Null, |k| k["tries"].clone())
}

#[test]
fn net_versions_probed_follow_the_release() {
    let p = Plugins::new();
    p.net("libnccl-net-mock.so", 9, &[]);
    let dir = s(p.dir.path());
    let env = [
        ("LD_LIBRARY_PATH", dir.as_str()),
        ("NCCL_NET_PLUGIN", "mock"),
    ];
    // 2.24 tries v9 first: the v9 library is fine.
    let (code, v) = doctor_json(&["--nccl-version", "2.24"], &env);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(tries(&v, "net"), serde_json::json!([9, 8, 7, 6, 5]));
    assert_eq!(tries(&v, "tuner"), serde_json::json!([4, 3, 2]));
    // 2.20–2.23 stop at v8: NCCL 2.22 cannot use a v9-only library.
    let (code, v) = doctor_json(&["--nccl-version", "2.22"], &env);
    assert_eq!(code, Some(1));
    let pr = problems(&v);
    assert!(
        pr.iter().any(|x| x
            == "NCCL 2.22 cannot use 'mock': it tries v8, v7, v6, v5 and the library exports v9"),
        "{pr:?}"
    );
    assert!(
        v["verdict"]
            .as_str()
            .is_some_and(|x| x.starts_with("PROBLEM: NCCL 2.22")),
        "{v:#}"
    );
}

#[test]
fn tuner_versions_probed_follow_the_release() {
    let p = Plugins::new();
    p.net("libnccl-net-mock.so", 10, &[]);
    p.tuner("libnccl-tuner-mock.so", 5, &[]);
    let dir = s(p.dir.path());
    let env = [
        ("LD_LIBRARY_PATH", dir.as_str()),
        ("NCCL_NET_PLUGIN", "mock"),
        ("NCCL_TUNER_PLUGIN", "mock"),
    ];
    let (code, v) = doctor_json(&["--nccl-version", "2.28"], &env);
    assert_eq!(code, Some(0), "{v:#}");
    let (code, v) = doctor_json(&["--nccl-version", "2.26"], &env);
    assert_eq!(code, Some(1));
    assert!(
        problems(&v)
            .iter()
            .any(|x| x.contains("NCCL 2.26 cannot use 'mock': it tries v4, v3, v2")),
        "{v:#}"
    );
}

#[test]
fn env_plugins_exist_from_2_28_only() {
    let env = [("NCCL_ENV_PLUGIN", "cclkit-no-such-env")];
    let (_, v) = doctor_json(&["--nccl-version", "2.27"], &env);
    assert_eq!(v["env"]["resolution"]["outcome"]["outcome"], "disabled");
    assert!(
        v["env"]["resolution"]["opens"]
            .as_array()
            .is_some_and(Vec::is_empty)
    );
    assert!(
        v["notes"]
            .to_string()
            .contains("NCCL_ENV_PLUGIN=cclkit-no-such-env is ignored"),
        "{v:#}"
    );
    assert_eq!(tries(&v, "env"), Value::Null, "2.27 knows no env kind");
    let (_, v) = doctor_json(&["--nccl-version", "2.28"], &env);
    assert_eq!(v["env"]["resolution"]["outcome"]["outcome"], "not_found");
    assert_eq!(tries(&v, "env"), serde_json::json!([1]));
    let (_, v) = doctor_json(&["--nccl-version", "2.31"], &env);
    assert_eq!(tries(&v, "env"), serde_json::json!([2, 1]));
    assert_eq!(
        tries(&v, "net"),
        serde_json::json!([12, 11, 10, 9, 8, 7, 6])
    );
}

#[test]
fn none_is_an_ordinary_name_before_2_28() {
    let (code, v) = doctor_json(&["--nccl-version", "2.27", "--net", "none"], &[]);
    assert_eq!(code, Some(1));
    assert!(
        problems(&v)
            .iter()
            .any(|x| x.contains("NCCL_NET_PLUGIN=none is not special before 2.28")),
        "{v:#}"
    );
    let (_, v) = doctor_json(&["--nccl-version", "2.28", "--net", "none"], &[]);
    assert!(
        !problems(&v).iter().any(|x| x.contains("not special")),
        "{v:#}"
    );
}

#[test]
fn rccl_default_net_library_changes_with_rocm_release() {
    let p = Plugins::new();
    p.net("libnccl-net.so", 10, &[]);
    let dir = s(p.dir.path());
    let env = [("LD_LIBRARY_PATH", dir.as_str())];
    let opened = |release: &str| {
        let (_, v) = doctor_json(&["--rccl-version", release], &env);
        assert_eq!(v["flavor"], "rccl");
        (
            v["release"]["net_default"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            v["net"]["steps"][0]["opens"][0]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            v["net"]["chosen"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let (default, name, chosen) = opened("7.2");
    assert_eq!(
        (default.as_str(), name.as_str()),
        ("libnccl-net.so", "libnccl-net.so")
    );
    assert!(
        chosen.contains("libnccl-net.so"),
        "ROCm 7.2 loads libnccl-net.so: {chosen}"
    );
    for release in ["7.1", "6.4", "7.3"] {
        let (default, name, chosen) = opened(release);
        assert_eq!(
            (default.as_str(), name.as_str()),
            ("librccl-net.so", "librccl-net.so")
        );
        assert!(
            !chosen.contains("libnccl-net.so"),
            "ROCm {release}: {chosen}"
        );
    }
    // Without any plugin installed, ROCm 7.2's absent default is as quiet as any default.
    let (code, v) = doctor_json(&["--rccl-version", "7.2"], &[]);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(
        v["settings"][0],
        serde_json::json!(["NCCL_NET_PLUGIN", null])
    );
}

#[test]
fn bad_release_values_exit_2() {
    for args in [
        &["doctor", "--nccl-version", "2.x"][..],
        &["doctor", "--nccl-version", "2.18"],
        &["doctor", "--rccl-version", "5.7"],
        &["doctor", "--nccl-version", "2.28", "--rccl-version", "7.2"],
    ] {
        let out = cclkit(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("cclkit doctor:"),
            "{args:?}"
        );
    }
}

#[test]
fn text_report_lists_the_rules() {
    let out = cclkit(&["doctor", "--nccl-version", "2.19"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Rules of NCCL 2.19 (the walk below follows cclkit's newest rules",
        "NCCL_NET_PLUGIN unset opens libnccl-net.so",
        "net: v7, v6, v5",
        "tuner: v1",
        "NCCL 2.19: NCCL 2.19–2.20 open NCCL_TUNER_PLUGIN as given only",
        "PROFILER (NCCL_PROFILER_PLUGIN=unset)\n  => this release has no profiler plugins\n",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(
        !text.contains("profiler:"),
        "2.19 has no profiler plugins:\n{text}"
    );
}
