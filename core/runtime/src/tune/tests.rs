//! The built-in model's tables and decisions against values worked out by hand from
//! the formulas documented in this module and NCCL 2.30's constants
//! (`src/graph/tuning.cc`), never from the model's own output.
//!
//! The machine of every case: `tuning(n)` puts each rank on its own node with a
//! 1.25 GB/s, 20 µs network. One step then costs, for tree and ring alike (the
//! model uses Simple's latencies for every protocol on host memory):
//! `baseLatencies[.][SIMPLE] + hwLatencies[NET][.][SIMPLE] + 20 = 8.4 + 14.0 + 20 = 42.4 µs`,
//! and a byte costs `1 / (1250 · channels · eff)` µs, eff = 1 (Simple), 0.5 (LL),
//! 120/128 (LL128). Simple's slice is NCCL's: 4 MiB buffer / 8 steps × 2 steps = 1 MiB.

use super::*;

/// One step's latency of `tuning(_)` in µs (see the module doc).
const STEP_US: f64 = 8.4 + 14.0 + 20.0;
/// Network bytes per µs of `tuning(_)`: 1.25 GB/s.
const NET_B_PER_US: f64 = 1250.0;
/// Simple's slice: NCCL's 4 MiB `NCCL_BUFFSIZE` over `NCCL_STEPS` = 8, times 2 steps.
const SIMPLE_SLICE: usize = (4 << 20) / 8 * 2;

fn tuning(n: usize) -> Tuning {
    Tuning::new(
        None,
        default_constants(),
        ModelInputs {
            n_ranks: n,
            n_nodes: n,
            net_gbps: 1.25,
            net_lat_us: 20.0,
        },
        false,
    )
}

fn params(p: Protocol) -> ProtoParams {
    ProtoParams::new(p, &|_| None).unwrap()
}

/// `got` equals the hand-computed `want` to f32 precision.
fn assert_close(got: f32, want: f64, what: &str) {
    let err = (f64::from(got) - want).abs() / want.abs().max(1e-9);
    assert!(err < 1e-5, "{what}: model {got}, by hand {want}");
}

#[test]
fn constants_are_nccl_2_30s() {
    // The hand values below rest on these cells of NCCL 2.30's tuning.cc.
    let c = default_constants();
    for a in [Algorithm::TREE, Algorithm::RING] {
        let a = a.0 as usize;
        assert_eq!(c.baseLatencies[a][Protocol::SIMPLE.0 as usize], 8.4);
        assert_eq!(c.hwLatencies[2][a][Protocol::SIMPLE.0 as usize], 14.0);
    }
}

#[test]
fn allreduce_cost_table_for_8_bytes_on_4_ranks_matches_the_hand_table() {
    let t = tuning(4).table(Func::ALL_REDUCE, 8, 1);
    // Tree: 2⌈log2 5⌉ + 2(4/4 − 1) = 6 steps, 3 bytes moved per byte.
    // Ring: 2(4 − 1) = 6 steps, 2·3/4 = 1.5 bytes per byte.
    // PAT below a slice on 4 ranks: recursive doubling (2 steps, whole message each)
    // costs 2·42.4 + 8·2/1250, halving-doubling 4·42.4 + 8·1.5/1250: doubling.
    let want = [
        (
            Algorithm::TREE,
            Protocol::LL,
            6.0 * STEP_US + 8.0 * 3.0 / 625.0,
        ),
        (
            Algorithm::TREE,
            Protocol::LL128,
            6.0 * STEP_US + 8.0 * 3.0 / 1171.875,
        ),
        (
            Algorithm::TREE,
            Protocol::SIMPLE,
            6.0 * STEP_US + 8.0 * 3.0 / 1250.0,
        ),
        (
            Algorithm::RING,
            Protocol::LL,
            6.0 * STEP_US + 8.0 * 1.5 / 625.0,
        ),
        (
            Algorithm::RING,
            Protocol::LL128,
            6.0 * STEP_US + 8.0 * 1.5 / 1171.875,
        ),
        (
            Algorithm::RING,
            Protocol::SIMPLE,
            6.0 * STEP_US + 8.0 * 1.5 / 1250.0,
        ),
        (
            Algorithm::PAT,
            Protocol::LL,
            2.0 * STEP_US + 8.0 * 2.0 / 625.0,
        ),
        (
            Algorithm::PAT,
            Protocol::LL128,
            2.0 * STEP_US + 8.0 * 2.0 / 1171.875,
        ),
        (
            Algorithm::PAT,
            Protocol::SIMPLE,
            2.0 * STEP_US + 8.0 * 2.0 / 1250.0,
        ),
    ];
    for (a, p, v) in want {
        assert_close(t[idx(a, p)], v, &format!("{a:?} {p:?}"));
    }
    // Nothing else is offered (CollNet, NVLS: not in this runtime).
    let offered = t.iter().filter(|c| **c >= 0.0).count();
    assert_eq!(offered, want.len(), "{t:?}");
}

