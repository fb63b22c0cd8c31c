//! The receiver-driven protocol end to end, on the in-memory fake NIC.
#![allow(clippy::needless_range_loop)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, RngCore};

use super::endpoint::{AcceptOpts, ConnectOpts, SenderHalf, accept};
use super::plan::SendOpts;
use super::recv::{Receiver, RecvTarget};
use super::request::{ReqCell, State};
use super::send::{SendBuf, Sender};
use super::split::chunk;
use super::{MAX_RECVS, MAX_REQUESTS};
use crate::fake::{self, FakeFabric, FakeMr, FakeNic};
use crate::nic::{Link, Nic, Op, WriteOrder};
use cclkit_abi::raw::common::NcclResult;

pub(super) const SENDER: u32 = 1;
pub(super) const RECEIVER: u32 = 2;

pub(super) struct Pair {
    pub fabric: Arc<FakeFabric>,
    pub a: Arc<FakeNic>,
    pub b: Arc<FakeNic>,
    pub snd: Sender<FakeNic>,
    pub rcv: Receiver<FakeNic>,
}

fn pair(nqps: usize, flush: bool) -> Pair {
    pair_with(FakeFabric::new(), nqps, flush, SendOpts::default())
}

/// A connected pair on `fabric` (configure its nodes first).
pub(super) fn pair_with(fabric: Arc<FakeFabric>, nqps: usize, flush: bool, send: SendOpts) -> Pair {
    let (a, b) = (fabric.nic(SENDER), fabric.nic(RECEIVER));
    let opts = ConnectOpts {
        nqps,
        link: Link::default(),
        ece: true,
        ooo_rq: false,
        send,
    };
    let sh = SenderHalf::new(vec![Arc::clone(&a)], 1, opts).unwrap();
    let accept_opts = AcceptOpts {
        flush,
        ..AcceptOpts::default()
    };
    let (rcv, meta) = accept(vec![Arc::clone(&b)], &sh.meta(), accept_opts).unwrap();
    let snd = sh.connect(&meta).unwrap();
    Pair {
        fabric,
        a,
        b,
        snd,
        rcv,
    }
}

/// The keys of a registration on a plain (one-port) device.
pub(super) fn one_key(k: u32) -> super::Keys {
    let mut keys = [0; super::MAX_DEVS];
    keys[0] = k;
    keys
}

/// A registered test buffer.
pub(super) struct Buf {
    pub data: Vec<u8>,
    mr: FakeMr,
}

impl Buf {
    pub fn new(nic: &FakeNic, data: Vec<u8>) -> Self {
        // SAFETY: `data` lives in the returned value next to its registration, and is
        // never reallocated.
        let mr = unsafe {
            nic.reg_mr(
                data.as_ptr() as usize,
                data.len().max(1),
                WriteOrder::Relaxed,
            )
        }
        .unwrap();
        Self { data, mr }
    }
    pub fn random(nic: &FakeNic, len: usize) -> Self {
        let mut v = vec![0u8; len];
        rand::rng().fill_bytes(&mut v);
        Self::new(nic, v)
    }
    pub fn send(&self, len: usize) -> SendBuf {
        SendBuf {
            addr: self.data.as_ptr() as u64,
            len,
            lkeys: one_key(FakeNic::keys(&self.mr).0),
        }
    }
    pub fn target(&self, tag: i32) -> RecvTarget {
        RecvTarget {
            addr: self.data.as_ptr() as u64,
            len: self.data.len(),
            rkeys: one_key(FakeNic::keys(&self.mr).1),
            tag,
        }
    }
}

const DEADLINE: Duration = Duration::from_secs(20);

impl Pair {
    pub fn drive(&mut self) {
        let _ = self.snd.progress();
        let _ = self.rcv.progress();
    }

