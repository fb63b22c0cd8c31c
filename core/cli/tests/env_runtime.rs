//! The runtime reads its `NCCL_*` knobs through the env plugin, as NCCL does (issue
//! 19): a 2-rank `cclkit perf` where only the packaged TOML env plugin
//! (`libnccl-env-cclkit.so`) sets `NCCL_ALGO`, `NCCL_PROTO` and `NCCL_MAX_NCHANNELS`
//! runs with them; a bad value from the plugin is refused naming the variable and the
//! plugin; a plugin whose `init` fails fails the run. Clean child environments.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// `cclkit perf --np 2` (one size of `bytes`) with `env` on a clean environment.
fn perf(env: &[(&str, &str)], bytes: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args([
        "perf", "--np", "2", "-b", bytes, "-e", bytes, "-n", "1", "-w", "0",
    ])
    .env_clear()
    .env("PATH", std::env::var("PATH").unwrap_or_default())
    .env("NCCL_NET_PLUGIN", "none")
    .env("NCCL_TUNER_PLUGIN", "none")
    .env("CCLKIT_BOOTSTRAP_TIMEOUT", "10")
    .envs(env.iter().copied())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cclkit_tests::run_with_timeout(&mut cmd, Duration::from_secs(60))
}

fn plugin() -> String {
    cclkit_tests::plugin("libnccl-env-cclkit.so")
        .display()
        .to_string()
}

/// Every distinct (algo, proto, nch) of the tuner report.
fn choices(out: &Output) -> Vec<(String, String, String)> {
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let mut rows: Vec<_> = text
        .lines()
        .skip_while(|l| !l.starts_with("# tuner report"))
        .skip(2)
        .filter_map(|l| {
            let f: Vec<&str> = l.trim_start_matches('#').split_whitespace().collect();
            (f.len() >= 6).then(|| (f[2].to_owned(), f[3].to_owned(), f[4].to_owned()))
        })
        .collect();
    rows.sort();
    rows.dedup();
    rows
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn env_plugin_values_drive_algo_proto_and_channels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("nccl.toml");
    // A random pick, so a runtime that ignored the plugin cannot pass by luck twice.
    let algos = [("ring", "RING"), ("tree", "TREE")];
    let protos = [("LL", "LL"), ("LL128", "LL128"), ("Simple", "SIMPLE")];
    let (algo, algo_shown) = algos[rand::random::<u64>() as usize % algos.len()];
    let (proto, proto_shown) = protos[rand::random::<u64>() as usize % protos.len()];
    std::fs::write(
        &file,
        format!(
            "[env]\nNCCL_ALGO = \"{algo}\"\nNCCL_PROTO = \"{proto}\"\nNCCL_MAX_NCHANNELS = 1\n"
        ),
    )
    .expect("write");
    let file = file.display().to_string();
    let lib = plugin();
    let env = [
        ("NCCL_ENV_PLUGIN", lib.as_str()),
        ("CCLKIT_ENV_FILE", file.as_str()),
        ("CCLKIT_TUNER_REPORT", "1"),
    ];
    // 4 MiB: the built-in cost model uses two channels there on its own.
    let out = perf(&env, "4194304");
    assert!(out.status.success(), "{}", stderr(&out));
    let want = vec![(
        algo_shown.to_owned(),
        proto_shown.to_owned(),
        "1".to_owned(),
    )];
    assert_eq!(choices(&out), want, "{}", stderr(&out));

    // Without the plugin the same file changes nothing: the model's two channels
    // come back, so the single channel above came from the plugin's value.
    let out = perf(&env[1..], "4194304");
    assert!(out.status.success(), "{}", stderr(&out));
    let got = choices(&out);
    assert!(!got.is_empty() && got.iter().all(|c| c.2 != "1"), "{got:?}");
}

#[test]
fn a_bad_value_from_the_env_plugin_names_the_variable_and_the_plugin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = plugin();
    for (name, value) in [
        ("NCCL_MAX_NCHANNELS", "\"lots\""),
        ("NCCL_PROTO", "\"LL,warp\""),
        ("NCCL_BUFFSIZE", "\"abc\""),
    ] {
        let file = dir.path().join(format!("{name}.toml"));
        std::fs::write(&file, format!("[env]\n{name} = {value}\n")).expect("write");
        let file = file.display().to_string();
        let out = perf(
            &[
                ("NCCL_ENV_PLUGIN", lib.as_str()),
                ("CCLKIT_ENV_FILE", file.as_str()),
            ],
            "8",
        );
        let err = stderr(&out);
        assert!(!out.status.success(), "{name}: exit 0\n{err}");
        let line = format!("{name} set by the ENV plugin 'cclkit-env-toml'");
        assert!(err.contains(&line), "{name}: {err}");
        assert!(err.contains(&format!("{name}=")), "{name}: {err}");
    }
}

#[test]
fn a_failed_env_plugin_init_fails_the_run_naming_the_plugin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("broken.toml");
    std::fs::write(&file, "this is [[ not toml\n").expect("write");
    let file = file.display().to_string();
    let lib = plugin();
    let out = perf(
        &[
            ("NCCL_ENV_PLUGIN", lib.as_str()),
            ("CCLKIT_ENV_FILE", file.as_str()),
        ],
        "8",
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "exit 0\n{err}");
    assert!(
        err.contains("ENV plugin 'cclkit-env-toml': init failed"),
        "{err}"
    );
}
