//! Env plugin host adapter against a recording C env plugin (tests/fixtures/env):
//! resolution by path, v1/v2 `init` arguments and logger, values copied exactly,
//! a failing `init` that leaves `getEnv` callable, hostile values, a NULL slot, and
//! `finalize` once.

use std::ffi::{CString, c_char, c_int, c_long};

use cclkit_host::Library;
use cclkit_host::env::{EnvError, EnvInitArgs, EnvOutcome, EnvPlugin, resolve_value};
use cclkit_tests::cplugin::{Plugins, s};
use rand::{Rng, SeedableRng};

/// Builds the fixture and resolves it as `NCCL_ENV_PLUGIN=<path>`; also returns a
/// second handle that keeps the library mapped after the plugin is dropped.
fn load(p: &Plugins, name: &str, defines: &[&str]) -> (EnvPlugin, Library) {
    let path = p.with_header(name, "env/env_mock.c", defines);
    let keep = Library::open(Some(&s(&path))).expect("open env mock");
    let r = resolve_value(Some(&s(&path)));
    assert_eq!(r.opens.len(), 1, "a path is tried verbatim only");
    match r.outcome {
        EnvOutcome::Loaded { plugin, .. } => (plugin, keep),
        other => panic!("env mock not loaded: {other:?}"),
    }
}

fn counter(lib: &Library, what: &str) -> c_long {
    let f = lib
        .data_symbol("env_mock_counter")
        .expect("env_mock_counter");
    // SAFETY: the fixture exports `long env_mock_counter(const char *)`.
    let f: extern "C" fn(*const c_char) -> c_long = unsafe { std::mem::transmute(f.as_ptr()) };
    let what = CString::new(what).expect("name");
    f(what.as_ptr())
}

fn set(lib: &Library, name: &str, value: &str) {
    let f = lib.data_symbol("env_mock_set").expect("env_mock_set");
    // SAFETY: the fixture exports `int env_mock_set(const char *, const char *)`.
    let f: extern "C" fn(*const c_char, *const c_char) -> c_int =
        unsafe { std::mem::transmute(f.as_ptr()) };
    let (n, v) = (
        CString::new(name).expect("n"),
        CString::new(value).expect("v"),
    );
    assert_eq!(f(n.as_ptr(), v.as_ptr()), 0);
}

fn random_text(rng: &mut impl Rng, max: usize) -> String {
    let len = rng.random_range(0..=max);
    (0..len)
        .map(|_| char::from(rng.random_range(0x20u8..0x7f)))
        .collect()
}

