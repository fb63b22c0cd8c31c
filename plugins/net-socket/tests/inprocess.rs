//! In-process transfers through the exported v8, v11 and v12 tables: a send comm
//! connected to a receive comm of the same process, driven as NCCL drives them.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use cclkit_abi::net::NetHandle;
use cclkit_abi::raw::common::NcclResult;
use cclkit_net_socket::wire::HandleInfo;
use common::script::{exchange, singles};
use common::{
    PTR_CUDA, PTR_HOST, Plugin, Ptr, SIZES, Ver, pattern, seed, send_now, truncate, wait_one,
};

const LONG: Duration = Duration::from_secs(60);

#[test]
fn name_devices_and_properties() {
    for ver in Ver::ALL {
        let p = Plugin::open(ver);
        assert_eq!(p.name(), "cclkit-socket");
        let n = p.devices();
        assert!(n >= 1, "no devices");
        for dev in 0..n {
            let props = p.properties(dev).expect("properties");
            assert!(!props.name.is_empty());
            assert_eq!(props.ptr_support, PTR_HOST);
            assert!(props.speed > 0);
            assert_eq!(props.max_recvs, 1, "grouped receives are opt-in");
            let sys = format!("/sys/class/net/{}/device", props.name);
            assert_eq!(
                props.pci_path.is_some(),
                std::path::Path::new(&sys).exists()
            );
            if ver != Ver::V8 {
                assert_eq!(props.max_p2p_bytes, Some(1 << 30));
                assert_eq!(props.max_coll_bytes, Some(512 << 20));
            }
        }
        assert_eq!(p.properties(n).unwrap_err(), NcclResult::INVALID_ARGUMENT);
    }
}

#[test]
fn every_size_through_every_version() {
    let s = seed();
    for ver in Ver::ALL {
        let p = Plugin::open(ver);
        let (send, recv) = p.pair(0);
        exchange(&p, send, recv, &singles(&SIZES), s, 0, 0, 32, LONG);
        p.close_send(send);
        p.close_recv(recv);
    }
}

#[test]
fn thirty_two_outstanding_random_sizes() {
    let s = seed();
    let sizes: Vec<usize> = (0..96)
        .map(|i| match pattern(s, i, 4) {
            b if b[0] % 8 == 0 => 4 << 20,
            b => usize::from(u16::from_le_bytes([b[1], b[2]])) * (1 + usize::from(b[3] % 16)),
        })
        .collect();
    let p = Plugin::open(Ver::V12);
    let (send, recv) = p.pair(0);
    exchange(&p, send, recv, &singles(&sizes), s, 0, 0, 32, LONG);
    p.close_send(send);
    p.close_recv(recv);
}

#[test]
fn truncation_is_an_error_and_the_stream_stays_in_sync() {
    let s = seed();
    for ver in Ver::ALL {
        let p = Plugin::open(ver);
        let (send, recv) = p.pair(0);
        for (cap, len) in [(10, 100), (64 << 10, 3 << 20), (0, 1)] {
            let (r, snd) = truncate(&p, send, recv, cap, len);
            assert_eq!(
                r,
                NcclResult::INVALID_USAGE,
                "{len} bytes into {cap}: receive"
            );
            // Without clear-to-send records the sender cannot know the receive size.
            assert_eq!(snd, NcclResult::SUCCESS, "{len} bytes into {cap}: send");
            // The next messages arrive intact: no byte of the truncated one was left behind.
            exchange(&p, send, recv, &singles(&[7, 1 << 20]), s, 0, 0, 4, LONG);
        }
        p.close_send(send);
        p.close_recv(recv);
    }
}

#[test]
fn grouped_receive_needs_max_recvs() {
    let p = Plugin::open(Ver::V12);
    let (send, recv) = p.pair(0);
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    let bufs = [(a.as_mut_ptr(), 8), (b.as_mut_ptr(), 8)];
    let none = [std::ptr::null_mut(); 2];
    // SAFETY: the call fails before anything is posted.
    let r = unsafe { p.irecv(recv, &bufs, &[0, 1], &none) };
    assert_eq!(r.unwrap_err(), NcclResult::INVALID_ARGUMENT);
    p.close_send(send);
    p.close_recv(recv);
}

#[test]
fn cuda_memory_is_refused() {
    let p = Plugin::open(Ver::V12);
    let (send, recv) = p.pair(0);
    let mut buf = vec![0u8; 64];
    for comm in [send, recv] {
        assert_eq!(
            p.reg_mr(comm, buf.as_mut_ptr(), buf.len(), PTR_CUDA)
                .unwrap_err(),
            NcclResult::INTERNAL_ERROR
        );
        let mh = p
            .reg_mr(comm, buf.as_mut_ptr(), buf.len(), PTR_HOST)
            .unwrap();
        p.dereg_mr(comm, mh);
    }
    p.close_send(send);
    p.close_recv(recv);
}

