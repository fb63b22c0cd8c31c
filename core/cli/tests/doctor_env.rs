//! `cclkit doctor` with env plugins: `NCCL_ENV_PLUGIN` is resolved first, every
//! variable doctor uses is shown with its source, and the net/tuner resolution uses the
//! env plugin's values. Child processes with a clean environment.

mod common;

use std::process::Output;

use common::{Plugins, s};
use serde_json::Value;

/// Runs `cclkit ARGS` with only `env` set; kills it after 60 s.
fn cclkit(args: &[&str], env: &[(&str, &str)]) -> Output {
    common::cclkit_clean(args, env)
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    })
}

fn variable<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["env"]["variables"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == name))
        .unwrap_or_else(|| panic!("{name} not reported: {v}"))
}

/// A directory with the mock net plugin and the packaged env and tuner plugins.
fn setup(p: &Plugins) -> String {
    p.net("libnccl-net-mock.so", 10, &[]);
    format!("{}:{}", s(p.dir.path()), s(&cclkit_tests::lib_dir()))
}

#[test]
fn env_plugin_values_drive_net_and_tuner_resolution() {
    let p = Plugins::new();
    let path = setup(&p);
    let file = p.path("nccl-env.toml");
    let ifname = format!("eth{}", rand::random::<u16>());
    std::fs::write(
        &file,
        format!(
            "[env]\nNCCL_TUNER_PLUGIN = \"cclkit\"\nNCCL_SOCKET_IFNAME = \"{ifname}\"\n\
             [pinned]\nNCCL_NET_PLUGIN = \"mock\"\n"
        ),
    )
    .expect("write");
    let file = s(&file);
    let env = [
        ("LD_LIBRARY_PATH", path.as_str()),
        ("NCCL_ENV_PLUGIN", "cclkit"),
        ("CCLKIT_ENV_FILE", file.as_str()),
        ("NCCL_NET_PLUGIN", "not-what-the-fleet-pins"),
        ("NCCL_NET", "Mock"),
    ];
    let out = cclkit(&["doctor", "--json"], &env);
    let v = json(&out);
    assert!(out.status.success(), "{v:#}");
    assert_eq!(v["env"]["resolution"]["outcome"]["outcome"], "loaded");
    assert_eq!(v["env"]["resolution"]["outcome"]["version"], 2);
    assert_eq!(v["env"]["resolution"]["outcome"]["name"], "cclkit-env-toml");
    let net = variable(&v, "NCCL_NET_PLUGIN");
    assert_eq!(
        (&net["value"], &net["process"], &net["source"]),
        (
            &"mock".into(),
            &"not-what-the-fleet-pins".into(),
            &"env_plugin".into()
        )
    );
    let tuner = variable(&v, "NCCL_TUNER_PLUGIN");
    assert_eq!(
        (&tuner["value"], &tuner["source"]),
        (&"cclkit".into(), &"env_plugin".into())
    );
    let sock = variable(&v, "NCCL_SOCKET_IFNAME");
    assert_eq!(sock["value"], Value::from(ifname.as_str()));
    let name = variable(&v, "NCCL_NET");
    assert_eq!(
        (&name["value"], &name["source"]),
        (&"Mock".into(), &"passed_through".into())
    );
    assert_eq!(variable(&v, "NCCL_IB_HCA")["source"], "unset");
    // The resolution explained is the one the env plugin's values lead to.
    assert!(
        v["net"]["chosen"]
            .as_str()
            .is_some_and(|c| c.contains("libnccl-net-mock.so")),
        "{v:#}"
    );
    assert!(
        v["tuner"]["chosen"]
            .as_str()
            .is_some_and(|c| c.contains("libnccl-tuner-cclkit.so")),
        "{v:#}"
    );

    let out = cclkit(&["doctor"], &env);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "ENV (NCCL_ENV_PLUGIN=cclkit, resolved first)",
        "dlopen(\"libnccl-env-cclkit.so\") [<prefix>-<value>.so form]: loaded",
        "-> selected 'cclkit-env-toml' v2",
        "NCCL_NET_PLUGIN = \"mock\"  [env plugin (process has \"not-what-the-fleet-pins\")]",
        "NCCL_NET = \"Mock\"  [process, passed through by the env plugin]",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn a_failing_env_plugin_init_is_the_first_problem() {
    let p = Plugins::new();
    let path = setup(&p);
    let file = p.path("bad.toml");
    std::fs::write(&file, "[env]\nNCCL_IB_TIMEOUT = 2.5\n").expect("write");
    let file = s(&file);
    let out = cclkit(
        &["doctor", "--json"],
        &[
            ("LD_LIBRARY_PATH", path.as_str()),
            ("NCCL_ENV_PLUGIN", "cclkit"),
            ("CCLKIT_ENV_FILE", file.as_str()),
            ("NCCL_NET_PLUGIN", "mock"),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let v = json(&out);
    let first = v["problems"][0].as_str().unwrap_or_default();
    assert!(
        first.contains("ENV plugin 'cclkit-env-toml': init failed: ncclInvalidUsage (5)")
            && first.contains("bad.toml:2"),
        "{v:#}"
    );
    // NCCL keeps asking the failed plugin; an `export_env!` plugin answers "unset" to
    // everything after a failed init, so the job's own value is hidden too.
    let net = variable(&v, "NCCL_NET_PLUGIN");
    assert_eq!(
        (&net["value"], &net["source"]),
        (&Value::Null, &"env_plugin".into()),
        "{v:#}"
    );
}

#[test]
fn a_requested_env_plugin_that_is_missing_or_unsupported_is_a_problem() {
    let p = Plugins::new();
    let path = setup(&p);
    let base = [
        ("LD_LIBRARY_PATH", path.as_str()),
        ("NCCL_NET_PLUGIN", "mock"),
    ];
    let with = |extra: (&'static str, &'static str)| {
        let mut e = base.to_vec();
        e.push(extra);
        json(&cclkit(&["doctor", "--json"], &e))
    };
    let v = with(("NCCL_ENV_PLUGIN", "cclkit-no-such-env"));
    assert_eq!(v["env"]["resolution"]["outcome"]["outcome"], "not_found");
    assert!(
        v["problems"][0]
            .as_str()
            .is_some_and(|x| x.contains("cannot be opened")),
        "{v:#}"
    );
    assert_eq!(variable(&v, "NCCL_NET_PLUGIN")["source"], "process");

    // A net plugin is not an env plugin: NCCL closes it and uses the built-in one.
    let v = with(("NCCL_ENV_PLUGIN", "libnccl-net-mock.so"));
    assert_eq!(v["env"]["resolution"]["outcome"]["outcome"], "unsupported");
    assert!(
        v["problems"][0]
            .as_str()
            .is_some_and(|x| x.contains("ncclEnvPlugin_v1")),
        "{v:#}"
    );

    let v = with(("NCCL_ENV_PLUGIN", "NONE"));
    assert_eq!(v["env"]["resolution"]["outcome"]["outcome"], "disabled");
    assert_eq!(v["problems"].as_array().map(Vec::len), Some(0), "{v:#}");
}

#[test]
fn an_env_plugin_that_hides_a_value_changes_the_resolution() {
    let p = Plugins::new();
    let path = setup(&p);
    // The C mock answers only what it was told: everything else reads as unset.
    let mock = s(&p.with_header("libenv_mock.so", "env/env_mock.c", &["ENV_VERSION=1"]));
    let out = cclkit(
        &["doctor", "--json"],
        &[
            ("LD_LIBRARY_PATH", path.as_str()),
            ("NCCL_ENV_PLUGIN", mock.as_str()),
            ("NCCL_NET_PLUGIN", "mock"),
        ],
    );
    let v = json(&out);
    assert_eq!(v["env"]["resolution"]["outcome"]["version"], 1);
    let net = variable(&v, "NCCL_NET_PLUGIN");
    assert_eq!(
        (&net["value"], &net["source"]),
        (&Value::Null, &"env_plugin".into())
    );
    let tried = v["net"]["steps"][0]["opens"][0]["name"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        tried, "libnccl-net.so",
        "unset through the plugin: the default name: {v:#}"
    );
}
