//! Real-hardware loopback: one host, one HCA port, a connection from the port to
//! itself through the shipped verbs backend (`IbNet<Verbs>`), moving random data.
//!
//! `#[ignore]`d because it needs an RDMA device (none on the project's CI machines).
//! On a host with one (see HARDWARE.md):
//!
//! ```text
//! CCLKIT_IB_TEST_DEVICE=0 NCCL_IB_QPS_PER_CONNECTION=2 \
//!   cargo test -p cclkit-net-ib --test hardware_loopback -- --ignored --test-threads=1
//! ```
//! `CCLKIT_IB_TEST_DEVICE` picks the device index (default 0); `NCCL_IB_HCA`,
//! `NCCL_IB_GID_INDEX`, … apply as in production.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use cclkit_abi::net::{
    Buf, CommConfig, CommRef, InitArgs, MemRegion, Net, NetHandle, RecvBuf, Sizes,
};
use cclkit_abi::raw::common::ptr;
use cclkit_net_ib::IbVerbsNet;

const DEADLINE: Duration = Duration::from_secs(60);

fn wait(req: &mut <IbVerbsNet as Net>::Request, n: usize) -> Vec<c_int> {
    let mut out = [0 as c_int; 64];
    let start = Instant::now();
    loop {
        // SAFETY: 64 entries, more than any request's buffer count.
        let mut sizes = unsafe { Sizes::from_raw(out.as_mut_ptr()) };
        if IbVerbsNet::test(req, &mut sizes).expect("request failed") {
            return out[..n].to_vec();
        }
        assert!(
            start.elapsed() < DEADLINE,
            "request stuck (check the fabric / GID index)"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device; see plugins/net-ib/HARDWARE.md"]
fn loopback_transfers_on_a_real_hca() {
    let net = IbVerbsNet::init(&InitArgs {
        host_abi: 12,
        profiler: cclkit_abi::profiler::net::NetProfiler::disabled(),
    })
    .expect("init (is there an active HCA port?)");
    let dev: usize = std::env::var("CCLKIT_IB_TEST_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(dev < net.devices(), "device {dev} of {}", net.devices());
    let props = net.properties(dev).unwrap();
    eprintln!("device {dev}: {props:?}");
    assert!(props.speed_mbps > 0);
    assert!(props.reg_is_global);
    assert_eq!(props.max_recvs, 8);

    let ctx = net.open_context(1, CommConfig::default()).unwrap();
    let mut handle = NetHandle::zeroed();
    let mut listen = net.listen(&ctx, dev, &mut handle).unwrap();
    let mut shipped = *handle.as_bytes();
    let peer = NetHandle::from_bytes_mut(&mut shipped);
    let (mut send, mut recv) = (None, None);
    let start = Instant::now();
    while send.is_none() || recv.is_none() {
        assert!(start.elapsed() < DEADLINE, "connection setup stuck");
        if send.is_none() {
            send = net.connect(&ctx, dev, peer).unwrap();
        }
        if recv.is_none() {
            recv = net.accept(&mut listen).unwrap();
        }
    }
    net.close_listen(listen).unwrap();
    let (mut send, mut recv) = (send.unwrap(), recv.unwrap());

    const CHUNK: usize = 1 << 20;
    let mut src: Vec<u8> = (0..8 * CHUNK).map(|i| (i * 131 + 7) as u8).collect();
    let mut dst = vec![0u8; 8 * CHUNK];
    let region = |v: &[u8]| MemRegion {
        addr: v.as_ptr() as usize,
        len: v.len(),
        kind: ptr::HOST,
    };
    let ms = net.reg_mr(CommRef::Send(&send), region(&src)).unwrap();
    let mr = net.reg_mr(CommRef::Recv(&recv), region(&dst)).unwrap();

    for round in 0..200usize {
        let n = 1 + round % 8;
        let lens: Vec<usize> = (0..n)
            .map(|i| (round * 7919 + i * 104_729) % CHUNK)
            .collect();
        dst.fill(0);
        let bufs: Vec<RecvBuf<'_, _>> = (0..n)
            .map(|i| RecvBuf {
                // SAFETY: `dst` outlives the request and is not touched until it completes.
                buf: unsafe { Buf::new(dst.as_mut_ptr().add(i * CHUNK), CHUNK) },
                tag: i as i32,
                mr: Some(&mr),
            })
            .collect();
        let mut r = net
            .irecv(&mut recv, &bufs, false)
            .unwrap()
            .expect("a free receive slot");
        let mut sends = Vec::new();
        for i in (0..n).rev() {
            // SAFETY: `src` outlives the request.
            let b = unsafe { Buf::new(src.as_mut_ptr().add(i * CHUNK), lens[i]) };
            let start = Instant::now();
            let s = loop {
                if let Some(s) = net.isend(&mut send, b, i as i32, Some(&ms)).unwrap() {
                    break s;
                }
                assert!(start.elapsed() < DEADLINE, "no CTS from the receiver");
            };
            sends.push((s, lens[i]));
        }
        for (mut s, len) in sends {
            assert_eq!(wait(&mut s, 1), vec![len as c_int]);
        }
        let got = wait(&mut r, n);
        for i in 0..n {
            assert_eq!(got[i] as usize, lens[i], "round {round} buffer {i}");
            assert_eq!(
                &dst[i * CHUNK..i * CHUNK + lens[i]],
                &src[i * CHUNK..i * CHUNK + lens[i]],
                "round {round} buffer {i}"
            );
        }
    }
    net.dereg_mr(CommRef::Send(&send), ms).unwrap();
    net.dereg_mr(CommRef::Recv(&recv), mr).unwrap();
    net.close_send(send).unwrap();
    net.close_recv(recv).unwrap();
}