    /// Polls both sides until every cell left `Pending`.
    pub fn wait(&mut self, cells: &[&Arc<ReqCell>]) {
        let start = Instant::now();
        while cells.iter().any(|c| c.state() == State::Pending) {
            assert!(start.elapsed() < DEADLINE, "requests did not complete");
            self.drive();
        }
    }

    /// Retries `isend` (driving the receiver) until it yields a request.
    pub fn isend(&mut self, b: SendBuf, tag: i32) -> Arc<ReqCell> {
        let start = Instant::now();
        loop {
            if let Some(c) = self.snd.isend(b, tag).unwrap() {
                return c;
            }
            assert!(start.elapsed() < DEADLINE, "CTS never arrived");
            let _ = self.rcv.progress();
        }
    }
}

fn bytes(b: &Buf) -> &[u8] {
    &b.data
}

#[test]
fn single_messages_of_random_sizes_arrive_intact_over_1_to_4_qps() {
    let mut rng = rand::rng();
    for nqps in 1..=4 {
        let mut p = pair(nqps, false);
        let mut sizes = vec![0usize, 1, 127, 128, 129, 4099, 100_003];
        sizes.extend((0..20).map(|_| rng.random_range(0..70_000)));
        for size in sizes {
            let src = Buf::random(&p.a, size);
            let dst = Buf::new(&p.b, vec![0xAB; size + rng.random_range(0..300)]);
            let r = p.rcv.irecv(&[dst.target(7)]).unwrap().unwrap();
            let s = p.isend(src.send(size), 7);
            p.wait(&[&r, &s]);
            assert_eq!((r.state(), s.state()), (State::Done, State::Done));
            assert_eq!(r.size(0) as usize, size, "nqps {nqps}");
            assert_eq!(s.size(0) as usize, size);
            assert_eq!(&bytes(&dst)[..size], bytes(&src), "nqps {nqps} size {size}");
            assert!(
                bytes(&dst)[size..].iter().all(|&x| x == 0xAB),
                "wrote past the size"
            );
        }
    }
}

#[test]
fn fifo_wraps_over_many_messages_with_32_receives_in_flight() {
    let mut p = pair(2, false);
    let mut rng = rand::rng();
    let total = 40 * MAX_REQUESTS + 5;
    let dsts: Vec<Buf> = (0..MAX_REQUESTS)
        .map(|_| Buf::new(&p.b, vec![0; 3000]))
        .collect();
    let srcs: Vec<Buf> = (0..total)
        .map(|_| Buf::random(&p.a, rng.random_range(0..3000)))
        .collect();
    let mut recvs: std::collections::VecDeque<(usize, Arc<ReqCell>)> = Default::default();
    let (mut posted, mut sent) = (0usize, 0usize);
    while sent < total {
        // Keep the receive window full: exactly 32 in flight, the 33rd is refused.
        while posted < total && recvs.len() < MAX_REQUESTS {
            let b = &dsts[posted % MAX_REQUESTS];
            let r = p.rcv.irecv(&[b.target(3)]).unwrap().expect("a free slot");
            recvs.push_back((posted, r));
            posted += 1;
        }
        if posted < total {
            let extra = Buf::new(&p.b, vec![0; 8]);
            assert!(
                p.rcv.irecv(&[extra.target(3)]).unwrap().is_none(),
                "33rd receive"
            );
        }
        // Send a burst, then complete the oldest receive in order.
        for _ in 0..rng.random_range(1..=8) {
            if sent < posted {
                let s = p.isend(srcs[sent].send(srcs[sent].data.len()), 3);
                p.wait(&[&s]);
                sent += 1;
            }
        }
        while let Some((i, r)) = recvs.front().cloned() {
            if i >= sent {
                break;
            }
            p.wait(&[&r]);
            assert_eq!(r.state(), State::Done);
            let len = srcs[i].data.len();
            assert_eq!(r.size(0) as usize, len, "message {i}");
            assert_eq!(
                &dsts[i % MAX_REQUESTS].data[..len],
                &srcs[i].data[..],
                "message {i}"
            );
            recvs.pop_front();
        }
    }
    assert!(recvs.is_empty());
}

