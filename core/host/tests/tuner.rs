//! Tuner host adapter (v1–v7) and tuner selection (NCCL 2.30 tuner.cc) against C
//! tuners built here, and the packaged Rust template tuner.

mod common;

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};
use cclkit_host::library::is_loaded;
use cclkit_host::net::{CommConfig, NetPlugin};
use cclkit_host::select::{Attempt, NetRegistry, Outcome, SelectError, TunerArgs, TunerRegistry};
use cclkit_host::tuner::{CostTable, NvlDomainInfo, TunerConstants, TunerPlugin};
use cclkit_host::{Cause, Library, LoaderConfig, resolve::Rule};
use common::{Plugins, capture, config, s, tuner_value};

const NVL: NvlDomainInfo = NvlDomainInfo {
    nNvlDomains: 3,
    minRanksPerNvlDomain: 4,
    maxRanksPerNvlDomain: 8,
};

fn args() -> TunerArgs {
    TunerArgs {
        n_ranks: 16,
        n_nodes: 2,
        comm_id: 0xabc,
        nvl: NVL,
    }
}

fn idx(a: Algorithm, p: Protocol) -> usize {
    a.0 as usize * 3 + p.0 as usize
}

/// 100 µs everywhere, CollNet and NVLS unsupported (-1).
fn table() -> CostTable {
    let mut t = [100.0; 21];
    for a in [
        Algorithm::COLLNET_DIRECT,
        Algorithm::COLLNET_CHAIN,
        Algorithm::NVLS,
        Algorithm::NVLS_TREE,
    ] {
        for p in [Protocol::LL, Protocol::LL128, Protocol::SIMPLE] {
            t[idx(a, p)] = -1.0;
        }
    }
    t
}

fn load(path: &std::path::Path) -> TunerPlugin {
    TunerPlugin::load(Library::open(Some(&s(path))).expect("dlopen")).expect("tuner table")
}

#[test]
fn every_version_gets_its_argument_order_and_shim() {
    let p = Plugins::new();
    for v in 1..=7u32 {
        let path = p.tuner(&format!("t{v}.so"), v, &[]);
        let t = load(&path);
        assert_eq!((t.version(), t.name()), (v, "MockTuner"));
        let mut constants = TunerConstants::default();
        let mut ctx = t.init(16, 2, 0xabc, NVL, &mut constants).expect("init");
        assert_eq!(tuner_value(&path, "nRanks"), 16.0, "v{v}");
        assert_eq!(tuner_value(&path, "nNodes"), 2.0, "v{v}");
        if v >= 5 {
            assert_eq!(tuner_value(&path, "commId"), f64::from(0xabc), "v{v}");
            assert_eq!(tuner_value(&path, "nvlDomains"), 3.0, "v{v}");
            assert_eq!(
                constants.baseLatencies[0][0], 42.0,
                "v{v}: constants copied back"
            );
            if v == 7 {
                // The fifth GPU-generation row NCCL 2.30 has no values for reads 0;
                // the tuner's write there does not leak into the four-row view.
                assert_eq!(tuner_value(&path, "fifthRow"), 0.0);
                assert_eq!(constants.llMaxBws, TunerConstants::default().llMaxBws);
            }
        } else {
            assert_eq!(
                constants.baseLatencies[0][0], 0.0,
                "v{v}: no constants before v5"
            );
        }
        let mut t21 = table();
        let mut channels = 0;
        ctx.get_coll_info(Func::ALL_REDUCE, 1 << 20, 1, true, &mut t21, &mut channels)
            .expect("getCollInfo");
        assert_eq!(channels, 4, "v{v}");
        assert_eq!(
            t21[idx(Algorithm::RING, Protocol::SIMPLE)],
            0.0,
            "v{v}: RING/SIMPLE chosen"
        );
        assert_eq!(
            t21[idx(Algorithm::TREE, Protocol::LL)],
            100.0,
            "v{v}: others untouched"
        );
        assert_eq!(
            tuner_value(&path, "ctx_ok"),
            1.0,
            "v{v}: the context comes back"
        );
        match v {
            1 | 2 => {
                // tuner_v2.cc: support flags derived from the table.
                assert_eq!(tuner_value(&path, "collNetSupport"), 0.0);
                assert_eq!(tuner_value(&path, "nvlsSupport"), 0.0);
            }
            _ => {
                assert_eq!(
                    (
                        tuner_value(&path, "numAlgo"),
                        tuner_value(&path, "numProto")
                    ),
                    (7.0, 3.0)
                );
                if v >= 4 {
                    assert_eq!(tuner_value(&path, "regBuff"), 1.0);
                }
            }
        }
        let mut chunk = 4096usize;
        let has = ctx
            .get_chunk_size(
                Func::ALL_REDUCE,
                1 << 20,
                Algorithm::RING,
                Protocol::SIMPLE,
                4,
                &mut chunk,
            )
            .expect("getChunkSize");
        assert_eq!(
            (has, chunk),
            if v >= 6 { (true, 65536) } else { (false, 4096) },
            "v{v}"
        );
        drop(ctx);
        assert_eq!(
            tuner_value(&path, "destroy"),
            1.0,
            "v{v}: finalize/destroy on drop"
        );
    }
}

