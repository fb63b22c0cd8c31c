//! Decoding of every descriptor and state-argument version into the typed views,
//! and the net-plugin callback handle, against hand-filled raw structs.
#![allow(clippy::unwrap_used)]

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Mutex;

use cclkit_abi::profiler::net::{NetProfiler, RequestProfiler};
use cclkit_abi::profiler::*;
use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::profiler::{self as raw, ProfilerEventState, event as bit};

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let s = t.as_nanos() as u64 | 1;
    eprintln!("seed {s}");
    s
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn v1_numeric_codes_become_nccl_names() {
    let mut r = seed();
    // SAFETY: plain data; zero is valid.
    let mut d: raw::v1::ncclProfilerEventDescr_v1_t = unsafe { std::mem::zeroed() };
    let (count, hash) = (xorshift(&mut r) as usize % 999_983, xorshift(&mut r));
    d.type_ = bit::COLL as u8;
    d.rank = 7;
    d.u.coll.func = 4; // AllReduce
    d.u.coll.datatype = 9; // bfloat16
    d.u.coll.algo = 1; // Ring
    d.u.coll.proto = 2; // Simple
    d.u.coll.count = count;
    d.u.coll.commHash = hash;
    d.u.coll.op = 3;
    d.u.coll.trafficBytes = count * 2;
    // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
    let e = unsafe { event_v1(&d) };
    let EventKind::Coll(c) = e.kind else {
        panic!("{e:?}")
    };
    assert_eq!(
        (e.rank, c.func, c.datatype),
        (7, Some("AllReduce"), Some("ncclBfloat16"))
    );
    assert_eq!((c.algo, c.proto), (Some("RING"), Some("SIMPLE")));
    assert_eq!(
        (c.count, c.comm_hash, c.red_op, c.traffic_bytes),
        (count, Some(hash), Some(3), Some(count * 2))
    );
    assert_eq!(c.bytes(), count * 2);
    assert_eq!(c.comm_name, None, "NULL string ⇒ None");
    // An out-of-range code is not invented into a name.
    d.u.coll.func = 200;
    // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
    let EventKind::Coll(c) = unsafe { event_v1(&d) }.kind else {
        panic!()
    };
    assert_eq!(c.func, None);
    d.type_ = 0x40; // KernelCh does not exist in v1
    // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
    assert_eq!(unsafe { event_v1(&d) }.kind, EventKind::Unknown(0x40));
}

#[test]
fn v3_net_plugin_ib_descriptor_and_v4_p2p_decode() {
    let mut r = seed();
    let mut ib = raw::ncclProfilerNetIbDescr_v1_t {
        type_: raw::NCCL_PROFILE_QP,
        qp: raw::ncclProfilerNetIbQpDescr_v1_t {
            device: 1,
            wr_id: xorshift(&mut r),
            opcode: 4,
            qpNum: 0x1234,
            length: xorshift(&mut r) as usize % 4096 + 1,
        },
    };
    // SAFETY: plain data.
    let mut d: raw::v3::ncclProfilerEventDescr_v3_t = unsafe { std::mem::zeroed() };
    d.type_ = bit::NET_PLUGIN as u8;
    d.u.netPlugin.id = i64::from(raw::NCCL_PROFILER_NET_TYPE_IB | 1);
    d.u.netPlugin.data = (&mut ib as *mut raw::ncclProfilerNetIbDescr_v1_t).cast();
    // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
    let EventKind::NetPlugin(n) = unsafe { event_v3(&d) }.kind else {
        panic!()
    };
    assert_eq!(
        n.detail,
        Some(NetDetail::IbQp {
            device: 1,
            wr_id: ib.qp.wr_id,
            opcode: 4,
            qp_num: 0x1234,
            length: ib.qp.length
        })
    );
    // Unknown version: kept undecoded rather than misread.
    d.u.netPlugin.id = i64::from(raw::NCCL_PROFILER_NET_TYPE_IB | 2);
    // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
    let EventKind::NetPlugin(n) = unsafe { event_v3(&d) }.kind else {
        panic!()
    };
    assert_eq!(n.detail, None);

    // SAFETY: plain data.
    let mut d4: raw::v4::ncclProfilerEventDescr_v4_t = unsafe { std::mem::zeroed() };
    d4.type_ = bit::P2P as u8;
    d4.u.p2p = raw::v4::ncclProfilerP2pDescr_v4_t {
        func: c"Send".as_ptr(),
        buff: null_mut(),
        datatype: c"ncclInt64".as_ptr(),
        count: 33,
        peer: 5,
        nChannels: 2,
    };
    // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
    let EventKind::P2p(p) = unsafe { event_v4(&d4) }.kind else {
        panic!()
    };
    assert_eq!(
        (p.func, p.peer, p.n_channels, p.bytes()),
        (Some("Send"), 5, Some(2), 264)
    );
}

