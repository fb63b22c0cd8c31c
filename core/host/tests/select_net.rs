//! The net selection walk (NCCL 2.30 net.cc) against C plugins built here: every
//! resolution rule, every failure cause, the fallback chosen and the reason text.

mod common;

use cclkit_host::library::is_loaded;
use cclkit_host::net::CommConfig;
use cclkit_host::select::{Attempt, NetRegistry, NetSelection, Outcome, SelectError};
use cclkit_host::{Cause, Library, LoaderConfig, OpenOutcome, resolve::Rule};
use common::{Plugins, capture, config, counter, s};

fn select(cfg: LoaderConfig) -> (NetRegistry, Result<NetSelection, SelectError>) {
    let reg = NetRegistry::new(cfg);
    let r = reg.select(0x1234, CommConfig::default());
    (reg, r)
}

fn selected(a: &Attempt) -> &cclkit_host::select::Chosen {
    match &a.outcome {
        Outcome::Selected(c) => c,
        other => panic!("expected selected, got {other:?}"),
    }
}

fn failed(a: &Attempt) -> &cclkit_host::LoadError {
    match &a.outcome {
        Outcome::Failed(e) => e,
        other => panic!("expected failed, got {other:?}"),
    }
}

fn skipped(a: &Attempt) -> &cclkit_host::LoadError {
    match &a.outcome {
        Outcome::Skipped(e) => e,
        other => panic!("expected skipped, got {other:?}"),
    }
}

#[test]
fn by_path_selects_the_plugin_without_fallback() {
    let p = Plugins::new();
    let lib = p.net("mocknet.so", 12, &[]);
    let ((_reg, sel), logs) = capture(|| select(config(Some(&s(&lib)), None)));
    let sel = sel.expect("selected");
    assert!(!sel.fell_back);
    assert_eq!(sel.devices, 1);
    assert_eq!(sel.attempts.len(), 1);
    let c = selected(&sel.attempts[0]);
    assert_eq!(
        (c.name.as_str(), c.version, c.symbol.as_str()),
        ("Mock", 12, "ncclNetPlugin_v12")
    );
    assert_eq!(c.rule, Rule::Verbatim);
    assert_eq!(c.path.as_deref(), Some(s(&lib).as_str()));
    assert_eq!(sel.context.plugin().name(), "Mock");
    assert!(logs.warnings().is_empty(), "{:?}", logs.warnings());
}

#[test]
fn a_missing_plain_name_tries_both_forms_then_falls_back_loudly() {
    let ((_reg, sel), logs) = capture(|| select(config(Some("cclkit-test-absent"), None)));
    let sel = sel.expect("built-in");
    assert!(sel.fell_back);
    let e = failed(&sel.attempts[0]);
    assert!(matches!(e.cause, Cause::NotLoaded));
    let names: Vec<_> = e
        .opens
        .iter()
        .map(|o| (o.shown_name().to_owned(), o.rule))
        .collect();
    assert_eq!(
        names,
        [
            ("cclkit-test-absent".to_owned(), Rule::Verbatim),
            (
                "libnccl-net-cclkit-test-absent.so".to_owned(),
                Rule::PrefixForm
            )
        ]
    );
    assert!(
        e.opens
            .iter()
            .all(|o| matches!(o.outcome, OpenOutcome::NotFound { .. }))
    );
    assert_eq!(
        e.reason(),
        "could not load the library; tried: cclkit-test-absent (cannot open shared object \
         file: No such file or directory), libnccl-net-cclkit-test-absent.so (cannot open \
         shared object file: No such file or directory)"
    );
    assert!(selected(&sel.attempts[1]).name == "cclkit-socket" && sel.attempts[1].builtin);
    let w = logs.warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].contains("libnccl-net-cclkit-test-absent.so (cannot open shared object file: No such file or directory)")
            && w[0].contains("falling back to 'built-in cclkit-socket'"),
        "{}",
        w[0]
    );
    assert!(
        w[1].contains("using 'cclkit-socket' after 1 plugin(s) could not be used"),
        "{}",
        w[1]
    );
}

#[test]
fn paths_and_lib_so_names_are_tried_once() {
    let p = Plugins::new();
    for v in [
        s(&p.path("libnccl-net-gone.so")),
        "libcclkit-gone.so".to_owned(),
    ] {
        let (_reg, sel) = select(config(Some(&v), None));
        let sel = sel.expect("built-in");
        let e = failed(&sel.attempts[0]);
        assert_eq!(e.opens.len(), 1, "{v}: {:?}", e.opens);
        assert_eq!(e.opens[0].name.as_deref(), Some(v.as_str()));
    }
}