#[test]
fn grouped_receive_selects_buffers_by_tag_and_reports_each_size() {
    let mut rng = rand::rng();
    for nqps in [1, 3] {
        let mut p = pair(nqps, false);
        for round in 0..20 {
            let n = rng.random_range(2..=MAX_RECVS);
            let tags: Vec<i32> = (0..n as i32).map(|t| 100 + t * 7).collect();
            let dsts: Vec<Buf> = (0..n)
                .map(|_| Buf::new(&p.b, vec![0; rng.random_range(1..5000)]))
                .collect();
            let targets: Vec<RecvTarget> =
                dsts.iter().zip(&tags).map(|(d, &t)| d.target(t)).collect();
            let r = p.rcv.irecv(&targets).unwrap().unwrap();
            let lens: Vec<usize> = dsts
                .iter()
                .map(|d| rng.random_range(0..=d.data.len()))
                .collect();
            let srcs: Vec<Buf> = lens.iter().map(|&l| Buf::random(&p.a, l)).collect();
            let mut order: Vec<usize> = (0..n).collect();
            order.shuffle(&mut rng);
            let mut sends = Vec::new();
            for (k, &i) in order.iter().enumerate() {
                sends.push(p.isend(srcs[i].send(lens[i]), tags[i]));
                if k + 1 < n {
                    // Nothing moves until every buffer of the receive has its send.
                    for _ in 0..5 {
                        p.drive();
                    }
                    assert!(
                        sends.iter().all(|s| s.state() == State::Pending),
                        "round {round}"
                    );
                    assert_eq!(r.state(), State::Pending);
                }
            }
            let all: Vec<&Arc<ReqCell>> = sends.iter().chain([&r]).collect();
            p.wait(&all);
            assert_eq!(r.len(), n);
            for i in 0..n {
                assert_eq!(r.size(i) as usize, lens[i], "round {round} buffer {i}");
                assert_eq!(
                    &dsts[i].data[..lens[i]],
                    &srcs[i].data[..],
                    "round {round} buffer {i}"
                );
            }
        }
    }
}

#[test]
fn a_send_waits_for_its_tag_and_a_send_larger_than_the_receive_is_an_error() {
    let mut p = pair(1, false);
    let dst = Buf::new(&p.b, vec![0; 100]);
    let r = p.rcv.irecv(&[dst.target(5)]).unwrap().unwrap();
    let src = Buf::random(&p.a, 101);
    for _ in 0..10 {
        p.drive();
    }
    // Wrong tag: no buffer for it, NCCL is told to retry.
    assert!(p.snd.isend(src.send(50), 6).unwrap().is_none());
    // One byte too many: an error, never a silent truncation.
    let err = p.snd.isend(src.send(101), 5).unwrap_err();
    assert_eq!(err.code(), NcclResult::INVALID_USAGE);
    assert!(err.message().contains("101 bytes"), "{}", err.message());
    assert!(err.message().contains("100-byte"), "{}", err.message());
    // The posted receive is still usable with a fitting send.
    let s = p.isend(src.send(100), 5);
    p.wait(&[&r, &s]);
    assert_eq!(r.size(0), 100);
    assert_eq!(&dst.data[..], &src.data[..100]);
}

