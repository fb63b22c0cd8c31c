//! The fake NIC's strict behaviours. Each test fails on the earlier, lenient fake
//! (which had no QP states, lkey == rkey, no access flags, in-order execution,
//! send-queue slots freed on execution, CQ overrun as a poll error, immediate
//! failure of unreachable peers).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::nic::{
    ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, CompletionKind, Link, Nic,
    PortAddr, QpCaps, SendWr, Sge,
};

const CAPS: QpCaps = QpCaps {
    max_send_wr: 4,
    max_recv_wr: 4,
    max_inline: 0,
    access: ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ,
    ooo_rq: false,
};

struct Two {
    fabric: Arc<FakeFabric>,
    a: FakeNic,
    b: FakeNic,
    cqa: FakeCq,
    cqb: FakeCq,
    qa: FakeQp,
    qb: FakeQp,
}

fn two(caps_a: QpCaps, caps_b: QpCaps, cq_depth: u32) -> Two {
    let fabric = FakeFabric::new();
    let (a, b) = (fabric.port(1), fabric.port(2));
    let cqa = a.create_cq(cq_depth).unwrap();
    let cqb = b.create_cq(cq_depth).unwrap();
    let mut qa = a.create_qp(&cqa, caps_a).unwrap();
    let mut qb = b.create_qp(&cqb, caps_b).unwrap();
    let (na, nb) = (FakeNic::qp_num(&qa), FakeNic::qp_num(&qb));
    a.connect_qp(&mut qa, &b.port_addr(), nb, Link::default())
        .unwrap();
    b.connect_qp(&mut qb, &a.port_addr(), na, Link::default())
        .unwrap();
    Two {
        fabric,
        a,
        b,
        cqa,
        cqb,
        qa,
        qb,
    }
}

fn write(src: &[u8], lkey: u32, dst: &[u8], rkey: u32, wr_id: u64) -> SendWr {
    SendWr {
        wr_id,
        op: Op::Write,
        local: Some(Sge {
            addr: src.as_ptr() as u64,
            len: src.len() as u32,
            lkey,
        }),
        remote_addr: dst.as_ptr() as u64,
        rkey,
        signaled: true,
        inline: false,
    }
}

fn poll_until(nic: &FakeNic, cq: &mut FakeCq, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < n {
        nic.poll_cq(cq, &mut out, 64).unwrap();
        assert!(start.elapsed() < Duration::from_secs(10), "only {out:?}");
    }
    out
}

#[test]
fn qp_state_machine_rejects_wrong_transitions_and_early_posts() {
    let f = FakeFabric::new();
    let (a, b) = (f.port(1), f.port(2));
    let cq = a.create_cq(8).unwrap();
    let mut qp = a.create_qp(&cq, CAPS).unwrap();
    let src = [0u8; 8];
    let e = a
        .post_send(&mut qp, &[write(&src, 0, &src, 0, 1)])
        .unwrap_err();
    assert!(e.message().contains("not RTS"), "{}", e.message());
    let other = b.port_addr();
    a.connect_qp(&mut qp, &other, 99, Link::default()).unwrap();
    let e = a
        .connect_qp(&mut qp, &other, 99, Link::default())
        .unwrap_err();
    assert!(e.message().contains("Rts → RTR"), "{}", e.message());
    let e = a.set_ece(&mut qp, &Ece::default()).unwrap_err();
    assert!(e.message().contains("not INIT"), "{}", e.message());
    let info = f.qp_info(FakeNic::qp_num(&qp)).unwrap();
    assert_eq!(info.state, QpState::Rts);
    assert!(!info.av.unwrap().is_global, "same IB subnet: LID-routed");
    // RoCE needs a GRH; the route module always gives one, so a RoCE peer address
    // vector is global.
    let mut roce = other;
    roce.link_layer = crate::route::LINK_ETHERNET;
    let mut q2 = a.create_qp(&cq, CAPS).unwrap();
    a.connect_qp(&mut q2, &roce, 99, Link::default()).unwrap();
    assert!(
        f.qp_info(FakeNic::qp_num(&q2))
            .unwrap()
            .av
            .unwrap()
            .is_global
    );
}

