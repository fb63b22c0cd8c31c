//! `NCCL_IB_OOO_RQ` on the fake NIC, whose out-of-order receive queues hand an
//! arriving message any posted receive: the decision (variable, provider, AR, both
//! sides, queue size) and transfers that stay correct because both sides match by
//! id.

use std::sync::Arc;

use rand::Rng;

use super::endpoint::{AcceptOpts, ConnectOpts, SenderHalf, accept};
use super::plan::SendOpts;
use super::request::{ReqCell, State};
use super::tests::{Buf, Pair, RECEIVER, SENDER};
use crate::fake::{FakeFabric, NodeCfg};
use crate::nic::{Link, Op};

/// An mlx5-like IB port with adaptive routing and OOO receive queues of `ooo`.
fn port(ooo: Option<u32>, ar: bool) -> NodeCfg {
    NodeCfg {
        ar,
        ooo_rq: ooo,
        ..NodeCfg::default()
    }
}

fn try_pair(
    send_cfg: NodeCfg,
    recv_cfg: NodeCfg,
    send_var: bool,
    recv_var: bool,
) -> cclkit_abi::Result<Pair> {
    let fabric = FakeFabric::new();
    fabric.configure(SENDER, send_cfg);
    fabric.configure(RECEIVER, recv_cfg);
    let (a, b) = (fabric.nic(SENDER), fabric.nic(RECEIVER));
    let opts = ConnectOpts {
        nqps: 1,
        link: Link::default(),
        ece: false,
        ooo_rq: send_var,
        send: SendOpts::default(),
    };
    let sh = SenderHalf::new(vec![Arc::clone(&a)], 1, opts)?;
    let acc = AcceptOpts {
        ooo_rq: recv_var,
        ..AcceptOpts::default()
    };
    let (rcv, meta) = accept(vec![Arc::clone(&b)], &sh.meta(), acc)?;
    let snd = sh.connect(&meta)?;
    Ok(Pair {
        fabric,
        a,
        b,
        snd,
        rcv,
    })
}

fn ooo_qps(p: &Pair, node: u32) -> Vec<bool> {
    p.fabric
        .qps_of(node)
        .into_iter()
        .map(|q| p.fabric.qp_info(q).unwrap().ooo_rq)
        .collect()
}

#[test]
fn many_receives_in_flight_complete_correctly_over_an_ooo_receive_queue() {
    let mut p = try_pair(port(Some(1024), true), port(Some(1024), true), true, true).unwrap();
    assert_eq!(
        ooo_qps(&p, RECEIVER),
        vec![true],
        "receiver QP has an OOO RQ"
    );
    assert_eq!(ooo_qps(&p, SENDER), vec![true]);
    let mut rng = rand::rng();
    for round in 0..6 {
        // Up to 16 receives posted on the one QP before any data moves: the fake
        // hands each arriving message a random one of them, so matching by wr_id
        // would fail ("does not belong to receive").
        let n = rng.random_range(8..=16);
        let lens: Vec<usize> = (0..n).map(|_| rng.random_range(0..40_000)).collect();
        let srcs: Vec<Buf> = lens.iter().map(|&l| Buf::random(&p.a, l)).collect();
        let dsts: Vec<Buf> = lens
            .iter()
            .map(|&l| Buf::new(&p.b, vec![0; l + 8]))
            .collect();
        let recvs: Vec<Arc<ReqCell>> = dsts
            .iter()
            .map(|d| p.rcv.irecv(&[d.target(9)]).unwrap().unwrap())
            .collect();
        let sends: Vec<Arc<ReqCell>> = srcs
            .iter()
            .zip(&lens)
            .map(|(s, &l)| p.isend(s.send(l), 9))
            .collect();
        let all: Vec<&Arc<ReqCell>> = recvs.iter().chain(&sends).collect();
        p.wait(&all);
        for (k, r) in recvs.iter().enumerate() {
            assert_eq!(r.state(), State::Done, "round {round} message {k}");
            assert_eq!(r.size(0) as usize, lens[k]);
            assert_eq!(&dsts[k].data[..lens[k]], &srcs[k].data[..], "message {k}");
        }
    }
    // Matched by id: every message's WRITE_WITH_IMM wrote its size record (8 bytes),
    // even single ones, and with AR on no separate zero-length immediate was sent.
    let imms: Vec<_> = p
        .fabric
        .log()
        .into_iter()
        .filter(|o| o.node == SENDER && matches!(o.op, Op::WriteImm(_)))
        .collect();
    assert!(!imms.is_empty());
    assert!(imms.iter().all(|o| o.len == 8), "{imms:?}");
}

#[test]
fn without_the_variable_or_without_mlx5dv_ooo_stays_off() {
    // Variable unset on a capable device: off (NCCL's default).
    let p = try_pair(port(Some(1024), true), port(Some(1024), true), false, false).unwrap();
    assert_eq!(ooo_qps(&p, RECEIVER), vec![false]);
    // Set, but the provider cannot enable it (the verbs NIC: no mlx5dv): off, with
    // a warning, and the connection works.
    let mut p = try_pair(port(None, true), port(None, true), true, true).unwrap();
    assert_eq!(
        (ooo_qps(&p, SENDER), ooo_qps(&p, RECEIVER)),
        (vec![false], vec![false])
    );
    let src = Buf::random(&p.a, 5000);
    let dst = Buf::new(&p.b, vec![0; 5000]);
    let r = p.rcv.irecv(&[dst.target(1)]).unwrap().unwrap();
    let s = p.isend(src.send(5000), 1);
    p.wait(&[&r, &s]);
    assert_eq!(dst.data, src.data);
}

#[test]
fn forced_ooo_fails_the_connection_as_nccl_does() {
    let msg = |r: cclkit_abi::Result<Pair>| match r {
        Ok(_) => panic!("connected"),
        Err(e) => e.message().to_owned(),
    };
    let m = msg(try_pair(
        port(Some(1024), false),
        port(Some(1024), true),
        true,
        true,
    ));
    assert!(m.contains("AR is not enabled"), "{m}");
    let m = msg(try_pair(
        port(Some(1024), true),
        port(Some(0), true),
        true,
        true,
    ));
    assert!(m.contains("not supported on both sides"), "{m}");
    let m = msg(try_pair(
        port(Some(0), true),
        port(Some(1024), true),
        true,
        true,
    ));
    assert!(m.contains("not supported on both sides"), "{m}");
    // The receiver forced, the sender without the variable: it announces none.
    let m = msg(try_pair(
        port(Some(1024), true),
        port(Some(1024), true),
        false,
        true,
    ));
    assert!(m.contains("not supported on both sides"), "{m}");
    let m = msg(try_pair(
        port(Some(1024), true),
        port(Some(16), true),
        true,
        true,
    ));
    assert!(
        m.contains("less than the required recv work request size"),
        "{m}"
    );
}
