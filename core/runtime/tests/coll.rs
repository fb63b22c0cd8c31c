//! Collectives across processes (issue 6): every collective × every type × every op
//! on 1, 2, 3, 4, 5 and 8 ranks with random data and counts 0, 1, primes and more
//! than one chunk, in and out of place, alone and aggregated in groups; then every
//! algorithm and protocol forced once (`NCCL_ALGO`/`NCCL_PROTO`), checked through
//! the decisions the calls return.

#[macro_use]
mod common_rt;

use std::collections::BTreeMap;
use std::time::Duration;

use common_rt::colls::{Bufs, DEBUG, Tally, cases, note};
use common_rt::{Job, Run, builtin_net, emit, join, param, param_u64};

/// The rank program: runs every case (windows of 1, 1 and 4 cases per group) and
/// checks each result; reports what ran.
fn collectives() {
    let comm = join();
    let (me, n) = (comm.rank(), comm.nranks());
    let seed = param_u64("SEED", 1);
    let big = param_u64("BIG_BYTES", 1 << 20) as usize;
    let forced_algo = param("FORCE_ALGO");
    let forced_proto = param("FORCE_PROTO");
    let forced = forced_algo.as_deref().zip(forced_proto.as_deref());
    let all = cases(n, seed, big, param("ONLY_TUNED").is_some());
    let mut tally = Tally::default();
    let started = std::time::Instant::now();
    let (mut i, mut w) = (0, 0);
    let mut timing = [0f64; 3];
    while i < all.len() {
        let k = [1, 1, 4][w % 3].min(all.len() - i);
        w += 1;
        let window = &all[i..i + k];
        let t0 = std::time::Instant::now();
        let mut bufs: Vec<Bufs> = window.iter().map(|c| c.buffers(seed, me, n)).collect();
        let t1 = std::time::Instant::now();
        let mut g = comm.collectives();
        for (c, b) in window.iter().zip(bufs.iter_mut()) {
            c.add(&mut g, b);
        }
        let decisions = g
            .run()
            .unwrap_or_else(|e| panic!("rank {me}/{n}: {window:?}: {e}"));
        assert_eq!(decisions.len(), k, "one decision per collective");
        let t2 = std::time::Instant::now();
        timing[0] += (t1 - t0).as_secs_f64();
        timing[1] += (t2 - t1).as_secs_f64();
        for ((c, b), d) in window.iter().zip(&bufs).zip(&decisions) {
            tally.add_digest(c.verify(&comm, seed, b));
            note(&mut tally, c, n, d, forced);
        }
        timing[2] += t2.elapsed().as_secs_f64();
        i += k;
    }
    tally.agree(&comm);
    comm.barrier().expect("barrier");
    emit("cases", all.len());
    emit("seconds", started.elapsed().as_secs_f64());
    emit("timing", timing);
    emit("runs", &tally.runs);
    emit("multi_chunk", &tally.multi_chunk);
    emit("ahead_slices", cclkit_runtime::coll::ahead_slices());
    emit("report", comm.tuning().report_text());
    comm.destroy().expect("destroy");
}

/// Every rank ran the same number of cases and rank 0 reported what ran.
fn summary(run: &Run, label: &str) -> BTreeMap<String, u64> {
    let cases = run.value(0, "cases");
    for r in 0..run.ranks.len() {
        assert_eq!(run.value(r, "cases"), cases, "rank {r}");
    }
    let runs: BTreeMap<String, u64> =
        serde_json::from_value(run.value(0, "runs")).expect("runs map");
    eprintln!(
        "{label}: {cases} cases in {:.1} s (rank 0 {:.1} s, {}): {runs:?}; more than one chunk: {}",
        run.wall.as_secs_f64(),
        run.value(0, "seconds").as_f64().unwrap_or(0.0),
        run.value(0, "timing"),
        run.value(0, "multi_chunk")
    );
    runs
}

/// Small FIFOs (`NCCL_BUFFSIZE`, …): many chunks, steps and slot reuses at modest
/// sizes. Chunks become 64 KiB (Simple), 4 KiB (LL) and 28 800 B (LL128) in
/// optimised builds, 16 KiB, 2 KiB and 3840 B in debug ones.
fn small_fifos(job: Job) -> Job {
    job.env("NCCL_BUFFSIZE", if DEBUG { 32_768 } else { 131_072 })
        .env("NCCL_LL_BUFFSIZE", if DEBUG { 32_768 } else { 65_536 })
        .env("NCCL_LL128_BUFFSIZE", if DEBUG { 32_768 } else { 245_760 })
}

