//! Issue 22, item 2: the tuner lookup follows NCCL's order (tuner.cc
//! `ncclTunerPluginLoad`, plugin_open.cc `ncclGetNetPluginLib`): `NCCL_TUNER_PLUGIN`
//! (or `libnccl-tuner.so`), then the external net library opened last, *even when its
//! net part was rejected*, then the built-in cost model.

mod common;

use cclkit_host::Cause;
use cclkit_host::library::is_loaded;
use cclkit_host::net::CommConfig;
use cclkit_host::resolve::Rule;
use cclkit_host::select::{NetRegistry, Outcome, TunerArgs, TunerRegistry};
use cclkit_host::tuner::{NvlDomainInfo, TunerConstants};
use common::{Plugins, config, fixture, s};

fn args() -> TunerArgs {
    TunerArgs {
        n_ranks: 8,
        n_nodes: 2,
        comm_id: 0x22,
        nvl: NvlDomainInfo {
            nNvlDomains: 2,
            minRanksPerNvlDomain: 4,
            maxRanksPerNvlDomain: 4,
        },
    }
}

/// NCCL's mixed example, shaped as the issue saw it: `ncclNetPlugin_v12` with 0
/// devices and `ncclTunerPlugin_v6` in one library.
fn mixed(p: &Plugins, ndev: u32) -> std::path::PathBuf {
    p.cc(
        &format!("mixed{ndev}.so"),
        &[fixture("net_mock.c"), fixture("tuner_mock.c")],
        &[
            "-DNET_VERSION=12".to_owned(),
            "-DTUNER_VERSION=6".to_owned(),
            format!("-DNDEV={ndev}"),
        ],
    )
}

#[test]
fn a_tuner_in_a_rejected_net_library_is_found_and_used() {
    let p = Plugins::new();
    for ndev in [0, 1] {
        let lib = mixed(&p, ndev);
        let nets = NetRegistry::new(config(Some(&s(&lib)), None));
        let net = nets.select(1, CommConfig::default()).expect("a net");
        assert_eq!(net.fell_back, ndev == 0, "ndev {ndev}");
        if ndev == 0 {
            assert!(net.context.plugin().is_builtin(), "0 devices: built-in net");
            assert!(is_loaded(&lib), "NCCL keeps the rejected net library open");
        }
        let tuners = TunerRegistry::new(config(Some(&s(&lib)), None));
        let sel = tuners
            .select(
                nets.tuner_library().as_ref(),
                args(),
                &mut TunerConstants::default(),
            )
            .expect("tuner");
        assert!(sel.tuner.is_some(), "ndev {ndev}: the tuner is used");
        let last = sel.attempts.last().expect("attempts");
        match &last.outcome {
            Outcome::Selected(c) => {
                assert_eq!((c.rule, c.version), (Rule::NetLibrary, 6), "ndev {ndev}");
                assert_eq!(c.path.as_deref(), Some(s(&lib).as_str()));
            }
            o => panic!("ndev {ndev}: {o:?}"),
        }
        assert!(!sel.fell_back, "an absent default tuner is not a fallback");
    }
}

#[test]
fn the_net_library_step_is_shown_when_there_is_none_to_search() {
    let nets = NetRegistry::new(config(Some("none"), None));
    nets.select(1, CommConfig::default()).expect("built-in");
    assert!(nets.tuner_library().is_none());
    let sel = TunerRegistry::new(config(None, None))
        .select(None, args(), &mut TunerConstants::default())
        .expect("built-in model");
    let causes: Vec<_> = sel
        .attempts
        .iter()
        .map(|a| match &a.outcome {
            Outcome::Skipped(e) | Outcome::Failed(e) => Some(e.cause.clone()),
            Outcome::Selected(_) => None,
        })
        .collect();
    assert_eq!(causes.len(), 3, "{causes:?}");
    assert!(matches!(causes[0], Some(Cause::NotLoaded)));
    assert!(matches!(causes[1], Some(Cause::NoNetLibrary)));
    assert!(sel.tuner.is_none() && sel.attempts[2].builtin);
}

#[test]
fn a_net_library_without_a_usable_table_is_closed_and_not_searched() {
    let p = Plugins::new();
    // Only a tuner: NCCL finds no net symbol, closes the library, forgets it.
    let lib = p.tuner("tuner_only.so", 6, &[]);
    let nets = NetRegistry::new(config(Some(&s(&lib)), None));
    nets.select(1, CommConfig::default()).expect("built-in");
    assert!(nets.tuner_library().is_none());
    assert!(!is_loaded(&lib));
}
