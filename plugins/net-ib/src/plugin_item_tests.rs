//! Issue-23 behaviours through the `Net` trait on the fake NIC: GPUDirect capability
//! decisions and NCCL_IB_TC over the communicator's traffic class.

use cclkit_abi::net::{CommConfig, CommRef, Net, RecvBuf};
use cclkit_abi::raw::common::ptr;

use crate::config::Config;
use crate::fake::{FakeFabric, NodeCfg};
use crate::plugin_tests::{buf, connect_ctx, node_with, region, wait};
use crate::route::LINK_ETHERNET;

#[test]
fn gpu_memory_needs_peermem_for_regmr_and_dmabuf_for_regmrdmabuf() {
    for (support, peermem, dmabuf) in [
        (ptr::HOST, false, false),
        (ptr::HOST | ptr::CUDA, true, false),
        (ptr::HOST | ptr::DMABUF, false, true),
        (ptr::HOST | ptr::CUDA | ptr::DMABUF, true, true),
    ] {
        let fabric = FakeFabric::new();
        let a = node_with(&fabric, &[1], support, Config::default());
        let b = node_with(&fabric, &[2], support, Config::default());
        let ctx = a.open_context(1, CommConfig::default()).unwrap();
        let cb = b.open_context(1, CommConfig::default()).unwrap();
        let mut c = connect_ctx(&a, &b, &ctx, &cb);
        let mut gpu = vec![0u8; 8192];
        let via_regmr = b.reg_mr(CommRef::Recv(&c.recv), region(&gpu, ptr::CUDA));
        assert_eq!(via_regmr.is_ok(), peermem, "ptrSupport {support:#x}");
        if let Err(e) = &via_regmr {
            assert!(e.message().contains("peer-memory"), "{}", e.message());
        }
        let via_dmabuf = b.reg_mr_dmabuf(CommRef::Recv(&c.recv), region(&gpu, ptr::CUDA), 0, 5);
        assert_eq!(via_dmabuf.is_ok(), dmabuf, "ptrSupport {support:#x}");
        // The receiver gets a loopback flush QP whenever GPUDirect is possible.
        let gdr = peermem || dmabuf;
        assert_eq!(
            fabric.qps_of(2).len(),
            1 + usize::from(gdr),
            "ptrSupport {support:#x}"
        );
        let mr = via_dmabuf.ok().or(via_regmr.ok());
        if let Some(mr) = mr {
            let bufs = [RecvBuf {
                buf: buf(&mut gpu),
                tag: 0,
                mr: Some(&mr),
            }];
            let mut f = b.iflush(&mut c.recv, &bufs).unwrap().expect("a flush");
            wait(&mut f, 0).unwrap();
            drop(f);
            b.dereg_mr(CommRef::Recv(&c.recv), mr).unwrap();
        }
    }
}

#[test]
fn nccl_ib_tc_beats_the_communicators_traffic_class_on_both_sides() {
    let fabric = FakeFabric::new();
    let roce = NodeCfg {
        link_layer: LINK_ETHERNET,
        ..NodeCfg::default()
    };
    fabric.configure(1, roce);
    fabric.configure(2, roce);
    let env = Config {
        traffic_class: Some(106),
        ..Config::default()
    };
    let a = node_with(&fabric, &[1], ptr::HOST, env);
    let b = node_with(&fabric, &[2], ptr::HOST, Config::default());
    let ca = a
        .open_context(
            1,
            CommConfig {
                traffic_class: Some(40),
            },
        )
        .unwrap();
    // The receiver's own settings do not matter: it follows the sender.
    let cb = b
        .open_context(
            1,
            CommConfig {
                traffic_class: Some(7),
            },
        )
        .unwrap();
    let c = connect_ctx(&a, &b, &ca, &cb);
    for node in [1, 2] {
        for qpn in fabric.qps_of(node) {
            let av = fabric.qp_info(qpn).unwrap().av.unwrap();
            assert_eq!((av.traffic_class, av.sl), (106, 40), "node {node}");
        }
    }
    drop(c);
}