#[test]
fn lkey_and_rkey_are_distinct_and_mixing_them_up_fails() {
    let mut t = two(CAPS, CAPS, 16);
    let src = vec![7u8; 64];
    let dst = vec![0u8; 64];
    // SAFETY: both vectors outlive their registrations (dropped at the end).
    let (ms, md) = unsafe {
        (
            t.a.reg_mr(src.as_ptr() as usize, 64, WriteOrder::Relaxed)
                .unwrap(),
            t.b.reg_mr(dst.as_ptr() as usize, 64, WriteOrder::Relaxed)
                .unwrap(),
        )
    };
    let (ls, rs) = FakeNic::keys(&ms);
    let (ld, rd) = FakeNic::keys(&md);
    assert_ne!(ls, rs);
    // rkey of the source as lkey: local protection error.
    t.a.post_send(&mut t.qa, &[write(&src, rs, &dst, rd, 1)])
        .unwrap();
    let c = poll_until(&t.a, &mut t.cqa, 1);
    assert_eq!(c[0].status, LOC_PROT_ERR);
    // A fresh pair: lkey of the destination as rkey: remote access error.
    let mut t = two(CAPS, CAPS, 16);
    // SAFETY: as above.
    let (ms, md) = unsafe {
        (
            t.a.reg_mr(src.as_ptr() as usize, 64, WriteOrder::Relaxed)
                .unwrap(),
            t.b.reg_mr(dst.as_ptr() as usize, 64, WriteOrder::Relaxed)
                .unwrap(),
        )
    };
    t.a.post_send(&mut t.qa, &[write(&src, FakeNic::keys(&ms).0, &dst, ld, 1)])
        .unwrap();
    assert_eq!(poll_until(&t.a, &mut t.cqa, 1)[0].status, REM_ACCESS_ERR);
    assert!(dst.iter().all(|&x| x == 0));
    drop((ms, md));
}

#[test]
fn access_flags_of_registrations_and_qps_are_enforced() {
    let write_only = QpCaps {
        access: ACCESS_REMOTE_WRITE,
        ..CAPS
    };
    let mut t = two(CAPS, write_only, 16);
    let src = vec![1u8; 32];
    let dst = vec![0u8; 32];
    // SAFETY: the vectors outlive the registrations.
    let (ms, md_ro) = unsafe {
        (
            t.a.reg_mr(src.as_ptr() as usize, 32, WriteOrder::Relaxed)
                .unwrap(),
            t.b.reg_mr_access(
                dst.as_ptr() as usize,
                32,
                ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ,
            ),
        )
    };
    let w = write(&src, FakeNic::keys(&ms).0, &dst, FakeNic::keys(&md_ro).1, 1);
    t.a.post_send(&mut t.qa, &[w]).unwrap();
    assert_eq!(
        poll_until(&t.a, &mut t.cqa, 1)[0].status,
        REM_ACCESS_ERR,
        "registration without REMOTE_WRITE"
    );
    // READ from a peer QP that only allows REMOTE_WRITE.
    let mut t = two(CAPS, write_only, 16);
    // SAFETY: as above.
    let (ms, md) = unsafe {
        (
            t.a.reg_mr(src.as_ptr() as usize, 32, WriteOrder::Relaxed)
                .unwrap(),
            t.b.reg_mr(dst.as_ptr() as usize, 32, WriteOrder::Relaxed)
                .unwrap(),
        )
    };
    let mut r = write(&src, FakeNic::keys(&ms).0, &dst, FakeNic::keys(&md).1, 2);
    r.op = Op::Read;
    t.a.post_send(&mut t.qa, &[r]).unwrap();
    assert_eq!(poll_until(&t.a, &mut t.cqa, 1)[0].status, REM_ACCESS_ERR);
    drop((ms, md, md_ro));
}

#[test]
fn send_queue_slots_return_only_when_completions_are_polled() {
    let mut t = two(CAPS, CAPS, 16);
    let src = vec![3u8; 16];
    let dst = vec![0u8; 16];
    // SAFETY: the vectors outlive the registrations.
    let (ms, md) = unsafe {
        (
            t.a.reg_mr(src.as_ptr() as usize, 16, WriteOrder::Relaxed)
                .unwrap(),
            t.b.reg_mr(dst.as_ptr() as usize, 16, WriteOrder::Relaxed)
                .unwrap(),
        )
    };
    let w = write(&src, FakeNic::keys(&ms).0, &dst, FakeNic::keys(&md).1, 1);
    t.a.post_send(&mut t.qa, &[w; 4]).unwrap();
    t.fabric.run(200);
    assert_eq!(dst, src, "the writes executed");
    let e = t.a.post_send(&mut t.qa, &[w]).unwrap_err();
    assert!(e.message().contains("send queue full"), "{}", e.message());
    let got = poll_until(&t.a, &mut t.cqa, 4);
    assert!(
        got.iter()
            .all(|c| c.status == 0 && c.kind == CompletionKind::Write)
    );
    t.a.post_send(&mut t.qa, &[w; 4]).unwrap();
    drop((ms, md, t.qb, t.cqb));
}

