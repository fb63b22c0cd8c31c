//! Per-request profiler events (net v10+): the socket plugin reports each `isend` /
//! `irecv` through NCCL's callback with the socket descriptor v1, closes it with the
//! bytes that moved, and stays silent without a profiler or when it declines.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cclkit_abi::net::{Buf, InitArgs, Net, NetHandle, RecvBuf, Sizes};
use cclkit_abi::profiler::net::{NetDescriptor, NetProfiler, RequestProfiler};
use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::profiler::ncclProfilerNetSockDescr_v1_t;
use cclkit_net_socket::SocketNet;
use rand::Rng;

/// (kind, phandle, plugin id, event handle, descriptor op and length).
type Call = (c_int, usize, i64, usize, Option<(i32, usize)>);

static CALLS: Mutex<Vec<Call>> = Mutex::new(Vec::new());
/// Requests posted with this phandle are declined (NULL event handle).
const DECLINE: usize = 0x3000;

unsafe extern "C" fn record(
    e: *mut *mut c_void,
    kind: c_int,
    ph: *mut c_void,
    id: i64,
    data: *mut c_void,
) -> NcclResult {
    // SAFETY: the plugin passes NULL or a socket descriptor live for the call.
    let d = unsafe { data.cast::<ncclProfilerNetSockDescr_v1_t>().as_ref() };
    let d = d.map(|d| (d.sock.op, d.sock.length));
    let mut calls = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    if kind == 0 {
        let h = if ph as usize == DECLINE {
            0
        } else {
            0x100 + calls.len()
        };
        // SAFETY: the plugin passes a writable handle slot.
        unsafe { *e = h as *mut c_void };
    }
    // SAFETY: as above.
    let h = unsafe { *e } as usize;
    calls.push((kind, ph as usize, id, h, d));
    NcclResult::SUCCESS
}

type Req = <SocketNet as Net>::Request;

fn finish(req: &mut Req, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut size = 0;
    loop {
        // SAFETY: one int, enough for a single-buffer request.
        let mut sizes = unsafe { Sizes::from_raw(&mut size) };
        match SocketNet::test(req, &mut sizes) {
            Ok(true) => return if n == 1 { size as usize } else { 0 },
            Ok(false) => assert!(Instant::now() < deadline, "request never finished"),
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn requests_report_start_update_and_stop() {
    let prof = NetProfiler::new(Some(record));
    let net = SocketNet::init(&InitArgs {
        host_abi: 12,
        profiler: prof,
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
    let mut rng = rand::rng();
    let size: usize = rng.random_range(1..300_000);
    let cap = size + rng.random_range(0..1000usize);
    let mut src: Vec<u8> = (0..size).map(|_| rng.random()).collect();
    let mut dst = vec![0u8; cap];
    let id = ncclProfilerNetSockDescr_v1_t::PLUGIN_ID;
    for (sph, rph) in [(0x1000usize, 0x2000usize), (DECLINE, 0), (DECLINE, DECLINE)] {
        CALLS.lock().unwrap().clear();
        // SAFETY: a NULL phandle or one the test made up; the callback only logs it.
        let (sp, rp) = unsafe {
            (
                RequestProfiler::new(prof, sph as *mut c_void),
                RequestProfiler::new(prof, rph as *mut c_void),
            )
        };
        let bufs = [RecvBuf::<()> {
            // SAFETY: the buffers outlive the requests (finished below).
            buf: unsafe { Buf::new(dst.as_mut_ptr(), cap) },
            tag: 7,
            mr: None,
        }];
        let mut r = net
            .irecv_profiled(&mut recv, &bufs, false, rp)
            .expect("irecv")
            .expect("posted");
        // SAFETY: as above.
        let buf = unsafe { Buf::new(src.as_mut_ptr(), size) };
        let mut s = net
            .isend_profiled(&mut send, buf, 7, None, sp)
            .expect("isend")
            .expect("posted");
        assert_eq!(finish(&mut s, 1), size);
        assert_eq!(finish(&mut r, 1), size);
        drop((s, r));
        assert_eq!(dst[..size], src[..]);
        let calls = CALLS.lock().unwrap().clone();
        let mut want: Vec<Call> = Vec::new();
        if rph != 0 {
            let h = if rph == DECLINE { 0 } else { 0x100 };
            want.push((0, rph, id, h, Some((1, cap))));
        }
        let hs = if sph == DECLINE {
            0
        } else {
            0x100 + want.len()
        };
        want.push((0, sph, id, hs, Some((0, size))));
        // Completions (send first: it finished first), each an update then a stop.
        for (h, op) in [(hs, 0), (if rph == 0x2000 { 0x100 } else { 0 }, 1)] {
            if h != 0 {
                want.push((2, 0, 0, h, Some((op, size))));
                want.push((1, 0, 0, h, None));
            }
        }
        assert_eq!(calls, want, "phandles {sph:#x}/{rph:#x}");
        src.iter_mut().for_each(|b| *b = b.wrapping_add(1));
    }
    net.close_send(send).expect("close");
    net.close_recv(recv).expect("close");
}
