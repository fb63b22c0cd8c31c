//! A collective group identical to the one before it (collectives, sizes, types,
//! ops, roots and decisions) reruns that group's steps instead of planning again
//! (`CollGroup::run`'s step cache). The steps hold no buffer: every rerun here gets
//! fresh buffers (and in place once) with fresh random data, on 3 ranks, and every
//! result is checked exactly. The parent checks which calls reused steps, through
//! the process-wide counter `cclkit_runtime::coll::step_reuses`.

#[macro_use]
mod common_rt;

use std::time::Duration;

use cclkit_abi::raw::common::{DataType, RedOp};
use cclkit_runtime::coll::step_reuses;
use common_rt::data::{Rng, check_reduction, input};
use common_rt::{Job, builtin_net, emit, join, param_u64};

/// One AllReduce of a call: elements, type, op.
type Red = (usize, DataType, RedOp);

/// The calls, in order: (AllReduces of one group, in place, whether it reuses the
/// steps of the call before).
const CALLS: &[(&[Red], bool, bool)] = &[
    (&[(1001, DataType::INT32, RedOp::SUM)], false, false),
    (&[(1001, DataType::INT32, RedOp::SUM)], false, true),
    // The same steps in place.
    (&[(1001, DataType::INT32, RedOp::SUM)], true, true),
    // Another size, type and op (AVG: PAT's later rounds use a second reduction).
    (&[(257, DataType::INT64, RedOp::AVG)], false, false),
    (&[(257, DataType::INT64, RedOp::AVG)], false, true),
    // Back to the first: only the last group's steps are kept.
    (&[(1001, DataType::INT32, RedOp::SUM)], false, false),
    // A group of two.
    (
        &[
            (333, DataType::INT32, RedOp::MAX),
            (77, DataType::INT64, RedOp::AVG),
        ],
        false,
        false,
    ),
    (
        &[
            (333, DataType::INT32, RedOp::MAX),
            (77, DataType::INT64, RedOp::AVG),
        ],
        false,
        true,
    ),
    // Same sizes and types, another op.
    (
        &[
            (333, DataType::INT32, RedOp::MIN),
            (77, DataType::INT64, RedOp::AVG),
        ],
        false,
        false,
    ),
    // A ring over two channels (3 MiB), twice.
    (&[(786_433, DataType::INT32, RedOp::SUM)], false, false),
    (&[(786_433, DataType::INT32, RedOp::SUM)], false, true),
];

fn size(dt: DataType) -> usize {
    common_rt::data::size(dt)
}

/// Rank `rank`'s input of reduction `k` of call `call`.
fn rank_input(seed: u64, call: usize, k: usize, rank: usize, r: &Red) -> Vec<u8> {
    let mut rng = Rng::new(&[seed, call as u64, k as u64, rank as u64]);
    input(r.1, r.2, r.0, &mut rng)
}

fn rank_program() {
    let comm = join();
    let (me, n) = (comm.rank(), comm.nranks());
    let seed = param_u64("SEED", 5);
    let mut reused = Vec::new();
    for (call, (reds, in_place, _)) in CALLS.iter().enumerate() {
        let inputs: Vec<Vec<Vec<u8>>> = reds
            .iter()
            .enumerate()
            .map(|(k, r)| (0..n).map(|p| rank_input(seed, call, k, p, r)).collect())
            .collect();
        // Fresh buffers on every call: in place, the input itself.
        let mut outs: Vec<Vec<u8>> = reds
            .iter()
            .enumerate()
            .map(|(k, r)| {
                if *in_place {
                    inputs[k][me].clone()
                } else {
                    vec![0u8; r.0 * size(r.1)]
                }
            })
            .collect();
        let before = step_reuses();
        let mut g = comm.collectives();
        for ((r, out), ins) in reds.iter().zip(outs.iter_mut()).zip(&inputs) {
            if *in_place {
                g.all_reduce_in_place(out, r.1, r.2);
            } else {
                g.all_reduce(&ins[me], out, r.1, r.2);
            }
        }
        let decisions = g.run().unwrap_or_else(|e| panic!("call {call}: {e}"));
        assert!(
            decisions.windows(2).all(|w| w[0].proto == w[1].proto),
            "call {call}: a group of one protocol is what this test needs: {decisions:?}"
        );
        reused.push(step_reuses() - before);
        for (k, r) in reds.iter().enumerate() {
            let ins: Vec<&[u8]> = inputs[k].iter().map(Vec::as_slice).collect();
            check_reduction(r.1, r.2, &ins, 0, &outs[k])
                .unwrap_or_else(|e| panic!("rank {me}, call {call}, reduction {k}: {e}"));
        }
    }
    emit("reused", reused);
    comm.destroy().expect("destroy");
}

#[test]
fn an_identical_group_reruns_the_last_steps_with_new_buffers() {
    rank!(rank_program);
    let run = Job::new(test_name!(), 3)
        .envs(builtin_net())
        .env("CKT_SEED", 23)
        .timeout(Duration::from_secs(120))
        .run();
    run.assert_ok();
    let want: Vec<u64> = CALLS.iter().map(|c| u64::from(c.2)).collect();
    for r in 0..3 {
        let got: Vec<u64> = serde_json::from_value(run.value(r, "reused"))
            .unwrap_or_else(|e| panic!("rank {r} reuse counts: {e}"));
        assert_eq!(got, want, "rank {r}: which calls reran the previous steps");
    }
}
