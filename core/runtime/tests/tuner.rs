//! A tuner plugin steering the runtime across processes (issue 6): the packaged
//! template tuner, loaded by name (`NCCL_TUNER_PLUGIN=template`), picks tree/LL below
//! `CCLKIT_TEMPLATE_THRESHOLD` and ring/Simple above; the decisions each call returns
//! and `comm.tuning().report()` must show its choices honoured, its channel count
//! used, no fallback, and `NCCL_ALGO`/`NCCL_PROTO` still binding on it.

#[macro_use]
mod common_rt;

use cclkit_abi::raw::common::{DataType, Func, RedOp};
use cclkit_runtime::tune::Decision;
use common_rt::data::{Rng, check_reduction};
use common_rt::{Job, Run, builtin_net, emit, join, lib_dir, packaged, param_u64};

fn json(d: &Decision) -> serde_json::Value {
    serde_json::json!({
        "algo": d.algo.name().unwrap_or("?"),
        "proto": d.proto.name().unwrap_or("?"),
        "channels": d.channels,
        "source": format!("{:?}", d.source),
    })
}

/// Sizes (bytes) the rank program runs AllReduce with, for `threshold`.
fn sizes(threshold: u64) -> Vec<u64> {
    vec![
        threshold / 4,
        threshold - 4,
        threshold + 4,
        threshold * 4,
        16_388,
    ]
}

/// The rank program: AllReduce at sizes around the threshold (results checked),
/// one Broadcast below it; reports decisions, the tuner and its report.
fn steered() {
    let comm = join();
    let (me, n) = (comm.rank(), comm.nranks());
    let threshold = param_u64("THRESHOLD", 65536);
    emit("tuner", comm.tuning().tuner_name());
    for (i, bytes) in sizes(threshold).into_iter().enumerate() {
        let count = bytes as usize / 4;
        let xs: Vec<Vec<u8>> = (0..n)
            .map(|r| Rng::new(&[i as u64, r as u64]).bytes(count * 4))
            .collect();
        let mut out = vec![0u8; count * 4];
        let d = comm
            .all_reduce(&xs[me], &mut out, DataType::INT32, RedOp::SUM)
            .unwrap_or_else(|e| panic!("rank {me}: allreduce of {bytes} bytes: {e}"));
        let refs: Vec<&[u8]> = xs.iter().map(Vec::as_slice).collect();
        check_reduction(DataType::INT32, RedOp::SUM, &refs, 0, &out)
            .unwrap_or_else(|e| panic!("rank {me}: {bytes} bytes with {d:?}: {e}"));
        emit("allreduce", json(&d));
    }
    let small = (threshold / 4) as usize;
    let src = Rng::new(&[99]).bytes(small);
    let mut got = vec![0u8; small];
    let d = comm.broadcast(&src, &mut got, 0).expect("broadcast");
    assert_eq!(got, src, "broadcast result");
    emit("broadcast", json(&d));
    let report: Vec<serde_json::Value> = comm
        .tuning()
        .report()
        .iter()
        .map(|(f, size, d, calls)| {
            let mut j = json(d);
            j["func"] = format!("{f:?}").into();
            j["size"] = (*size).into();
            j["calls"] = (*calls).into();
            j
        })
        .collect();
    emit("report", report);
    emit("fallbacks", comm.tuning().fallbacks());
    comm.destroy().expect("destroy");
}

/// A launch with the template tuner and `extra` settings.
fn launch(test: &str, np: usize, threshold: u64, extra: &[(&str, &str)]) -> Run {
    packaged("libnccl-tuner-template.so");
    let mut job = Job::new(test, np)
        .envs(builtin_net())
        .env("NCCL_TUNER_PLUGIN", "template")
        .env("LD_LIBRARY_PATH", lib_dir().display())
        .env("CCLKIT_STRICT", 1)
        .env("CCLKIT_TEMPLATE_THRESHOLD", threshold)
        .env("CCLKIT_TEMPLATE_CHANNELS", 1)
        .env("CKT_THRESHOLD", threshold);
    for (k, v) in extra {
        job = job.env(k, v);
    }
    let run = job.run();
    run.assert_ok();
    for r in 0..np {
        let name = run.value(r, "tuner");
        assert!(
            name.as_str().is_some_and(|s| s.contains("TemplateTuner")),
            "rank {r} runs tuner {name}\n{}",
            run.describe()
        );
        assert_eq!(
            run.value(r, "fallbacks"),
            0,
            "rank {r}: a tuner call fell back"
        );
        assert_eq!(
            run.values(r, "allreduce"),
            run.values(0, "allreduce"),
            "rank {r} decided differently from rank 0"
        );
    }
    run
}

