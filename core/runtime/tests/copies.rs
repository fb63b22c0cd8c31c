//! Copies per forwarded byte (issue 21, item 3), counted, not timed: ring AllReduce
//! and AllGather on 3 and 4 ranks, in and out of place, with NCCL's direct paths
//! (receive into the user's output, send from it) and with staging through FIFO
//! slots (`CCLKIT_DIRECT=0`, the data path before the direct paths existed). Every
//! rank reads the runtime's copy counters around each collective
//! (`cclkit_runtime::coll::copy_counts`) and checks the result exactly; the parent
//! asserts each site's bytes.

#[macro_use]
mod common_rt;

use std::time::Duration;

use cclkit_abi::raw::common::{Algorithm, DataType, RedOp};
use cclkit_runtime::coll::{CopyCounts, copy_counts, user_registrations};
use common_rt::{Job, builtin_net, emit, join, param_u64};
use rand::{Rng, SeedableRng};

/// Channels forced, so that pieces are `bytes / (channels × ranks)` each.
const CHANNELS: usize = 2;
/// Bytes of one ring piece: a whole slice and a shorter tail, within one chunk
/// (`NCCL_BUFFSIZE` below; a host communicator's Simple chunk is 256 KiB).
const PIECE: usize = 250_004;

fn ints(seed: u64, count: usize) -> Vec<i32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..count).map(|_| rng.random_range(-1000..1000)).collect()
}