#[test]
fn v5_api_events_and_v6_copy_engine_events_decode() {
    // SAFETY: plain data.
    let mut d: raw::v5::ncclProfilerEventDescr_v5_t = unsafe { std::mem::zeroed() };
    d.type_ = bit::COLL_API;
    d.u.collApi = raw::v5::ncclProfilerCollApiDescr_v5_t {
        func: c"ReduceScatter".as_ptr(),
        count: 1001,
        datatype: c"ncclFloat16".as_ptr(),
        root: 0,
        stream: 0xdead0 as *mut c_void,
        graphCaptured: 2,
    };
    // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
    let EventKind::CollApi(a) = unsafe { event_v5(&d) }.kind else {
        panic!()
    };
    assert_eq!(
        a,
        CollApi {
            func: Some("ReduceScatter"),
            count: 1001,
            datatype: Some("ncclFloat16"),
            root: 0,
            stream: 0xdead0,
            graph_captured: true,
            user_tag: None
        }
    );
    d.type_ = bit::CE_COLL; // not in v5
    assert_eq!(
        // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
        unsafe { event_v5(&d) }.kind,
        EventKind::Unknown(bit::CE_COLL)
    );

    // SAFETY: plain data.
    let mut d6: raw::v6::ncclProfilerEventDescr_v6_t = unsafe { std::mem::zeroed() };
    d6.type_ = bit::CE_BATCH;
    d6.u.ceCollBatch = raw::v6::ncclProfilerCeBatchDescr_v6_t {
        numOps: 3,
        totalBytes: 77,
        useIntraSync: 1,
    };
    assert_eq!(
        // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
        unsafe { event_v6(&d6) }.kind,
        EventKind::CeBatch {
            num_ops: 3,
            total_bytes: 77,
            use_intra_sync: true
        }
    );
}

#[test]
fn state_arguments_follow_the_state_that_selects_them() {
    let a1 = raw::ncclProfilerEventStateArgs_v1_t {
        proxyOp: raw::ncclProfilerProxyOpStateArgs_v1_t {
            transSize: 4096,
            steps: 3,
        },
    };
    // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
    let s = unsafe { EventState::from_v1(ProfilerEventState::PROXY_OP_SEND_DONE, &a1) };
    assert_eq!(
        s.args,
        StateArgs::ProxyOp {
            trans_size: 4096,
            steps: 3
        }
    );
    // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
    let s = unsafe { EventState::from_v1(ProfilerEventState::PROXY_CTRL_SLEEP, &a1) };
    assert_eq!(s.args, StateArgs::None);
    let a4 = raw::ncclProfilerEventStateArgs_v4_t {
        kernelCh: raw::ncclProfilerKernelChStateArgs_v4_t { pTimer: 123456789 },
    };
    for st in [
        ProfilerEventState::KERNEL_CH_STOP,
        ProfilerEventState::KERNEL_PHASE_STOP,
    ] {
        assert_eq!(
            // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
            unsafe { EventState::from_v4(st, &a4) }.args,
            StateArgs::Timer { ptimer: 123456789 }
        );
    }
    // SAFETY: the descriptor is initialised for the member its type selects; strings are static.
    let s = unsafe { EventState::from_v4(ProfilerEventState(99), std::ptr::null()) };
    assert_eq!((s.state.name(), s.args), (None, StateArgs::None));
}

