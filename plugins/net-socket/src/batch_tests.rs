//! Small-message batching: queued inline sends leave in one `sendmsg`, the receiver
//! takes several messages per `recv`, and batching never reorders, drops or mixes up
//! bytes, whatever mix of tiny and large messages is in flight in both directions.
//!
//! These tests sit inside the crate to read the control streams' system-call
//! counters, which make the batching claim exact rather than a timing.

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use cclkit_abi::net::{Buf, Net, NetHandle, RecvBuf, Sizes};
use rand::Rng;

use crate::comm::{Comm, Control};
use crate::config::Config;
use crate::send::FLUSH_AT;
use crate::slots::Request;
use crate::{Nic, SocketNet, iface, streams_for};

const LONG: Duration = Duration::from_secs(60);
/// Bytes after each receive buffer that the plugin must leave alone.
const SLACK: usize = 11;
const CANARY: u8 = 0xA5;

/// The plugin on loopback with `threads` helper threads × `socks` streams per comm.
fn net(threads: usize, socks: usize) -> SocketNet {
    let cfg = Config {
        ifname: Some("lo".to_owned()),
        nthreads: Some(threads),
        socks_per_thread: Some(socks),
        ..Config::default()
    };
    let nics = iface::discover(cfg.ifname.as_deref(), cfg.family)
        .expect("interfaces")
        .into_iter()
        .map(|dev| {
            let (threads, streams) = streams_for(&cfg, &dev);
            Nic {
                dev,
                threads,
                streams,
            }
        })
        .collect::<Vec<_>>();
    assert!(!nics.is_empty(), "no loopback interface");
    SocketNet { cfg, nics }
}

/// A connected (send, receive) pair.
fn pair(net: &SocketNet) -> (Comm, Comm) {
    let mut handle = NetHandle::zeroed();
    let mut listen = net.listen(&(), 0, &mut handle).expect("listen");
    let deadline = Instant::now() + LONG;
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "connection setup timed out");
        if send.is_none() {
            send = net.connect(&(), 0, &mut handle).expect("connect");
        }
        if recv.is_none() {
            recv = net.accept(&mut listen).expect("accept");
        }
    }
    (send.unwrap(), recv.unwrap())
}

/// One `test` call: `Some(size)` once done.
fn poll(req: &mut Request) -> Option<usize> {
    let mut size: c_int = -1;
    // SAFETY: one int, enough for the single-buffer requests used here.
    let mut sizes = unsafe { Sizes::from_raw(&mut size) };
    match SocketNet::test(req, &mut sizes) {
        Ok(true) => Some(size as usize),
        Ok(false) => None,
        Err(e) => panic!("request failed: {e}"),
    }
}

fn writes(comm: &Comm) -> (u64, usize) {
    match &*comm.core().control() {
        Control::Send(c) => (c.writes(), c.queued()),
        Control::Recv(_) => panic!("not a send comm"),
    }
}

fn reads(comm: &Comm) -> u64 {
    match &*comm.core().control() {
        Control::Recv(c) => c.reads(),
        Control::Send(_) => panic!("not a receive comm"),
    }
}

fn staged(comm: &Comm) -> u64 {
    match &*comm.core().control() {
        Control::Recv(c) => c.staged(),
        Control::Send(_) => panic!("not a receive comm"),
    }
}

/// The receive comm's control socket.
fn control_fd(comm: &Comm) -> std::os::fd::RawFd {
    match &*comm.core().control() {
        Control::Recv(c) => c.socket().as_raw_fd(),
        Control::Send(_) => panic!("not a receive comm"),
    }
}

