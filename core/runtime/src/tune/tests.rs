use super::*;

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

#[test]
fn model_prefers_low_latency_small_and_bandwidth_large() {
    let t = tuning(4);
    let small = t.decide(Func::ALL_REDUCE, 8, 2, &params).unwrap();
    let big = t.decide(Func::ALL_REDUCE, 256 << 20, 2, &params).unwrap();
    // Few steps for small messages (recursive doubling: 2 for 4 ranks, not the
    // ring's 6), on one channel; Simple, which on host memory is as fast as LL.
    assert_eq!(
        (small.algo, small.proto, small.channels),
        (Algorithm::PAT, Protocol::SIMPLE, 1),
        "{small:?}"
    );
    // PAT doubles small messages and halves, then doubles, large ones.
    assert_eq!(t.pat_kind(8, Protocol::SIMPLE), PatKind::Doubling);
    assert_eq!(
        t.pat_kind(64 << 20, Protocol::SIMPLE),
        PatKind::HalvingDoubling
    );
    assert_eq!(
        tuning(2).pat_kind(512 << 10, Protocol::SIMPLE),
        PatKind::Doubling
    );
    assert_eq!(
        tuning(2).pat_kind(1 << 20, Protocol::SIMPLE),
        PatKind::HalvingDoubling
    );
    assert!(t.table(Func::BROADCAST, 8, 2)[idx(Algorithm::PAT, Protocol::SIMPLE)] < 0.0);
    assert_eq!(
        (big.algo, big.proto),
        (Algorithm::RING, Protocol::SIMPLE),
        "{big:?}"
    );
    assert_eq!(big.chunk, params(Protocol::SIMPLE).chunk_data());
    // Only ring for broadcast; one rank: only ring/simple.
    let b = t.decide(Func::BROADCAST, 1 << 20, 2, &params).unwrap();
    assert_eq!(b.algo, Algorithm::RING);
    let one = tuning(1)
        .decide(Func::ALL_REDUCE, 1 << 20, 2, &params)
        .unwrap();
    assert_eq!((one.algo, one.proto), (Algorithm::RING, Protocol::SIMPLE));
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
