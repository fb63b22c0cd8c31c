//! The profiler callback handed to net plugins (net `init` v10+): NCCL's
//! `ncclProfilerCallback`, turning a net plugin's report into a NetPlugin event of
//! the loaded profiler, nested under the proxy step that posted the request.
//!
//! The `phandle` given with each `isend`/`irecv` is a [`StepHandle`]: the step's
//! context and event. `start` reads it; `stop` and `update` only get the event handle,
//! so they go to the profiler [`install`]ed for the process (NCCL too has exactly one
//! profiler per process). A NULL `phandle` or a NULL event handle is a no-op.

use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::RwLock;

use cclkit_abi::profiler::{EventState, StateArgs};
use cclkit_abi::raw::common::{NcclResult, ncclProfilerCallback_t};
use cclkit_abi::raw::profiler::{
    NET_EVENT_START, NET_EVENT_STOP, NET_EVENT_UPDATE, NET_EVENT_UPDATE_AND_STOP,
    ProfilerEventState,
};

use super::ProfilerPlugin;
use super::context::{EventHandle, ProfilerContext, record_raw, stop_raw};

/// What a proxy step passes to a net plugin as the request's `phandle`.
///
/// Keep it at a fixed address (boxed or in a slot) until the request completes: the
/// net plugin may call back with it at any time until then.
#[derive(Debug)]
#[repr(C)]
pub struct StepHandle {
    ctx: *const ProfilerContext,
    step: EventHandle,
}

// SAFETY: the context is `Sync` (profilers are called from any thread) and outlives
// every request of its communicator (the runtime's ownership order).
unsafe impl Send for StepHandle {}

impl StepHandle {
    /// The handle of `step` in `ctx`.
    pub fn new(ctx: &ProfilerContext, step: EventHandle) -> Self {
        Self { ctx, step }
    }

    /// The step event.
    pub fn step(&self) -> EventHandle {
        self.step
    }

    /// The `phandle` to pass to `isend`/`irecv` (NULL when the step has no event, so
    /// the net plugin's reports cost nothing).
    pub fn as_phandle(&mut self) -> *mut c_void {
        if self.step.is_null() {
            std::ptr::null_mut()
        } else {
            (self as *mut StepHandle).cast()
        }
    }
}

static ACTIVE: RwLock<Option<ProfilerPlugin>> = RwLock::new(None);

/// Makes `plugin` the one net-plugin reports are stopped and updated through.
pub fn install(plugin: &ProfilerPlugin) {
    *ACTIVE.write().unwrap_or_else(|p| p.into_inner()) = Some(plugin.clone());
}

/// The callback function itself (for tests and tools that drive net plugins).
pub fn callback() -> ncclProfilerCallback_t {
    Some(net_callback)
}

/// What net `init` (v10+) gets: the callback once a profiler is [`install`]ed, else
/// NULL (as NCCL passes no callback without a profiler).
pub fn active() -> ncclProfilerCallback_t {
    let installed = ACTIVE.read().unwrap_or_else(|p| p.into_inner()).is_some();
    if installed { callback() } else { None }
}

fn with_active(f: impl FnOnce(&ProfilerPlugin)) {
    if let Some(p) = ACTIVE.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
        f(p);
    }
}

fn update(h: EventHandle, data: *mut c_void) {
    let state = EventState {
        state: ProfilerEventState::NET_PLUGIN_UPDATE,
        args: StateArgs::NetPlugin {
            data: data as usize,
        },
    };
    with_active(|p| record_raw(p.raw(), h, &state, |_| {}));
}

fn stop(h: EventHandle) {
    with_active(|p| stop_raw(p.raw(), h, |_| {}));
}

/// `ncclProfilerCallback_t`.
///
/// # Safety
/// As NCCL's: `e_handle` is NULL or a writable handle slot; `p_handle` is NULL or a
/// live [`StepHandle`]; `ext_data` is NULL or the net plugin's descriptor for
/// `plugin_id`, live during the call.
unsafe extern "C" fn net_callback(
    e_handle: *mut *mut c_void,
    kind: c_int,
    p_handle: *mut c_void,
    plugin_id: i64,
    ext_data: *mut c_void,
) -> NcclResult {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if e_handle.is_null() {
            return NcclResult::INVALID_ARGUMENT;
        }
        match kind {
            NET_EVENT_START => {
                // SAFETY: caller's contract: NULL or a live StepHandle.
                let Some(sh) = (unsafe { p_handle.cast::<StepHandle>().as_ref() }) else {
                    return NcclResult::SUCCESS;
                };
                // SAFETY: the context outlives the step's requests (see StepHandle).
                let Some(ctx) = (unsafe { sh.ctx.as_ref() }) else {
                    return NcclResult::SUCCESS;
                };
                let h = ctx.start_net(sh.step, plugin_id, ext_data);
                // SAFETY: non-NULL writable slot (checked above).
                unsafe { *e_handle = h.0 as *mut c_void };
                NcclResult::SUCCESS
            }
            NET_EVENT_STOP | NET_EVENT_UPDATE | NET_EVENT_UPDATE_AND_STOP => {
                // SAFETY: non-NULL readable slot (checked above).
                let h = EventHandle(unsafe { *e_handle } as usize);
                if kind != NET_EVENT_STOP {
                    update(h, ext_data);
                }
                if kind != NET_EVENT_UPDATE {
                    stop(h);
                }
                NcclResult::SUCCESS
            }
            _ => NcclResult::INVALID_ARGUMENT,
        }
    }));
    r.unwrap_or(NcclResult::INTERNAL_ERROR)
}