/// What the fake NCCL callback saw.
static CALLS: Mutex<Vec<(c_int, usize, i64, usize)>> = Mutex::new(Vec::new());

unsafe extern "C" fn fake_callback(
    handle: *mut *mut c_void,
    kind: c_int,
    phandle: *mut c_void,
    plugin_id: i64,
    data: *mut c_void,
) -> NcclResult {
    let len = if data.is_null() {
        0
    } else {
        // SAFETY: `data` is the socket descriptor `start`/`update` passed, live for the call.
        unsafe {
            (*data.cast::<raw::ncclProfilerNetSockDescr_v1_t>())
                .sock
                .length
        }
    };
    // SAFETY: NCCL's contract for the callback: `handle` is a writable event-handle slot.
    let current = unsafe { *handle } as usize;
    CALLS.lock().unwrap().push((kind, current, plugin_id, len));
    if kind == raw::NET_EVENT_START && phandle as usize == 0x77 {
        // SAFETY: NCCL's contract for the callback: `handle` is a writable event-handle slot.
        unsafe { *handle = 0xE0 as *mut c_void };
    }
    NcclResult::SUCCESS
}

#[test]
fn net_profiler_handle_starts_updates_and_stops_through_the_callback() {
    let np = NetProfiler::new(Some(fake_callback));
    let mut d = raw::ncclProfilerNetSockDescr_v1_t {
        type_: raw::NCCL_PROFILE_SOCKET,
        sock: raw::ncclProfilerNetSockSockDescr_v1_t {
            fd: 3,
            op: 1,
            length: 1234,
        },
    };
    // SAFETY: 0x77/0x66/NULL stand for NCCL's request handles; only the fake callback sees them.
    let mut ev = unsafe { np.start(0x77 as *mut c_void, &mut d) }.unwrap();
    assert!(ev.is_active());
    d.sock.length = 99;
    np.update(&mut ev, &mut d).unwrap();
    np.stop(ev).unwrap();
    // NCCL left the handle NULL (NetPlugin inactive): later calls never reach it.
    // SAFETY: 0x77/0x66/NULL stand for NCCL's request handles; only the fake callback sees them.
    let declined = unsafe { np.start(0x66 as *mut c_void, &mut d) }.unwrap();
    assert!(!declined.is_active());
    np.update_and_stop(declined, &mut d).unwrap();
    // No request handle, or no callback: nothing is called.
    // SAFETY: 0x77/0x66/NULL stand for NCCL's request handles; only the fake callback sees them.
    assert!(!unsafe { np.start(null_mut(), &mut d) }.unwrap().is_active());
    // SAFETY: the callback is absent, so the handle is never used.
    let off = unsafe { NetProfiler::disabled().start(0x77 as *mut c_void, &mut d) };
    assert!(!off.unwrap().is_active());
    // The per-request binding reports through the same callback without `unsafe`.
    // SAFETY: 0x77 stands for NCCL's request handle; only the fake callback sees it.
    let req = unsafe { RequestProfiler::new(np, 0x77 as *mut c_void) };
    assert!(req.is_enabled() && !RequestProfiler::none().is_enabled());
    d.sock.length = 7;
    let ev = req.start(&mut d).unwrap();
    assert!(ev.is_active());
    req.stop(ev).unwrap();
    assert!(!RequestProfiler::none().start(&mut d).unwrap().is_active());
    let sock_id = i64::from(raw::NCCL_PROFILER_NET_TYPE_SOCK | 1);
    assert_eq!(
        *CALLS.lock().unwrap(),
        vec![
            (raw::NET_EVENT_START, 0, sock_id, 1234),
            (raw::NET_EVENT_UPDATE, 0xE0, 0, 99),
            (raw::NET_EVENT_STOP, 0xE0, 0, 0),
            (raw::NET_EVENT_START, 0, sock_id, 99),
            (raw::NET_EVENT_START, 0, sock_id, 7),
            (raw::NET_EVENT_STOP, 0xE0, 0, 0),
        ]
    );
}