#[test]
fn v2_shim_sees_nvls_support_and_never_enables_an_ignored_entry() {
    let p = Plugins::new();
    let path = p.tuner("t2.so", 2, &["ENABLE_IGNORED"]);
    let t = load(&path);
    let mut ctx = t
        .init(8, 1, 0, NVL, &mut TunerConstants::default())
        .expect("init");
    let mut t21 = table();
    let mut ch = 0;
    ctx.get_coll_info(Func::ALL_GATHER, 4096, 1, false, &mut t21, &mut ch)
        .expect("ok");
    assert_eq!(
        t21,
        table(),
        "NVLS is ignored here, so the v2 choice changes nothing"
    );
    let mut with_nvls = table();
    with_nvls[idx(Algorithm::NVLS, Protocol::SIMPLE)] = 50.0;
    ctx.get_coll_info(Func::ALL_GATHER, 4096, 1, false, &mut with_nvls, &mut ch)
        .expect("ok");
    assert_eq!(tuner_value(&path, "nvlsSupport"), 1.0);
    assert_eq!(with_nvls[idx(Algorithm::NVLS, Protocol::SIMPLE)], 0.0);
}

#[test]
fn enabling_an_entry_nccl_left_at_minus_one_is_reported() {
    let p = Plugins::new();
    let path = p.tuner("t4.so", 4, &["ENABLE_IGNORED"]);
    let mut ctx = load(&path)
        .init(8, 1, 0, NVL, &mut TunerConstants::default())
        .expect("init");
    let mut t21 = table();
    let mut ch = 0;
    let e = ctx
        .get_coll_info(Func::ALL_REDUCE, 8, 1, false, &mut t21, &mut ch)
        .expect_err("must be refused");
    assert_eq!(e.call, "getCollInfo");
    assert!(
        e.to_string()
            .contains("enabled NVLS/SIMPLE that NCCL left at -1"),
        "{e}"
    );
    assert_eq!(
        t21[idx(Algorithm::NVLS, Protocol::SIMPLE)],
        -1.0,
        "put back"
    );
    assert_eq!(
        t21[idx(Algorithm::RING, Protocol::SIMPLE)],
        0.0,
        "the legal edit stays"
    );
}

#[test]
fn writing_past_the_table_or_the_constants_is_caught() {
    let p = Plugins::new();
    let path = p.tuner("t6.so", 6, &["TABLE_OVERRUN"]);
    let mut ctx = load(&path)
        .init(8, 1, 0, NVL, &mut TunerConstants::default())
        .expect("init");
    let mut t21 = table();
    let before = t21;
    let mut ch = 0;
    let e = ctx
        .get_coll_info(Func::ALL_REDUCE, 8, 1, false, &mut t21, &mut ch)
        .expect_err("overrun");
    assert!(
        e.to_string()
            .contains("wrote at least 4 bytes past the end of the 84-byte struct"),
        "{e}"
    );
    assert_eq!(t21, before, "an overrunning tuner's table is not used");
    let path = p.tuner("c5.so", 5, &["CONSTANTS_OVERRUN"]);
    let mut constants = TunerConstants::default();
    let e = load(&path)
        .init(8, 1, 0, NVL, &mut constants)
        .err()
        .expect("overrun");
    assert!(
        e.to_string()
            .contains("past the end of the 1152-byte struct"),
        "{e}"
    );
    assert_eq!(constants, TunerConstants::default(), "not copied back");
}