#[test]
fn model_prefers_low_latency_small_and_bandwidth_large() {
    let t = tuning(4);
    // 8 B: PAT/Simple at 84.8128 µs beats every 6-step entry (254.4 µs and up) and
    // PAT's LL (84.8256) and LL128 (84.8137); it runs on one channel.
    let small = t.decide(Func::ALL_REDUCE, 8, 2, &params).unwrap();
    assert_eq!(
        (small.algo, small.proto, small.channels),
        (Algorithm::PAT, Protocol::SIMPLE, 1),
        "{small:?}"
    );
    // 256 MiB on 2 channels (256 slices, capped at 2):
    //   ring Simple  6·42.4 + 2^28·1.5/2500          = 161 315.7 µs
    //   ring LL128   6·42.4 + 2^28·1.5/(2500·0.9375) = 172 053.1 µs
    //   tree Simple  6·42.4 + 2^28·3/2500            = 322 376.9 µs
    //   PAT (≥ a slice: halving-doubling, 1 channel) 4·42.4 + 2^28·1.5/1250 = 322 292.1 µs
    let big = t.decide(Func::ALL_REDUCE, 256 << 20, 2, &params).unwrap();
    assert_eq!(
        (big.algo, big.proto, big.channels),
        (Algorithm::RING, Protocol::SIMPLE, 2),
        "{big:?}"
    );
    assert_close(
        t.table(Func::ALL_REDUCE, 256 << 20, 2)[idx(Algorithm::RING, Protocol::SIMPLE)],
        6.0 * STEP_US + (256u64 << 20) as f64 * 1.5 / (2.0 * NET_B_PER_US),
        "ring Simple, 256 MiB",
    );
    // Simple's chunk on host memory: NCCL's 4 steps of 512 KiB, capped at 256 KiB;
    // a device communicator keeps NCCL's.
    assert_eq!(big.chunk, crate::protocol::HOST_SIMPLE_CHUNK);
    let mut dev = tuning(4);
    dev.buffers_on_host(false);
    let dev_big = dev.decide(Func::ALL_REDUCE, 256 << 20, 2, &params).unwrap();
    assert_eq!(dev_big.chunk, 4 * (512 << 10));
    // Broadcast is ring only; Simple moves the most per µs.
    let b = t.decide(Func::BROADCAST, 1 << 20, 2, &params).unwrap();
    assert_eq!((b.algo, b.proto), (Algorithm::RING, Protocol::SIMPLE));
    assert!(t.table(Func::BROADCAST, 8, 2)[idx(Algorithm::PAT, Protocol::SIMPLE)] < 0.0);
    // One rank: only ring/Simple.
    let one = tuning(1)
        .decide(Func::ALL_REDUCE, 1 << 20, 2, &params)
        .unwrap();
    assert_eq!((one.algo, one.proto), (Algorithm::RING, Protocol::SIMPLE));
}