/// Waits until the receive comm's control socket holds `bytes` unread bytes.
fn wait_arrived(comm: &Comm, bytes: usize) {
    let fd = control_fd(comm);
    let deadline = Instant::now() + LONG;
    loop {
        let mut n: c_int = 0;
        // SAFETY: FIONREAD writes one int.
        let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
        assert_eq!(rc, 0, "ioctl(FIONREAD)");
        if n as usize == bytes {
            return;
        }
        assert!((n as usize) < bytes, "{n} bytes arrived, expected {bytes}");
        assert!(
            Instant::now() < deadline,
            "only {n} of {bytes} bytes arrived"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn random_bytes(rng: &mut impl Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

fn post_recv(net: &SocketNet, comm: &mut Comm, buf: &mut [u8]) -> Request {
    let bufs = [RecvBuf::<()> {
        // SAFETY: every caller keeps the buffer alive until the request completes.
        buf: unsafe { Buf::new(buf.as_mut_ptr(), buf.len()) },
        tag: 0,
        mr: None,
    }];
    net.irecv(comm, &bufs, false)
        .expect("irecv")
        .expect("posted")
}

fn post_send(net: &SocketNet, comm: &mut Comm, buf: &mut [u8]) -> Request {
    // SAFETY: every caller keeps the buffer alive until the request completes.
    let b = unsafe { Buf::new(buf.as_mut_ptr(), buf.len()) };
    net.isend(comm, b, 0, None).expect("isend").expect("posted")
}

#[test]
fn queued_small_sends_share_one_sendmsg_and_one_recv() {
    let net = net(0, 1);
    let (mut send, mut recv) = pair(&net);
    let mut rng = rand::rng();
    let n = rng.random_range(2..FLUSH_AT);
    let mut srcs: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let len = rng.random_range(0..=200);
            random_bytes(&mut rng, len)
        })
        .collect();
    let mut dsts: Vec<Vec<u8>> = srcs
        .iter()
        .map(|s| vec![CANARY; s.len() + rng.random_range(1..=SLACK)])
        .collect();
    let mut rreqs: Vec<Request> = dsts
        .iter_mut()
        .map(|d| post_recv(&net, &mut recv, d))
        .collect();
    let mut sreqs: Vec<Request> = srcs
        .iter_mut()
        .map(|s| post_send(&net, &mut send, s))
        .collect();
    // Posting does no I/O; the first test writes every queued message at once.
    assert_eq!(writes(&send), (0, n));
    assert_eq!(poll(&mut sreqs[0]), Some(srcs[0].len()));
    assert_eq!(writes(&send), (1, 0), "{n} messages, one sendmsg");
    for (r, s) in sreqs.iter_mut().zip(&srcs) {
        assert_eq!(poll(r), Some(s.len()), "already written");
    }
    assert_eq!(writes(&send).0, 1, "testing finished sends does no I/O");
    let wire: usize = srcs
        .iter()
        .map(|s| crate::wire::Header::LEN + s.len())
        .sum();
    wait_arrived(&recv, wire);
    assert_eq!(reads(&recv), 0, "posting receives does no I/O");
    assert_eq!(poll(&mut rreqs[0]), Some(srcs[0].len()));
    assert_eq!(reads(&recv), 1, "{n} messages, one recv");
    for (i, r) in rreqs.iter_mut().enumerate() {
        assert_eq!(poll(r), Some(srcs[i].len()));
        assert_eq!(dsts[i][..srcs[i].len()], srcs[i][..], "message {i}");
        assert!(dsts[i][srcs[i].len()..].iter().all(|&b| b == CANARY));
    }
    assert_eq!(reads(&recv), 1, "every message came with the first read");
    drop((sreqs, rreqs));
    net.close_send(send).expect("close");
    net.close_recv(recv).expect("close");
}

#[test]
fn a_full_batch_is_written_without_waiting_for_test() {
    let net = net(0, 1);
    let (mut send, mut recv) = pair(&net);
    let mut rng = rand::rng();
    let mut srcs: Vec<Vec<u8>> = (0..FLUSH_AT + 3)
        .map(|_| {
            let len = rng.random_range(1..=8);
            random_bytes(&mut rng, len)
        })
        .collect();
    let mut dsts: Vec<Vec<u8>> = srcs.iter().map(|s| vec![0u8; s.len()]).collect();
    let mut sreqs = Vec::new();
    for (i, s) in srcs.iter_mut().enumerate() {
        sreqs.push(post_send(&net, &mut send, s));
        let want = if i + 1 < FLUSH_AT {
            (0, i + 1)
        } else {
            (1, i + 1 - FLUSH_AT)
        };
        assert_eq!(writes(&send), want, "after isend {i}");
    }
    let mut rreqs: Vec<Request> = dsts
        .iter_mut()
        .map(|d| post_recv(&net, &mut recv, d))
        .collect();
    finish_all(&mut sreqs, &mut rreqs);
    assert_eq!(
        writes(&send),
        (2, 0),
        "the 3 left over went in one more write"
    );
    for (d, s) in dsts.iter().zip(&srcs) {
        assert_eq!(d, s);
    }
    drop((sreqs, rreqs));
    net.close_send(send).expect("close");
    net.close_recv(recv).expect("close");
}

/// Tests every request round-robin until all are done.
fn finish_all(sends: &mut [Request], recvs: &mut [Request]) {
    let deadline = Instant::now() + LONG;
    let mut done = vec![false; sends.len() + recvs.len()];
    while done.iter().any(|d| !d) {
        assert!(Instant::now() < deadline, "requests never finished");
        for (i, r) in sends.iter_mut().chain(recvs.iter_mut()).enumerate() {
            if !done[i] {
                done[i] = poll(r).is_some();
            }
        }
    }
}

#[test]
fn small_messages_queued_behind_a_large_one_in_flight() {
    let net = net(0, 1);
    let (mut send, mut recv) = pair(&net);
    let mut rng = rand::rng();
    // Larger than any loopback socket buffer: the first write is partial.
    let big_len = (24 << 20) + rng.random_range(1..4096);
    let mut msgs = vec![random_bytes(&mut rng, big_len)];
    // At most 32 sends in flight per comm (NCCL_NET_MAX_REQUESTS).
    for _ in 0..30 {
        let len = rng.random_range(0..=100);
        msgs.push(random_bytes(&mut rng, len));
    }
    let mut dsts: Vec<Vec<u8>> = msgs
        .iter()
        .map(|m| vec![CANARY; m.len() + rng.random_range(0..=SLACK)])
        .collect();
    let mut sreqs = vec![post_send(&net, &mut send, &mut msgs[0])];
    assert_eq!(
        poll(&mut sreqs[0]),
        None,
        "{big_len} bytes cannot go at once"
    );
    let (w, queued) = writes(&send);
    assert!(
        w >= 1 && queued == 1,
        "mid-transfer: {w} writes, {queued} queued"
    );
    for m in msgs.iter_mut().skip(1) {
        sreqs.push(post_send(&net, &mut send, m));
    }
    assert_eq!(
        writes(&send).1,
        msgs.len(),
        "all queued behind the large one"
    );
    let mut rreqs: Vec<Request> = dsts
        .iter_mut()
        .map(|d| post_recv(&net, &mut recv, d))
        .collect();
    finish_all(&mut sreqs, &mut rreqs);
    for (i, (d, m)) in dsts.iter().zip(&msgs).enumerate() {
        assert!(d[..m.len()] == m[..], "message {i} ({} bytes)", m.len());
        assert!(
            d[m.len()..].iter().all(|&b| b == CANARY),
            "message {i} overrun"
        );
    }
    drop((sreqs, rreqs));
    net.close_send(send).expect("close");
    net.close_recv(recv).expect("close");
}

/// One direction of [`mixed_tiny_and_large_both_ways`]: messages still to post and
/// the requests in flight with their buffers.
struct Flow {
    send: Comm,
    recv: Comm,
    msgs: Vec<Vec<u8>>,
    next_send: usize,
    next_recv: usize,
    sends: Vec<(Request, usize)>,
    recvs: Vec<(Request, usize, Vec<u8>)>,
    checked: usize,
}

impl Flow {
    fn step(&mut self, net: &SocketNet, window: usize, rng: &mut impl Rng) {
        while self.next_recv < self.msgs.len() && self.recvs.len() < window {
            let i = self.next_recv;
            let mut buf = vec![CANARY; self.msgs[i].len() + rng.random_range(0..=SLACK)];
            let r = post_recv(net, &mut self.recv, &mut buf);
            self.recvs.push((r, i, buf));
            self.next_recv += 1;
        }
        while self.next_send < self.msgs.len() && self.sends.len() < window {
            let i = self.next_send;
            let r = post_send(net, &mut self.send, &mut self.msgs[i]);
            self.sends.push((r, i));
            self.next_send += 1;
        }
        let msgs = &self.msgs;
        self.sends.retain_mut(|(r, i)| match poll(r) {
            None => true,
            Some(n) => {
                assert_eq!(n, msgs[*i].len(), "send size of message {i}");
                false
            }
        });
        let mut checked = 0;
        self.recvs.retain_mut(|(r, i, buf)| {
            let Some(n) = poll(r) else {
                return true;
            };
            let m = &msgs[*i];
            assert_eq!(n, m.len(), "size of message {i}");
            assert!(buf[..n] == m[..], "data of message {i} ({n} bytes) differs");
            assert!(buf[n..].iter().all(|&b| b == CANARY), "message {i} overrun");
            checked += 1;
            false
        });
        self.checked += checked;
    }
}

#[test]
fn mixed_tiny_and_large_both_ways() {
    let mut rng = rand::rng();
    // Without data streams (all inline, as on loopback by default) and with two.
    for (threads, socks) in [(0, 1), (1, 2)] {
        let net = net(threads, socks);
        let mut flows: Vec<Flow> = (0..2)
            .map(|_| {
                let (send, recv) = pair(&net);
                let msgs = (0..300)
                    .map(|_| {
                        let len = match rng.random_range(0..25) {
                            0 => rng.random_range(64 << 10..3 << 19),
                            1 => rng.random_range(1000..20_000),
                            _ => rng.random_range(0..=64),
                        };
                        random_bytes(&mut rng, len)
                    })
                    .collect();
                Flow {
                    send,
                    recv,
                    msgs,
                    next_send: 0,
                    next_recv: 0,
                    sends: Vec::new(),
                    recvs: Vec::new(),
                    checked: 0,
                }
            })
            .collect();
        let deadline = Instant::now() + LONG;
        while flows
            .iter()
            .any(|f| f.checked < f.msgs.len() || !f.sends.is_empty())
        {
            assert!(Instant::now() < deadline, "exchange stuck");
            for f in &mut flows {
                let window = rng.random_range(1..=32);
                f.step(&net, window, &mut rng);
            }
        }
        for f in flows {
            net.close_send(f.send).expect("close");
            net.close_recv(f.recv).expect("close");
        }
    }
}

#[test]
fn large_inline_payloads_bypass_the_staging_buffer() {
    let net = net(0, 1);
    let (mut send, mut recv) = pair(&net);
    let mut rng = rand::rng();
    let mut msgs: Vec<Vec<u8>> = (0..6)
        .map(|_| {
            let len = rng.random_range(100_000..1_500_000);
            random_bytes(&mut rng, len)
        })
        .collect();
    let mut dsts: Vec<Vec<u8>> = msgs
        .iter()
        .map(|m| vec![CANARY; m.len() + rng.random_range(0..=SLACK)])
        .collect();
    let mut sreqs: Vec<Request> = msgs
        .iter_mut()
        .map(|m| post_send(&net, &mut send, m))
        .collect();
    let mut rreqs: Vec<Request> = dsts
        .iter_mut()
        .map(|d| post_recv(&net, &mut recv, d))
        .collect();
    finish_all(&mut sreqs, &mut rreqs);
    for (i, (d, m)) in dsts.iter().zip(&msgs).enumerate() {
        assert!(d[..m.len()] == m[..], "message {i}");
        assert!(
            d[m.len()..].iter().all(|&b| b == CANARY),
            "message {i} overrun"
        );
    }
    // Only the first header's read ahead (at most one staging buffer) was copied;
    // every later header was read alone and every payload went straight to NCCL.
    let copied = staged(&recv);
    assert!(
        copied < 64 * 1024,
        "{copied} payload bytes went through the stage"
    );
    drop((sreqs, rreqs));
    net.close_send(send).expect("close");
    net.close_recv(recv).expect("close");
}

/// The receive control socket's `TCP_QUICKACK` as the kernel reports it: 0 while
/// ACKs are delayed.
fn quick_acks_on(comm: &Comm) -> c_int {
    let fd = control_fd(comm);
    let mut v: c_int = -1;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: reads one int into `v`, with its size in `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&raw mut v).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "getsockopt(TCP_QUICKACK)");
    v
}

/// Sends one message of `len` random bytes and checks it arrives whole.
fn round(net: &SocketNet, send: &mut Comm, recv: &mut Comm, len: usize, rng: &mut impl Rng) {
    let mut msg = random_bytes(rng, len);
    let mut dst = vec![CANARY; len + SLACK];
    let mut s = [post_send(net, send, &mut msg)];
    let mut r = [post_recv(net, recv, &mut dst)];
    finish_all(&mut s, &mut r);
    assert!(dst[..len] == msg[..], "{len}-byte message corrupted");
    assert!(
        dst[len..].iter().all(|&b| b == CANARY),
        "{len}-byte message overran"
    );
}

#[test]
fn small_messages_delay_acks_and_large_ones_restore_quick_acks() {
    let net = net(0, 1);
    let (mut send, mut recv) = pair(&net);
    let mut rng = rand::rng();
    let mut kernel_delayed = 0;
    for phase in 0..4 {
        for _ in 0..rng.random_range(3..9) {
            let len = rng.random_range(1..4000);
            round(&net, &mut send, &mut recv, len, &mut rng);
        }
        assert!(acks_delayed(&recv), "phase {phase}: small messages");
        // The kernel drops delayed ACKs by itself when its delayed-ACK timer
        // (≥ 40 ms) fires, which a stalled test machine can let happen: one phase
        // that shows them is the proof, none would be the bug.
        kernel_delayed += usize::from(quick_acks_on(&recv) == 0);
        let len = rng.random_range(100_000..700_000);
        round(&net, &mut send, &mut recv, len, &mut rng);
        assert!(!acks_delayed(&recv), "phase {phase}: a {len}-byte message");
        // Quick ACKs, once asked for, stay on: this one is exact.
        assert_eq!(
            quick_acks_on(&recv),
            1,
            "phase {phase}: a {len}-byte message"
        );
    }
    assert!(kernel_delayed > 0, "the kernel never showed delayed ACKs");
    net.close_send(send).expect("close");
    net.close_recv(recv).expect("close");
}

fn acks_delayed(comm: &Comm) -> bool {
    match &*comm.core().control() {
        Control::Recv(c) => c.acks_delayed(),
        Control::Send(_) => panic!("not a receive comm"),
    }
}