#[test]
fn v1_is_initialised_once_and_destroyed_with_the_last_context() {
    let p = Plugins::new();
    let path = p.tuner("t1.so", 1, &[]);
    let t = load(&path);
    let a = t
        .init(8, 1, 0, NVL, &mut TunerConstants::default())
        .expect("a");
    let b = t
        .init(8, 1, 1, NVL, &mut TunerConstants::default())
        .expect("b");
    assert_eq!(tuner_value(&path, "init"), 1.0);
    drop(a);
    assert_eq!(tuner_value(&path, "destroy"), 0.0);
    b.finalize().expect("finalize");
    assert_eq!(tuner_value(&path, "destroy"), 1.0);
}

fn outcome_kind(a: &Attempt) -> &'static str {
    match a.outcome {
        Outcome::Selected(_) => "selected",
        Outcome::Failed(_) => "failed",
        Outcome::Skipped(_) => "skipped",
    }
}

#[test]
fn tuner_by_path_then_released_and_reloaded() {
    let p = Plugins::new();
    let path = p.tuner("libtuner.so", 6, &[]);
    let reg = TunerRegistry::new(config(None, Some(&s(&path))));
    let mut constants = TunerConstants::default();
    let sel = reg.select(None, args(), &mut constants).expect("tuner");
    assert!(!sel.fell_back);
    assert_eq!(sel.tuner.as_ref().map(|t| t.plugin().version()), Some(6));
    assert_eq!(constants.baseLatencies[0][0], 42.0);
    drop(sel);
    assert!(!is_loaded(&path), "closed with the last communicator");
    let sel = reg
        .select(None, args(), &mut TunerConstants::default())
        .expect("again");
    assert_eq!(tuner_value(&path, "init"), 1.0, "reloaded: fresh globals");
    assert!(sel.tuner.is_some());
}

#[test]
fn tuner_inside_the_net_library_keeps_it_loaded() {
    let p = Plugins::new();
    let both = p.net_and_tuner("combined.so", 11, 6);
    let nets = NetRegistry::new(config(Some(&s(&both)), None));
    let net = nets.select(1, CommConfig::default()).expect("net");
    let plugin: NetPlugin = net.context.plugin().clone();
    let tuners = TunerRegistry::new(config(Some(&s(&both)), None));
    let sel = tuners
        .select(
            nets.tuner_library().as_ref(),
            args(),
            &mut TunerConstants::default(),
        )
        .expect("tuner");
    let kinds: Vec<_> = sel.attempts.iter().map(outcome_kind).collect();
    assert_eq!(
        kinds,
        ["skipped", "selected"],
        "default libnccl-tuner.so absent, then the net library"
    );
    match &sel.attempts[1].outcome {
        Outcome::Selected(c) => {
            assert_eq!(
                (c.rule, c.name.as_str(), c.version),
                (Rule::NetLibrary, "MockTuner", 6)
            );
        }
        o => panic!("{o:?}"),
    }
    assert!(!sel.fell_back);
    drop(net);
    drop(plugin);
    assert!(
        is_loaded(&both),
        "the tuner keeps the shared library mapped"
    );
    drop(sel);
    assert!(!is_loaded(&both));
}

#[test]
fn none_and_absent_defaults_use_the_built_in_model_quietly() {
    for v in [Some("none"), None] {
        let reg = TunerRegistry::new(config(None, v));
        let (sel, logs) = capture(|| reg.select(None, args(), &mut TunerConstants::default()));
        let sel = sel.expect("built-in");
        assert!(sel.tuner.is_none() && !sel.fell_back, "{v:?}");
        assert!(sel.attempts.last().is_some_and(|a| a.builtin));
        assert!(logs.warnings().is_empty(), "{v:?}: {:?}", logs.warnings());
        if v.is_some() {
            match &sel.attempts[0].outcome {
                Outcome::Skipped(e) => assert!(matches!(e.cause, Cause::SetToNone { .. })),
                o => panic!("{o:?}"),
            }
        }
    }
}

