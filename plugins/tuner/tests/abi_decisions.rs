//! Model decisions through the exported v2, v4, v5 and v6 tables, called through
//! their raw function pointers as NCCL calls them, checked against cost tables worked
//! out by hand: the README's formulas ("Model mode") with NCCL 2.30's constants
//! (`src/graph/tuning.cc`), never the crate's own model.
//!
//! Every case is one communicator of 16 ranks on 2 nodes (8 per node) with the default
//! link parameters: NVLink inside a node, 240 GB/s intra, 100 GB/s network, no extra
//! network latency, Hopper, 16 channels. The path bandwidth B = min(240, 100) = 100
//! GB/s; the ceilings come from the Hopper row, 2-node column.

mod common;

use std::ffi::c_void;
use std::ptr;

use cclkit_abi::raw::common::{Func, NcclResult};
use cclkit_abi::raw::tuner::{NCCL_HW_NET, NCCL_HW_NVLINK};
use cclkit_abi::tuner::NCCL_DEFAULT_CONSTANTS;
use cclkit_tuner::ncclTunerPlugin_v2;
use common::comm::{Comm, Ver};
use common::{Channels, Env, NA, NP, Table, capture_logs};

const VERSIONS: [Ver; 3] = [Ver::V4, Ver::V5, Ver::V6];

/// One entry the model covers: `(algorithm, protocol, L µs, F bytes per byte, BW GB/s)`.
type Entry = (usize, usize, f64, f64, f64);

/// AllReduce (n = 16, N = 2, ppn = 8): ring S = 2·15 = 30 steps of which I = 2 cross
/// the network; tree k = 2, ppn − 1 = 7 NVLink hops and ⌈log2 2⌉ = 1 network hop.
/// PAT is not modelled for allreduce (keeps NCCL's value).
const ALLREDUCE: [Entry; 6] = [
    // 6.8 + 2(7·0.6 + 5.0); 100/3.8 under llMaxBws 45.
    (0, 0, 25.2, 2.0, 100.0 / 3.8),
    // 14.0 + 2(7·1.25 + 8.5); 100·120/128 across nodes, under 16·36.7.
    (0, 1, 48.5, 2.0, 93.75),
    // 8.4 + 2(7·4.0 + 14.0); min(0.92·100, 16·41.4).
    (0, 2, 92.4, 2.0, 92.0),
    // 6.6 + 28·0.6 + 2·2.7; 100/4.
    (1, 0, 28.8, 1.875, 25.0),
    // 14.0 + 28·1.9 + 2·4.0; 0.92·100 (ppn ≥ 2), under 16·36.7.
    (1, 1, 75.2, 1.875, 92.0),
    // 8.4 + 28·3.4 + 2·14.0; 100.
    (1, 2, 131.6, 1.875, 100.0),
];

/// AllGather and ReduceScatter: ring S = 15 steps, I = 1 network step, F = 15/16;
/// PAT ⌈log2 16⌉ = 4 network hops, bandwidth × 0.75. Tree is not modelled.
const GATHER: [Entry; 4] = [
    // 6.6 + 14·0.6 + 2.7; 100/4 (multi-node).
    (1, 0, 17.7, 0.9375, 25.0),
    // 14.0 + 14·1.9 + 4.0; 0.92·100.
    (1, 1, 44.6, 0.9375, 92.0),
    // 8.4 + 14·3.4 + 14.0; 100.
    (1, 2, 70.0, 0.9375, 100.0),
    // 8.0 + 4·14.0; 0.75·100.
    (6, 2, 64.0, 0.9375, 75.0),
];

/// Broadcast: the ring latencies of [`GATHER`], every byte moved once (F = 1).
const BROADCAST: [Entry; 3] = [
    (1, 0, 17.7, 1.0, 25.0),
    (1, 1, 44.6, 1.0, 92.0),
    (1, 2, 70.0, 1.0, 100.0),
];

