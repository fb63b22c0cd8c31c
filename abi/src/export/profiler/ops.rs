//! Operations behind the profiler tables: context and handle bookkeeping around
//! the trait calls. Trait methods always run outside the registry's locks.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex};

use super::slab::{self, EventToken, MAX_CONTEXTS, Miss, Slab};
use super::{Context, ProfilerExport};
use crate::error::{Error, Result};
use crate::profiler::{Event, EventMask, EventState, ProfilerInit};

/// Communicator facts a v4+ `init` passes.
pub(crate) struct CommInfo {
    pub comm_id: u64,
    pub comm_name: *const c_char,
    pub n_nodes: c_int,
    pub n_ranks: c_int,
    pub rank: c_int,
}

fn context<P: ProfilerExport>(index: usize) -> Option<Arc<Context<P>>> {
    let g = P::state().contexts.read().ok()?;
    g.get(index).and_then(Clone::clone)
}

/// # Safety
/// `ctx` and `mask` must be NULL or writable; `comm.comm_name` NULL or a C string.
pub(crate) unsafe fn init<P: ProfilerExport>(
    host_abi: u32,
    ctx: *mut *mut c_void,
    mask: *mut c_int,
    comm: Option<CommInfo>,
) -> Result<()> {
    if ctx.is_null() || mask.is_null() {
        return Err(Error::invalid_argument(
            "profiler init: context or activation-mask out-pointer is NULL",
        ));
    }
    // SAFETY: checked non-NULL; NCCL passes its (process-wide) mask.
    let current = unsafe { mask.read() };
    let name = comm
        .as_ref()
        .filter(|c| !c.comm_name.is_null())
        // SAFETY: caller's contract: a NUL-terminated name.
        .and_then(|c| unsafe { CStr::from_ptr(c.comm_name) }.to_str().ok());
    let args = ProfilerInit {
        host_abi,
        comm_id: comm.as_ref().map(|c| c.comm_id),
        comm_name: name,
        n_nodes: comm.as_ref().map(|c| c.n_nodes),
        n_ranks: comm.as_ref().map(|c| c.n_ranks),
        rank: comm.as_ref().map(|c| c.rank),
        current_mask: EventMask(u64::from(current as u32)),
    };
    let (profiler, wanted) = P::init(&args)?;
    let mut contexts = P::state()
        .contexts
        .write()
        .map_err(|_| Error::internal("profiler registry poisoned"))?;
    let index = match contexts.iter().position(Option::is_none) {
        Some(i) => i,
        None if contexts.len() < MAX_CONTEXTS => {
            contexts.push(None);
            contexts.len() - 1
        }
        None => {
            return Err(Error::internal(format!(
                "profiler: {MAX_CONTEXTS} communicators already profiled in this process"
            )));
        }
    };
    contexts[index] = Some(Arc::new(Context {
        profiler,
        host_abi,
        events: Mutex::new(Slab::new(index, P::MAX_EVENTS)),
    }));
    drop(contexts);
    // The mask is an `int` holding bits 0–15; bits the host cannot know stay clear.
    let bits = wanted.for_version(host_abi).0 as u32 as c_int;
    // SAFETY: both checked non-NULL above.
    unsafe {
        mask.write(bits);
        ctx.write(slab::ctx_token(index) as usize as *mut c_void);
    }
    Ok(())
}

fn ctx_index(ctx: *mut c_void) -> Result<usize> {
    slab::ctx_of_token(ctx as usize as u64).ok_or_else(|| {
        Error::invalid_argument(format!("{ctx:p} is not a context of this profiler"))
    })
}