#[test]
fn unset_default_absent_is_not_a_fallback() {
    let ((_reg, sel), logs) = capture(|| select(LoaderConfig::default()));
    let sel = sel.expect("built-in");
    assert!(!sel.fell_back);
    let e = skipped(&sel.attempts[0]);
    assert_eq!(e.opens[0].name.as_deref(), Some("libnccl-net.so"));
    assert_eq!(e.opens[0].rule, Rule::Default);
    assert!(logs.warnings().is_empty(), "{:?}", logs.warnings());
    assert!(logs.at(tracing::Level::INFO).iter().any(|m| {
        m.contains("libnccl-net.so (cannot open shared object file: No such file or directory)")
    }));
}

#[test]
fn list_order_first_usable_wins_and_failures_are_sticky() {
    let p = Plugins::new();
    let one = p.net("one.so", 11, &["PLUGIN_NAME=\"One\""]);
    let two = p.net("two.so", 10, &["PLUGIN_NAME=\"Two\""]);
    let list = format!("cclkit-test-absent,{},{}", s(&one), s(&two));
    let (reg, sel) = select(config(Some(&list), None));
    let sel = sel.expect("one");
    assert!(sel.fell_back);
    assert_eq!(sel.attempts.len(), 2);
    failed(&sel.attempts[0]);
    assert_eq!(selected(&sel.attempts[1]).name, "One");
    assert!(!is_loaded(&two), "a later entry must not even be loaded");
    // Second communicator: the failure is not retried; "One" is shared.
    let again = reg.select(0x5678, CommConfig::default()).expect("again");
    match &skipped(&again.attempts[0]).cause {
        Cause::FailedEarlier { reason } => assert!(reason.contains("could not load"), "{reason}"),
        c => panic!("{c:?}"),
    }
    assert_eq!(selected(&again.attempts[1]).name, "One");
    assert_eq!(counter(&one, "init"), 2, "v11: one init per communicator");
}

#[test]
fn none_or_an_empty_list_means_built_in_only() {
    for v in ["none", "NONE", ""] {
        let (_reg, sel) = select(config(Some(v), None));
        let sel = sel.expect("built-in");
        assert_eq!(sel.attempts.len(), 1, "{v}");
        assert!(sel.attempts[0].builtin && !sel.fell_back);
    }
}

#[test]
fn a_file_without_symbols_is_unsupported() {
    let p = Plugins::new();
    let lib = p.c_source("nosym.so", "int cclkit_nothing = 1;\n", &[]);
    let (_reg, sel) = select(config(Some(&s(&lib)), None));
    let e = failed(&sel.expect("built-in").attempts[0]).clone();
    match &e.cause {
        Cause::NoSymbol { tried, exported } => {
            assert_eq!(tried[0], "ncclNetPlugin_v12");
            assert_eq!(tried.len(), 7);
            assert!(exported.is_empty());
        }
        c => panic!("{c:?}"),
    }
    assert!(
        e.reason().contains("exports none of ncclNetPlugin_v12")
            && e.reason().contains("no plugin symbols at all"),
        "{}",
        e.reason()
    );
}

#[test]
fn only_v5_symbols_name_the_version_found() {
    let p = Plugins::new();
    let lib = p.c_source(
        "v5.so",
        "const char ncclNetPlugin_v5[128] = \"old\";\n",
        &[],
    );
    let (_reg, sel) = select(config(Some(&s(&lib)), None));
    let e = failed(&sel.expect("built-in").attempts[0]).clone();
    assert!(
        e.reason().ends_with("(it exports only ncclNetPlugin_v5)"),
        "{}",
        e.reason()
    );
    assert_eq!(e.path.as_deref(), Some(s(&lib).as_str()));
}