/// Collectives on ring/tree connections, as the decisions name them.
const TUNED: [&str; 5] = [
    "AllReduce",
    "Reduce",
    "ReduceScatter",
    "Broadcast",
    "AllGather",
];

#[test]
fn every_collective_type_and_op_on_1_2_3_4_5_8_ranks() {
    rank!(collectives);
    for np in [1, 2, 3, 4, 5, 8] {
        let big = match (DEBUG, np >= 5) {
            (false, false) => 1 << 20,
            // 5 ranks use small FIFOs (below): 1 MiB spans several chunks even when
            // the model opens two channels.
            (false, true) if np == 5 => 1 << 20,
            (false, true) => 512 << 10,
            (true, false) => 128 << 10,
            (true, true) if np == 5 => 256 << 10,
            (true, true) => 64 << 10,
        };
        // Default FIFOs on some rank counts; on 3 and 5 ranks small ones, so the large
        // count spans several chunks whatever the model picks.
        let small = np == 3 || np == 5;
        let mut job = Job::new(test_name!(), np)
            .envs(builtin_net())
            .env("CKT_SEED", 1000 + np)
            .env("CKT_BIG_BYTES", big)
            .timeout(Duration::from_secs(240));
        if small {
            // The multi-chunk pipelining asserted below is a ring/tree property; the
            // log-step AllReduce (PAT) runs on the other rank counts and in perf_cli.
            job = small_fifos(job).env("NCCL_ALGO", "allreduce:ring,tree");
        }
        let run = job.run();
        run.assert_ok();
        let runs = summary(&run, &format!("{np} ranks"));
        // All eight collectives ran, with the model's choices.
        for f in TUNED.iter().chain(&["AlltoAll", "Gather", "Scatter"]) {
            assert!(
                runs.keys().any(|k| k.starts_with(&format!("{f} "))),
                "{f} never ran: {runs:?}"
            );
        }
        if small {
            let multi: BTreeMap<String, u64> =
                serde_json::from_value(run.value(0, "multi_chunk")).expect("multi_chunk map");
            for f in TUNED {
                assert!(
                    multi.contains_key(f),
                    "{np} ranks: {f} never spanned two chunks: {multi:?}; ran: {runs:?}"
                );
            }
        }
    }
}

#[test]
fn each_algorithm_and_protocol_forced() {
    rank!(collectives);
    // (NCCL_ALGO, NCCL_PROTO, ranks, ranks per host): trees across several hosts
    // (NCCL_HOSTID), a chain inside one host, rings of odd and even size.
    let runs = [
        ("ring", "LL", 3, 3),
        ("ring", "LL128", 4, 4),
        ("ring", "Simple", 5, 5),
        ("allreduce:tree", "LL", 5, 1),
        ("allreduce:tree", "LL128", 8, 2),
        ("allreduce:tree", "Simple", 4, 4),
    ];
    for (algo, proto, np, per_host) in runs {
        let mut job = Job::new(test_name!(), np)
            .envs(builtin_net())
            .env("NCCL_ALGO", algo)
            .env("NCCL_PROTO", proto)
            .env("CKT_FORCE_ALGO", algo)
            .env("CKT_FORCE_PROTO", proto)
            .env("CKT_ONLY_TUNED", 1)
            // Rings run their next loop's send ahead even where ranks share cores
            // (the default runs ahead only with a core per rank).
            .env("CCLKIT_RUN_AHEAD", 1)
            .env("CKT_SEED", 2000 + np)
            .env("CKT_BIG_BYTES", if DEBUG { 256 << 10 } else { 1 << 20 })
            .timeout(Duration::from_secs(240));
        job = small_fifos(job);
        for r in 0..np {
            job = job.rank_env(r, "NCCL_HOSTID", format!("host{}", r / per_host));
        }
        let run = job.run();
        run.assert_ok();
        let label = format!("NCCL_ALGO={algo} NCCL_PROTO={proto}, {np} ranks");
        let ran = summary(&run, &label);
        let multi: BTreeMap<String, u64> =
            serde_json::from_value(run.value(0, "multi_chunk")).expect("multi_chunk map");
        for f in TUNED {
            assert!(
                multi.contains_key(f),
                "{label}: {f} never needed more than one chunk: {multi:?}"
            );
            assert!(
                ran.keys().any(|k| k.starts_with(&format!("{f} "))),
                "{label}: {f} never ran"
            );
        }
        if algo == "ring" {
            // A ring's loops end in a plain receive and start with a plain send of
            // fresh input: the engine runs the send ahead (proxy/engine/ahead.rs),
            // and every result above stayed exact.
            let ahead: u64 =
                serde_json::from_value(run.value(0, "ahead_slices")).expect("ahead_slices count");
            assert!(ahead > 0, "{label}: no slice ran ahead");
        }
        let report = run.value(0, "report");
        let report = report.as_str().unwrap_or_default();
        let want = proto.to_ascii_uppercase();
        assert!(
            report.contains(&want),
            "{label}: report lacks {want}:\n{report}"
        );
    }
}