#[test]
fn a_requested_tuner_that_cannot_load_falls_back_loudly_and_stickily() {
    let reg = TunerRegistry::new(config(None, Some("cclkit-test-absent")));
    let (sel, logs) = capture(|| reg.select(None, args(), &mut TunerConstants::default()));
    let sel = sel.expect("built-in");
    assert!(sel.fell_back && sel.tuner.is_none());
    match &sel.attempts[0].outcome {
        Outcome::Failed(e) => assert!(
            e.reason()
                .contains("libnccl-tuner-cclkit-test-absent.so (cannot open shared object file: No such file or directory)"),
            "{}",
            e.reason()
        ),
        o => panic!("{o:?}"),
    }
    let w = logs.warnings();
    assert!(
        w.iter()
            .any(|m| m.starts_with("TUNER plugin cclkit-test-absent")),
        "{w:?}"
    );
    assert!(
        w.iter()
            .any(|m| m.contains("using the built-in cost model")),
        "{w:?}"
    );
    let again = reg
        .select(None, args(), &mut TunerConstants::default())
        .expect("again");
    match &again.attempts[0].outcome {
        Outcome::Failed(e) => assert!(matches!(e.cause, Cause::FailedEarlier { .. })),
        o => panic!("{o:?}"),
    }
    let mut strict = config(None, Some("cclkit-test-absent"));
    strict.strict = true;
    let r = TunerRegistry::new(strict).select(None, args(), &mut TunerConstants::default());
    assert!(matches!(r, Err(SelectError::Strict { .. })));
}

#[test]
fn a_tuner_whose_init_fails_leaves_the_communicator_on_the_built_in_model() {
    let p = Plugins::new();
    let path = p.tuner("bad.so", 5, &["TUNER_INIT_RC=3"]);
    let reg = TunerRegistry::new(config(None, Some(&s(&path))));
    let sel = reg
        .select(None, args(), &mut TunerConstants::default())
        .expect("built-in");
    assert!(sel.fell_back && sel.tuner.is_none());
    match &sel.attempts[0].outcome {
        Outcome::Failed(e) => match &e.cause {
            Cause::Call(c) => {
                assert_eq!((c.call, c.code.0), ("init", 3));
                assert_eq!(
                    c.plugin_message.as_deref(),
                    Some("mock tuner: init failed on purpose (code 3)")
                );
            }
            c => panic!("{c:?}"),
        },
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_net_only_library_named_as_tuner_is_unsupported() {
    let p = Plugins::new();
    let net = p.net("netonly.so", 12, &[]);
    let reg = TunerRegistry::new(LoaderConfig {
        tuner_plugin: Some(s(&net)),
        ..LoaderConfig::default()
    });
    let sel = reg
        .select(None, args(), &mut TunerConstants::default())
        .expect("built-in");
    assert!(sel.fell_back);
    match &sel.attempts[0].outcome {
        Outcome::Failed(e) => {
            assert!(
                e.reason().contains("(it exports only ncclNetPlugin_v12)"),
                "{}",
                e.reason()
            )
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn the_rust_template_tuner_works_through_its_v7_table() {
    let path = common::rust_plugin("libnccl-tuner-template.so");
    let t = load(&path);
    // Every version is exported; the loader, as NCCL after 2.31, tries v7 first.
    assert_eq!(t.version(), 7);
    let mut ctx = t
        .init(16, 2, 7, NVL, &mut TunerConstants::default())
        .expect("init");
    let mut t21 = table();
    let mut ch = 0;
    ctx.get_coll_info(Func::ALL_REDUCE, 1 << 20, 1, false, &mut t21, &mut ch)
        .expect("getCollInfo");
    assert!(
        t21.iter().zip(table()).all(|(a, b)| b >= 0.0 || *a == -1.0),
        "never enables -1 entries"
    );
}
