//! NIC fusion (`makeVDevice`, `NCCL_IB_MERGE_NICS`) through the `Net` trait on
//! several fake NICs per host: a fused device's properties, transfers whose data
//! leaves through every physical NIC with that NIC's keys, asymmetric fusion, GPU
//! flushes on every port, and fusion switched off.

use std::collections::BTreeSet;
use std::ffi::c_int;
use std::time::{Duration, Instant};

use cclkit_abi::net::{CommConfig, CommRef, Net, NetHandle, RecvBuf};
use cclkit_abi::raw::common::{NcclResult, ptr};
use rand::{Rng, RngCore};

use crate::config::Config;
use crate::fake::{FakeFabric, NodeCfg};
use crate::nic::Op;
use crate::plugin_tests::{Conn, FakeNet, buf, err, node_with, region, wait};
use crate::route::LINK_ETHERNET;

const DEADLINE: Duration = Duration::from_secs(20);

/// Connects `a`'s device `da` (sender) to `b`'s device `db` (receiver).
fn connect_dev(a: &FakeNet, da: usize, b: &FakeNet, db: usize) -> Conn {
    let ca = a.open_context(1, CommConfig::default()).unwrap();
    let cb = b.open_context(1, CommConfig::default()).unwrap();
    let mut handle = NetHandle::zeroed();
    let mut listen = b.listen(&cb, db, &mut handle).unwrap();
    let mut shipped = *handle.as_bytes();
    let peer = NetHandle::from_bytes_mut(&mut shipped);
    let (mut send, mut recv) = (None, None);
    let start = Instant::now();
    while send.is_none() || recv.is_none() {
        assert!(start.elapsed() < DEADLINE, "connection setup stuck");
        if send.is_none() {
            send = a.connect(&ca, da, peer).unwrap();
        }
        if recv.is_none() {
            recv = b.accept(&mut listen).unwrap();
        }
    }
    b.close_listen(listen).unwrap();
    Conn {
        send: send.unwrap(),
        recv: recv.unwrap(),
    }
}

/// Sends `lens.len()` buffers of random bytes as one (grouped) receive and checks
/// every byte and size.
fn transfer(a: &FakeNet, b: &FakeNet, c: &mut Conn, lens: &[usize]) {
    let mut rng = rand::rng();
    let mut srcs: Vec<Vec<u8>> = lens
        .iter()
        .map(|&l| {
            let mut v = vec![0u8; l];
            rng.fill_bytes(&mut v);
            v
        })
        .collect();
    let mut dsts: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l + 64]).collect();
    let smrs: Vec<_> = srcs
        .iter()
        .map(|s| {
            a.reg_mr(CommRef::Send(&c.send), region(s, ptr::HOST))
                .unwrap()
        })
        .collect();
    let rmrs: Vec<_> = dsts
        .iter()
        .map(|d| {
            b.reg_mr(CommRef::Recv(&c.recv), region(d, ptr::HOST))
                .unwrap()
        })
        .collect();
    {
        let rb: Vec<RecvBuf<'_, _>> = dsts
            .iter_mut()
            .zip(&rmrs)
            .enumerate()
            .map(|(i, (d, mr))| RecvBuf {
                buf: buf(d),
                tag: 40 + i as i32,
                mr: Some(mr),
            })
            .collect();
        let mut rreq = b.irecv(&mut c.recv, &rb, false).unwrap().expect("slot");
        let mut sreqs = Vec::new();
        for (i, s) in srcs.iter_mut().enumerate() {
            let start = Instant::now();
            let req = loop {
                if let Some(r) = a
                    .isend(&mut c.send, buf(s), 40 + i as i32, Some(&smrs[i]))
                    .unwrap()
                {
                    break r;
                }
                let mut sizes_out = [0 as c_int; 8];
                // SAFETY: 8 entries, as many as a receive may have.
                let mut sz = unsafe { cclkit_abi::net::Sizes::from_raw(sizes_out.as_mut_ptr()) };
                let _ = FakeNet::test(&mut rreq, &mut sz);
                assert!(start.elapsed() < DEADLINE, "isend never matched");
            };
            sreqs.push(req);
        }
        for (mut r, &l) in sreqs.into_iter().zip(lens) {
            assert_eq!(wait(&mut r, 1).unwrap(), vec![l as c_int]);
        }
        let got = wait(&mut rreq, lens.len()).unwrap();
        let want: Vec<c_int> = lens.iter().map(|&l| l as c_int).collect();
        assert_eq!(got, want);
    }
    for (i, (s, d)) in srcs.iter().zip(&dsts).enumerate() {
        assert_eq!(&d[..s.len()], &s[..], "buffer {i} of {lens:?}");
        assert!(
            d[s.len()..].iter().all(|&x| x == 0),
            "nothing past the data"
        );
    }
    for mr in smrs {
        a.dereg_mr(CommRef::Send(&c.send), mr).unwrap();
    }
    for mr in rmrs {
        b.dereg_mr(CommRef::Recv(&c.recv), mr).unwrap();
    }
}

