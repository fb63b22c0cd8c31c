//! The template profiler driven through its exported v6 table, as NCCL 2.29–2.30 would.
#![allow(clippy::unwrap_used)]

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::profiler::{self as raw, ProfilerEventState, event as bit};
use cclkit_profiler_template::ncclProfiler_v6;

fn descr(ty: u64, parent: *mut c_void) -> raw::v6::ncclProfilerEventDescr_v6_t {
    // SAFETY: plain C data; zero is valid.
    let mut d: raw::v6::ncclProfilerEventDescr_v6_t = unsafe { std::mem::zeroed() };
    d.type_ = ty;
    d.parentObj = parent;
    d
}

fn start(ctx: *mut c_void, d: &mut raw::v6::ncclProfilerEventDescr_v6_t) -> *mut c_void {
    let mut h = null_mut();
    // SAFETY: the exported entry point with a live descriptor and out-pointer.
    let rc = unsafe { (ncclProfiler_v6.startEvent.unwrap())(ctx, &mut h, d) };
    assert_eq!(rc, NcclResult::SUCCESS);
    h
}

fn stop(h: *mut c_void) {
    // SAFETY: the exported entry point; `h` came from start (or is NULL).
    let rc = unsafe { (ncclProfiler_v6.stopEvent.unwrap())(h) };
    assert_eq!(rc, NcclResult::SUCCESS);
}

#[test]
fn counts_events_and_bytes_per_communicator() {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let seed = t.as_nanos() as u64;
    let (step_bytes, net_bytes) = (seed % 100_003 + 1, (seed >> 17) % 65_521 + 1);
    eprintln!("seed {seed}");
    let out =
        std::env::temp_dir().join(format!("cclkit-template-{}-{seed}.txt", std::process::id()));
    // SAFETY: the only test in this binary; nothing else reads the environment now.
    unsafe { std::env::set_var("CCLKIT_TEMPLATE_PROFILE_OUT", &out) };

    let (mut ctx, mut mask): (*mut c_void, c_int) = (null_mut(), 0);
    // SAFETY: the exported entry point with writable out-pointers.
    let rc = unsafe {
        (ncclProfiler_v6.init.unwrap())(&mut ctx, 9, &mut mask, std::ptr::null(), 1, 4, 3, None)
    };
    assert_eq!(rc, NcclResult::SUCCESS);
    assert_eq!(
        mask as u64,
        bit::COLL | bit::P2P | bit::PROXY_OP | bit::PROXY_STEP | bit::NET_PLUGIN
    );

    let coll = start(ctx, &mut descr(bit::COLL, null_mut()));
    let step = start(ctx, &mut descr(bit::PROXY_STEP, coll));
    let mut args = raw::ncclProfilerEventStateArgs_v4_t {
        proxyStep: raw::ncclProfilerProxyStepStateArgs_v4_t {
            transSize: step_bytes as usize,
        },
    };
    // SAFETY: the exported entry point with a live handle and arguments.
    let rc = unsafe {
        (ncclProfiler_v6.recordEventState.unwrap())(
            step,
            ProfilerEventState::PROXY_STEP_SEND_WAIT,
            &mut args,
        )
    };
    assert_eq!(rc, NcclResult::SUCCESS);
    let mut sock = raw::ncclProfilerNetSockDescr_v1_t {
        type_: raw::NCCL_PROFILE_SOCKET,
        sock: raw::ncclProfilerNetSockSockDescr_v1_t {
            fd: 5,
            op: 0,
            length: net_bytes as usize,
        },
    };
    let mut n = descr(bit::NET_PLUGIN, step);
    n.u.netPlugin.id = i64::from(raw::NCCL_PROFILER_NET_TYPE_SOCK | 1);
    n.u.netPlugin.data = (&mut sock as *mut raw::ncclProfilerNetSockDescr_v1_t).cast();
    let net = start(ctx, &mut n);
    // An unknown type (a newer NCCL) is declined with a NULL handle.
    let odd = start(ctx, &mut descr(1 << 20, null_mut()));
    assert!(odd.is_null());
    stop(odd);
    stop(step);
    stop(coll);
    // SAFETY: the exported entry point with the context from init.
    let rc = unsafe { (ncclProfiler_v6.finalize.unwrap())(ctx) };
    assert_eq!(rc, NcclResult::SUCCESS);
    let _ = net; // never stopped: counted as started only

    let line = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(
        line,
        format!(
            "rank=3 Coll=1/1 ProxyStep=1/1 NetPlugin=1/0 stepBytes={step_bytes} netBytes={net_bytes}\n"
        )
    );
}
