//! A pass of progress drives only the connections with network work, not every
//! installed one (`proxy/engine/busy.rs`). On 3 ranks with 4 channels each rank
//! installs a ring and tree connection per channel and direction; small AllReduces
//! on one channel's ring use one send and one receive. Every result is checked
//! exactly; the parent compares the connections driven per pass, counted through
//! the process-wide `cclkit_runtime::coll::pass_visits`, with the connections
//! installed.

#[macro_use]
mod common_rt;

use std::time::Duration;

use cclkit_abi::raw::common::{DataType, RedOp};
use cclkit_runtime::coll::pass_visits;
use common_rt::data::{Rng, check_reduction, input};
use common_rt::{Job, builtin_net, emit, join, param_u64};

/// Elements per AllReduce (odd; small enough for one channel) and how many run.
const COUNT: usize = 37;
const CALLS: usize = 40;
const CHANNELS: usize = 4;

fn rank_program() {
    let comm = join();
    let (me, n) = (comm.rank(), comm.nranks());
    let seed = param_u64("SEED", 3);
    let (passes0, visits0) = pass_visits();
    for call in 0..CALLS {
        let (dt, op) = [
            (DataType::INT32, RedOp::SUM),
            (DataType::FLOAT64, RedOp::MAX),
        ][call % 2];
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|p| input(dt, op, COUNT, &mut Rng::new(&[seed, call as u64, p as u64])))
            .collect();
        let mut out = vec![0u8; inputs[me].len()];
        let mut g = comm.collectives();
        g.all_reduce(&inputs[me], &mut out, dt, op);
        g.run().unwrap_or_else(|e| panic!("call {call}: {e}"));
        let ins: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        check_reduction(dt, op, &ins, 0, &out)
            .unwrap_or_else(|e| panic!("rank {me}, call {call}: {e}"));
    }
    let (passes, visits) = pass_visits();
    emit("passes", passes - passes0);
    emit("visits", visits - visits0);
    comm.destroy().expect("destroy");
}

#[test]
fn a_pass_drives_the_links_in_use_not_every_installed_one() {
    rank!(rank_program);
    let run = Job::new(test_name!(), 3)
        .envs(builtin_net())
        .env("CKT_SEED", 29)
        .env("NCCL_MIN_NCHANNELS", CHANNELS)
        .env("NCCL_MAX_NCHANNELS", CHANNELS)
        .env("NCCL_ALGO", "ring")
        .env("NCCL_PROTO", "simple")
        .timeout(Duration::from_secs(120))
        .run();
    run.assert_ok();
    for r in 0..3 {
        let passes: u64 = serde_json::from_value(run.value(r, "passes")).expect("passes");
        let visits: u64 = serde_json::from_value(run.value(r, "visits")).expect("visits");
        assert!(passes >= CALLS as u64, "rank {r}: {passes} passes");
        let per_pass = visits as f64 / passes as f64;
        // Installed: a ring send and receive per channel (the trees add more). A
        // pass drives sends at most three times and receives once, on the one
        // channel's two links: at most 4 visits.
        assert!(
            per_pass <= 4.0,
            "rank {r}: {per_pass:.2} connections driven per pass ({visits} over {passes} \
             passes); {} ring connections are installed",
            2 * CHANNELS
        );
        eprintln!("rank {r}: {per_pass:.2} connections per pass ({visits} / {passes})");
    }
}
