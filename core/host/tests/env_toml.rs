//! The packaged env plugin (`libnccl-env-cclkit.so`) through the host adapter: v2 is
//! chosen over v1, values of a random TOML file come back with the documented
//! precedence, and a bad file fails `init` with the plugin's own message.
//!
//! One test per binary: it changes the process environment, which the plugin reads.

use cclkit_host::env::{EnvError, EnvInitArgs, EnvOutcome, resolve_value};
use cclkit_tests::cplugin::s;
use rand::Rng;

#[test]
fn packaged_env_plugin_serves_file_values_with_precedence() {
    let lib = cclkit_tests::plugin("libnccl-env-cclkit.so");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = rand::rng();
    let pinned: String = format!("pinned-{}", rng.random::<u32>());
    let default: u32 = rng.random();
    let file = dir.path().join("nccl-env.toml");
    std::fs::write(
        &file,
        format!(
            "[env]\nNCCL_SOCKET_IFNAME = \"eth{default}\"\nNCCL_BUFFSIZE = {default}\n\
             NCCL_IB_DISABLE = true\n[pinned]\nNCCL_NET_PLUGIN = \"{pinned}\"\n"
        ),
    )
    .expect("write");
    // SAFETY: this binary has one test and no other thread reads the environment.
    unsafe {
        std::env::set_var("CCLKIT_ENV_FILE", &file);
        std::env::set_var("NCCL_NET_PLUGIN", "from-the-job");
        std::env::set_var("NCCL_BUFFSIZE", "12345");
        std::env::remove_var("NCCL_SOCKET_IFNAME");
    }
    let r = resolve_value(Some(&s(&lib)));
    let EnvOutcome::Loaded {
        plugin, version, ..
    } = r.outcome
    else {
        panic!("not loaded: {:?}", r.outcome);
    };
    assert_eq!(version, 2, "ncclEnvPlugin_v2 is tried before _v1");
    plugin.init(&EnvInitArgs::default()).expect("init");
    let get = |n: &str| plugin.get_env(n).expect("getEnv");
    assert_eq!(
        get("NCCL_NET_PLUGIN"),
        Some(pinned),
        "[pinned] beats the job"
    );
    assert_eq!(
        get("NCCL_BUFFSIZE"),
        Some("12345".into()),
        "the job beats [env]"
    );
    assert_eq!(get("NCCL_SOCKET_IFNAME"), Some(format!("eth{default}")));
    assert_eq!(get("NCCL_IB_DISABLE"), Some("1".into()));
    plugin.finalize().expect("finalize");
    drop(plugin);

    // A float is refused: init fails with the plugin's file:line message.
    std::fs::write(&file, "[env]\nNCCL_IB_TIMEOUT = 1.5\n").expect("write");
    let r = resolve_value(Some(&s(&lib)));
    let EnvOutcome::Loaded { plugin, .. } = r.outcome else {
        panic!("not loaded: {:?}", r.outcome);
    };
    let err = plugin.init(&EnvInitArgs::default()).expect_err("bad file");
    let EnvError::InitFailed {
        code,
        plugin_message,
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*code, 5, "ncclInvalidUsage");
    let msg = plugin_message.clone().unwrap_or_default();
    assert!(
        msg.contains("nccl-env.toml:2") && msg.contains("NCCL_IB_TIMEOUT"),
        "{msg}"
    );
}