#[test]
fn completions_of_different_qps_arrive_in_either_order() {
    let mut seen = [false; 2];
    for _ in 0..200 {
        let f = FakeFabric::new();
        let (a, b) = (f.port(1), f.port(2));
        let mut cq = a.create_cq(16).unwrap();
        let cqb = b.create_cq(16).unwrap();
        let src = vec![1u8; 8];
        let dst = vec![0u8; 8];
        // SAFETY: the vectors outlive the registrations.
        let (ms, md) = unsafe {
            (
                a.reg_mr(src.as_ptr() as usize, 8, WriteOrder::Relaxed)
                    .unwrap(),
                b.reg_mr(dst.as_ptr() as usize, 8, WriteOrder::Relaxed)
                    .unwrap(),
            )
        };
        let mut qps = Vec::new();
        for id in 0..2 {
            let mut qa = a.create_qp(&cq, CAPS).unwrap();
            let mut qb = b.create_qp(&cqb, CAPS).unwrap();
            let (na, nb) = (FakeNic::qp_num(&qa), FakeNic::qp_num(&qb));
            a.connect_qp(&mut qa, &b.port_addr(), nb, Link::default())
                .unwrap();
            b.connect_qp(&mut qb, &a.port_addr(), na, Link::default())
                .unwrap();
            let w = write(&src, FakeNic::keys(&ms).0, &dst, FakeNic::keys(&md).1, id);
            a.post_send(&mut qa, &[w]).unwrap();
            qps.push((qa, qb));
        }
        let c = poll_until(&a, &mut cq, 2);
        seen[c[0].wr_id as usize] = true;
        drop((qps, ms, md));
        if seen == [true, true] {
            return;
        }
    }
    panic!("completions always arrived in posting order: {seen:?}");
}

#[test]
fn relaxed_writes_land_out_of_address_order_and_strict_ones_never() {
    let mut relaxed_out_of_order = false;
    for order in [WriteOrder::Relaxed, WriteOrder::Strict] {
        for _ in 0..50 {
            let mut t = two(CAPS, CAPS, 16);
            t.fabric.set_bytes_per_step(8);
            let src = vec![0xEEu8; 64];
            let dst = vec![0u8; 64];
            // SAFETY: the vectors outlive the registrations.
            let (ms, md) = unsafe {
                (
                    t.a.reg_mr(src.as_ptr() as usize, 64, WriteOrder::Relaxed)
                        .unwrap(),
                    t.b.reg_mr(dst.as_ptr() as usize, 64, order).unwrap(),
                )
            };
            let w = write(&src, FakeNic::keys(&ms).0, &dst, FakeNic::keys(&md).1, 1);
            t.a.post_send(&mut t.qa, &[w]).unwrap();
            for _ in 0..8 {
                t.fabric.run(1);
                // Same thread: `run` returned, nothing writes `dst` meanwhile.
                let landed: Vec<bool> = (0..8).map(|i| dst[8 * i] != 0).collect();
                let gap = landed.windows(2).any(|w| !w[0] && w[1]);
                if gap {
                    assert_eq!(order, WriteOrder::Relaxed, "strict write out of order");
                    relaxed_out_of_order = true;
                }
            }
            drop((ms, md));
        }
    }
    assert!(
        relaxed_out_of_order,
        "relaxed writes always landed in address order"
    );
}

#[test]
fn cq_overrun_is_an_async_cq_error_not_a_poll_error() {
    let mut t = two(CAPS, CAPS, 2);
    let src = vec![5u8; 8];
    let dst = vec![0u8; 8];
    // SAFETY: the vectors outlive the registrations.
    let (ms, md) = unsafe {
        (
            t.a.reg_mr(src.as_ptr() as usize, 8, WriteOrder::Relaxed)
                .unwrap(),
            t.b.reg_mr(dst.as_ptr() as usize, 8, WriteOrder::Relaxed)
                .unwrap(),
        )
    };
    let w = write(&src, FakeNic::keys(&ms).0, &dst, FakeNic::keys(&md).1, 1);
    t.a.post_send(&mut t.qa, &[w; 3]).unwrap();
    t.fabric.run(100);
    let mut out = Vec::new();
    t.a.poll_cq(&mut t.cqa, &mut out, 64).unwrap();
    assert_eq!(out.len(), 2, "the third completion was lost");
    let e = t.a.check_fatal(&t.cqa).unwrap_err();
    assert!(e.message().contains("CQ error"), "{}", e.message());
    assert!(t.b.check_fatal(&t.cqb).is_ok(), "only that CQ");
    drop((ms, md));
}

