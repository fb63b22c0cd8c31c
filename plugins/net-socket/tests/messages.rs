//! Error messages, through the Rust API (the C tables only carry the code; the
//! message goes to NCCL's log): they must name the peer and the sizes involved.

use std::time::{Duration, Instant};

use cclkit_abi::net::{Buf, InitArgs, Net, NetHandle, RecvBuf, Sizes};
use cclkit_abi::raw::common::NcclResult;
use cclkit_net_socket::SocketNet;

type Req = <SocketNet as Net>::Request;

/// Tests `req` until it finishes; the error if it failed.
fn finish(req: &mut Req) -> Option<cclkit_abi::Error> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut size = 0;
    loop {
        // SAFETY: one int, enough for a single-buffer request.
        let mut sizes = unsafe { Sizes::from_raw(&mut size) };
        match SocketNet::test(req, &mut sizes) {
            Ok(true) => return None,
            Ok(false) => assert!(Instant::now() < deadline, "request never finished"),
            Err(e) => return Some(e),
        }
    }
}

#[test]
fn errors_name_the_peer_and_the_sizes() {
    let net = SocketNet::init(&InitArgs {
        host_abi: 12,
        profiler: cclkit_abi::profiler::net::NetProfiler::disabled(),
    })
    .expect("init");
    let mut handle = NetHandle::zeroed();
    let mut listen = net.listen(&(), 0, &mut handle).expect("listen");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline);
        if send.is_none() {
            send = net.connect(&(), 0, &mut handle).expect("connect");
        }
        if recv.is_none() {
            recv = net.accept(&mut listen).expect("accept");
        }
    }
    let (mut send, mut recv) = (send.unwrap(), recv.unwrap());
    let ip = net.properties(0).expect("props").name;
    let mut small = vec![0u8; 10];
    let mut big = vec![1u8; 100];
    let bufs = [RecvBuf::<()> {
        // SAFETY: the buffers outlive the requests (finished below).
        buf: unsafe { Buf::new(small.as_mut_ptr(), small.len()) },
        tag: 0,
        mr: None,
    }];
    let mut r = net
        .irecv(&mut recv, &bufs, false)
        .expect("irecv")
        .expect("posted");
    // SAFETY: as above.
    let mut s = net
        .isend(
            &mut send,
            unsafe { Buf::new(big.as_mut_ptr(), big.len()) },
            0,
            None,
        )
        .expect("isend")
        .expect("posted");
    assert!(finish(&mut s).is_none());
    let e = finish(&mut r).expect("truncation must fail the receive");
    assert_eq!(e.code(), NcclResult::INVALID_USAGE);
    for part in ["truncated", "100 bytes", "10 bytes"] {
        assert!(e.message().contains(part), "{e} lacks {part:?}");
    }
    drop((r, s));

    // The peer goes away: the pending receive fails naming the peer's address.
    net.close_send(send).expect("close");
    let r2 = net
        .irecv(&mut recv, &bufs, false)
        .expect("irecv")
        .expect("posted");
    let mut r2 = r2;
    let e = finish(&mut r2).expect("peer loss must fail the receive");
    assert_eq!(e.code(), NcclResult::REMOTE_ERROR);
    assert!(
        e.message().contains("peer") && e.message().contains("closed"),
        "{e}"
    );
    let listen_ip = cclkit_net_socket::wire::HandleInfo::read(&handle)
        .expect("handle")
        .addr
        .ip();
    assert!(
        e.message().contains(&listen_ip.to_string()),
        "{e} does not name {listen_ip} ({ip})"
    );
    drop(r2);
    net.close_recv(recv).expect("close");
}
