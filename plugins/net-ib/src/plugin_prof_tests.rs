//! Profiler QP events through the `Net` trait on the fake NIC: a recording
//! profiler callback sees, per request and QP, a start with NCCL's IB descriptor v1
//! (device, wr_id, opcode, QP number, length) when the work is posted and a stop
//! when that QP's completion is polled; declined and absent profilers cost nothing.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use cclkit_abi::net::{CommConfig, CommRef, Net, RecvBuf};
use cclkit_abi::profiler::net::{NetProfiler, RequestProfiler};
use cclkit_abi::raw::common::{NcclResult, ptr};
use cclkit_abi::raw::profiler::ncclProfilerNetIbDescr_v1_t;
use rand::{Rng, RngCore};

use crate::config::Config;
use crate::fake::FakeFabric;
use crate::plugin_tests::{FakeNet, buf, connect_ctx, node_with, region, wait};
use crate::verbs::sys::{IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM};

/// `(device, wr_id, opcode, qpNum, length)` of an IB descriptor.
type Descr = (i32, u64, i32, i32, usize);
/// (kind, phandle, plugin id, event handle, descriptor).
type Call = (c_int, usize, i64, usize, Option<Descr>);

static CALLS: Mutex<Vec<Call>> = Mutex::new(Vec::new());
/// Requests with this phandle are declined (NULL event handle).
const DECLINE: usize = 0x9000;
/// `NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER`.
const IB_V1: i64 = (1 << 16) | 1;

unsafe extern "C" fn record(
    e: *mut *mut c_void,
    kind: c_int,
    ph: *mut c_void,
    id: i64,
    data: *mut c_void,
) -> NcclResult {
    // SAFETY: the plugin passes NULL or an IB descriptor live for the call.
    let d = unsafe { data.cast::<ncclProfilerNetIbDescr_v1_t>().as_ref() };
    // Only ncclProfileQp descriptors are recorded (a panic must not cross this
    // C boundary: a wrong type shows up as a missing descriptor instead).
    let d = d.filter(|d| d.type_ == 1).map(|d| {
        (
            d.qp.device,
            d.qp.wr_id,
            d.qp.opcode,
            d.qp.qpNum,
            d.qp.length,
        )
    });
    let mut calls = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    if kind == 0 {
        let h = if ph as usize == DECLINE {
            0
        } else {
            0x10_0000 + calls.len()
        };
        // SAFETY: the plugin passes a writable handle slot.
        unsafe { *e = h as *mut c_void };
    }
    // SAFETY: as above.
    let h = unsafe { *e } as usize;
    calls.push((kind, ph as usize, id, h, d));
    NcclResult::SUCCESS
}

fn prof(phandle: usize) -> RequestProfiler {
    // SAFETY: the recording callback never dereferences the handle.
    unsafe { RequestProfiler::new(NetProfiler::new(Some(record)), phandle as *mut c_void) }
}

/// A grouped receive's profiler: one handle per buffer, as NCCL passes `phandles`.
fn grouped(phandles: &[usize]) -> RequestProfiler {
    let handles: Vec<*mut c_void> = phandles.iter().map(|&p| p as *mut c_void).collect();
    // SAFETY: as above.
    unsafe { RequestProfiler::new_grouped(NetProfiler::new(Some(record)), &handles) }
}

/// The starts recorded for `phandle`, each with whether its handle was stopped
/// later, and exactly once.
fn events_of(calls: &[Call], phandle: usize) -> Vec<(Descr, bool)> {
    calls
        .iter()
        .enumerate()
        .filter(|(_, c)| c.0 == 0 && c.1 == phandle)
        .map(|(i, c)| {
            assert_eq!(c.2, IB_V1, "plugin id");
            let stops = calls[i..].iter().filter(|s| s.0 == 1 && s.3 == c.3).count();
            assert!(stops <= 1, "stopped twice");
            (
                c.4.expect("an ncclProfileQp descriptor"),
                stops == 1 && c.3 != 0,
            )
        })
        .collect()
}