/// Starts `event` in context `ctx`, writing the new handle (or NULL) to `out`.
///
/// # Safety
/// `out` must be NULL or writable.
pub(crate) unsafe fn start<P: ProfilerExport>(
    ctx: *mut c_void,
    out: *mut *mut c_void,
    parent: *mut c_void,
    event: &Event<'_>,
) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid_argument("startEvent: eHandle is NULL"));
    }
    // Declined unless everything below succeeds.
    // SAFETY: checked non-NULL.
    unsafe { out.write(std::ptr::null_mut()) };
    let index = ctx_index(ctx)?;
    let c = context::<P>(index)
        .ok_or_else(|| Error::invalid_usage("startEvent on a finalized profiler context"))?;
    // A parent from another context, a declined (NULL) one or one long evicted
    // simply yields no parent: NCCL hands out whatever the parent's start returned.
    let parent = EventToken::decode(parent as usize as u64)
        .filter(|t| t.ctx == index)
        .and_then(|t| c.events.lock().ok()?.any(t));
    let (token, evicted) = c
        .events
        .lock()
        .map_err(|_| Error::internal("profiler event table poisoned"))?
        .reserve();
    drop(evicted);
    let Some(token) = token else {
        crate::nccl_trace!(
            crate::raw::common::subsys::PROFILE,
            "profiler: {} events live, declining a {}",
            P::MAX_EVENTS,
            event.kind.name()
        );
        return Ok(());
    };
    // A panic must not leak the reserved slot: release it, then let the guard report.
    let started = match catch_unwind(AssertUnwindSafe(|| {
        c.profiler.start_event(event, parent.as_deref())
    })) {
        Ok(r) => r,
        Err(payload) => {
            if let Ok(mut e) = c.events.lock() {
                e.release(token);
            }
            resume_unwind(payload);
        }
    };
    let mut events = c
        .events
        .lock()
        .map_err(|_| Error::internal("profiler event table poisoned"))?;
    match started {
        Ok(Some(record)) => {
            events.fill(token, Arc::new(record));
            // SAFETY: checked non-NULL.
            unsafe { out.write(token.encode() as usize as *mut c_void) };
            Ok(())
        }
        Ok(None) => {
            events.release(token);
            Ok(())
        }
        Err(e) => {
            events.release(token);
            Err(e)
        }
    }
}

fn resolve<P: ProfilerExport>(
    handle: *mut c_void,
    what: &str,
) -> Result<Option<(Arc<Context<P>>, EventToken)>> {
    if handle.is_null() {
        // NCCL passes the NULL a declined start produced: nothing to do.
        return Ok(None);
    }
    let token = EventToken::decode(handle as usize as u64).ok_or_else(|| {
        Error::invalid_argument(format!(
            "{what}: {handle:p} is not an event handle of this profiler"
        ))
    })?;
    let c = context::<P>(token.ctx).ok_or_else(|| {
        Error::invalid_usage(format!("{what}: {handle:p} belongs to a finalized context"))
    })?;
    Ok(Some((c, token)))
}

fn miss(what: &str, handle: *mut c_void, m: Miss) -> Error {
    match m {
        Miss::Stopped => {
            Error::invalid_usage(format!("{what}: event {handle:p} was already stopped"))
        }
        Miss::Unknown => Error::invalid_argument(format!("{what}: {handle:p} is stale or unknown")),
    }
}

/// Stops the event `handle` (NULL: no-op).
pub(crate) fn stop<P: ProfilerExport>(handle: *mut c_void) -> Result<()> {
    let Some((c, token)) = resolve::<P>(handle, "stopEvent")? else {
        return Ok(());
    };
    let record = c
        .events
        .lock()
        .map_err(|_| Error::internal("profiler event table poisoned"))?
        .stop(token)
        .map_err(|m| miss("stopEvent", handle, m))?;
    c.profiler.stop_event(&record)
}

/// Records a state of the event `handle` (NULL: no-op).
pub(crate) fn record<P: ProfilerExport>(handle: *mut c_void, state: &EventState) -> Result<()> {
    let Some((c, token)) = resolve::<P>(handle, "recordEventState")? else {
        return Ok(());
    };
    let record = c
        .events
        .lock()
        .map_err(|_| Error::internal("profiler event table poisoned"))?
        .live(token)
        .map_err(|m| miss("recordEventState", handle, m))?;
    c.profiler.record_state(&record, state)
}

/// Finalizes and forgets context `ctx`.
pub(crate) fn finalize<P: ProfilerExport>(ctx: *mut c_void) -> Result<()> {
    let index = ctx_index(ctx)?;
    let c = P::state()
        .contexts
        .write()
        .map_err(|_| Error::internal("profiler registry poisoned"))?
        .get_mut(index)
        .and_then(Option::take)
        .ok_or_else(|| {
            Error::invalid_usage(format!(
                "finalize: context {ctx:p} is not live (double finalize?)"
            ))
        })?;
    let held = c.events.lock().map(|e| e.len()).unwrap_or(0);
    crate::nccl_trace!(
        crate::raw::common::subsys::PROFILE,
        "profiler finalize (ABI v{}): {held} events still held",
        c.host_abi
    );
    c.profiler.finalize()
}