fn pick(v: &serde_json::Value) -> (String, String, String) {
    let s = |k: &str| v[k].as_str().unwrap_or("?").to_owned();
    (s("algo"), s("proto"), s("source"))
}

fn tuner_pick(algo: &str, proto: &str) -> (String, String, String) {
    (algo.into(), proto.into(), "Tuner".into())
}

#[test]
fn template_tuner_steers_allreduce_by_threshold() {
    rank!(steered);
    for (np, threshold) in [(3, 65_536u64), (4, 4_096)] {
        let run = launch(test_name!(), np, threshold, &[]);
        let ar = run.values(0, "allreduce");
        for (bytes, d) in sizes(threshold).into_iter().zip(&ar) {
            let want = if bytes < threshold {
                tuner_pick("TREE", "LL")
            } else {
                tuner_pick("RING", "SIMPLE")
            };
            assert_eq!(
                pick(d),
                want,
                "{np} ranks, {bytes} bytes, threshold {threshold}"
            );
            assert_eq!(d["channels"], 1, "CCLKIT_TEMPLATE_CHANNELS=1 not used: {d}");
        }
        // tree/LL is not offered for Broadcast: the tuner leaves the model's choice.
        let b = run.value(0, "broadcast");
        assert_eq!(
            (b["algo"].as_str(), b["source"].as_str()),
            (Some("RING"), Some("Model")),
            "{b}"
        );
        // The report holds the tuner's decisions for AllReduce.
        let report = run.value(0, "report");
        let rows: Vec<&serde_json::Value> = report
            .as_array()
            .expect("report rows")
            .iter()
            .filter(|r| r["func"] == format!("{:?}", Func::ALL_REDUCE))
            .collect();
        assert!(!rows.is_empty(), "no AllReduce in the report: {report}");
        for r in rows {
            let size = r["size"].as_u64().expect("size");
            // A size class straddling the threshold may end either way.
            if size * 2 <= threshold {
                assert_eq!(pick(r), tuner_pick("TREE", "LL"), "{r}");
            } else if size >= threshold {
                assert_eq!(pick(r), tuner_pick("RING", "SIMPLE"), "{r}");
            }
        }
        eprintln!("{np} ranks, threshold {threshold}: {ar:?}\nreport: {report}");
    }
}

#[test]
fn nccl_algo_and_proto_bind_the_tuner() {
    rank!(steered);
    let threshold = 65_536u64;
    // Tree is ruled out: the tuner's tree/LL cannot be chosen, ring runs everywhere.
    let run = launch(test_name!(), 3, threshold, &[("NCCL_ALGO", "ring")]);
    for d in run.values(0, "allreduce") {
        assert_eq!(d["algo"], "RING", "NCCL_ALGO=ring: {d}");
    }
    // Only LL128: neither LL below nor Simple above is available to the tuner.
    let run = launch(test_name!(), 3, threshold, &[("NCCL_PROTO", "LL128")]);
    for d in run
        .values(0, "allreduce")
        .into_iter()
        .chain(run.values(0, "broadcast"))
    {
        assert_eq!(d["proto"], "LL128", "NCCL_PROTO=LL128: {d}");
    }
    // Tree with Simple forced: above the threshold ring/Simple is gone, tree/Simple runs.
    let run = launch(
        test_name!(),
        4,
        threshold,
        &[("NCCL_ALGO", "allreduce:tree"), ("NCCL_PROTO", "Simple")],
    );
    for d in run.values(0, "allreduce") {
        assert_eq!(
            (d["algo"].as_str(), d["proto"].as_str()),
            (Some("TREE"), Some("SIMPLE")),
            "{d}"
        );
    }
}