#[test]
fn pat_form_crossovers_follow_from_the_step_cost() {
    assert_eq!(SIMPLE_SLICE, params(Protocol::SIMPLE).slice_data());
    // Two ranks: doubling takes 1 step, halving-doubling 2 steps, both move the
    // message once, so doubling wins everywhere below a slice, and at a slice the
    // pipelined form takes over.
    let two = tuning(2);
    for bytes in [8, 512 << 10, SIMPLE_SLICE - 1] {
        assert_eq!(
            two.pat_kind(bytes, Protocol::SIMPLE),
            PatKind::Doubling,
            "{bytes}"
        );
    }
    assert_eq!(
        two.pat_kind(SIMPLE_SLICE, Protocol::SIMPLE),
        PatKind::HalvingDoubling
    );
    // Four ranks: doubling (2 steps × 2 bytes per byte) against halving-doubling
    // (4 steps × 1.5): doubling while 2·42.4 + 2b/1250 ≤ 4·42.4 + 1.5b/1250, that is
    // b ≤ 4 · 42.4 · 1250 = 212 000 bytes.
    let crossover = (4.0 * STEP_US * NET_B_PER_US).round() as usize;
    assert_eq!(crossover, 212_000);
    let four = tuning(4);
    assert_eq!(
        four.pat_kind(crossover - 1_000, Protocol::SIMPLE),
        PatKind::Doubling
    );
    assert_eq!(
        four.pat_kind(crossover + 1_000, Protocol::SIMPLE),
        PatKind::HalvingDoubling
    );
    assert_eq!(
        four.pat_kind(64 << 20, Protocol::SIMPLE),
        PatKind::HalvingDoubling
    );
}

#[test]
fn nccl_algo_and_proto_are_respected() {
    let mut t = tuning(4);
    t.force(Some("tree".into()), Some("^ll,ll128".into()));
    let d = t.decide(Func::ALL_REDUCE, 8, 2, &params).unwrap();
    assert_eq!((d.algo, d.proto), (Algorithm::TREE, Protocol::SIMPLE));
    t.force(Some("tree".into()), None);
    let e = t.decide(Func::BROADCAST, 8, 2, &params).unwrap_err();
    assert!(
        e.message().contains("no algorithm/protocol available"),
        "{e}"
    );
    assert_eq!(allowed(Some("Ring,Tree"), "TREE"), Some(true));
    assert_eq!(allowed(Some("^ring"), "RING"), Some(false));
    assert_eq!(allowed(None, "RING"), None);
    let per = Some("allreduce:tree;broadcast:^ring");
    assert_eq!(allowed_for(per, Func::ALL_REDUCE, "TREE"), Some(true));
    assert_eq!(allowed_for(per, Func::ALL_REDUCE, "RING"), Some(false));
    assert_eq!(allowed_for(per, Func::BROADCAST, "RING"), Some(false));
    assert_eq!(allowed_for(per, Func::ALL_GATHER, "RING"), None);
}

#[test]
fn decisions_are_recorded() {
    let t = tuning(3);
    for _ in 0..3 {
        t.decide(Func::ALL_REDUCE, 1000, 2, &params).unwrap();
    }
    let r = t.report();
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].0, r[0].1, r[0].3), (Func::ALL_REDUCE, 1000, 3));
    assert!(t.report_text().contains("AllReduce"));
}

/// The remembered cost table: a repeated size gets the same decision as a fresh
/// model would give, a different size or channel count is computed anew, and
/// forcing an algorithm list afterwards is obeyed at once.
#[test]
fn remembered_table_matches_the_model_and_follows_forced_lists() {
    let mut t = tuning(4);
    let fresh = tuning(4);
    let sizes = [8usize, 3 << 20, 8, 77_777, 77_777, 256 << 20, 8];
    for (i, &bytes) in sizes.iter().enumerate() {
        let ch = 1 + i % 2;
        let got = t.decide(Func::ALL_REDUCE, bytes, ch, &params).unwrap();
        let want = fresh.decide(Func::ALL_REDUCE, bytes, ch, &params).unwrap();
        assert_eq!(got, want, "{bytes} bytes, {ch} channels");
        assert_eq!(
            t.table_for(Func::ALL_REDUCE, bytes, ch),
            fresh.table(Func::ALL_REDUCE, bytes, ch)
        );
    }
    assert_eq!(
        t.decide(Func::ALL_REDUCE, 8, 1, &params).unwrap().algo,
        Algorithm::PAT
    );
    t.force(Some("ring".into()), None);
    assert_eq!(
        t.decide(Func::ALL_REDUCE, 8, 1, &params).unwrap().algo,
        Algorithm::RING
    );
}

