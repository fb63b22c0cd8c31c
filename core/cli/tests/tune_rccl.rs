//! `cclkit tune show` and `cclkit check` in both host flavours: under RCCL the tuner
//! gets RCCL's constants struct (1632 bytes with 8 algorithms, 1488 with 7) and a
//! `float[8][3]` table, v7 is not used, and the packaged model tuner, which reads the
//! same NCCL fields at RCCL's offsets, decides exactly as under NCCL.

mod common;

use std::time::Duration;

use common::tune::{cclkit, json};
use serde_json::Value;

fn show(tuner: &str, extra: &[&str], env: &[(&str, &str)]) -> Value {
    let mut args = vec![
        "tune", "show", "--tuner", tuner, "--nranks", "16", "--nnodes", "2", "-b", "8", "-e",
        "64M", "-f", "8", "--json",
    ];
    args.extend_from_slice(extra);
    let r = cclkit(&args, env, Duration::from_secs(120));
    assert_eq!(r.code, Some(0), "{r}");
    json(&r)
}

#[test]
fn tune_show_in_both_flavours_decides_the_same() {
    let tuner = common::s(&common::rust_plugin("libnccl-tuner-cclkit.so"));
    let nccl = show(&tuner, &[], &[]);
    assert_eq!(nccl["host"], "NCCL v7, 1272 bytes");
    assert!(
        nccl["tuner"]
            .as_str()
            .is_some_and(|t| t.contains("ncclTunerPlugin_v7"))
    );

    let rccl8 = show(&tuner, &["--rccl"], &[]);
    assert_eq!(rccl8["host"], "RCCL, 8 algorithms, 1632 bytes");
    assert!(
        rccl8["tuner"]
            .as_str()
            .is_some_and(|t| t.contains("ncclTunerPlugin_v6")),
        "RCCL has no v7: {}",
        rccl8["tuner"]
    );
    let rccl7 = show(
        &tuner,
        &[],
        &[("CCLKIT_FLAVOR", "rccl"), ("CCLKIT_RCCL_NUM_ALGO", "7")],
    );
    assert_eq!(rccl7["host"], "RCCL, 7 algorithms, 1488 bytes");

    let cells = |t: &Value| t["cells"].clone();
    assert!(cells(&nccl).as_array().is_some_and(|c| c.len() == 5 * 8));
    assert_eq!(cells(&nccl), cells(&rccl8));
    assert_eq!(cells(&nccl), cells(&rccl7));
    assert_eq!(rccl8["fallbacks"], 0);
}

#[test]
fn check_init_reports_the_rccl_layout() {
    let tuner = common::s(&common::rust_plugin("libnccl-tuner-cclkit.so"));
    let r = cclkit(
        &[
            "check",
            &tuner,
            "--json",
            "--only",
            "tuner.init,tuner.cost-table",
            "--seed",
            "7",
        ],
        &[("CCLKIT_FLAVOR", "rccl")],
        Duration::from_secs(120),
    );
    assert_eq!(r.code, Some(0), "{r}");
    let rep = json(&r);
    let res = rep["results"].as_array().expect("results");
    let msg = |v: u64, c: &str| {
        res.iter()
            .find(|x| x["version"] == v && x["check"] == c)
            .map(|x| {
                (
                    x["status"].clone(),
                    x["message"].as_str().unwrap_or("").to_owned(),
                )
            })
            .unwrap_or_else(|| panic!("no v{v} {c}: {rep:#}"))
    };
    for v in [6, 5] {
        let (st, m) = msg(v, "init");
        assert_eq!(st, "PASS", "{m}");
        assert!(m.contains("RCCL, 8 algorithms, 1632 bytes"), "{m}");
        assert_eq!(msg(v, "cost-table").0, "PASS");
    }
    let (st, m) = msg(7, "init");
    assert_eq!(st, "PASS", "{m}");
    assert!(m.contains("NCCL v7, 1272 bytes"), "{m}");
}