/// A model-mode case: collective, bytes, its hand table, and NCCL's pick afterwards.
type Case = (Func, usize, &'static [Entry], (usize, usize));

/// The README's `T = L + nBytes · F / (1000 · BW)` for one operation.
fn time(e: &Entry, bytes: usize) -> f64 {
    e.2 + bytes as f64 * e.3 / (1000.0 * e.4)
}

/// Checks the table the tuner returned for `bytes` against the hand table `model`,
/// as the README says it reaches NCCL: each modelled entry NCCL offered becomes
/// `k·T`, `k = min(1, min offered/T)`; every other entry keeps NCCL's value.
fn assert_table(before: &Table, after: &Table, model: &[Entry], bytes: usize, what: &str) {
    let offered = |e: &&Entry| before.get(e.0, e.1) >= 0.0;
    let k = model
        .iter()
        .filter(offered)
        .map(|e| f64::from(before.get(e.0, e.1)) / time(e, bytes))
        .fold(1.0f64, f64::min);
    for a in 0..NA {
        for p in 0..NP {
            let got = f64::from(after.get(a, p));
            let want = match model.iter().filter(offered).find(|e| (e.0, e.1) == (a, p)) {
                Some(e) => k * time(e, bytes),
                None => f64::from(before.get(a, p)),
            };
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{what}: entry [{a}][{p}] is {got}, by hand {want} (k = {k})"
            );
        }
    }
}

#[test]
fn hand_tables_rest_on_nccl_2_30_constants() {
    // The cells the tables above use, as typed from NCCL 2.30's tuning.cc.
    let c = NCCL_DEFAULT_CONSTANTS;
    assert_eq!(c.baseLatencies[0], [6.8, 14.0, 8.4]);
    assert_eq!(c.baseLatencies[1], [6.6, 14.0, 8.4]);
    assert_eq!(c.baseLatencies[6], [8.0, 8.0, 8.0]);
    assert_eq!(c.hwLatencies[NCCL_HW_NVLINK][0], [0.6, 1.25, 4.0]);
    assert_eq!(c.hwLatencies[NCCL_HW_NVLINK][1], [0.6, 1.9, 3.4]);
    assert_eq!(c.hwLatencies[NCCL_HW_NET][0], [5.0, 8.5, 14.0]);
    assert_eq!(c.hwLatencies[NCCL_HW_NET][1], [2.7, 4.0, 14.0]);
    assert_eq!(c.hwLatencies[NCCL_HW_NET][6][2], 14.0);
    // Hopper, 2 nodes: llMaxBws 45; per-channel ring/tree LL128 36.7, tree 41.4.
    assert_eq!(c.llMaxBws[2][1], 45.0);
    assert_eq!(c.perChMaxRingLL128Bws[2][1], 36.7);
    assert_eq!(c.perChMaxTreeLL128Bws[2][1], 36.7);
    assert_eq!(c.perChMaxTreeBws[2][1], 41.4);
}