/// Nodes that posted data writes (RDMA WRITE / WRITE_WITH_IMM moving bytes) among
/// `nodes`, since log entry `from`.
fn writers(fabric: &FakeFabric, from: usize, nodes: &[u32]) -> BTreeSet<u32> {
    fabric.log()[from..]
        .iter()
        .filter(|o| o.len > 0 && matches!(o.op, Op::Write | Op::WriteImm(_)))
        .filter(|o| nodes.contains(&o.node))
        .map(|o| o.node)
        .collect()
}

#[test]
fn a_fused_device_reports_nccls_properties() {
    let fabric = FakeFabric::new();
    let net = node_with(
        &fabric,
        &[1, 2, 3],
        ptr::HOST | ptr::DMABUF,
        Config::default(),
    );
    assert_eq!(net.devices(), 3);
    let v = net.make_vdevice(&[2, 0]).unwrap();
    assert_eq!(v, 3, "appended after the physical devices");
    assert_eq!(net.devices(), 4);
    let p = net.properties(v).unwrap();
    let p0 = net.properties(2).unwrap();
    assert_eq!(p.name, "fake3+fake1");
    assert_eq!(p.speed_mbps, 2 * p0.speed_mbps);
    assert_eq!(p.vdevs, vec![2, 0]);
    assert_eq!(p.ptr_support, ptr::HOST | ptr::DMABUF);
    assert_eq!(p.port, p0.port);
    assert!(
        net.properties(0).unwrap().vdevs.is_empty(),
        "physical stays plain"
    );
    let single = net.make_vdevice(&[1]).unwrap();
    assert_eq!(single, 4, "NCCL appends one even for a single device");
    assert_eq!(net.properties(single).unwrap().name, "fake2");
    assert!(net.properties(5).is_err());
}

#[test]
fn a_transfer_over_fused_nics_spreads_over_both_with_each_nics_keys() {
    let fabric = FakeFabric::new();
    let gpu = ptr::HOST | ptr::CUDA;
    let a = node_with(&fabric, &[1, 2], gpu, Config::default());
    let b = node_with(&fabric, &[3, 4], gpu, Config::default());
    let (va, vb) = (
        a.make_vdevice(&[0, 1]).unwrap(),
        b.make_vdevice(&[0, 1]).unwrap(),
    );
    let mut c = connect_dev(&a, va, &b, vb);
    // NCCL_IB_QPS_PER_CONNECTION (1) QPs on each port; the receiver adds one
    // loopback flush QP per port (GPUDirect).
    assert_eq!((fabric.qps_of(1).len(), fabric.qps_of(2).len()), (1, 1));
    assert_eq!((fabric.qps_of(3).len(), fabric.qps_of(4).len()), (2, 2));
    let mut rng = rand::rng();
    let start = fabric.log().len();
    for round in 0..12 {
        let n = if round % 3 == 2 { 3 } else { 1 };
        let lens: Vec<usize> = (0..n).map(|_| rng.random_range(1..50_000) | 1).collect();
        transfer(&a, &b, &mut c, &lens);
    }
    assert_eq!(
        writers(&fabric, start, &[1, 2]),
        BTreeSet::from([1, 2]),
        "data left through both sender NICs"
    );
    assert_eq!(
        writers(&fabric, start, &[3, 4]),
        BTreeSet::from([3]),
        "CTS entries go out on the receiver's first QP (first port)"
    );
    // A GPU flush reads through every receiver port.
    let mut gpu_buf = vec![0u8; 4096];
    let mr = b
        .reg_mr(CommRef::Recv(&c.recv), region(&gpu_buf, ptr::CUDA))
        .unwrap();
    let before = fabric.log().len();
    let bufs = [RecvBuf {
        buf: buf(&mut gpu_buf),
        tag: 0,
        mr: Some(&mr),
    }];
    let mut f = b.iflush(&mut c.recv, &bufs).unwrap().expect("a flush");
    wait(&mut f, 0).unwrap();
    let readers: BTreeSet<u32> = fabric.log()[before..]
        .iter()
        .filter(|o| o.op == Op::Read)
        .map(|o| o.node)
        .collect();
    assert_eq!(readers, BTreeSet::from([3, 4]));
    drop(f);
    b.dereg_mr(CommRef::Recv(&c.recv), mr).unwrap();
    a.close_send(c.send).unwrap();
    b.close_recv(c.recv).unwrap();
    assert_eq!(fabric.live_mrs(), 0, "every port's registrations released");
}