fn bytes_of(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn sites(c: &CopyCounts) -> [u64; 8] {
    [
        c.recv_copy,
        c.src_copy,
        c.reduce,
        c.send_slot,
        c.to_dst,
        c.decode,
        c.direct_recv,
        c.direct_send,
    ]
}

/// Runs `f` and reports the bytes each copy site saw under `name`; the user
/// buffers a direct path registered are deregistered by the time it returns.
fn counted(name: &str, f: impl FnOnce()) {
    let before = copy_counts();
    f();
    emit(name, sites(&copy_counts().since(&before)));
    assert_eq!(
        user_registrations(),
        0,
        "{name}: user-buffer registrations left after the operation"
    );
}

/// The rank program: AllReduce (int32 sum) and AllGather, out of place then in place.
fn rank_program() {
    let comm = join();
    let (me, n) = (comm.rank(), comm.nranks());
    let seed = param_u64("SEED", 7);
    let count = PIECE / 4 * CHANNELS * n;
    let inputs: Vec<Vec<i32>> = (0..n).map(|r| ints(seed + r as u64, count)).collect();
    let sum: Vec<i32> = (0..count)
        .map(|i| inputs.iter().map(|v| v[i]).sum())
        .collect();
    let mine = bytes_of(&inputs[me]);
    let mut out = vec![0u8; mine.len()];
    counted("all_reduce", || {
        let d = comm
            .all_reduce(&mine, &mut out, DataType::INT32, RedOp::SUM)
            .expect("all_reduce");
        assert_eq!((d.algo, d.channels), (Algorithm::RING, CHANNELS), "{d:?}");
        assert!(d.chunk >= PIECE, "one loop of equal pieces: {d:?}");
    });
    assert_eq!(out, bytes_of(&sum), "rank {me}: all_reduce");
    let mut inplace = mine.clone();
    counted("all_reduce_in_place", || {
        comm.all_reduce_in_place(&mut inplace, DataType::INT32, RedOp::SUM)
            .expect("all_reduce_in_place");
    });
    assert_eq!(inplace, bytes_of(&sum), "rank {me}: all_reduce in place");
    let all: Vec<u8> = inputs.iter().flat_map(|v| bytes_of(v)).collect();
    let mut gathered = vec![0u8; all.len()];
    counted("all_gather", || {
        comm.all_gather(&mine, &mut gathered).expect("all_gather");
    });
    assert_eq!(gathered, all, "rank {me}: all_gather");
    let mut g = vec![0u8; all.len()];
    g[me * mine.len()..(me + 1) * mine.len()].copy_from_slice(&mine);
    counted("all_gather_in_place", || {
        let mut group = comm.collectives();
        group.all_gather_in_place(&mut g);
        group.run().expect("all_gather_in_place");
    });
    assert_eq!(g, all, "rank {me}: all_gather in place");
    comm.destroy().expect("destroy");
}

/// Expected bytes per site (order of [`sites`]) for `n` ranks and `q` bytes per
/// rank's share (AllReduce: bytes / n; AllGather: each rank's input).
fn expected(case: &str, n: u64, q: u64, direct: bool) -> [u64; 8] {
    let m = n - 1;
    // [recv_copy, src_copy, reduce, send_slot, to_dst, decode, direct_recv, direct_send]
    match (case, direct) {
        // Reduce-scatter: the first piece sent straight from the input (sum has no
        // pre-op), the others reduced (into slots, the last one into the output).
        // All-gather: n − 1 pieces received, n − 2 of them forwarded, plus the
        // output's own piece sent.
        ("all_reduce", true) => [0, 0, m * q, 0, 0, 0, m * q, m * q + q],
        // Staged: each received piece copied out of its slot, each sent one into a
        // slot: two copies per forwarded byte.
        ("all_reduce", false) => [m * q, q, m * q, m * q, 0, 0, 0, 0],
        // In place the last reduction reads the bytes it writes: scratch, then output;
        // and the first piece is staged (the all-gather phase later writes its bytes).
        ("all_reduce_in_place", true) => [0, q, m * q, 0, q, 0, m * q, m * q],
        ("all_reduce_in_place", false) => [m * q, q, m * q, m * q, q, 0, 0, 0],
        // The own block copied to the output, sent from there; the others received
        // into the output and forwarded from it.
        ("all_gather", true) => [0, q, 0, 0, 0, 0, m * q, m * q],
        ("all_gather", false) => [m * q, q, 0, m * q, 0, 0, 0, 0],
        // In place the own block is already in the output.
        ("all_gather_in_place", true) => [0, 0, 0, 0, 0, 0, m * q, m * q],
        ("all_gather_in_place", false) => [m * q, 0, 0, m * q, 0, 0, 0, 0],
        _ => unreachable!("{case}"),
    }
}

#[test]
fn ring_copies_per_forwarded_byte_on_3_and_4_ranks() {
    rank!(rank_program);
    for np in [3usize, 4] {
        for direct in [true, false] {
            let run = Job::new(test_name!(), np)
                .envs(builtin_net())
                .env("NCCL_ALGO", "ring")
                .env("NCCL_PROTO", "Simple")
                .env("NCCL_MIN_NCHANNELS", CHANNELS)
                .env("NCCL_MAX_NCHANNELS", CHANNELS)
                // 128 KiB steps: 256 KiB slices and 512 KiB chunks, capped on host
                // memory at 128 KiB and 256 KiB: a piece is one slice and a tail.
                .env("NCCL_BUFFSIZE", 1 << 20)
                .env("CCLKIT_DIRECT", u8::from(direct))
                .env("CKT_SEED", 100 + np)
                .timeout(Duration::from_secs(120))
                .run();
            run.assert_ok();
            for case in [
                "all_reduce",
                "all_reduce_in_place",
                "all_gather",
                "all_gather_in_place",
            ] {
                // AllReduce: bytes / n per share; AllGather: each rank's whole input.
                let share = PIECE
                    * CHANNELS
                    * if case.starts_with("all_gather") {
                        np
                    } else {
                        1
                    };
                let q = share as u64;
                let want = expected(case, np as u64, q, direct);
                for r in 0..np {
                    let got: [u64; 8] = serde_json::from_value(run.value(r, case))
                        .unwrap_or_else(|e| panic!("{case} counts: {e}"));
                    assert_eq!(
                        got, want,
                        "{np} ranks, rank {r}, {case}, direct {direct}: [recv_copy, src_copy, \
                         reduce, send_slot, to_dst, decode, direct_recv, direct_send]"
                    );
                    // Per forwarded byte: out of the receive slot and into the next
                    // send slot when staged (2 copies; the last receive and the first
                    // send add one share each), none on the direct path, where the
                    // plugin receives into and sends from the output as MPI does.
                    let (slot_copies, forwarded) = (got[0] + got[3], (np as u64 - 2) * q);
                    let staged = 2 * forwarded + 2 * q;
                    assert_eq!(slot_copies, if direct { 0 } else { staged }, "{case}");
                    if direct {
                        assert_eq!(got[6], forwarded + q, "{case}: received in place");
                    }
                }
            }
        }
    }
}