#[test]
fn data_is_split_over_qps_in_128_byte_aligned_chunks_each_ending_with_an_immediate() {
    let nqps = 4;
    let split = SendOpts {
        split: true,
        ..SendOpts::default()
    };
    let mut p = pair_with(FakeFabric::new(), nqps, false, split);
    let size = 10_000;
    let src = Buf::random(&p.a, size);
    let dst = Buf::new(&p.b, vec![0; size]);
    let r = p.rcv.irecv(&[dst.target(1)]).unwrap().unwrap();
    let s = p.isend(src.send(size), 1);
    p.wait(&[&r, &s]);
    assert_eq!(&dst.data[..], &src.data[..]);
    let qpns = p.fabric.qps_of(SENDER);
    assert_eq!(qpns.len(), nqps);
    let log = p.fabric.log();
    let base = dst.data.as_ptr() as u64;
    for (q, qpn) in qpns.iter().enumerate() {
        let ops: Vec<_> = log.iter().filter(|o| o.qpn == *qpn).collect();
        let want = chunk(size, nqps, q);
        assert_eq!(ops.len(), 1, "QP {q}: one write that carries the immediate");
        assert_eq!(ops[0].op, Op::WriteImm(size as u32));
        assert_eq!(ops[0].len, want.len());
        assert_eq!(ops[0].remote_addr, base + want.start as u64);
        assert_eq!(want.len(), if q < 3 { 2560 } else { 10_000 - 3 * 2560 });
    }
}

#[test]
fn cts_entries_written_in_8_byte_pieces_are_never_read_half_done() {
    let mut p = pair(2, false);
    p.fabric.set_bytes_per_step(8);
    let mut rng = rand::rng();
    for _ in 0..30 {
        let n = rng.random_range(1..=MAX_RECVS);
        let dsts: Vec<Buf> = (0..n).map(|_| Buf::new(&p.b, vec![0; 600])).collect();
        let targets: Vec<RecvTarget> = dsts
            .iter()
            .enumerate()
            .map(|(i, d)| d.target(i as i32))
            .collect();
        let r = p.rcv.irecv(&targets).unwrap().unwrap();
        let srcs: Vec<Buf> = (0..n)
            .map(|_| Buf::random(&p.a, rng.random_range(0..=600)))
            .collect();
        let mut sends = Vec::new();
        for (i, s) in srcs.iter().enumerate() {
            sends.push(p.isend(s.send(s.data.len()), i as i32));
        }
        let all: Vec<&Arc<ReqCell>> = sends.iter().chain([&r]).collect();
        p.wait(&all);
        for i in 0..n {
            assert_eq!(r.size(i) as usize, srcs[i].data.len());
            assert_eq!(&dsts[i].data[..srcs[i].data.len()], &srcs[i].data[..]);
        }
    }
}

#[test]
fn an_injected_completion_error_fails_the_requests_and_the_connection() {
    let mut p = pair(2, false);
    let dst = Buf::new(&p.b, vec![0; 4096]);
    let src = Buf::random(&p.a, 4096);
    let r = p.rcv.irecv(&[dst.target(0)]).unwrap().unwrap();
    for _ in 0..5 {
        p.drive();
    }
    // Message 1 travels on the first QP (one QP per message, round-robin).
    let qpn = p.fabric.qps_of(SENDER)[0];
    p.fabric.inject_error(qpn, fake::RETRY_EXC_ERR);
    let s = p.isend(src.send(4096), 0);
    p.wait(&[&s]);
    assert_eq!(s.state(), State::Failed);
    let err = p.snd.fatal().cloned().expect("fatal error recorded");
    assert_eq!(err.code(), NcclResult::REMOTE_ERROR);
    assert!(err.message().contains("RETRY_EXC_ERR"), "{}", err.message());
    assert!(
        err.message().contains(&format!("{qpn:#x}")),
        "{}",
        err.message()
    );
    // Later calls fail fast with the same error.
    assert_eq!(p.snd.isend(src.send(1), 0).unwrap_err(), err);
    // The receive never gets all its immediates; it is still pending, not corrupted.
    assert_eq!(r.state(), State::Pending);
}