#[test]
fn every_request_reports_one_event_per_qp_with_the_ib_descriptor() {
    let fabric = FakeFabric::new();
    let cfg = Config {
        qps_per_connection: 2,
        ..Config::default()
    };
    let a = node_with(&fabric, &[1], ptr::HOST, cfg.clone());
    let b = node_with(&fabric, &[2], ptr::HOST, cfg);
    let ctx = a.open_context(1, CommConfig::default()).unwrap();
    let cb = b.open_context(1, CommConfig::default()).unwrap();
    let mut c = connect_ctx(&a, &b, &ctx, &cb);
    let (sq, rq) = (fabric.qps_of(1), fabric.qps_of(2));
    assert_eq!((sq.len(), rq.len()), (2, 2));
    let mut rng = rand::rng();
    let mut src = vec![0u8; 1 << 16];
    rng.fill_bytes(&mut src);
    let mut dst = vec![0u8; 1 << 16];
    let smr = a
        .reg_mr(CommRef::Send(&c.send), region(&src, ptr::HOST))
        .unwrap();
    let rmr = b
        .reg_mr(CommRef::Recv(&c.recv), region(&dst, ptr::HOST))
        .unwrap();

    // Messages 1..=5: single buffers, one QP each, round-robin.
    let mut expect = Vec::new();
    for k in 0..5usize {
        let len = rng.random_range(1..20_000) | 1;
        let rb = [RecvBuf {
            buf: buf(&mut dst[..len + 100]),
            tag: 7,
            mr: Some(&rmr),
        }];
        let mut r = b
            .irecv_profiled(&mut c.recv, &rb, false, prof(0x2000 + k))
            .unwrap()
            .unwrap();
        let mut s = loop {
            if let Some(s) = a
                .isend_profiled(
                    &mut c.send,
                    buf(&mut src[..len]),
                    7,
                    Some(&smr),
                    prof(0x1000 + k),
                )
                .unwrap()
            {
                break s;
            }
            let _ = FakeNet::test(&mut r, &mut unsafe_sizes());
        };
        assert_eq!(wait(&mut s, 1).unwrap(), vec![len as c_int]);
        assert_eq!(wait(&mut r, 1).unwrap(), vec![len as c_int]);
        assert_eq!(dst[..len], src[..len]);
        expect.push((k, len));
    }
    // Message 6: a grouped receive of three buffers (sizes in the records, so the
    // data goes as plain RDMA writes) on QP (6 - 1) mod 2 = 1.
    let lens = [rng.random_range(1..9000), 0, rng.random_range(1..9000)];
    {
        let (d0, rest) = dst.split_at_mut(20_000);
        let (d1, d2) = rest.split_at_mut(20_000);
        let rb = [
            RecvBuf {
                buf: buf(d0),
                tag: 1,
                mr: Some(&rmr),
            },
            RecvBuf {
                buf: buf(d1),
                tag: 2,
                mr: Some(&rmr),
            },
            RecvBuf {
                buf: buf(d2),
                tag: 3,
                mr: Some(&rmr),
            },
        ];
        let mut r = b
            .irecv_profiled(&mut c.recv, &rb, false, grouped(&[0x3000, 0x3001, 0x3002]))
            .unwrap()
            .unwrap();
        let mut sends = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            let off = 20_000 * i;
            let s = loop {
                let sb = buf(&mut src[off..off + len]);
                let ph = if i == 1 { DECLINE } else { 0x4000 + i };
                if let Some(s) = a
                    .isend_profiled(&mut c.send, sb, 1 + i as i32, Some(&smr), prof(ph))
                    .unwrap()
                {
                    break s;
                }
                let _ = FakeNet::test(&mut r, &mut unsafe_sizes());
            };
            sends.push(s);
        }
        for (mut s, &len) in sends.into_iter().zip(&lens) {
            assert_eq!(wait(&mut s, 1).unwrap(), vec![len as c_int]);
        }
        let got = wait(&mut r, 3).unwrap();
        assert_eq!(got, lens.iter().map(|&l| l as c_int).collect::<Vec<_>>());
    }
    // Message 7 without a profiler (a NULL phandle): nothing is reported.
    {
        let rb = [RecvBuf {
            buf: buf(&mut dst[..64]),
            tag: 0,
            mr: Some(&rmr),
        }];
        let mut r = b
            .irecv_profiled(&mut c.recv, &rb, false, prof(0))
            .unwrap()
            .unwrap();
        let mut s = loop {
            if let Some(s) = a
                .isend_profiled(&mut c.send, buf(&mut src[..64]), 0, Some(&smr), prof(0))
                .unwrap()
            {
                break s;
            }
            let _ = FakeNet::test(&mut r, &mut unsafe_sizes());
        };
        wait(&mut s, 1).unwrap();
        wait(&mut r, 1).unwrap();
    }
    let calls = CALLS.lock().unwrap().clone();
    assert!(
        !calls.iter().any(|c| c.0 == 0 && c.1 == 0),
        "no profiler, no events"
    );

    for (k, len) in expect {
        let idx = k as u64 + 1;
        let send = events_of(&calls, 0x1000 + k);
        let wr = IBV_WR_RDMA_WRITE_WITH_IMM as i32;
        assert_eq!(
            send,
            vec![((0, idx, wr, sq[k % 2] as i32, len), true)],
            "send {k}"
        );
        let recv = events_of(&calls, 0x2000 + k);
        assert_eq!(
            recv,
            vec![((0, idx, wr, rq[k % 2] as i32, len + 100), true)],
            "recv {k}"
        );
    }
    let write = IBV_WR_RDMA_WRITE as i32;
    for i in [0usize, 2] {
        let ev = events_of(&calls, 0x4000 + i);
        assert_eq!(
            ev,
            vec![((0, 6, write, sq[1] as i32, lens[i]), true)],
            "grouped send {i}"
        );
    }
    let declined = events_of(&calls, DECLINE);
    assert_eq!(declined.len(), 1);
    assert!(!declined[0].1, "a declined event is never stopped");
    // One event per buffer of the grouped receive, each under its own handle with
    // its own posted bytes, all on the QP the receive was posted on (NCCL's
    // `phandles[r]` per buffer and QP).
    let wr = IBV_WR_RDMA_WRITE_WITH_IMM as i32;
    for (r, posted) in [20_000, 20_000, (1 << 16) - 40_000].into_iter().enumerate() {
        assert_eq!(
            events_of(&calls, 0x3000 + r),
            vec![((0, 6, wr, rq[1] as i32, posted), true)],
            "grouped receive, buffer {r}"
        );
    }
    a.dereg_mr(CommRef::Send(&c.send), smr).unwrap();
    b.dereg_mr(CommRef::Recv(&c.recv), rmr).unwrap();
}