#[test]
fn unreachable_peers_fail_after_the_retry_timeout_not_before() {
    for (label, setup) in [
        ("dead node", 0),
        ("port down", 1),
        ("wrong address vector", 2),
    ] {
        let f = FakeFabric::new();
        f.set_retry_timeout(Duration::from_millis(150));
        let (a, b) = (f.port(1), f.port(2));
        let mut cq = a.create_cq(16).unwrap();
        let cqb = b.create_cq(16).unwrap();
        let mut qa = a.create_qp(&cq, CAPS).unwrap();
        let qb = b.create_qp(&cqb, CAPS).unwrap();
        let mut to: PortAddr = b.port_addr();
        if setup == 2 {
            to.lid += 40; // LID of nobody
        }
        a.connect_qp(&mut qa, &to, FakeNic::qp_num(&qb), Link::default())
            .unwrap();
        match setup {
            0 => f.kill_node(2),
            1 => f.inject_async(2, FakeEvent::PortDown),
            _ => {}
        }
        let w = SendWr {
            wr_id: 9,
            op: Op::Write,
            local: None,
            remote_addr: 0,
            rkey: 0,
            signaled: true,
            inline: false,
        };
        a.post_send(&mut qa, &[w]).unwrap();
        let start = Instant::now();
        let c = poll_until(&a, &mut cq, 1);
        let took = start.elapsed();
        assert_eq!(c[0].status, RETRY_EXC_ERR, "{label}");
        assert!(
            took >= Duration::from_millis(150),
            "{label}: failed after {took:?}"
        );
        assert!(took < Duration::from_secs(3), "{label}: {took:?}");
        assert!(
            a.check_fatal(&cq).is_ok(),
            "{label}: not an async fatal event"
        );
        drop(qb);
    }
}

#[test]
fn a_port_that_comes_back_before_the_timeout_loses_nothing() {
    let mut t = two(CAPS, CAPS, 16);
    t.fabric.set_retry_timeout(Duration::from_secs(5));
    let src = vec![9u8; 8];
    let dst = vec![0u8; 8];
    // SAFETY: the vectors outlive the registrations.
    let (ms, md) = unsafe {
        (
            t.a.reg_mr(src.as_ptr() as usize, 8, WriteOrder::Relaxed)
                .unwrap(),
            t.b.reg_mr(dst.as_ptr() as usize, 8, WriteOrder::Relaxed)
                .unwrap(),
        )
    };
    t.fabric.inject_async(2, FakeEvent::PortDown);
    let w = write(&src, FakeNic::keys(&ms).0, &dst, FakeNic::keys(&md).1, 1);
    t.a.post_send(&mut t.qa, &[w]).unwrap();
    t.fabric.run(50);
    assert!(dst.iter().all(|&x| x == 0), "nothing passes a down port");
    t.fabric.inject_async(2, FakeEvent::PortUp);
    let c = poll_until(&t.a, &mut t.cqa, 1);
    assert_eq!(c[0].status, 0);
    assert_eq!(dst, src);
    drop((ms, md, t.qb, t.cqb));
}

#[test]
fn inline_sends_copy_at_post_time_and_respect_max_inline() {
    let caps = QpCaps {
        max_inline: 16,
        ..CAPS
    };
    let mut t = two(caps, caps, 16);
    let mut src = vec![0x5Au8; 16];
    let dst = vec![0u8; 32];
    // SAFETY: the vector outlives the registration.
    let md = unsafe {
        t.b.reg_mr(dst.as_ptr() as usize, 32, WriteOrder::Relaxed)
            .unwrap()
    };
    // No registration for the source: inline data needs no lkey.
    let mut w = write(&src, 0xdead, &dst, FakeNic::keys(&md).1, 1);
    w.inline = true;
    t.a.post_send(&mut t.qa, &[w]).unwrap();
    src.fill(0x11); // the NIC already has its copy
    poll_until(&t.a, &mut t.cqa, 1);
    assert!(dst[..16].iter().all(|&x| x == 0x5A));
    let big = vec![1u8; 17];
    let mut w = write(&big, 0, &dst, FakeNic::keys(&md).1, 2);
    w.inline = true;
    let e = t.a.post_send(&mut t.qa, &[w]).unwrap_err();
    assert!(e.message().contains("inline"), "{}", e.message());
    drop(md);
}