#[test]
fn a_dead_peer_fails_pending_receives_and_sends() {
    // Sender dies: the receiver's CTS write is never acknowledged.
    let mut p = pair(1, false);
    p.fabric.kill_node(SENDER);
    let dst = Buf::new(&p.b, vec![0; 64]);
    let r = p.rcv.irecv(&[dst.target(0)]).unwrap().unwrap();
    p.wait(&[&r]);
    assert_eq!(r.state(), State::Failed);
    let err = p.rcv.fatal().cloned().unwrap();
    assert!(err.message().contains("RETRY_EXC_ERR"), "{}", err.message());
    assert!(p.rcv.irecv(&[dst.target(0)]).is_err());

    // Receiver dies after its CTS arrived: the data writes fail.
    let mut p = pair(2, false);
    let dst = Buf::new(&p.b, vec![0; 64]);
    let src = Buf::random(&p.a, 64);
    let _r = p.rcv.irecv(&[dst.target(0)]).unwrap().unwrap();
    for _ in 0..5 {
        p.drive();
    }
    p.fabric.kill_node(RECEIVER);
    let s = p.isend(src.send(64), 0);
    p.wait(&[&s]);
    assert_eq!(s.state(), State::Failed);
    assert!(p.snd.fatal().unwrap().message().contains("RETRY_EXC_ERR"));
}

#[test]
fn a_write_to_a_deregistered_buffer_is_a_remote_access_error() {
    let mut p = pair(1, false);
    let dst = Buf::new(&p.b, vec![0; 256]);
    let src = Buf::random(&p.a, 256);
    let r = p.rcv.irecv(&[dst.target(0)]).unwrap().unwrap();
    for _ in 0..5 {
        p.drive();
    }
    let Buf { data: _keep, mr } = dst;
    drop(mr);
    let s = p.isend(src.send(256), 0);
    p.wait(&[&s, &r]);
    assert_eq!(s.state(), State::Failed);
    assert!(p.snd.fatal().unwrap().message().contains("REM_ACCESS_ERR"));
    assert_eq!(
        r.state(),
        State::Failed,
        "the responder QP enters the error state too"
    );
}

#[test]
fn flush_reads_one_byte_through_the_loopback_qp() {
    let mut p = pair(1, true);
    assert!(p.rcv.can_flush());
    let dst = Buf::new(&p.b, vec![9; 4096]);
    let f = p
        .rcv
        .iflush(Some((
            dst.data.as_ptr() as u64 + 100,
            one_key(FakeNic::keys(&dst.mr).1),
        )))
        .unwrap()
        .unwrap();
    p.wait(&[&f]);
    assert_eq!(f.state(), State::Done);
    let reads: Vec<_> = p
        .fabric
        .log()
        .into_iter()
        .filter(|o| o.op == Op::Read)
        .collect();
    assert_eq!(reads.len(), 1);
    assert_eq!(reads[0].len, 1);
    assert_eq!(reads[0].node, RECEIVER);
    assert_eq!(reads[0].remote_addr, dst.data.as_ptr() as u64 + 100);
    assert!(p.rcv.iflush(None).unwrap().is_none());

    let mut q = pair(1, false);
    assert!(!q.rcv.can_flush());
    assert!(
        q.rcv
            .iflush(Some((dst.data.as_ptr() as u64, one_key(1))))
            .unwrap()
            .is_none()
    );
    q.drive();
}

#[test]
fn control_memory_is_registered_strictly_ordered_and_data_may_be_relaxed() {
    let p = pair(2, true);
    // Sender: CTS FIFO + size-record staging. Receiver: CTS staging, size records,
    // flush scratch. All polled or DMA-ordered: never relaxed.
    assert_eq!(p.fabric.mrs_of(SENDER, WriteOrder::Strict), 2);
    assert_eq!(p.fabric.mrs_of(RECEIVER, WriteOrder::Strict), 3);
    assert_eq!(p.fabric.mrs_of(RECEIVER, WriteOrder::Relaxed), 0);
    let b = Buf::new(&p.b, vec![0; 64]);
    assert_eq!(p.fabric.mrs_of(RECEIVER, WriteOrder::Relaxed), 1);
    drop(b);
}

