//! A grouped `irecv` through the exported v12 table hands the plugin every
//! buffer's profiler handle (NCCL's `phandles[r]`), as NCCL's IB transport uses
//! them: one event per buffer. The first `NET_PROFILER_GROUP_HANDLES` are kept; a
//! NULL array reports nothing.
//!
//! One test function: the plugin's state and the recorded calls are process-wide.

use std::ffi::{CStr, c_int, c_void};
use std::sync::Mutex;

#[macro_use]
mod common;

use cclkit_abi::error::Result;
use cclkit_abi::net::{Net, NetHandle, RecvBuf};
use cclkit_abi::profiler::net::{NET_PROFILER_GROUP_HANDLES, RequestProfiler};
use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::profiler::{NCCL_PROFILE_SOCKET, ncclProfilerNetSockDescr_v1_t};

/// Phandles the profiler callback saw on event starts, in order.
static STARTED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// `buffers()` of each profiler the plugin was given.
static GROUPS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

unsafe extern "C" fn record(
    e: *mut *mut c_void,
    kind: c_int,
    phandle: *mut c_void,
    _: i64,
    _: *mut c_void,
) -> NcclResult {
    if kind == 0 {
        STARTED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(phandle as usize);
        // SAFETY: the adapter passes a writable event-handle slot.
        unsafe { *e = 0xE0 as *mut c_void };
    }
    NcclResult::SUCCESS
}

struct GroupNet;

impl Net for GroupNet {
    const NAME: &'static CStr = c"group";
    fake_net_basics!();
    fn listen(&self, _: &(), _: usize, _: &mut NetHandle) -> Result<u32> {
        Ok(1)
    }
    fn connect(&self, _: &(), _: usize, _: &mut NetHandle) -> Result<Option<u32>> {
        Ok(Some(2))
    }
    fn accept(&self, _: &mut u32) -> Result<Option<u32>> {
        Ok(Some(3))
    }
    fn irecv(&self, _: &mut u32, _: &[RecvBuf<'_, ()>], _: bool) -> Result<Option<Box<u8>>> {
        Ok(Some(Box::new(0)))
    }
    fn irecv_profiled(
        &self,
        comm: &mut u32,
        bufs: &[RecvBuf<'_, ()>],
        optional_completion: bool,
        prof: RequestProfiler,
    ) -> Result<Option<Box<u8>>> {
        GROUPS.lock().expect("groups").push(prof.buffers());
        let mut d = ncclProfilerNetSockDescr_v1_t {
            type_: NCCL_PROFILE_SOCKET,
            ..Default::default()
        };
        // One event per buffer, as NCCL's IB transport starts them.
        for r in 0..bufs.len() {
            let ev = prof.for_buffer(r).start(&mut d)?;
            prof.stop(ev)?;
        }
        self.irecv(comm, bufs, optional_completion)
    }
}

cclkit_abi::export_net!(GroupNet);

#[test]
fn every_buffers_phandle_reaches_the_plugin() {
    let n = &ncclNetPlugin_v12;
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: v12 init with a context out-pointer, NULL config and logger, and the
    // recording profiler callback.
    let rc =
        unsafe { n.init.expect("init")(&mut ctx, 1, std::ptr::null_mut(), None, Some(record)) };
    assert_eq!(rc, NcclResult::SUCCESS);
    let mut handle = [0u8; 128];
    let (mut lc, mut rc_comm): (*mut c_void, *mut c_void) =
        (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: a 128-byte handle and out-pointers; NULL device handle.
    unsafe {
        assert!(n.listen.expect("listen")(ctx, 0, handle.as_mut_ptr().cast(), &mut lc).is_ok());
        assert!(n.accept.expect("accept")(lc, &mut rc_comm, std::ptr::null_mut()).is_ok());
    }
    // 3 buffers; then 10 (more than are kept); then 2 with no phandles at all.
    for (count, with_handles) in [(3usize, true), (10, true), (2, false)] {
        let mut store = vec![0u8; 64 * count];
        let mut data: Vec<*mut c_void> = store
            .chunks_mut(64)
            .map(|c| c.as_mut_ptr().cast())
            .collect();
        let mut sizes = vec![64usize; count];
        let mut tags: Vec<c_int> = (0..count as c_int).collect();
        let mut mh = vec![std::ptr::null_mut::<c_void>(); count];
        let mut ph: Vec<*mut c_void> = (0..count).map(|r| (0x100 + r) as *mut c_void).collect();
        let mut req: *mut c_void = std::ptr::null_mut();
        STARTED.lock().expect("started").clear();
        // SAFETY: arrays of `count` entries live across the call; the fake plugin
        // touches no buffer.
        let rc = unsafe {
            n.irecv.expect("irecv")(
                rc_comm,
                count as c_int,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mh.as_mut_ptr(),
                if with_handles {
                    ph.as_mut_ptr()
                } else {
                    std::ptr::null_mut()
                },
                &mut req,
            )
        };
        assert_eq!(rc, NcclResult::SUCCESS, "{count} buffers");
        let started = STARTED.lock().expect("started").clone();
        let kept = if with_handles {
            count.min(NET_PROFILER_GROUP_HANDLES)
        } else {
            0
        };
        let want: Vec<usize> = (0..kept).map(|r| 0x100 + r).collect();
        assert_eq!(started, want, "{count} buffers: one event per kept handle");
        let mut done = 0;
        // SAFETY: the request irecv returned; `done` is writable; NULL sizes.
        let rc = unsafe { n.test.expect("test")(req, &mut done, std::ptr::null_mut()) };
        assert!(rc.is_ok() && done == 1);
    }
    assert_eq!(
        *GROUPS.lock().expect("groups"),
        vec![3, NET_PROFILER_GROUP_HANDLES, 1]
    );
    // SAFETY: comms from accept and listen above.
    unsafe {
        assert!(n.closeRecv.expect("closeRecv")(rc_comm).is_ok());
        assert!(n.closeListen.expect("closeListen")(lc).is_ok());
    }
}