#[test]
fn a_fused_sender_reaches_a_plain_receiver_and_split_mode_uses_every_nic() {
    let fabric = FakeFabric::new();
    let split = Config {
        split_data_on_qps: true,
        qps_per_connection: 2,
        ..Config::default()
    };
    let a = node_with(&fabric, &[1, 2, 3], ptr::HOST, split.clone());
    let b = node_with(&fabric, &[4], ptr::HOST, Config::default());
    let va = a.make_vdevice(&[0, 1, 2]).unwrap();
    let mut c = connect_dev(&a, va, &b, 0);
    assert_eq!(
        fabric.qps_of(4).len(),
        6,
        "the receiver matches the sender's 3 × 2"
    );
    let start = fabric.log().len();
    let mut rng = rand::rng();
    for _ in 0..4 {
        let lens = [rng.random_range(10_000..200_000) | 1];
        transfer(&a, &b, &mut c, &lens);
    }
    transfer(&a, &b, &mut c, &[7, 0, 3001]);
    assert_eq!(
        writers(&fabric, start, &[1, 2, 3]),
        BTreeSet::from([1, 2, 3])
    );
    // And the other way round: a plain sender into a fused receiver.
    let mut back = connect_dev(&b, 0, &a, va);
    // NCCL_IB_QPS_PER_CONNECTION × max(1, 3) QPs: one more on every receiving port
    // (read from the listen handle), three more on the plain sender.
    for n in [1, 2, 3] {
        assert_eq!(fabric.qps_of(n).len(), 3, "port {n}");
    }
    assert_eq!(fabric.qps_of(4).len(), 6 + 3);
    transfer(&b, &a, &mut back, &[99_999]);
    transfer(&b, &a, &mut back, &[1, 2, 3, 4]);
}

#[test]
fn merge_nics_0_and_mixed_link_layers_refuse_fusion() {
    let fabric = FakeFabric::new();
    let off = Config {
        merge_nics: false,
        ..Config::default()
    };
    let net = node_with(&fabric, &[1, 2], ptr::HOST, off);
    let e = err(net.make_vdevice(&[0, 1]));
    assert_eq!(e.code(), NcclResult::INVALID_USAGE);
    assert!(
        e.message().contains("NCCL_IB_MERGE_NICS=0"),
        "{}",
        e.message()
    );
    assert_eq!(net.devices(), 2, "nothing appended");
    assert_eq!(
        net.make_vdevice(&[1]).unwrap(),
        2,
        "a single device still works"
    );

    fabric.configure(
        5,
        NodeCfg {
            link_layer: LINK_ETHERNET,
            ..NodeCfg::default()
        },
    );
    let net = node_with(&fabric, &[3, 5], ptr::HOST, Config::default());
    let e = err(net.make_vdevice(&[0, 1]));
    assert!(e.message().contains("incompatible"), "{}", e.message());
    assert_eq!(err(net.make_vdevice(&[])).code(), NcclResult::INVALID_USAGE);
    assert!(net.make_vdevice(&[0, 7]).is_err(), "unknown device");
    assert_eq!(net.devices(), 2);
}