#[test]
fn irecv_rejects_bad_buffer_counts() {
    let mut p = pair(1, false);
    let bufs: Vec<Buf> = (0..MAX_RECVS + 1)
        .map(|_| Buf::new(&p.b, vec![0; 8]))
        .collect();
    let t: Vec<RecvTarget> = bufs.iter().map(|b| b.target(0)).collect();
    assert_eq!(
        p.rcv.irecv(&t).unwrap_err().code(),
        NcclResult::INVALID_ARGUMENT
    );
    assert_eq!(
        p.rcv.irecv(&[]).unwrap_err().code(),
        NcclResult::INVALID_ARGUMENT
    );
    assert!(p.rcv.irecv(&t[..MAX_RECVS]).unwrap().is_some());
}

#[test]
fn two_threads_stream_grouped_and_single_messages() {
    let split = SendOpts {
        split: true,
        ..SendOpts::default()
    };
    let Pair { a, b, snd, rcv, .. } = pair_with(FakeFabric::new(), 3, false, split);
    let (mut snd, mut rcv) = (snd, rcv);
    const ROUNDS: usize = 300;
    // Message k has 1 + k % 3 buffers of `len(k, i)` bytes filled with `byte(k, i)`.
    let nbufs = |k: usize| 1 + k % 3;
    let len = |k: usize, i: usize| (k * 37 + i * 1001) % 5000;
    let byte = |k: usize, i: usize| (k * 7 + i) as u8;
    let receiver = std::thread::spawn(move || {
        let bufs: Vec<Buf> = (0..3).map(|_| Buf::new(&b, vec![0; 5000])).collect();
        let start = Instant::now();
        for k in 0..ROUNDS {
            let t: Vec<RecvTarget> = bufs[..nbufs(k)]
                .iter()
                .enumerate()
                .map(|(i, d)| d.target(i as i32))
                .collect();
            let r = loop {
                if let Some(r) = rcv.irecv(&t).unwrap() {
                    break r;
                }
                assert!(start.elapsed() < DEADLINE);
            };
            while r.state() == State::Pending {
                rcv.progress().unwrap();
                assert!(start.elapsed() < DEADLINE, "receive {k} stuck");
            }
            for i in 0..nbufs(k) {
                assert_eq!(r.size(i) as usize, len(k, i));
                assert!(
                    bufs[i].data[..len(k, i)].iter().all(|&x| x == byte(k, i)),
                    "message {k} buffer {i}"
                );
            }
        }
    });
    let start = Instant::now();
    let srcs: Vec<Vec<Buf>> = (0..ROUNDS)
        .map(|k| {
            (0..nbufs(k))
                .map(|i| Buf::new(&a, vec![byte(k, i); len(k, i)]))
                .collect()
        })
        .collect();
    let mut pending = Vec::new();
    for (k, bufs) in srcs.iter().enumerate() {
        for (i, s) in bufs.iter().enumerate().rev() {
            let c = loop {
                if let Some(c) = snd.isend(s.send(s.data.len()), i as i32).unwrap() {
                    break c;
                }
                assert!(start.elapsed() < DEADLINE, "send {k} stuck");
            };
            pending.push(c);
        }
        // Sources must outlive their writes: wait before the next round reuses nothing,
        // but keep a few rounds in flight.
        while pending.len() > 12 {
            snd.progress().unwrap();
            assert!(pending.iter().all(|c| c.state() != State::Failed));
            pending.retain(|c| c.state() == State::Pending);
            assert!(start.elapsed() < DEADLINE);
        }
    }
    while !pending.is_empty() {
        snd.progress().unwrap();
        pending.retain(|c| c.state() == State::Pending);
        assert!(start.elapsed() < DEADLINE);
    }
    receiver.join().unwrap();
    drop(srcs);
}