#[test]
fn split_messages_report_each_qps_share_on_every_qp() {
    let fabric = FakeFabric::new();
    let cfg = Config {
        qps_per_connection: 3,
        split_data_on_qps: true,
        ..Config::default()
    };
    let a = node_with(&fabric, &[11], ptr::HOST, cfg.clone());
    let b = node_with(&fabric, &[12], ptr::HOST, cfg);
    let ctx = a.open_context(1, CommConfig::default()).unwrap();
    let cb = b.open_context(1, CommConfig::default()).unwrap();
    let mut c = connect_ctx(&a, &b, &ctx, &cb);
    let sq = fabric.qps_of(11);
    let len = rand::rng().random_range(30_000..60_000) | 1;
    let mut src = vec![3u8; len];
    let mut dst = vec![0u8; len];
    let smr = a
        .reg_mr(CommRef::Send(&c.send), region(&src, ptr::HOST))
        .unwrap();
    let rmr = b
        .reg_mr(CommRef::Recv(&c.recv), region(&dst, ptr::HOST))
        .unwrap();
    let rb = [RecvBuf {
        buf: buf(&mut dst),
        tag: 5,
        mr: Some(&rmr),
    }];
    let mut r = b
        .irecv_profiled(&mut c.recv, &rb, false, prof(0x5000))
        .unwrap()
        .unwrap();
    let mut s = loop {
        if let Some(s) = a
            .isend_profiled(&mut c.send, buf(&mut src), 5, Some(&smr), prof(0x6000))
            .unwrap()
        {
            break s;
        }
        let _ = FakeNet::test(&mut r, &mut unsafe_sizes());
    };
    wait(&mut s, 1).unwrap();
    wait(&mut r, 1).unwrap();
    drop((s, r));
    let calls = CALLS.lock().unwrap().clone();
    let ev = events_of(&calls, 0x6000);
    assert_eq!(ev.len(), 3, "one per QP");
    let total: usize = ev.iter().map(|e| e.0.4).sum();
    assert_eq!(total, len, "the QPs' shares add up to the message");
    let qpns: Vec<i32> = ev.iter().map(|e| e.0.3).collect();
    assert_eq!(qpns, sq.iter().map(|&q| q as i32).collect::<Vec<_>>());
    assert!(ev.iter().all(|e| e.1), "each stopped");
    assert_eq!(
        events_of(&calls, 0x5000).len(),
        3,
        "receive posted on 3 QPs"
    );
    a.dereg_mr(CommRef::Send(&c.send), smr).unwrap();
    b.dereg_mr(CommRef::Recv(&c.recv), rmr).unwrap();
}

/// A sizes array for a `test()` whose result is ignored (leaked: a few ints per
/// retry in a test).
fn unsafe_sizes() -> cclkit_abi::net::Sizes<'static> {
    let p = Box::leak(Box::new([0 as c_int; 8]));
    // SAFETY: 8 writable ints that live forever.
    unsafe { cclkit_abi::net::Sizes::from_raw(p.as_mut_ptr()) }
}