/// The reference itself: the kernels' serial ring result passes for every type × op,
/// and one wrong element is caught (so the checks above can fail).
#[test]
fn reference_accepts_nccl_results_and_catches_a_wrong_element() {
    use cclkit_kernels::Reduction;
    use common_rt::data::{OPS, Rng, TYPES, check_reduction, input, is_int, size};
    for dt in TYPES {
        for op in OPS {
            for n in [1usize, 2, 5, 8] {
                let count = 257;
                let xs: Vec<Vec<u8>> = (0..n)
                    .map(|r| {
                        input(
                            dt,
                            op,
                            count,
                            &mut Rng::new(&[dt.0 as u64, op.0 as u64, r as u64]),
                        )
                    })
                    .collect();
                let red = Reduction::new(dt, op, n as u32).expect("reduction");
                let mut acc = vec![0u8; xs[0].len()];
                red.pre_op(&mut acc, &xs[0]).expect("pre_op");
                if n == 1 {
                    red.post_op_in_place(&mut acc).expect("post_op");
                }
                for (r, x) in xs.iter().enumerate().skip(1) {
                    let mut next = vec![0u8; acc.len()];
                    red.reduce_local(&mut next, &acc, x, r == n - 1)
                        .expect("step");
                    acc = next;
                }
                let refs: Vec<&[u8]> = xs.iter().map(Vec::as_slice).collect();
                check_reduction(dt, op, &refs, 0, &acc)
                    .unwrap_or_else(|e| panic!("the reference rejects NCCL's result: {e}"));
                let at = 100 * size(dt);
                if is_int(dt) {
                    acc[at] ^= 1;
                } else {
                    // 400 is far outside what these inputs can reduce to (|x| ≤ 8).
                    acc[at..at + size(dt)].copy_from_slice(&far_value(dt));
                }
                assert!(
                    check_reduction(dt, op, &refs, 0, &acc).is_err(),
                    "{dt:?} {op:?} n={n}: a wrong element passed"
                );
            }
        }
    }
}

/// The bytes of 400.0 in a float type.
fn far_value(dt: cclkit_abi::raw::common::DataType) -> Vec<u8> {
    use cclkit_abi::raw::common::DataType as T;
    use cclkit_kernels::{Bf16, F16, Fp8E4M3, Fp8E5M2};
    match dt {
        T::FLOAT16 => F16::from_f32(400.0).0.to_le_bytes().to_vec(),
        T::BFLOAT16 => Bf16::from_f32(400.0).0.to_le_bytes().to_vec(),
        T::FLOAT32 => 400f32.to_le_bytes().to_vec(),
        T::FLOAT64 => 400f64.to_le_bytes().to_vec(),
        T::FLOAT8E4M3 => vec![Fp8E4M3::from_f32(400.0).0],
        T::FLOAT8E5M2 => vec![Fp8E5M2::from_f32(400.0).0],
        _ => unreachable!("float types only"),
    }
}

/// The rank program for `split`: two colours ordered by descending rank, rank 4
/// without colour; each part reduces on its own, then the parent still works.
fn split_and_reduce() {
    use cclkit_abi::raw::common::{DataType, RedOp};
    use common_rt::data::check_reduction;
    let comm = join();
    let (me, n) = (comm.rank(), comm.nranks());
    let color = if me == 4 { -1 } else { (me % 2) as i32 };
    let sub = comm.split(color, -(me as i32)).expect("split");
    let Some(sub) = sub else {
        assert!(color < 0, "rank {me} was left out");
        emit("sub", serde_json::Value::Null);
        parent_allreduce(&comm);
        comm.destroy().expect("destroy");
        return;
    };
    let members: Vec<usize> = (0..n)
        .rev()
        .filter(|&r| r != 4 && r % 2 == me % 2)
        .collect();
    assert_eq!(sub.nranks(), members.len(), "rank {me}");
    let pos = members.iter().position(|&r| r == me).expect("member");
    assert_eq!(sub.rank(), pos, "rank {me}: ordered by key");
    let input = |r: usize| -> Vec<u8> {
        (0..1001i64)
            .flat_map(|i| (i * 7 + r as i64 * 1_000_003).to_le_bytes())
            .collect()
    };
    let mut out = vec![0u8; 1001 * 8];
    sub.all_reduce(&input(me), &mut out, DataType::INT64, RedOp::SUM)
        .expect("allreduce in the part");
    let xs: Vec<Vec<u8>> = members.iter().map(|&r| input(r)).collect();
    let refs: Vec<&[u8]> = xs.iter().map(Vec::as_slice).collect();
    check_reduction(DataType::INT64, RedOp::SUM, &refs, 0, &out).expect("part's result");
    emit("sub", serde_json::json!([sub.rank(), sub.nranks()]));
    sub.destroy().expect("destroy part");
    parent_allreduce(&comm);
    comm.destroy().expect("destroy");
}