#[test]
fn model_mode_matches_the_hand_tables() {
    let mut env = Env::lock();
    env.set("CCLKIT_TUNER_MODE", "model");
    env.set("NCCL_TUNER_CONFIG_FILE", "/nonexistent/cclkit/none.conf");
    // (collective, bytes, hand table, NCCL's pick afterwards). The winner's hand time
    // and the runner-up's, in µs, on each line.
    let cases: [Case; 10] = [
        // tree LL 25.205 < ring LL 28.805
        (Func::ALL_REDUCE, 64, &ALLREDUCE, (0, 0)),
        // tree LL 30.18 < ring LL 33.72
        (Func::ALL_REDUCE, 64 << 10, &ALLREDUCE, (0, 0)),
        // tree LL128 70.87 < ring LL128 96.57
        (Func::ALL_REDUCE, 1 << 20, &ALLREDUCE, (0, 1)),
        // ring LL128 716.3 < tree LL128 719.6 < ring Simple 721.4
        (Func::ALL_REDUCE, 30 << 20, &ALLREDUCE, (1, 1)),
        // ring Simple 20 264 < ring LL128 21 958
        (Func::ALL_REDUCE, 1 << 30, &ALLREDUCE, (1, 2)),
        // ring LL 17.74 < ring LL128 44.61 (tree keeps NCCL's 35..60)
        (Func::ALL_GATHER, 1 << 10, &GATHER, (1, 0)),
        // ring LL128 55.29 < ring LL 57.02 < PAT 77.11
        (Func::ALL_GATHER, 1 << 20, &GATHER, (1, 1)),
        // ring Simple 10 136 < ring LL128 10 986 < PAT 13 486
        (Func::ALL_GATHER, 1 << 30, &GATHER, (1, 2)),
        // ring LL128 87.34 < ring Simple 109.3 < PAT 116.4
        (Func::REDUCE_SCATTER, 4 << 20, &GATHER, (1, 1)),
        // ring LL128 56.0 < ring LL 59.6 < ring Simple 80.5
        (Func::BROADCAST, 1 << 20, &BROADCAST, (1, 1)),
    ];
    for ver in VERSIONS {
        let comm = Comm::open(ver, 16, 2);
        for (func, bytes, model, pick) in cases {
            let what = format!("{ver:?} {func:?} {bytes} B");
            let mut t = Table::typical();
            assert_eq!(comm.coll(func, bytes, 1, 0, &mut t), 0, "{what}");
            assert_table(&Table::typical(), &t, model, bytes, &what);
            assert_eq!(t.nccl_choice(), Some(pick), "{what}");
        }
        // A sparse table: only the offered entries can win. 1 MiB: ring Simple
        // 151.26 µs offered at 7, tree LL128 70.87 at 9: k = 7/151.26, so tree LL128
        // lands at 3.28 and wins.
        let mut c = [[-1.0; NP]; NA];
        c[1][2] = 7.0;
        c[0][1] = 9.0;
        let before = Table::new(c);
        let mut t = Table::new(c);
        comm.coll(Func::ALL_REDUCE, 1 << 20, 1, 0, &mut t);
        assert_table(&before, &t, &ALLREDUCE, 1 << 20, "sparse");
        assert_eq!(t.nccl_choice(), Some((0, 1)));
        // One rank: NCCL offers only ring/simple at 0; nothing to rank.
        let mut c = [[-1.0; NP]; NA];
        c[1][2] = 0.0;
        let mut t = Table::new(c);
        comm.coll(Func::ALL_REDUCE, 1 << 20, 1, 0, &mut t);
        assert_eq!(t.costs(), c);
    }
}

#[test]
fn v5_constants_feed_the_model() {
    let mut env = Env::lock();
    env.set("CCLKIT_TUNER_MODE", "model");
    env.set("NCCL_TUNER_CONFIG_FILE", "/nonexistent/cclkit/none.conf");
    // NCCL's constants: 64 B allreduce takes tree LL (25.2 µs by hand).
    let comm = Comm::open(Ver::V5, 16, 2);
    let mut t = Table::typical();
    comm.coll(Func::ALL_REDUCE, 64, 1, 0, &mut t);
    assert_eq!(t.nccl_choice(), Some((0, 0)));
    drop(comm);
    // LL's base latency made huge in the constants the host passes: the model follows
    // them, and the next by hand is tree LL128 (48.5 µs; ring LL128 75.2, tree
    // Simple 92.4).
    let mut c = NCCL_DEFAULT_CONSTANTS;
    for a in 0..NA {
        c.baseLatencies[a][0] = 1.0e6;
    }
    let comm = Comm::open_with(Ver::V5, 16, 2, c);
    let mut t = Table::typical();
    comm.coll(Func::ALL_REDUCE, 64, 1, 0, &mut t);
    assert_eq!(t.nccl_choice(), Some((0, 1)));
}

