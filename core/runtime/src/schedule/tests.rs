//! Every schedule executed over an in-memory network (unbounded per-link queues of
//! slices): links must match slice for slice, nothing may deadlock, and results must
//! equal a serial reference. Odd rank counts, odd sizes, several channels.

use std::collections::{HashMap, VecDeque};

use cclkit_abi::raw::common::{DataType, Func, RedOp};
use cclkit_kernels::Reduction;

use super::*;
use crate::topo;

/// Shapes of all ranks, with hosts of `per_host` ranks.
fn shapes(n: usize, per_host: usize) -> Vec<Shape> {
    let peers: Vec<topo::PeerInfo> = (0..n)
        .map(|r| topo::PeerInfo {
            rank: r,
            host_hash: (r / per_host) as u64,
            hostname: String::new(),
            ip: format!("10.0.{}.1", r / per_host).parse().unwrap(),
            pid: 0,
            plugin: String::new(),
            plugin_version: 12,
            devices: vec![],
            device_buffers: false,
        })
        .collect();
    let ring = topo::ring(&peers);
    let t0 = topo::tree(&peers, &ring, 0);
    let t1 = topo::tree(&peers, &ring, 1);
    (0..n)
        .map(|r| Shape {
            rank: r,
            nranks: n,
            ring: RingView {
                order: ring.order.clone(),
                index: ring.index_of(r),
            },
            trees: [
                TreeView {
                    up: t0[r].up,
                    down: t0[r].down.clone(),
                },
                TreeView {
                    up: t1[r].up,
                    down: t1[r].down.clone(),
                },
            ],
        })
        .collect()
}

/// Runs plans of all ranks slice by slice; returns receive buffers.
fn simulate(plans: &[Plan], red: &Reduction, slice: usize, send: &[Vec<u8>], recv: &mut [Vec<u8>]) {
    let n = plans.len();
    let mut queues: HashMap<(usize, usize, usize, LinkClass), VecDeque<Vec<u8>>> = HashMap::new();
    // (channel, prim index, slice index) per rank.
    let mut cursor: Vec<Vec<(usize, usize)>> =
        plans.iter().map(|p| vec![(0, 0); p.len()]).collect();
    loop {
        let mut progressed = false;
        for r in 0..n {
            for ch in 0..plans[r].len() {
                let (pi, si) = cursor[r][ch];
                let Some(prim) = plans[r][ch].get(pi) else {
                    continue;
                };
                let off = si * slice;
                let len = slice.min(prim.len - off);
                let ready = prim.recv.iter().all(|l| {
                    queues
                        .get(&(l.peer, r, l.channel, l.class))
                        .is_some_and(|q| !q.is_empty())
                });
                if !ready {
                    continue;
                }
                let recvs: Vec<Vec<u8>> = prim
                    .recv
                    .iter()
                    .map(|l| {
                        queues
                            .get_mut(&(l.peer, r, l.channel, l.class))
                            .unwrap()
                            .pop_front()
                            .unwrap()
                    })
                    .collect();
                for v in &recvs {
                    assert_eq!(
                        v.len(),
                        len,
                        "rank {r} ch {ch} prim {pi}: slice size mismatch"
                    );
                }
                let src = prim.src.map(|s| {
                    let b = if s.buf == Buffer::Send {
                        &send[r]
                    } else {
                        &recv[r]
                    };
                    b[s.offset + off..s.offset + off + len].to_vec()
                });
                let refs: Vec<&[u8]> = recvs.iter().map(Vec::as_slice).collect();
                let mut out = vec![0u8; len];
                combine(prim.combine, red, src.as_deref(), &refs, &mut out).unwrap();
                for l in &prim.send {
                    queues
                        .entry((r, l.peer, l.channel, l.class))
                        .or_default()
                        .push_back(out.clone());
                }
                if let Some(d) = prim.dst {
                    assert_eq!(d.buf, Buffer::Recv);
                    recv[r][d.offset + off..d.offset + off + len].copy_from_slice(&out);
                }
                progressed = true;
                cursor[r][ch] = if off + len >= prim.len {
                    (pi + 1, 0)
                } else {
                    (pi, si + 1)
                };
            }
        }
        if !progressed {
            break;
        }
    }
    for r in 0..n {
        for ch in 0..plans[r].len() {
            assert_eq!(
                cursor[r][ch].0,
                plans[r][ch].len(),
                "rank {r} channel {ch} deadlocked at prim {:?}",
                cursor[r][ch]
            );
        }
    }
    assert!(
        queues.values().all(VecDeque::is_empty),
        "unconsumed slices left on links"
    );
}

fn ints(seed: u64, count: usize) -> Vec<i32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..count)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as i32) % 1000 - 500
        })
        .collect()
}