fn parent_allreduce(comm: &cclkit_runtime::Comm) {
    use cclkit_abi::raw::common::{DataType, RedOp};
    let mut v = (comm.rank() as u32 + 1).to_le_bytes();
    comm.all_reduce_in_place(&mut v, DataType::UINT32, RedOp::SUM)
        .expect("parent allreduce");
    let n = comm.nranks() as u32;
    assert_eq!(u32::from_le_bytes(v), n * (n + 1) / 2);
}

#[test]
fn split_parts_reduce_independently() {
    rank!(split_and_reduce);
    let run = Job::new(test_name!(), 5).envs(builtin_net()).run();
    run.assert_ok();
    let want = [
        serde_json::json!([1, 2]),
        serde_json::json!([1, 2]),
        serde_json::json!([0, 2]),
        serde_json::json!([0, 2]),
        serde_json::Value::Null,
    ];
    for (r, w) in want.iter().enumerate() {
        assert_eq!(&run.value(r, "sub"), w, "rank {r}");
    }
}

/// Issue 9: the runtime's collectives over the packaged libfabric plugin, on the
/// `tcp;ofi_rxm` and `shm` providers, 2 and 4 ranks.
#[test]
fn collectives_over_the_ofi_plugin_2_and_4_ranks() {
    rank!(collectives);
    common_rt::packaged("libnccl-net-cclkit-ofi.so");
    for (provider, np) in [
        ("tcp;ofi_rxm", 2),
        ("tcp;ofi_rxm", 4),
        ("shm", 2),
        ("shm", 4),
    ] {
        let mut job = Job::new(test_name!(), np)
            .env("NCCL_NET_PLUGIN", "cclkit-ofi")
            .env("LD_LIBRARY_PATH", common_rt::lib_dir().display())
            .env("CCLKIT_STRICT", 1)
            .env("CCLKIT_OFI_PROVIDER", provider)
            .env("CKT_ONLY_TUNED", 1)
            .env("CKT_SEED", 3000 + np)
            .env("CKT_BIG_BYTES", if DEBUG { 64 << 10 } else { 256 << 10 })
            .timeout(Duration::from_secs(240));
        if provider.starts_with("tcp") {
            // Both sides on loopback (plugins/net-ofi/README.md, local tests).
            job = job
                .env("CCLKIT_OFI_IFACE", "lo")
                .env("CCLKIT_OFI_ADDR", "127.0.0.1");
        }
        let run = job.run();
        run.assert_ok();
        let runs = summary(&run, &format!("cclkit-ofi {provider}, {np} ranks"));
        for f in TUNED {
            assert!(
                runs.keys().any(|k| k.starts_with(&format!("{f} "))),
                "{f} never ran over {provider}: {runs:?}"
            );
        }
    }
}

/// The rank program of the fallback test: which net plugin the communicator got.
fn report_net() {
    cclkit_host::log::init_from_env();
    let comm = join();
    emit("net", comm.net().name);
    comm.destroy().expect("destroy");
}

/// Issue 9: an OFI provider list that matches nothing fails the plugin's `init` with
/// the providers it saw, and the loader falls back (loudly) to the socket transport.
#[test]
fn ofi_with_no_matching_provider_falls_back_loudly() {
    rank!(report_net);
    common_rt::packaged("libnccl-net-cclkit-ofi.so");
    let run = Job::new(test_name!(), 2)
        .env("NCCL_NET_PLUGIN", "cclkit-ofi")
        .env("LD_LIBRARY_PATH", common_rt::lib_dir().display())
        .env("CCLKIT_OFI_PROVIDER", "nonesuch")
        .timeout(Duration::from_secs(120))
        .run();
    run.assert_ok();
    for r in 0..2 {
        assert_eq!(
            run.value(r, "net"),
            "cclkit-socket",
            "rank {r} fell back to the built-in socket transport"
        );
        let err = &run.ranks[r].stderr;
        assert!(
            err.contains("no usable libfabric provider") && err.contains("nonesuch"),
            "rank {r}: {err}"
        );
        assert!(
            err.contains("WARN"),
            "the fallback is reported at WARN: {err}"
        );
    }
}