#[test]
fn auto_mode_rules_then_model() {
    let mut env = Env::lock();
    env.config("allreduce,0,65535,tree,ll,4,-1,-1\n", "conf");
    for ver in VERSIONS {
        let comm = Comm::open(ver, 16, 2);
        let mut t = Table::typical();
        assert_eq!(comm.coll(Func::ALL_REDUCE, 100, 1, 0, &mut t), 4);
        assert_eq!(t.nccl_choice(), Some((0, 0)));
        // No rule for reducescatter: the model decides, nChannels stays 0.
        let mut t = Table::typical();
        assert_eq!(comm.coll(Func::REDUCE_SCATTER, 4 << 20, 1, 0, &mut t), 0);
        assert_table(&Table::typical(), &t, &GATHER, 4 << 20, "reducescatter");
        assert_eq!(t.nccl_choice(), Some((1, 1)));
    }
}

#[test]
fn bad_file_falls_back_to_model_and_reports_every_line() {
    let mut env = Env::lock();
    let path = env.config(
        "allreduce,0,65535,tree,ll,4,-1,-1\n\
         allreduce,0,64K,ring,simple,-1,-1,-1\n\
         # fine\n\
         allgather,0,10,ring\n",
        "conf",
    );
    env.set("CCLKIT_TUNER_MODE", "rules");
    for ver in VERSIONS {
        let (comm, logs) = capture_logs(|| Comm::open(ver, 16, 2));
        let p = path.display();
        assert!(
            logs.contains(&format!("{p}:2: max_bytes \"64K\" is not a number (NCCL would read it as 64; size suffixes are only allowed in TOML)")),
            "{logs}"
        );
        assert!(
            logs.contains(&format!("{p}:4: expected 8 to 10 comma-separated fields")),
            "{logs}"
        );
        assert!(
            logs.contains(&format!(
                "{p}: 2 bad line(s); the file is not used and the model decides"
            )),
            "{logs}"
        );
        // The good first rule is not used either: the model decides. By hand, 64 B:
        // tree LL (the rule would have set 4 channels; the model leaves them at 0).
        let mut t = Table::typical();
        assert_eq!(comm.coll(Func::ALL_REDUCE, 64, 1, 0, &mut t), 0);
        assert_table(&Table::typical(), &t, &ALLREDUCE, 64, "bad file");
        assert_eq!(t.nccl_choice(), Some((0, 0)));
        // 16 MiB: tree LL128 406.4 µs < ring LL128 417.1 < ring Simple 446.2.
        let mut t = Table::typical();
        assert_eq!(comm.coll(Func::ALL_REDUCE, 16 << 20, 1, 0, &mut t), 0);
        assert_eq!(t.nccl_choice(), Some((0, 1)));
    }
}

#[test]
fn v2_without_a_file_answers_with_the_model() {
    let mut env = Env::lock();
    env.set("NCCL_TUNER_CONFIG_FILE", "/nonexistent/cclkit/none.conf");
    let t = &ncclTunerPlugin_v2;
    let mut ctx: *mut c_void = ptr::null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { t.init.unwrap()(16, 2, None, &mut ctx) };
    assert_eq!(rc, NcclResult::SUCCESS);
    // v2 has no cost table: tree and ring with every protocol are offered, and the
    // model's cheapest comes back as (algorithm, protocol). By hand, 256 MiB:
    // ring Simple 131.6 + 2^28·1.875/100 000 = 5164.8 µs < ring LL128 5546.0.
    let (mut a, mut p) = (-1, -1);
    let mut ch = Channels::new();
    // SAFETY: live context, writable outputs.
    let rc = unsafe {
        t.getCollInfo.unwrap()(
            ctx,
            Func::ALL_REDUCE,
            1 << 28,
            0,
            0,
            1,
            &mut a,
            &mut p,
            ch.ptr(),
        )
    };
    assert_eq!(rc, NcclResult::SUCCESS);
    assert_eq!((a, p, ch.get()), (1, 2, 0));
    // SAFETY: context from init.
    assert_eq!(unsafe { t.destroy.unwrap()(ctx) }, NcclResult::SUCCESS);
}