#[test]
fn init_error_quotes_the_plugin_and_is_not_retried() {
    let p = Plugins::new();
    let lib = p.net("bad.so", 12, &["INIT_RC=2"]);
    let ((reg, sel), logs) = capture(|| select(config(Some(&s(&lib)), None)));
    let sel = sel.expect("built-in");
    let e = failed(&sel.attempts[0]).clone();
    match &e.cause {
        Cause::Call(c) => {
            assert_eq!((c.call, c.code.0), ("init", 2));
            assert_eq!(
                c.plugin_message.as_deref(),
                Some("mock: init failed on purpose (code 2)")
            );
        }
        c => panic!("{c:?}"),
    }
    assert_eq!(
        e.reason(),
        "NET plugin 'Mock' (v12): init failed: ncclSystemError (2); the plugin said: \
         \"mock: init failed on purpose (code 2)\""
    );
    assert!(
        logs.warnings()
            .iter()
            .any(|w| w.contains("mock: init failed on purpose"))
    );
    // net.cc `ncclNetPluginInit` disables it but never closes the library (the
    // tuner lookup may still search it).
    assert!(is_loaded(&lib), "a plugin that failed init stays loaded");
    let again = reg.select(1, CommConfig::default()).expect("built-in");
    assert!(matches!(
        skipped(&again.attempts[0]).cause,
        Cause::FailedEarlier { .. }
    ));
    assert_eq!(counter(&lib, "init"), 1, "and init is never retried");
    drop(reg);
    assert!(!is_loaded(&lib), "closed with the registry");
}

#[test]
fn zero_devices_fall_back_after_finalizing() {
    let p = Plugins::new();
    let lib = p.net("zero.so", 11, &["NDEV=0"]);
    let _pin = Library::open(Some(&s(&lib))).expect("pin to read counters");
    let (_reg, sel) = select(config(Some(&s(&lib)), None));
    let e = failed(&sel.expect("built-in").attempts[0]).clone();
    assert!(matches!(e.cause, Cause::NoDevices { ndev: 0 }));
    assert!(
        e.reason().contains("devices() reported 0 devices"),
        "{}",
        e.reason()
    );
    assert_eq!((counter(&lib, "init"), counter(&lib, "finalize")), (1, 1));
}

#[test]
fn device_type_must_be_host_or_unpack_v7() {
    let p = Plugins::new();
    let gin = p.net("gin.so", 12, &["DEV_TYPE=2"]);
    let (_reg, sel) = select(config(Some(&s(&gin)), None));
    let e = failed(&sel.expect("built-in").attempts[0]).clone();
    assert!(matches!(
        e.cause,
        Cause::DeviceType {
            device_type: 2,
            device_version: 0
        }
    ));
    assert!(e.reason().contains("netDeviceType 2"), "{}", e.reason());
    let old_unpack = p.net("unpack6.so", 9, &["DEV_TYPE=1", "DEV_VERSION=6"]);
    let (_reg, sel) = select(config(Some(&s(&old_unpack)), None));
    failed(&sel.expect("built-in").attempts[0]);
    let unpack = p.net("unpack7.so", 9, &["DEV_TYPE=1", "DEV_VERSION=7"]);
    let (_reg, sel) = select(config(Some(&s(&unpack)), None));
    assert_eq!(selected(&sel.expect("unpack").attempts[0]).version, 9);
}

#[test]
fn a_null_name_is_rejected() {
    let p = Plugins::new();
    let lib = p.net("null.so", 8, &["NULL_NAME"]);
    let (_reg, sel) = select(config(Some(&s(&lib)), None));
    let e = failed(&sel.expect("built-in").attempts[0]).clone();
    assert!(matches!(e.cause, Cause::NullName));
    assert_eq!(e.symbol.as_deref(), Some("ncclNetPlugin_v8"));
}

#[test]
fn a_properties_overrun_fails_the_device_check() {
    let p = Plugins::new();
    let lib = p.net("overrun.so", 11, &["PROPS_OVERRUN"]);
    let (_reg, sel) = select(config(Some(&s(&lib)), None));
    let e = failed(&sel.expect("built-in").attempts[0]).clone();
    assert!(
        e.reason()
            .contains("wrote at least 16 bytes past the end of the 112-byte struct"),
        "{}",
        e.reason()
    );
}

