//! The `extern "C"` entry points of the profiler tables and the const fns building them.

use std::ffi::{c_char, c_int, c_void};

use super::{ProfilerExport, ops};
use crate::error::Error;
use crate::export::guard::guard;
use crate::log::set_logger;
use crate::profiler::{self as sdk, EventState};
use crate::raw::common::{NcclResult, ncclDebugLogger_t};
use crate::raw::profiler::*;

/// v1–v3 `init(context, eActivationMask)`.
unsafe extern "C" fn init_v1<P: ProfilerExport, const V: u32>(
    ctx: *mut *mut c_void,
    mask: *mut c_int,
) -> NcclResult {
    // SAFETY: NCCL passes writable out-pointers (checked for NULL inside).
    guard("ncclProfiler.init", || unsafe {
        ops::init::<P>(V, ctx, mask, None)
    })
}

/// v4 `init`: mask before the communicator, `commHash` after its name.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn init_v4<P: ProfilerExport>(
    ctx: *mut *mut c_void,
    mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    n_ranks: c_int,
    rank: c_int,
    log: ncclDebugLogger_t,
) -> NcclResult {
    set_logger(log);
    let comm = ops::CommInfo {
        comm_id: comm_hash,
        comm_name,
        n_nodes,
        n_ranks,
        rank,
    };
    // SAFETY: NCCL passes writable out-pointers and a C string (or NULL).
    guard("ncclProfiler.init", || unsafe {
        ops::init::<P>(4, ctx, mask, Some(comm))
    })
}

/// v5–v7 `init`: `commId` right after the context.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn init_v5<P: ProfilerExport, const V: u32>(
    ctx: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    n_ranks: c_int,
    rank: c_int,
    log: ncclDebugLogger_t,
) -> NcclResult {
    set_logger(log);
    let comm = ops::CommInfo {
        comm_id,
        comm_name,
        n_nodes,
        n_ranks,
        rank,
    };
    // SAFETY: as init_v4.
    guard("ncclProfiler.init", || unsafe {
        ops::init::<P>(V, ctx, mask, Some(comm))
    })
}

/// Defines `startEvent` for one descriptor version.
macro_rules! start_fn {
    ($name:ident, $descr:ty, $decode:path) => {
        unsafe extern "C" fn $name<P: ProfilerExport>(
            ctx: *mut c_void,
            out: *mut *mut c_void,
            descr: *mut $descr,
        ) -> NcclResult {
            guard("ncclProfiler.startEvent", || {
                // SAFETY: NCCL passes NULL or its descriptor, live for the call.
                let Some(d) = (unsafe { descr.as_ref() }) else {
                    if !out.is_null() {
                        // SAFETY: non-NULL out-pointer from NCCL.
                        unsafe { out.write(std::ptr::null_mut()) };
                    }
                    return Err(Error::invalid_argument("startEvent: eDescr is NULL"));
                };
                // SAFETY: NCCL initialises the member `type` selects (see decode).
                let event = unsafe { $decode(d) };
                // SAFETY: `out` is NULL (rejected) or writable.
                unsafe { ops::start::<P>(ctx, out, d.parentObj, &event) }
            })
        }
    };
}

start_fn!(start_v1, v1::ncclProfilerEventDescr_v1_t, sdk::event_v1);
start_fn!(start_v2, v2::ncclProfilerEventDescr_v2_t, sdk::event_v2);
start_fn!(start_v3, v3::ncclProfilerEventDescr_v3_t, sdk::event_v3);
start_fn!(start_v4, v4::ncclProfilerEventDescr_v4_t, sdk::event_v4);
start_fn!(start_v5, v5::ncclProfilerEventDescr_v5_t, sdk::event_v5);
start_fn!(start_v6, v6::ncclProfilerEventDescr_v6_t, sdk::event_v6);
start_fn!(start_v7, v7::ncclProfilerEventDescr_v7_t, sdk::event_v7);

unsafe extern "C" fn stop<P: ProfilerExport>(handle: *mut c_void) -> NcclResult {
    guard("ncclProfiler.stopEvent", || ops::stop::<P>(handle))
}

