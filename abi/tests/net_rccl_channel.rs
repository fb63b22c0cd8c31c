//! RCCL's channel id reaches a Rust net plugin through `rccl_channel()` inside
//! `connect`/`accept` when the host is RCCL, is `None` under NCCL, and nothing is ever
//! written through the device-handle argument that carries it.
//!
//! One test function: the host rule reads the process environment.

use std::ffi::{CStr, c_void};
use std::sync::Mutex;

#[macro_use]
mod common;

use cclkit_abi::error::Result;
use cclkit_abi::export::net::channel::rccl_channel;
use cclkit_abi::net::{Net, NetHandle, RecvBuf};
use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::net::ncclNetDeviceHandle_v7_t;

/// `(call, channel)` as the plugin saw them.
static SEEN: Mutex<Vec<(&'static str, Option<u32>)>> = Mutex::new(Vec::new());

fn saw(call: &'static str) {
    SEEN.lock().expect("seen").push((call, rccl_channel()));
}

struct ChanNet;

impl Net for ChanNet {
    const NAME: &'static CStr = c"chan";
    fake_net_basics!();
    fn listen(&self, _: &(), _: usize, _: &mut NetHandle) -> Result<u32> {
        saw("listen");
        Ok(1)
    }
    fn connect(&self, _: &(), _: usize, _: &mut NetHandle) -> Result<Option<u32>> {
        saw("connect");
        Ok(Some(2))
    }
    fn accept(&self, _: &mut u32) -> Result<Option<u32>> {
        saw("accept");
        Ok(Some(3))
    }
    fn irecv(&self, _: &mut u32, _: &[RecvBuf<'_, ()>], _: bool) -> Result<Option<Box<u8>>> {
        Ok(None)
    }
}

cclkit_abi::export_net!(ChanNet);

fn set_flavor(f: &str) {
    // SAFETY: the only test of this binary; no other thread reads the environment.
    unsafe { std::env::set_var("CCLKIT_FLAVOR", f) };
}

#[test]
fn channel_id_under_rccl_only_and_never_written() {
    let n = &ncclNetPlugin_v12;
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: v12 init with a context out-pointer; NULL config, logger and profiler.
    let rc = unsafe { n.init.expect("init")(&mut ctx, 1, std::ptr::null_mut(), None, None) };
    assert_eq!(rc, NcclResult::SUCCESS);
    let mut handle = [0u8; 128];
    let mut lc: *mut c_void = std::ptr::null_mut();
    // SAFETY: a 128-byte handle and a listenComm out-pointer.
    let rc = unsafe { n.listen.expect("listen")(ctx, 0, handle.as_mut_ptr().cast(), &mut lc) };
    assert_eq!(rc, NcclResult::SUCCESS);

    for (flavor, ch_send, ch_recv) in [("rccl", 0x0005_0007u32, 11u32), ("nccl", 5, 9)] {
        set_flavor(flavor);
        // RCCL's ncclNet_ctxt_t followed by a guard word; under NCCL the same bytes
        // stand for the device-handle slot (8 bytes) the plugin must leave alone.
        let mut send_ctxt: [u32; 2] = [ch_send, 0xa5a5_a5a5];
        let mut recv_ctxt: [u32; 2] = [ch_recv, 0x5a5a_5a5a];
        let (send_before, recv_before) = (send_ctxt, recv_ctxt);
        let mut sc: *mut c_void = std::ptr::null_mut();
        let mut rcomm: *mut c_void = std::ptr::null_mut();
        // SAFETY: live context, the handle from listen, out-pointers, and an 8-byte
        // device-handle argument.
        unsafe {
            let rc = n.connect.expect("connect")(
                ctx,
                0,
                handle.as_mut_ptr().cast(),
                &mut sc,
                send_ctxt
                    .as_mut_ptr()
                    .cast::<*mut ncclNetDeviceHandle_v7_t>(),
            );
            assert_eq!(rc, NcclResult::SUCCESS);
            let rc = n.accept.expect("accept")(
                lc,
                &mut rcomm,
                recv_ctxt
                    .as_mut_ptr()
                    .cast::<*mut ncclNetDeviceHandle_v7_t>(),
            );
            assert_eq!(rc, NcclResult::SUCCESS);
            assert_eq!(n.closeSend.expect("closeSend")(sc), NcclResult::SUCCESS);
            assert_eq!(n.closeRecv.expect("closeRecv")(rcomm), NcclResult::SUCCESS);
        }
        assert_eq!(
            (send_ctxt, recv_ctxt),
            (send_before, recv_before),
            "{flavor}: untouched"
        );
        let seen: Vec<_> = SEEN.lock().expect("seen").drain(..).collect();
        let rccl = flavor == "rccl";
        let want = vec![
            ("connect", rccl.then_some(ch_send)),
            ("accept", rccl.then_some(ch_recv)),
        ];
        let got: Vec<_> = seen.into_iter().filter(|(c, _)| *c != "listen").collect();
        assert_eq!(got, want, "{flavor}");
        assert_eq!(rccl_channel(), None, "only inside the call");
    }
    // NULL device-handle argument under RCCL: no channel, no crash.
    set_flavor("rccl");
    let mut sc: *mut c_void = std::ptr::null_mut();
    // SAFETY: as above with a NULL device-handle argument.
    let rc = unsafe {
        n.connect.expect("connect")(
            ctx,
            0,
            handle.as_mut_ptr().cast(),
            &mut sc,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, NcclResult::SUCCESS);
    assert_eq!(SEEN.lock().expect("seen").pop(), Some(("connect", None)));
    // SAFETY: the comms from above, closed once.
    unsafe {
        assert_eq!(n.closeSend.expect("closeSend")(sc), NcclResult::SUCCESS);
        assert_eq!(n.closeListen.expect("closeListen")(lc), NcclResult::SUCCESS);
        assert_eq!(n.finalize.expect("finalize")(ctx), NcclResult::SUCCESS);
    }
    set_flavor("");
}
