//! The analytic model's formulas, and settings from environment variables.

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};
use cclkit_abi::tuner::NCCL_DEFAULT_CONSTANTS;
use cclkit_tuner::config::ModelSettings;
use cclkit_tuner::engine::Mode;
use cclkit_tuner::env::{ConfigSource, Settings};
use cclkit_tuner::model::{Arch, IntraLink, LinkParams, Model};

fn close(a: f32, b: f64) -> bool {
    ((f64::from(a) - b) / b).abs() < 1e-5
}

#[test]
fn ring_allreduce_one_node() {
    let p = LinkParams::default();
    let m = Model::new(8, 1, &p, None);
    let n = 1usize << 30;
    let t = m
        .predict(Func::ALL_REDUCE, Algorithm::RING, Protocol::SIMPLE, n, 1)
        .unwrap();
    // base 8.4 + 2(n-1) = 14 NVLink steps × 3.4 µs; 2(n-1)/n bytes at 240 GB/s.
    let want = 8.4 + 14.0 * 3.4 + (2.0 * 7.0 / 8.0) * n as f64 / (240.0 * 1000.0);
    assert!(close(t, want), "{t} vs {want}");
    // Latency counts once per pipelined op.
    let t4 = m
        .predict(Func::ALL_REDUCE, Algorithm::RING, Protocol::SIMPLE, n, 4)
        .unwrap();
    assert!(close(t4, want + 3.0 * (8.4 + 14.0 * 3.4)), "{t4}");
}

#[test]
fn tree_allreduce_two_nodes_with_ceiling() {
    let p = LinkParams::default();
    let c = NCCL_DEFAULT_CONSTANTS;
    let m = Model::new(16, 2, &p, Some(&c));
    let n = 1usize << 28;
    let t = m
        .predict(Func::ALL_REDUCE, Algorithm::TREE, Protocol::SIMPLE, n, 1)
        .unwrap();
    // base 8.4 + 2 × ((8-1) × 4.0 NVLink + log2(2) × 14.0 net);
    // bandwidth min(240, 100) × 0.92 (below the 16 × 41.4 GB/s ceiling); 2 bytes/byte.
    let want = 8.4 + 2.0 * (7.0 * 4.0 + 14.0) + 2.0 * n as f64 / (92.0 * 1000.0);
    assert!(close(t, want), "{t} vs {want}");

    // A ceiling below the link: LL is capped by llMaxBws[hopper][2 nodes] = 45 GB/s.
    let ll = m
        .predict(Func::ALL_REDUCE, Algorithm::RING, Protocol::LL, n, 1)
        .unwrap();
    let lat = 6.6 + (30.0 - 2.0) * 0.6 + 2.0 * 2.7;
    let want = lat + (2.0 * 15.0 / 16.0) * n as f64 / ((100.0f64 / 4.0).min(45.0) * 1000.0);
    assert!(close(ll, want), "{ll} vs {want}");
}

#[test]
fn constants_and_overrides_change_predictions() {
    let n = 1usize << 20;
    let base = Model::new(16, 2, &LinkParams::default(), None);
    let mut c = NCCL_DEFAULT_CONSTANTS;
    c.hwLatencies[2][1][2] += 100.0; // NET ring simple
    let slower = Model::new(16, 2, &LinkParams::default(), Some(&c));
    let (a, b) = (
        base.predict(Func::ALL_REDUCE, Algorithm::RING, Protocol::SIMPLE, n, 1)
            .unwrap(),
        slower
            .predict(Func::ALL_REDUCE, Algorithm::RING, Protocol::SIMPLE, n, 1)
            .unwrap(),
    );
    // 2(N-1) = 2 network steps.
    assert!(close(b - a, 200.0), "{a} {b}");

    let fast_net = LinkParams {
        net_bw: 400.0,
        ..LinkParams::default()
    };
    let f = Model::new(16, 2, &fast_net, None);
    assert!(
        f.predict(Func::ALL_GATHER, Algorithm::RING, Protocol::SIMPLE, n, 1)
            .unwrap()
            < base
                .predict(Func::ALL_GATHER, Algorithm::RING, Protocol::SIMPLE, n, 1)
                .unwrap()
    );
    let lat = LinkParams {
        net_lat: 10.0,
        ..LinkParams::default()
    };
    let l = Model::new(16, 2, &lat, None);
    let d = l
        .predict(Func::ALL_REDUCE, Algorithm::TREE, Protocol::LL, 8, 1)
        .unwrap()
        - base
            .predict(Func::ALL_REDUCE, Algorithm::TREE, Protocol::LL, 8, 1)
            .unwrap();
    // Tree allreduce crosses the network 2 × log2(2) times.
    assert!(close(d, 20.0), "{d}");
}

#[test]
fn every_algorithm_nccl_runs_is_modelled_and_nothing_else() {
    let m = Model::new(32, 4, &LinkParams::default(), None);
    for f in 0..5 {
        for a in 0..7 {
            for p in 0..3 {
                let t = m.predict(Func(f), Algorithm(a), Protocol(p), 1 << 20, 1);
                // Tree is allreduce-only and PAT allgather/reducescatter-only in NCCL;
                // PAT (6), NVLS (4) and NVLS tree (5) run the Simple protocol (2) only.
                let runs = match a {
                    0 => f == 4,
                    6 => (f == 2 || f == 3) && p == 2,
                    4 | 5 => p == 2,
                    _ => true,
                };
                if runs {
                    assert!(t.is_some_and(|t| t > 0.0 && t.is_finite()), "{f} {a} {p}");
                } else {
                    assert_eq!(t, None, "{f} {a} {p}");
                }
            }
        }
    }
    assert_eq!(
        m.predict(Func(5), Algorithm::RING, Protocol::SIMPLE, 1, 1),
        None
    );
    assert_eq!(
        m.predict(Func(4), Algorithm(7), Protocol::SIMPLE, 1, 1),
        None
    );
    assert_eq!(
        m.predict(Func(4), Algorithm::RING, Protocol(-1), 1, 1),
        None
    );
}