unsafe extern "C" fn record_v1<P: ProfilerExport>(
    handle: *mut c_void,
    state: ProfilerEventState,
    args: *mut ncclProfilerEventStateArgs_v1_t,
) -> NcclResult {
    guard("ncclProfiler.recordEventState", || {
        // SAFETY: NCCL passes NULL or its arguments, live for the call.
        let s = unsafe { EventState::from_v1(state, args) };
        ops::record::<P>(handle, &s)
    })
}

unsafe extern "C" fn record_v4<P: ProfilerExport>(
    handle: *mut c_void,
    state: ProfilerEventState,
    args: *mut ncclProfilerEventStateArgs_v4_t,
) -> NcclResult {
    guard("ncclProfiler.recordEventState", || {
        // SAFETY: as record_v1.
        let s = unsafe { EventState::from_v4(state, args) };
        ops::record::<P>(handle, &s)
    })
}

unsafe extern "C" fn finalize<P: ProfilerExport>(ctx: *mut c_void) -> NcclResult {
    guard("ncclProfiler.finalize", || ops::finalize::<P>(ctx))
}

/// `ncclProfiler_v1` for `P`.
pub const fn v1<P: ProfilerExport>() -> v1::ncclProfiler_v1_t {
    v1::ncclProfiler_v1_t {
        name: P::NAME.as_ptr(),
        init: Some(init_v1::<P, 1>),
        startEvent: Some(start_v1::<P>),
        stopEvent: Some(stop::<P>),
        recordEventState: Some(record_v1::<P>),
        finalize: Some(finalize::<P>),
    }
}

/// `ncclProfiler_v2` for `P`.
pub const fn v2<P: ProfilerExport>() -> v2::ncclProfiler_v2_t {
    v2::ncclProfiler_v2_t {
        name: P::NAME.as_ptr(),
        init: Some(init_v1::<P, 2>),
        startEvent: Some(start_v2::<P>),
        stopEvent: Some(stop::<P>),
        recordEventState: Some(record_v1::<P>),
        finalize: Some(finalize::<P>),
    }
}

/// `ncclProfiler_v3` for `P`.
pub const fn v3<P: ProfilerExport>() -> v3::ncclProfiler_v3_t {
    v3::ncclProfiler_v3_t {
        name: P::NAME.as_ptr(),
        init: Some(init_v1::<P, 3>),
        startEvent: Some(start_v3::<P>),
        stopEvent: Some(stop::<P>),
        recordEventState: Some(record_v1::<P>),
        finalize: Some(finalize::<P>),
    }
}

/// `ncclProfiler_v4` for `P`.
pub const fn v4<P: ProfilerExport>() -> v4::ncclProfiler_v4_t {
    v4::ncclProfiler_v4_t {
        name: P::NAME.as_ptr(),
        init: Some(init_v4::<P>),
        startEvent: Some(start_v4::<P>),
        stopEvent: Some(stop::<P>),
        recordEventState: Some(record_v4::<P>),
        finalize: Some(finalize::<P>),
    }
}

/// `ncclProfiler_v5` for `P`.
pub const fn v5<P: ProfilerExport>() -> v5::ncclProfiler_v5_t {
    v5::ncclProfiler_v5_t {
        name: P::NAME.as_ptr(),
        init: Some(init_v5::<P, 5>),
        startEvent: Some(start_v5::<P>),
        stopEvent: Some(stop::<P>),
        recordEventState: Some(record_v4::<P>),
        finalize: Some(finalize::<P>),
    }
}

/// `ncclProfiler_v6` for `P`.
pub const fn v6<P: ProfilerExport>() -> v6::ncclProfiler_v6_t {
    v6::ncclProfiler_v6_t {
        name: P::NAME.as_ptr(),
        init: Some(init_v5::<P, 6>),
        startEvent: Some(start_v6::<P>),
        stopEvent: Some(stop::<P>),
        recordEventState: Some(record_v4::<P>),
        finalize: Some(finalize::<P>),
    }
}

/// `ncclProfiler_v7` for `P`.
pub const fn v7<P: ProfilerExport>() -> v7::ncclProfiler_v7_t {
    v7::ncclProfiler_v7_t {
        name: P::NAME.as_ptr(),
        init: Some(init_v5::<P, 7>),
        startEvent: Some(start_v7::<P>),
        stopEvent: Some(stop::<P>),
        recordEventState: Some(record_v4::<P>),
        finalize: Some(finalize::<P>),
    }
}
