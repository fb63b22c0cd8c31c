//! Out-of-order receive queues on the fake NIC: a QP created with one hands an
//! arriving WRITE_WITH_IMM any posted receive; without one, the oldest; and a device
//! without them refuses such a QP, as `mlx5dv_create_qp` would.

use std::time::{Duration, Instant};

use super::{FakeFabric, NodeCfg};
use crate::nic::{ACCESS_REMOTE_WRITE, Completion, CompletionKind, Link, Nic, Op, QpCaps, SendWr};

const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_inline: 0,
    access: ACCESS_REMOTE_WRITE,
    ooo_rq: false,
};

/// The `wr_id`s of the receives 16 zero-length WRITE_WITH_IMMs consumed, in
/// arrival order (immediate = send order).
fn consumed(ooo: bool) -> Vec<u64> {
    let fabric = FakeFabric::new();
    for n in [1, 2] {
        fabric.configure(
            n,
            NodeCfg {
                ooo_rq: Some(64),
                ..NodeCfg::default()
            },
        );
    }
    let (a, b) = (fabric.port(1), fabric.port(2));
    let caps = QpCaps {
        ooo_rq: ooo,
        ..CAPS
    };
    let (cqa, mut cqb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let mut qa = a.create_qp(&cqa, caps).unwrap();
    let mut qb = b.create_qp(&cqb, caps).unwrap();
    let (na, nb) = (
        <super::FakeNic as Nic>::qp_num(&qa),
        <super::FakeNic as Nic>::qp_num(&qb),
    );
    a.connect_qp(&mut qa, &b.port_addr(), nb, Link::default())
        .unwrap();
    b.connect_qp(&mut qb, &a.port_addr(), na, Link::default())
        .unwrap();
    for id in 0..16 {
        b.post_recv(&mut qb, 100 + id).unwrap();
    }
    let wrs: Vec<SendWr> = (0..16u32)
        .map(|i| SendWr {
            wr_id: u64::from(i),
            op: Op::WriteImm(i),
            local: None,
            remote_addr: 0,
            rkey: 0,
            signaled: false,
            inline: false,
        })
        .collect();
    a.post_send(&mut qa, &wrs).unwrap();
    let mut out: Vec<Completion> = Vec::new();
    let start = Instant::now();
    while out.len() < 16 {
        b.poll_cq(&mut cqb, &mut out, 64).unwrap();
        assert!(start.elapsed() < Duration::from_secs(10), "only {out:?}");
    }
    let mut by_imm = vec![0u64; 16];
    for c in &out {
        let CompletionKind::RecvImm(i) = c.kind else {
            panic!("{c:?}")
        };
        by_imm[i as usize] = c.wr_id;
    }
    by_imm
}

#[test]
fn an_ooo_receive_queue_hands_out_any_posted_receive() {
    let in_order: Vec<u64> = (100..116).collect();
    for _ in 0..5 {
        assert_eq!(consumed(false), in_order, "a plain RQ is FIFO");
    }
    let runs: Vec<Vec<u64>> = (0..5).map(|_| consumed(true)).collect();
    for r in &runs {
        let mut sorted = r.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, in_order, "each receive consumed once");
    }
    assert!(
        runs.iter().any(|r| *r != in_order),
        "16! orders, five runs: an OOO RQ reorders"
    );
}

#[test]
fn a_device_without_ooo_receive_queues_refuses_such_a_qp() {
    let fabric = FakeFabric::new();
    fabric.configure(
        3,
        NodeCfg {
            ooo_rq: Some(8),
            ..NodeCfg::default()
        },
    );
    let caps = QpCaps {
        ooo_rq: true,
        ..CAPS
    };
    let (plain, small) = (fabric.port(1), fabric.port(3));
    let cq = plain.create_cq(8).unwrap();
    let Err(e) = plain.create_qp(&cq, caps) else {
        panic!("a device without OOO receive queues created one")
    };
    assert!(e.message().contains("mlx5dv_create_qp"), "{}", e.message());
    let cq = small.create_cq(8).unwrap();
    assert!(small.create_qp(&cq, caps).is_err(), "8 < 16 receives");
    assert!(
        small
            .create_qp(
                &cq,
                QpCaps {
                    max_recv_wr: 8,
                    ..caps
                }
            )
            .is_ok()
    );
}