fn vars(list: &[(&str, &str)]) -> Settings {
    Settings::from_vars(list.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

#[test]
fn settings_from_variables() {
    let s = vars(&[]);
    assert_eq!(s.mode, Mode::Auto);
    assert_eq!(s.config, ConfigSource::Default("nccl_tuner.conf".into()));
    assert!(s.model.is_empty() && s.warnings.is_empty());

    let s = vars(&[
        ("NCCL_TUNER_CONFIG_FILE", "/etc/rules.toml"),
        ("CCLKIT_TUNER_MODE", "Rules"),
        ("CCLKIT_TUNER_INTRA_BW", "300"),
        ("CCLKIT_TUNER_NET_BW", "48.5"),
        ("CCLKIT_TUNER_NET_LAT", "0"),
        ("CCLKIT_TUNER_INTRA_LINK", "pci"),
        ("CCLKIT_TUNER_ARCH", "ampere"),
        ("CCLKIT_TUNER_CHANNELS", "32"),
        ("PATH", "/bin"),
    ]);
    assert_eq!(s.mode, Mode::Rules);
    assert_eq!(s.config, ConfigSource::Explicit("/etc/rules.toml".into()));
    assert_eq!(
        s.model,
        ModelSettings {
            intra_bw: Some(300.0),
            net_bw: Some(48.5),
            net_lat: Some(0.0),
            intra_link: Some(IntraLink::Pci),
            arch: Some(Arch::Ampere),
            channels: Some(32),
        }
    );
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);

    let s = vars(&[
        ("CCLKIT_TUNER_MODE", "fast"),
        ("CCLKIT_TUNER_INTRA_BW", "-3"),
        ("CCLKIT_TUNER_NET_BW", "inf"),
        ("CCLKIT_TUNER_NET_LAT", "-1"),
        ("CCLKIT_TUNER_INTRA_LINK", "ethernet"),
        ("CCLKIT_TUNER_CHANNELS", "0"),
        ("CCLKIT_TUNER_NETBW", "10"),
        ("NCCL_TUNER_CONFIG_FILE", ""),
    ]);
    assert_eq!(s.mode, Mode::Auto);
    assert!(s.model.is_empty());
    assert_eq!(s.config, ConfigSource::Default("nccl_tuner.conf".into()));
    assert_eq!(
        s.warnings,
        vec![
            "CCLKIT_TUNER_CHANNELS: \"0\" is not a channel count (1 to 1024)",
            "CCLKIT_TUNER_INTRA_BW: -3 must be greater than 0",
            "CCLKIT_TUNER_INTRA_LINK: unknown intra-node link \"ethernet\" (expected nvlink or pci)",
            "CCLKIT_TUNER_MODE: unknown mode \"fast\" (expected rules, model or auto)",
            "CCLKIT_TUNER_NETBW: unknown variable, ignored (known: CCLKIT_TUNER_MODE, CCLKIT_TUNER_INTRA_BW, CCLKIT_TUNER_NET_BW, CCLKIT_TUNER_NET_LAT, CCLKIT_TUNER_INTRA_LINK, CCLKIT_TUNER_ARCH, CCLKIT_TUNER_CHANNELS)",
            "CCLKIT_TUNER_NET_BW: \"inf\" is not a number",
            "CCLKIT_TUNER_NET_LAT: -1 must not be negative",
        ]
    );
}

#[test]
fn environment_wins_over_toml_model_table() {
    let toml = ModelSettings {
        net_bw: Some(10.0),
        arch: Some(Arch::Volta),
        ..ModelSettings::default()
    };
    let env = ModelSettings {
        net_bw: Some(20.0),
        ..ModelSettings::default()
    };
    let p = LinkParams::with(&toml.overridden_by(&env));
    assert_eq!(p.net_bw, 20.0);
    assert_eq!(p.arch, Arch::Volta);
    assert_eq!(p.intra_bw, LinkParams::default().intra_bw);
}

#[test]
fn blackwell_ll_ceiling_is_nccls() {
    // One node of 8 Blackwell GPUs on a link fast enough that only the ceiling binds:
    // ring allreduce LL moves link/4 = 500 GB/s, capped by NCCL 2.30's
    // llMaxBws[Blackwell][1 node] = 2 × 141 = 282 GB/s (tuning.cc).
    let p = LinkParams {
        intra_bw: 2000.0,
        arch: Arch::Blackwell,
        ..LinkParams::default()
    };
    let m = Model::new(8, 1, &p, None);
    let n = 3 * (1usize << 20) + 17;
    let t = m
        .predict(Func::ALL_REDUCE, Algorithm::RING, Protocol::LL, n, 1)
        .unwrap();
    // base 6.6 + 14 NVLink steps × 0.6 µs; 2 × 7/8 bytes per byte at 282 GB/s.
    let want = 6.6 + 14.0 * 0.6 + (2.0 * 7.0 / 8.0) * n as f64 / (282.0 * 1000.0);
    assert!(close(t, want), "{t} vs {want}");
}