#[test]
fn nccl_net_filters_by_table_name_case_insensitively() {
    let p = Plugins::new();
    let one = p.net("one.so", 12, &["PLUGIN_NAME=\"One\""]);
    let two = p.net("two.so", 12, &["PLUGIN_NAME=\"Two\""]);
    let mut cfg = config(Some(&format!("{},{}", s(&one), s(&two))), None);
    cfg.net_name = Some("two".into());
    let (_reg, sel) = select(cfg.clone());
    let sel = sel.expect("two");
    assert!(!sel.fell_back);
    match &skipped(&sel.attempts[0]).cause {
        Cause::NameMismatch { name, wanted } => {
            assert_eq!((name.as_str(), wanted.as_str()), ("One", "two"))
        }
        c => panic!("{c:?}"),
    }
    assert_eq!(selected(&sel.attempts[1]).name, "Two");
    cfg.net_name = Some("Socket".into());
    let (_reg, sel) = select(cfg.clone());
    assert!(sel.expect("built-in").attempts[2].builtin);
    cfg.net_name = Some("IB".into());
    let (_reg, sel) = select(cfg);
    assert!(matches!(sel, Err(SelectError::NoNet { .. })));
}

#[test]
fn strict_mode_turns_a_fallback_into_an_error() {
    let mut cfg = config(Some("cclkit-test-absent"), None);
    cfg.strict = true;
    let (_reg, sel) = select(cfg);
    let err = match sel {
        Err(e) => e,
        Ok(_) => panic!("strict must refuse the fallback"),
    };
    assert!(matches!(err, SelectError::Strict { .. }));
    assert_eq!(err.attempts().len(), 1);
    assert!(
        err.to_string()
            .starts_with("CCLKIT_STRICT=1: refusing to fall back"),
        "{err}"
    );
    let p = Plugins::new();
    let good = p.net("good.so", 12, &[]);
    let mut cfg = config(Some(&s(&good)), None);
    cfg.strict = true;
    assert!(select(cfg).1.is_ok());
}

#[test]
fn reload_after_the_last_release() {
    for version in [12, 8] {
        let p = Plugins::new();
        let lib = p.net("reload.so", version, &[]);
        let (reg, sel) = select(config(Some(&s(&lib)), None));
        let sel = sel.expect("selected");
        assert!(is_loaded(&lib));
        assert_eq!(counter(&lib, "init"), 1);
        let (h, _listen) = sel.context.listen(0).expect("listen");
        assert_eq!(&h[..8], &0x6d6f636b6e657421u64.to_ne_bytes());
        drop(_listen);
        drop(sel);
        assert!(
            !is_loaded(&lib),
            "v{version}: the last release must dlclose the plugin"
        );
        // Loadable again: fresh globals (init counter starts over) and it works.
        let sel = reg.select(2, CommConfig::default()).expect("reloaded");
        assert!(is_loaded(&lib));
        assert_eq!(
            counter(&lib, "init"),
            1,
            "v{version}: globals start over after reload"
        );
        assert_eq!(counter(&lib, "listen"), 0);
        assert_eq!(selected(&sel.attempts[0]).name, "Mock");
        let (_h, _l) = sel.context.listen(0).expect("listen after reload");
        assert_eq!(counter(&lib, "listen"), 1);
    }
}

#[test]
fn ref_count_setting_pins_the_library() {
    let p = Plugins::new();
    let lib = p.net("pinned.so", 12, &[]);
    let mut cfg = config(Some(&s(&lib)), None);
    cfg.pin_net_plugins = true;
    let (reg, sel) = select(cfg);
    drop(sel.expect("selected"));
    assert!(
        is_loaded(&lib),
        "NCCL_NET_PLUGIN_REF_COUNT>0 keeps it loaded"
    );
    drop(reg);
    assert!(!is_loaded(&lib));
}

#[test]
fn collnet_is_found_separately_from_net() {
    let p = Plugins::new();
    let collnet = p.path("collnet.c");
    std::fs::write(&collnet, "const char ncclCollNetPlugin_v9[144] = \"cn\";\n").expect("write");
    let lib = p.cc(
        "netcollnet.so",
        &[common::fixture("net_mock.c"), collnet],
        &["-DNET_VERSION=12".into()],
    );
    let (_reg, sel) = select(config(Some(&s(&lib)), None));
    let sel = sel.expect("selected");
    assert_eq!(sel.context.plugin().version(), 12);
    assert_eq!(
        sel.context.plugin().collnet(),
        Some(("ncclCollNetPlugin_v9", 9))
    );
    let plain = p.net("plain.so", 12, &[]);
    let (_reg, sel) = select(config(Some(&s(&plain)), None));
    assert_eq!(sel.expect("selected").context.plugin().collnet(), None);
}
