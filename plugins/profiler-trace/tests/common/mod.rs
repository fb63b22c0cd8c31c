//! Helpers shared by the trace plugin's tests: drive the exported v7 table as NCCL does.
#![allow(dead_code, clippy::unwrap_used)]

use std::ffi::{CString, c_int, c_void};
use std::ptr::null_mut;

use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::profiler::{self as raw, ProfilerEventState};
use cclkit_profiler_trace::ncclProfiler_v7;

/// A fresh, empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "cclkit-prof-{tag}-{}-{}",
        std::process::id(),
        rand_u64()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Time-seeded 64-bit value (xorshift of the clock), printed so failures reproduce.
pub fn rand_u64() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let mut x = t.as_nanos() as u64 | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// `init` through the v7 table; returns the context and the mask NCCL would use.
pub fn init(comm_id: u64, rank: c_int, n_ranks: c_int) -> (*mut c_void, c_int) {
    let mut ctx = null_mut();
    let mut mask: c_int = 0;
    let name = CString::new("bench").unwrap();
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    let rc = unsafe {
        (ncclProfiler_v7.init.unwrap())(
            &mut ctx,
            comm_id,
            &mut mask,
            name.as_ptr(),
            1,
            n_ranks,
            rank,
            None,
        )
    };
    assert_eq!(rc, NcclResult::SUCCESS);
    (ctx, mask)
}

/// An all-zero v7 descriptor of one type.
pub fn descr(ty: u64, parent: *mut c_void, rank: c_int) -> raw::v7::ncclProfilerEventDescr_v7_t {
    // SAFETY: plain C data; zero is valid.
    let mut d: raw::v7::ncclProfilerEventDescr_v7_t = unsafe { std::mem::zeroed() };
    d.type_ = ty;
    d.parentObj = parent;
    d.rank = rank;
    d
}

/// `startEvent`; asserts success.
pub fn start(ctx: *mut c_void, d: &mut raw::v7::ncclProfilerEventDescr_v7_t) -> *mut c_void {
    let mut h = null_mut();
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    let rc = unsafe { (ncclProfiler_v7.startEvent.unwrap())(ctx, &mut h, d) };
    assert_eq!(rc, NcclResult::SUCCESS);
    h
}

/// `stopEvent`; asserts success.
pub fn stop(h: *mut c_void) {
    assert_eq!(
        // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
        unsafe { (ncclProfiler_v7.stopEvent.unwrap())(h) },
        NcclResult::SUCCESS
    );
}

/// `recordEventState` with a ProxyStep size.
pub fn step_state(h: *mut c_void, state: ProfilerEventState, bytes: usize) {
    let mut a = raw::ncclProfilerEventStateArgs_v4_t {
        proxyStep: raw::ncclProfilerProxyStepStateArgs_v4_t { transSize: bytes },
    };
    assert_eq!(
        // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
        unsafe { (ncclProfiler_v7.recordEventState.unwrap())(h, state, &mut a) },
        NcclResult::SUCCESS
    );
}

/// `finalize`; asserts success.
pub fn finalize(ctx: *mut c_void) {
    assert_eq!(
        // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
        unsafe { (ncclProfiler_v7.finalize.unwrap())(ctx) },
        NcclResult::SUCCESS
    );
}

/// A Coll descriptor for `func` over `count` float32s.
pub fn coll(
    parent: *mut c_void,
    func: &'static std::ffi::CStr,
    count: usize,
    seq: u64,
) -> raw::v7::ncclProfilerEventDescr_v7_t {
    let mut d = descr(raw::event::COLL, parent, 0);
    d.u.coll.seqNumber = seq;
    d.u.coll.func = func.as_ptr();
    d.u.coll.count = count;
    d.u.coll.datatype = c"ncclFloat32".as_ptr();
    d.u.coll.algo = c"RING".as_ptr();
    d.u.coll.proto = c"SIMPLE".as_ptr();
    d.u.coll.nChannels = 2;
    d
}

/// A ProxyOp descriptor.
pub fn proxy_op(
    parent: *mut c_void,
    channel: u8,
    peer: c_int,
    send: bool,
) -> raw::v7::ncclProfilerEventDescr_v7_t {
    let mut d = descr(raw::event::PROXY_OP, parent, 0);
    d.u.proxyOp = raw::ncclProfilerProxyOpDescr_v1_t {
        pid: 1,
        channelId: channel,
        peer,
        nSteps: 2,
        chunkSize: 4096,
        isSend: i32::from(send),
    };
    d
}

/// Parses a trace file.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}\n{text}", path.display()))
}

/// The complete (`X`) events of a trace.
pub fn spans(v: &serde_json::Value) -> Vec<serde_json::Value> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .cloned()
        .collect()
}