#[test]
fn v2_passes_version_and_logger_and_values_come_back_exactly() {
    let p = Plugins::new();
    let (env, lib) = load(&p, "libenv_v2.so", &["ENV_VERSION=2"]);
    assert_eq!(
        (env.version(), env.symbol(), env.name()),
        (2, "ncclEnvPlugin_v2", "EnvMock")
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let args = EnvInitArgs {
        major: rng.random(),
        minor: rng.random(),
        patch: rng.random(),
        ..EnvInitArgs::default()
    };
    env.init(&args).expect("init");
    assert!(env.is_initialized());
    assert_eq!(counter(&lib, "major"), c_long::from(args.major));
    assert_eq!(counter(&lib, "minor"), c_long::from(args.minor));
    assert_eq!(counter(&lib, "patch"), c_long::from(args.patch));
    assert_eq!(counter(&lib, "logger"), 1);

    let mut expected = Vec::new();
    for i in 0..rng.random_range(5..40) {
        let name = format!("NCCL_T{i}_{}", rng.random_range(0..1_000_000));
        let value = random_text(&mut rng, 255);
        set(&lib, &name, &value);
        expected.push((name, value));
    }
    for (name, value) in &expected {
        assert_eq!(
            env.get_env(name).expect("getEnv").as_deref(),
            Some(value.as_str())
        );
    }
    // A value changed by the plugin later does not change what was copied before.
    let (name, old) = expected[0].clone();
    let copied = env.get_env(&name).expect("getEnv");
    set(&lib, &name, "changed");
    assert_eq!(copied.as_deref(), Some(old.as_str()));
    assert_eq!(
        env.get_env(&name).expect("getEnv").as_deref(),
        Some("changed")
    );
    assert_eq!(env.get_env("NCCL_NOT_SET_ANYWHERE").expect("getEnv"), None);
    assert_eq!(counter(&lib, "getenv"), expected.len() as c_long + 3);
    assert_eq!(
        env.init(&args),
        Err(EnvError::AlreadyInitialized {
            plugin: "EnvMock".into()
        })
    );
    assert_eq!(
        counter(&lib, "init"),
        1,
        "a second init never reaches the plugin"
    );
    drop(env);
    assert_eq!(
        counter(&lib, "finalize"),
        1,
        "drop finalizes an initialised plugin"
    );
}

/// NCCL's suffix is a string literal, so a plugin may keep the pointer `init` gets
/// and read it later: the host keeps its copy while the plugin lives, whatever the
/// caller did with its `EnvInitArgs` and the heap since.
#[test]
fn the_init_suffix_stays_valid_after_init() {
    let p = Plugins::new();
    for v in [1, 2] {
        let (env, _lib) = load(
            &p,
            &format!("libenv_suffix_v{v}.so"),
            &[&format!("ENV_VERSION={v}")],
        );
        let suffix = format!("-rc{}", rand::rng().random_range(1..1_000_000u32));
        let args = EnvInitArgs {
            suffix: CString::new(suffix.clone()).expect("suffix"),
            ..EnvInitArgs::default()
        };
        env.init(&args).expect("init");
        drop(args);
        let churn: Vec<Vec<u8>> = (1..512).map(|i| vec![b'#'; i % 64 + 1]).collect();
        drop(churn);
        assert_eq!(
            env.get_env("NCCL_MOCK_SUFFIX").expect("getEnv"),
            Some(suffix),
            "v{v}"
        );
    }
}

#[test]
fn v1_gets_no_logger_argument() {
    let p = Plugins::new();
    let (env, lib) = load(&p, "libenv_v1.so", &["ENV_VERSION=1"]);
    assert_eq!((env.version(), env.symbol()), (1, "ncclEnvPlugin_v1"));
    env.init(&EnvInitArgs::default()).expect("init");
    assert_eq!(
        [
            counter(&lib, "major"),
            counter(&lib, "minor"),
            counter(&lib, "patch")
        ],
        [2, 30, 7]
    );
    assert_eq!(
        counter(&lib, "logger"),
        0,
        "v1 init has no logger to record"
    );
    set(&lib, "NCCL_SOCKET_IFNAME", "eth7");
    assert_eq!(
        env.get_env("NCCL_SOCKET_IFNAME")
            .expect("getEnv")
            .as_deref(),
        Some("eth7")
    );
}

#[test]
fn a_failed_init_is_named_and_get_env_still_answers_as_in_nccl() {
    for version in [1u32, 2] {
        let p = Plugins::new();
        let v = format!("ENV_VERSION={version}");
        let (env, lib) = load(&p, &format!("libenv_fail{version}.so"), &[&v, "FAIL_INIT"]);
        let err = env
            .init(&EnvInitArgs::default())
            .expect_err("init must fail");
        let EnvError::InitFailed {
            code,
            plugin_message,
            ..
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(*code, 5, "ncclInvalidUsage");
        if version == 2 {
            assert_eq!(
                plugin_message.as_deref(),
                Some("env_mock: refusing to start")
            );
        }
        assert!(err.to_string().contains("ncclInvalidUsage (5)"), "{err}");
        assert!(!env.is_initialized());
        set(&lib, "NCCL_NET_PLUGIN", "cclkit-socket");
        assert_eq!(
            env.get_env("NCCL_NET_PLUGIN").expect("getEnv").as_deref(),
            Some("cclkit-socket")
        );
        drop(env);
        assert_eq!(
            counter(&lib, "finalize"),
            0,
            "NCCL registers finalize only after init"
        );
    }
}

#[test]
fn hostile_values_and_names_are_refused_by_name() {
    let p = Plugins::new();
    let (env, _lib) = load(&p, "libenv_hostile.so", &[]);
    env.init(&EnvInitArgs::default()).expect("init");
    assert!(matches!(
        env.get_env("NCCL_MOCK_HUGE"),
        Err(EnvError::ValueTooLong { ref name, .. }) if name == "NCCL_MOCK_HUGE"
    ));
    assert!(matches!(
        env.get_env("NCCL_MOCK_BAD_UTF8"),
        Err(EnvError::ValueNotUtf8 { ref name, .. }) if name == "NCCL_MOCK_BAD_UTF8"
    ));
    assert!(matches!(
        env.get_env("NCCL_A\0B"),
        Err(EnvError::BadName { .. })
    ));
}

#[test]
fn finalize_runs_once_and_get_env_is_refused_after_it() {
    let p = Plugins::new();
    let (env, lib) = load(&p, "libenv_fin.so", &[]);
    env.init(&EnvInitArgs::default()).expect("init");
    env.finalize().expect("finalize");
    env.finalize().expect("second finalize is a no-op");
    assert_eq!(counter(&lib, "finalize"), 1);
    assert_eq!(
        env.get_env("NCCL_X"),
        Err(EnvError::Finalized {
            plugin: "EnvMock".into()
        })
    );
    drop(env);
    assert_eq!(counter(&lib, "finalize"), 1, "drop does not finalize twice");
}

#[test]
fn a_null_get_env_slot_is_named() {
    let p = Plugins::new();
    let (env, _lib) = load(&p, "libenv_null.so", &["NULL_GETENV"]);
    env.init(&EnvInitArgs::default()).expect("init");
    assert_eq!(
        env.get_env("NCCL_X"),
        Err(EnvError::NullSlot {
            plugin: "EnvMock".into(),
            symbol: "ncclEnvPlugin_v2".into(),
            slot: "getEnv"
        })
    );
}

#[test]
fn get_env_from_many_threads_copies_consistent_values() {
    let p = Plugins::new();
    let (env, lib) = load(&p, "libenv_mt.so", &[]);
    env.init(&EnvInitArgs::default()).expect("init");
    let names: Vec<(String, String)> = (0..16)
        .map(|i| {
            (
                format!("NCCL_MT_{i}"),
                format!("value-{i}-{}", rand::random::<u32>()),
            )
        })
        .collect();
    for (n, v) in &names {
        set(&lib, n, v);
    }
    std::thread::scope(|sc| {
        for t in 0..4 {
            let (env, names) = (&env, &names);
            sc.spawn(move || {
                for round in 0..500 {
                    let (n, v) = &names[(t * 7 + round) % names.len()];
                    assert_eq!(env.get_env(n).expect("getEnv").as_deref(), Some(v.as_str()));
                }
            });
        }
    });
}