#[test]
fn stray_and_wrong_magic_connections_are_dropped() {
    let p = Plugin::open(Ver::V12);
    let (mut handle, lc) = p.listen(0).unwrap();
    let info = HandleInfo::read(NetHandle::from_bytes_mut(&mut handle)).unwrap();
    // A connection with the wrong magic, and one that sends nothing at all.
    let mut wrong = TcpStream::connect(info.addr).unwrap();
    let mut hello = [0u8; 24];
    hello[..8].copy_from_slice(&(info.magic ^ 1).to_le_bytes());
    hello[18] = 1 + info.nstreams as u8;
    hello[20] = 1;
    wrong.write_all(&hello).unwrap();
    let silent = TcpStream::connect(info.addr).unwrap();
    wrong.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + LONG;
    // Each accept call reads hellos; the wrong-magic connection must get closed.
    loop {
        assert!(Instant::now() < deadline, "stray connection not closed");
        assert!(
            p.accept(lc).unwrap().is_null(),
            "accepted a stray connection"
        );
        let mut byte = [0u8; 1];
        match wrong.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => panic!("the listener wrote to a stray connection"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break, // reset: closed too
        }
    }
    let (mut s, mut r): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
    while s.is_null() || r.is_null() {
        assert!(Instant::now() < deadline);
        if s.is_null() {
            s = p.connect(0, &mut handle).unwrap();
        }
        if r.is_null() {
            r = p.accept(lc).unwrap();
        }
    }
    p.close_listen(lc);
    exchange(&p, s, r, &singles(&[5, 300_000]), seed(), 0, 0, 4, LONG);
    drop(silent);
    p.close_send(s);
    p.close_recv(r);
}

#[test]
fn peer_close_fails_a_pending_receive() {
    let p = Plugin::open(Ver::V12);
    let (send, recv) = p.pair(0);
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: buf outlives the request.
    let req = unsafe {
        p.irecv(
            recv,
            &[(buf.as_mut_ptr(), buf.len())],
            &[0],
            &[std::ptr::null_mut()],
        )
    }
    .unwrap();
    p.close_send(send);
    // The plugin has no data-path timeout: a failure at all can only come from the
    // closed peer, and LONG merely bounds a hang (a loaded machine is slow, not wrong).
    assert_eq!(
        wait_one(&p, req, LONG).unwrap_err(),
        NcclResult::REMOTE_ERROR
    );
    // Later operations fail at once, naming the failure instead of hanging.
    // SAFETY: as above.
    let again = unsafe {
        p.irecv(
            recv,
            &[(buf.as_mut_ptr(), 8)],
            &[0],
            &[std::ptr::null_mut()],
        )
    };
    assert_eq!(again.unwrap_err(), NcclResult::REMOTE_ERROR);
    p.close_recv(recv);
}

#[test]
fn peer_close_mid_transfer_fails_the_sender() {
    let p = Plugin::open(Ver::V12);
    let (send, recv) = p.pair(0);
    let mut big = vec![7u8; 64 << 20];
    let mut small = vec![0u8; 64 << 20];
    // The receive takes only part of the first message before its comm is closed.
    // SAFETY: buffers outlive the requests.
    let rreq = unsafe {
        p.irecv(
            recv,
            &[(small.as_mut_ptr(), small.len())],
            &[0],
            &[std::ptr::null_mut()],
        )
    }
    .unwrap();
    // SAFETY: as above.
    let sreq = unsafe { send_now(&p, send, big.as_mut_ptr(), big.len(), 0) }.unwrap();
    let mut sizes = [0; 64];
    let _ = p.test(rreq, &mut sizes);
    p.close_recv(recv);
    // As above, only the closed peer can fail a send; LONG bounds a hang.
    let deadline = Instant::now() + LONG;
    let mut failed = wait_one(&p, sreq, LONG).err();
    // A send the kernel already buffered may still succeed; a later one cannot.
    while failed.is_none() {
        assert!(
            Instant::now() < deadline,
            "sender never noticed the closed peer within {LONG:?}"
        );
        // SAFETY: as above.
        match unsafe { p.isend(send, big.as_mut_ptr(), big.len(), 0, std::ptr::null_mut()) } {
            Ok(r) if r.is_null() => {}
            Ok(r) => failed = wait_one(&p, r, LONG).err(),
            Err(e) => failed = Some(e),
        }
    }
    assert_eq!(failed, Some(NcclResult::REMOTE_ERROR));
    p.close_send(send);
}