#[test]
fn two_host_ranks_run_allreduce_up_to_2_mib_as_pat_halving_doubling() {
    // By the model alone, 1 MiB on 2 ranks ties ring and PAT (2 steps, one byte moved
    // per byte, one channel: the ring wins the tie) and from 2 MiB the ring's second
    // channel halves its byte cost; on host memory PAT is preferred up to
    // HOST_PAIR_PAT_MAX (measured, see the constant).
    let t = tuning(2);
    for bytes in [SIMPLE_SLICE, 1_500_007, HOST_PAIR_PAT_MAX] {
        let d = t.decide(Func::ALL_REDUCE, bytes, 2, &params).unwrap();
        assert_eq!(
            (d.algo, d.proto, d.channels),
            (Algorithm::PAT, Protocol::SIMPLE, 1),
            "{bytes} B: {d:?}"
        );
        assert_eq!(t.pat_kind(bytes, d.proto), PatKind::HalvingDoubling);
        // Just below the cheapest other entry, which the model left as it was.
        let table = t.table(Func::ALL_REDUCE, bytes, d.channels);
        let ring = table[idx(Algorithm::RING, Protocol::SIMPLE)];
        let pat = table[idx(Algorithm::PAT, Protocol::SIMPLE)];
        assert!(
            pat < ring && pat > ring * 0.999,
            "{bytes} B: PAT {pat}, ring {ring}"
        );
    }
    // Past it the model decides alone: the ring on 2 channels.
    let big = t
        .decide(Func::ALL_REDUCE, HOST_PAIR_PAT_MAX + 4, 2, &params)
        .unwrap();
    assert_eq!((big.algo, big.channels), (Algorithm::RING, 2), "{big:?}");
    // Device buffers, other rank counts, other collectives: the model alone.
    let mut dev = tuning(2);
    dev.buffers_on_host(false);
    let d = dev.decide(Func::ALL_REDUCE, 1 << 20, 2, &params).unwrap();
    assert_eq!(d.algo, Algorithm::RING, "device comm: {d:?}");
    let d = tuning(4)
        .decide(Func::ALL_REDUCE, 2 << 20, 2, &params)
        .unwrap();
    assert_eq!(d.algo, Algorithm::RING, "4 ranks: {d:?}");
    let d = t.decide(Func::ALL_GATHER, 1 << 20, 2, &params).unwrap();
    assert_eq!(d.algo, Algorithm::RING, "AllGather: {d:?}");
    // NCCL_ALGO still rules: without PAT on the list the ring runs.
    let mut forced = tuning(2);
    forced.force(Some("^PAT".to_owned()), None);
    let d = forced
        .decide(Func::ALL_REDUCE, 1 << 20, 2, &params)
        .unwrap();
    assert_eq!(d.algo, Algorithm::RING, "NCCL_ALGO=^PAT: {d:?}");
}

#[test]
fn model_inputs_take_the_slowest_known_speed_and_the_largest_latency() {
    // A device of unknown speed (0, or -1 as some NICs report) counts as NCCL reads
    // it: not at all while another device knows its speed, 10000 Mb/s otherwise.
    let m = ModelInputs::from_devices(6, 2, [(0, 0.0), (25_000, 1.5), (-1, 3.0), (12_500, 0.5)]);
    assert_eq!((m.n_ranks, m.n_nodes), (6, 2));
    assert_eq!(m.net_gbps, 12_500.0 / 8000.0);
    assert_eq!(m.net_lat_us, 3.0);
    let m = ModelInputs::from_devices(2, 1, [(-1, 0.0)]);
    assert_eq!((m.net_gbps, m.net_lat_us), (10_000.0 / 8000.0, 20.0));
}

#[test]
fn cheapest_skips_ignored_entries_and_keeps_the_first_of_equal_ones() {
    let mut t: CostTable = [NCCL_ALGO_PROTO_IGNORE; COST_TABLE_LEN];
    assert_eq!(cheapest(&t), None);
    t[idx(Algorithm::RING, Protocol::SIMPLE)] = 5.0;
    t[idx(Algorithm::TREE, Protocol::LL)] = 5.0;
    t[idx(Algorithm::PAT, Protocol::SIMPLE)] = 7.0;
    assert_eq!(cheapest(&t), Some((Algorithm::TREE, Protocol::LL)));
    assert_eq!(default_channels(1, 4, 65536), 1);
    assert_eq!(default_channels(65537, 4, 65536), 2);
    assert_eq!(default_channels(1 << 30, 4, 65536), 4);
    assert_eq!(default_channels(1 << 30, 0, 0), 1);
}
