//! The whole `Net` implementation on the fake NIC: two plugin instances (two fake
//! nodes) connect over a real loopback TCP side channel and move data.

use std::ffi::c_int;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cclkit_abi::net::{
    Buf, CommConfig, CommRef, MemRegion, Net, NetHandle, Properties, RecvBuf, Sizes,
};
use cclkit_abi::raw::common::{NcclResult, ptr};
use cclkit_abi::{Error, Result};
use rand::RngCore;

use crate::config::Config;
use crate::conn::wire::read_handle;
use crate::fake::{FakeFabric, FakeNic};
use crate::plugin::{Backend, CommCtx, IbNet};

pub(crate) struct FakeBackend;

impl Backend for FakeBackend {
    type Nic = FakeNic;
    fn discover(_: &Config) -> Result<Vec<(FakeNic, Properties)>> {
        Err(Error::internal("the fake backend is built by from_parts"))
    }
}

pub(crate) type FakeNet = IbNet<FakeBackend>;

fn node(fabric: &Arc<FakeFabric>, n: u32, gpu: bool, nqps: usize) -> FakeNet {
    let ptr_support = if gpu {
        ptr::HOST | ptr::CUDA
    } else {
        ptr::HOST
    };
    let cfg = Config {
        qps_per_connection: nqps,
        ..Config::default()
    };
    node_with(fabric, &[n], ptr_support, cfg)
}

/// A plugin instance over fake ports `nodes` with pointer support `ptr_support`.
pub(crate) fn node_with(
    fabric: &Arc<FakeFabric>,
    nodes: &[u32],
    ptr_support: i32,
    cfg: Config,
) -> FakeNet {
    let found = nodes
        .iter()
        .map(|&n| {
            let mut props = Properties::host(format!("fake{n}"));
            props.reg_is_global = true;
            props.max_recvs = 8;
            props.ptr_support = ptr_support;
            (fabric.port(n), props)
        })
        .collect();
    FakeNet::from_parts(cfg, found, IpAddr::V4(Ipv4Addr::LOCALHOST))
}

const DEADLINE: Duration = Duration::from_secs(20);

pub(crate) struct Conn {
    pub send: <FakeNet as Net>::SendComm,
    pub recv: <FakeNet as Net>::RecvComm,
}

/// Listens on `b`, ships the handle bytes to `a` (as NCCL's bootstrap does) and
/// calls connect/accept until both return a comm.
fn connect(a: &FakeNet, b: &FakeNet) -> Conn {
    let (ca, cb): (CommCtx, CommCtx) = (
        a.open_context(1, CommConfig::default()).unwrap(),
        b.open_context(
            1,
            CommConfig {
                traffic_class: Some(106),
            },
        )
        .unwrap(),
    );
    connect_ctx(a, b, &ca, &cb)
}