fn bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn back(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

const CUTS: [(usize, usize, usize); 3] = [(1, 64, 20), (2, 40, 12), (3, 400, 400)];

#[test]
fn all_reduce_ring_and_tree() {
    for n in [1, 2, 3, 5, 8] {
        for per_host in [1, 2, 3] {
            let sh = shapes(n, per_host);
            for count in [0usize, 1, 13, 97, 1000] {
                for op in [RedOp::SUM, RedOp::AVG, RedOp::MAX] {
                    let red = Reduction::new(DataType::INT32, op, n as u32).unwrap();
                    let inputs: Vec<Vec<i32>> = (0..n)
                        .map(|r| ints(r as u64 * 31 + count as u64, count))
                        .collect();
                    let want: Vec<i32> = (0..count)
                        .map(|i| {
                            let col = inputs.iter().map(|v| v[i]);
                            match op {
                                RedOp::SUM => col.sum(),
                                RedOp::MAX => col.max().unwrap(),
                                _ => col.sum::<i32>() / n as i32,
                            }
                        })
                        .collect();
                    for (channels, chunk, slice) in CUTS {
                        for tree in [false, true] {
                            let cut = Cut {
                                channels,
                                chunk,
                                elem: 4,
                            };
                            let plans: Vec<Plan> = sh
                                .iter()
                                .map(|s| {
                                    if tree {
                                        tree_all_reduce(s, count * 4, cut)
                                    } else {
                                        ring_all_reduce(s, count * 4, cut)
                                    }
                                })
                                .collect();
                            let send: Vec<Vec<u8>> = inputs.iter().map(|v| bytes(v)).collect();
                            let mut recv = vec![vec![0u8; count * 4]; n];
                            simulate(&plans, &red, slice, &send, &mut recv);
                            for (r, got) in recv.iter().enumerate() {
                                assert_eq!(
                                    back(got),
                                    want,
                                    "n={n} count={count} {op:?} tree={tree} rank {r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn rooted_and_gather_scatter_collectives() {
    for n in [1, 2, 3, 4, 5] {
        let sh = shapes(n, 2);
        let red = Reduction::new(DataType::INT32, RedOp::SUM, n as u32).unwrap();
        for count in [0usize, 1, 7, 301] {
            let inputs: Vec<Vec<i32>> = (0..n).map(|r| ints(r as u64 + 7, count)).collect();
            for (channels, chunk, slice) in CUTS {
                let cut = Cut {
                    channels,
                    chunk,
                    elem: 4,
                };
                for root in 0..n {
                    // Broadcast.
                    let plans: Vec<Plan> = sh
                        .iter()
                        .map(|s| ring_broadcast(s, count * 4, root, cut).unwrap())
                        .collect();
                    let send: Vec<Vec<u8>> = inputs.iter().map(|v| bytes(v)).collect();
                    let mut recv = vec![vec![0u8; count * 4]; n];
                    simulate(&plans, &red, slice, &send, &mut recv);
                    assert!(
                        recv.iter().all(|b| back(b) == inputs[root]),
                        "broadcast n={n} root={root}"
                    );
                    // Reduce.
                    let plans: Vec<Plan> = sh
                        .iter()
                        .map(|s| ring_reduce(s, count * 4, root, cut).unwrap())
                        .collect();
                    let mut recv = vec![vec![0u8; count * 4]; n];
                    simulate(&plans, &red, slice, &send, &mut recv);
                    let want: Vec<i32> = (0..count)
                        .map(|i| inputs.iter().map(|v| v[i]).sum())
                        .collect();
                    assert_eq!(back(&recv[root]), want, "reduce n={n} root={root}");
                }
                // AllGather: count per rank.
                let plans: Vec<Plan> = sh
                    .iter()
                    .map(|s| ring_all_gather(s, count * 4, cut))
                    .collect();
                let send: Vec<Vec<u8>> = inputs.iter().map(|v| bytes(v)).collect();
                let mut recv = vec![vec![0u8; n * count * 4]; n];
                simulate(&plans, &red, slice, &send, &mut recv);
                let want: Vec<i32> = inputs.concat();
                assert!(recv.iter().all(|b| back(b) == want), "allgather n={n}");
                // ReduceScatter: inputs of n × count.
                let big: Vec<Vec<i32>> = (0..n).map(|r| ints(r as u64 + 99, n * count)).collect();
                let plans: Vec<Plan> = sh
                    .iter()
                    .map(|s| ring_reduce_scatter(s, count * 4, cut))
                    .collect();
                let send: Vec<Vec<u8>> = big.iter().map(|v| bytes(v)).collect();
                let mut recv = vec![vec![0u8; count * 4]; n];
                simulate(&plans, &red, slice, &send, &mut recv);
                for r in 0..n {
                    let want: Vec<i32> = (0..count)
                        .map(|i| big.iter().map(|v| v[r * count + i]).sum())
                        .collect();
                    assert_eq!(back(&recv[r]), want, "reducescatter n={n} rank {r}");
                }
            }
            // AllToAll / Gather / Scatter through p2p.
            for (func, root) in [
                (Func::ALL_TO_ALL, 0),
                (Func::GATHER, n - 1),
                (Func::SCATTER, n / 2),
            ] {
                let per = count * 4;
                let send: Vec<Vec<u8>> = (0..n)
                    .map(|r| bytes(&ints(r as u64 * 5 + 1, n * count)))
                    .collect();
                let mut recv = vec![vec![0u8; n * per]; n];
                let plans: Vec<Plan> = sh
                    .iter()
                    .map(|s| vec![p2p(s, &p2p_collective(s, func, per, root).unwrap(), 0).unwrap()])
                    .collect();
                simulate(&plans, &red, 44, &send, &mut recv);
                for r in 0..n {
                    match func {
                        Func::ALL_TO_ALL => {
                            for p in 0..n {
                                assert_eq!(
                                    recv[r][p * per..(p + 1) * per],
                                    send[p][r * per..(r + 1) * per],
                                    "alltoall"
                                );
                            }
                        }
                        Func::GATHER if r == root => {
                            for p in 0..n {
                                assert_eq!(
                                    recv[r][p * per..(p + 1) * per],
                                    send[p][..per],
                                    "gather"
                                );
                            }
                        }
                        Func::SCATTER => assert_eq!(
                            recv[r][..per],
                            send[root][r * per..(r + 1) * per],
                            "scatter"
                        ),
                        _ => {}
                    }
                }
            }
        }
    }
}

#[test]
fn p2p_self_send_must_match() {
    let sh = shapes(3, 1);
    let err = p2p(
        &sh[1],
        &[P2pOp::Send {
            peer: 1,
            offset: 0,
            len: 8,
        }],
        0,
    )
    .unwrap_err();
    assert!(err.message().contains("send(s) to self"), "{err}");
    let err = p2p(
        &sh[1],
        &[
            P2pOp::Send {
                peer: 1,
                offset: 0,
                len: 8,
            },
            P2pOp::Recv {
                peer: 1,
                offset: 0,
                len: 4,
            },
        ],
        0,
    )
    .unwrap_err();
    assert!(err.message().contains("into a 4-byte receive"), "{err}");
    assert!(
        p2p(
            &sh[0],
            &[P2pOp::Recv {
                peer: 9,
                offset: 0,
                len: 4
            }],
            0
        )
        .is_err()
    );
}

/// The promise behind [`Prim::direct`] that a plan shows, for every direct schedule,
/// in and out of place (in place the input is a range of the output): no primitive
/// after a direct one on its channel, and none on another channel, writes the bytes
/// it receives into or sends from.
#[test]
fn direct_bytes_are_not_written_later() {
    let mut checked = 0;
    for n in [1, 2, 3, 4, 5, 8] {
        let sh = shapes(n, 2);
        for bytes in [4usize, 52, 388, 4000] {
            for (channels, chunk, _) in CUTS {
                let cut = Cut {
                    channels,
                    chunk,
                    elem: 4,
                };
                for s in &sh {
                    let ar = ring_all_reduce(s, bytes, cut);
                    let ag = ring_all_gather(s, bytes, cut);
                    for (plan, base) in [(ar, 0), (ag, s.rank * bytes)] {
                        for in_place in [None, Some(base)] {
                            checked += check_direct(&plan, in_place);
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} direct primitives checked");
}

/// Checks the direct primitives of `plan` (in place: the input starts at byte
/// `Some(base)` of the output); returns how many there were.
pub(crate) fn check_direct(plan: &Plan, in_place: Option<usize>) -> usize {
    let range = |s: Span, len: usize| match (s.buf, in_place) {
        (Buffer::Recv, _) => Some((s.offset, s.offset + len)),
        (Buffer::Send, Some(base)) => Some((base + s.offset, base + s.offset + len)),
        (Buffer::Send, None) => None,
    };
    let overlap = |a: (usize, usize), b: (usize, usize)| a.0 < b.1 && b.0 < a.1;
    let mut checked = 0;
    for (ch, prims) in plan.iter().enumerate() {
        for (i, p) in prims.iter().enumerate().filter(|(_, p)| p.direct) {
            // The engine sends from the input only out of place.
            let from = p
                .src
                .filter(|_| p.recv.is_empty() && p.dst.is_none() && in_place.is_none());
            let touched = [p.dst, from].into_iter().flatten();
            for m in touched.filter_map(|sp| range(sp, p.len)) {
                for (ch2, other) in plan.iter().enumerate() {
                    let later = other
                        .iter()
                        .enumerate()
                        .filter(|&(j, _)| ch2 != ch || j > i);
                    for (j, q) in later {
                        if let Some(w) = q.dst.and_then(|d| range(d, q.len)) {
                            assert!(
                                !overlap(m, w),
                                "channel {ch} prim {i} ({m:?}) written by channel {ch2} prim {j}"
                            );
                        }
                    }
                }
            }
            checked += 1;
        }
    }
    checked
}