/// Connects `a` (sender, context `ca`) to `b` (receiver, context `cb`).
pub(crate) fn connect_ctx(a: &FakeNet, b: &FakeNet, ca: &CommCtx, cb: &CommCtx) -> Conn {
    let mut handle = NetHandle::zeroed();
    let mut listen = b.listen(cb, 0, &mut handle).unwrap();
    let mut shipped = *handle.as_bytes();
    let peer_handle = NetHandle::from_bytes_mut(&mut shipped);
    let (mut send, mut recv) = (None, None);
    let start = Instant::now();
    while send.is_none() || recv.is_none() {
        assert!(start.elapsed() < DEADLINE, "connection setup stuck");
        if send.is_none() {
            send = a.connect(ca, 0, peer_handle).unwrap();
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

pub(crate) fn region(v: &[u8], kind: i32) -> MemRegion {
    MemRegion {
        addr: v.as_ptr() as usize,
        len: v.len(),
        kind,
    }
}

/// Tests `req` until done; returns the sizes it reported.
pub(crate) fn wait(req: &mut <FakeNet as Net>::Request, n: usize) -> Result<Vec<c_int>> {
    let mut out = [0 as c_int; 64];
    let start = Instant::now();
    loop {
        // SAFETY: `out` has 64 entries, more than any request's buffer count.
        let mut sizes = unsafe { Sizes::from_raw(out.as_mut_ptr()) };
        if FakeNet::test(req, &mut sizes)? {
            return Ok(out[..n].to_vec());
        }
        assert!(start.elapsed() < DEADLINE, "request stuck");
    }
}

pub(crate) fn buf(v: &mut [u8]) -> Buf {
    // SAFETY: the vectors outlive every request in these tests.
    unsafe { Buf::new(v.as_mut_ptr(), v.len()) }
}

#[test]
fn connect_accept_then_single_and_grouped_transfers_through_the_net_trait() {
    let fabric = FakeFabric::new();
    let (a, b) = (node(&fabric, 1, false, 2), node(&fabric, 2, false, 2));
    let mut c = connect(&a, &b);
    let baseline = fabric.live_mrs();
    let mut rng = rand::rng();

    // Registered once as a whole (NCCL's regIsGlobal early registration), then
    // sub-ranges per buffer: cache hits, no new NIC registration.
    let mut src = vec![0u8; 64 * 1024];
    rng.fill_bytes(&mut src);
    let mut dst = vec![0u8; 64 * 1024];
    let whole_s = a
        .reg_mr(CommRef::Send(&c.send), region(&src, ptr::HOST))
        .unwrap();
    let whole_r = b
        .reg_mr(CommRef::Recv(&c.recv), region(&dst, ptr::HOST))
        .unwrap();
    let after_whole = fabric.live_mrs();
    assert_eq!(after_whole, baseline + 2);

    for round in 0..50usize {
        let n = 1 + round % 4;
        let chunk = 64 * 1024 / 4;
        let parts_r: Vec<&mut [u8]> = dst.chunks_mut(chunk).take(n).collect();
        let mut recv_bufs = Vec::new();
        let mut mrs_r = Vec::new();
        for p in &parts_r {
            mrs_r.push(
                b.reg_mr(CommRef::Recv(&c.recv), region(p, ptr::HOST))
                    .unwrap(),
            );
        }
        for (i, p) in parts_r.into_iter().enumerate() {
            recv_bufs.push((buf(p), 10 + i as i32));
        }
        let rb: Vec<RecvBuf<'_, _>> = recv_bufs
            .iter()
            .zip(&mrs_r)
            .map(|((bf, tag), mr)| RecvBuf {
                buf: *bf,
                tag: *tag,
                mr: Some(mr),
            })
            .collect();
        let mut rreq = b
            .irecv(&mut c.recv, &rb, false)
            .unwrap()
            .expect("a free receive slot");
        let lens: Vec<usize> = (0..n).map(|i| (round * 997 + i * 131) % chunk).collect();
        let mut sreqs = Vec::new();
        for i in (0..n).rev() {
            let off = i * chunk;
            let sb = buf(&mut src[off..off + lens[i]]);
            let start = Instant::now();
            let req = loop {
                if let Some(r) = a
                    .isend(&mut c.send, sb, 10 + i as i32, Some(&whole_s))
                    .unwrap()
                {
                    break r;
                }
                // The receiver's CTS write moves when its side polls.
                let _ = wait_once(&mut rreq);
                assert!(start.elapsed() < DEADLINE);
            };
            sreqs.push((req, lens[i]));
        }
        for (mut r, len) in sreqs {
            assert_eq!(wait(&mut r, 1).unwrap(), vec![len as c_int]);
        }
        let got = wait(&mut rreq, n).unwrap();
        drop(rreq);
        for i in 0..n {
            assert_eq!(got[i] as usize, lens[i], "round {round} buffer {i}");
            let off = i * chunk;
            assert_eq!(
                &dst[off..off + lens[i]],
                &src[off..off + lens[i]],
                "round {round} buffer {i}"
            );
        }
        for mr in mrs_r {
            b.dereg_mr(CommRef::Recv(&c.recv), mr).unwrap();
        }
        assert_eq!(
            fabric.live_mrs(),
            after_whole,
            "sub-range registrations were cache hits"
        );
    }
    a.dereg_mr(CommRef::Send(&c.send), whole_s).unwrap();
    b.dereg_mr(CommRef::Recv(&c.recv), whole_r).unwrap();
    assert_eq!(
        fabric.live_mrs(),
        baseline,
        "last deregMr released the registrations"
    );
    let live_before_close = fabric.live_mrs();
    a.close_send(c.send).unwrap();
    b.close_recv(c.recv).unwrap();
    assert!(
        fabric.live_mrs() < live_before_close,
        "comm memory deregistered on close"
    );
    assert_eq!(fabric.live_mrs(), 0);
}

/// One `test()` call without waiting (keeps the receiver side progressing).
fn wait_once(req: &mut <FakeNet as Net>::Request) -> Result<bool> {
    // SAFETY: NULL sizes are allowed.
    let mut sizes = unsafe { Sizes::from_raw(std::ptr::null_mut()) };
    let r = FakeNet::test(req, &mut sizes);
    assert!(
        !matches!(r, Ok(true)),
        "receive completed before its sends were posted"
    );
    r
}

pub(crate) fn err<T>(r: Result<T>) -> Error {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn buffers_outside_their_registration_and_oversized_sends_are_errors() {
    let fabric = FakeFabric::new();
    let (a, b) = (node(&fabric, 1, false, 1), node(&fabric, 2, false, 1));
    let mut c = connect(&a, &b);
    let mut small = vec![0u8; 4096 * 2];
    let mut other = vec![0u8; 4096 * 8];
    let mr = a
        .reg_mr(CommRef::Send(&c.send), region(&small, ptr::HOST))
        .unwrap();
    let e = err(a.isend(&mut c.send, buf(&mut other), 0, Some(&mr)));
    assert_eq!(e.code(), NcclResult::INVALID_ARGUMENT);
    assert!(
        e.message().contains("outside its registration"),
        "{}",
        e.message()
    );
    let e = err(a.isend(&mut c.send, buf(&mut small), 0, None));
    assert!(e.message().contains("mhandle is NULL"), "{}", e.message());
    // GPU memory without GPUDirect support is refused with the reason.
    let e = err(a.reg_mr(CommRef::Send(&c.send), region(&other, ptr::CUDA)));
    assert!(e.message().contains("peer-memory"), "{}", e.message());
    let e = err(a.reg_mr_dmabuf(CommRef::Send(&c.send), region(&other, ptr::CUDA), 0, 3));
    assert!(e.message().contains("dma-buf"), "{}", e.message());
    a.dereg_mr(CommRef::Send(&c.send), mr).unwrap();
    // An empty buffer (even at NULL) registers nothing with the NIC.
    let live = fabric.live_mrs();
    let null = MemRegion {
        addr: 0,
        len: 0,
        kind: ptr::HOST,
    };
    let empty = a.reg_mr(CommRef::Send(&c.send), null).unwrap();
    assert_eq!(fabric.live_mrs(), live);
    let e = err(a.isend(&mut c.send, buf(&mut small), 0, Some(&empty)));
    assert!(
        e.message().contains("empty registration"),
        "{}",
        e.message()
    );
    a.dereg_mr(CommRef::Send(&c.send), empty).unwrap();
}

#[test]
fn iflush_reads_only_for_gpu_buffers() {
    let fabric = FakeFabric::new();
    let (a, b) = (node(&fabric, 1, true, 1), node(&fabric, 2, true, 1));
    let mut c = connect(&a, &b);
    let mut host = vec![0u8; 4096];
    let mut gpu = vec![0u8; 4096]; // stands in for device memory on the fake NIC
    let mh = b
        .reg_mr(CommRef::Recv(&c.recv), region(&host, ptr::HOST))
        .unwrap();
    let mg = b
        .reg_mr(CommRef::Recv(&c.recv), region(&gpu, ptr::CUDA))
        .unwrap();
    let hb = [RecvBuf {
        buf: buf(&mut host),
        tag: 0,
        mr: Some(&mh),
    }];
    assert!(
        b.iflush(&mut c.recv, &hb).unwrap().is_none(),
        "host receives need no flush"
    );
    let gb = [
        RecvBuf {
            buf: buf(&mut gpu),
            tag: 0,
            mr: Some(&mg),
        },
        RecvBuf {
            buf: buf(&mut host[..0]),
            tag: 1,
            mr: Some(&mh),
        },
    ];
    let mut f = b
        .iflush(&mut c.recv, &gb)
        .unwrap()
        .expect("a flush request");
    wait(&mut f, 0).unwrap();
    drop(f);
    let reads: Vec<_> = fabric
        .log()
        .into_iter()
        .filter(|o| o.op == crate::nic::Op::Read)
        .collect();
    assert_eq!(reads.len(), 1);
    assert_eq!(reads[0].remote_addr, gpu.as_ptr() as u64);
    b.dereg_mr(CommRef::Recv(&c.recv), mh).unwrap();
    b.dereg_mr(CommRef::Recv(&c.recv), mg).unwrap();
}

/// Captures `tracing` messages (where plugin logs go without an NCCL logger).
#[derive(Clone, Default)]
pub(crate) struct Capture(pub Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Msg(String);
        impl tracing::field::Visit for Msg {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    let _ = write!(self.0, "{v:?}");
                }
            }
        }
        let mut m = Msg(String::new());
        event.record(&mut m);
        if let Ok(mut v) = self.0.lock() {
            v.push(m.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_connection_with_the_wrong_magic_is_dropped_and_logged() {
    let fabric = FakeFabric::new();
    let b = node(&fabric, 2, false, 1);
    let a = node(&fabric, 1, false, 1);
    let cb = b.open_context(0, CommConfig::default()).unwrap();
    let ca = a.open_context(0, CommConfig::default()).unwrap();
    let mut handle = NetHandle::zeroed();
    let mut listen = b.listen(&cb, 0, &mut handle).unwrap();
    let (magic, addr): (u64, SocketAddr) = read_handle(&handle).unwrap();
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), || {
        let mut intruder = TcpStream::connect(addr).unwrap();
        let mut hello = (magic ^ 1).to_le_bytes().to_vec();
        hello.extend_from_slice(&40u32.to_le_bytes());
        intruder.write_all(&hello).unwrap();
        let start = Instant::now();
        loop {
            assert!(
                b.accept(&mut listen).unwrap().is_none(),
                "an intruder must not get a comm"
            );
            if capture
                .0
                .lock()
                .unwrap()
                .iter()
                .any(|m| m.contains("wrong magic"))
            {
                break;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the bad connection was never dropped"
            );
        }
        assert_eq!(listen.inner_in_progress(), 0, "dropped, not kept pending");
    });
    let logs = capture.0.lock().unwrap().clone();
    let line = logs.iter().find(|m| m.contains("wrong magic")).unwrap();
    assert!(
        line.contains("dropped side-channel connection from 127.0.0.1"),
        "{line}"
    );
    // The listener still serves the real peer.
    let mut shipped = *handle.as_bytes();
    let h = NetHandle::from_bytes_mut(&mut shipped);
    let (mut s, mut r) = (None, None);
    let start = Instant::now();
    while s.is_none() || r.is_none() {
        assert!(start.elapsed() < DEADLINE);
        if s.is_none() {
            s = a.connect(&ca, 0, h).unwrap();
        }
        if r.is_none() {
            r = b.accept(&mut listen).unwrap();
        }
    }
}

#[test]
fn connect_to_a_closed_port_fails_with_the_address() {
    let fabric = FakeFabric::new();
    let (a, b) = (node(&fabric, 1, false, 1), node(&fabric, 2, false, 1));
    let (ca, cb) = (
        a.open_context(0, CommConfig::default()).unwrap(),
        b.open_context(0, CommConfig::default()).unwrap(),
    );
    let mut handle = NetHandle::zeroed();
    let listen = b.listen(&cb, 0, &mut handle).unwrap();
    let (_, addr) = read_handle(&handle).unwrap();
    b.close_listen(listen).unwrap();
    let start = Instant::now();
    let err = loop {
        match a.connect(&ca, 0, &mut handle) {
            Ok(None) => assert!(start.elapsed() < DEADLINE),
            Ok(Some(_)) => panic!("connected to a closed listener"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), NcclResult::REMOTE_ERROR);
    assert!(
        err.message().contains(&addr.to_string()),
        "{}",
        err.message()
    );
    assert!(
        b.open_context(
            0,
            CommConfig {
                traffic_class: Some(300)
            }
        )
        .is_err()
    );
}
