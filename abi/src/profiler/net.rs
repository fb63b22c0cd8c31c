//! The net-plugin side: a safe handle on the profiler callback NCCL passes to net
//! `init` (v10+), used to report a transport's own events (NCCL_ABI.md §1.3).
//!
//! NCCL turns each callback into a NetPlugin event of the active profiler, nested
//! under the proxy step whose per-request profiler handle (`phandle` of net
//! `isend`/`irecv` v10+) the plugin passes to [`NetProfiler::start`]. When no
//! profiler is loaded, or it did not activate NetPlugin events, NCCL leaves the
//! event handle NULL and every later call on it is a no-op here.

use std::ffi::c_void;

use crate::error::{Error, Result};
use crate::raw::common::ncclProfilerCallback_t;
use crate::raw::profiler::{
    NCCL_PROFILER_NET_IB_VER, NCCL_PROFILER_NET_SOCKET_VER, NCCL_PROFILER_NET_TYPE_IB,
    NCCL_PROFILER_NET_TYPE_SOCK, NET_EVENT_START, NET_EVENT_STOP, NET_EVENT_UPDATE,
    NET_EVENT_UPDATE_AND_STOP, ncclProfilerNetIbDescr_v1_t, ncclProfilerNetSockDescr_v1_t,
};

/// A descriptor a net plugin can report, with the plugin id that names its layout.
///
/// # Safety
/// `PLUGIN_ID` must name `Self`'s exact C layout: profilers decode `data` by it.
pub unsafe trait NetDescriptor {
    /// `NCCL_PROFILER_NET_TYPE_* | version`.
    const PLUGIN_ID: i64;
}

// SAFETY: the socket v1 id names exactly this layout (asserted in raw::profiler).
unsafe impl NetDescriptor for ncclProfilerNetSockDescr_v1_t {
    const PLUGIN_ID: i64 = (NCCL_PROFILER_NET_TYPE_SOCK | NCCL_PROFILER_NET_SOCKET_VER) as i64;
}

// SAFETY: the IB v1 id names exactly this layout.
unsafe impl NetDescriptor for ncclProfilerNetIbDescr_v1_t {
    const PLUGIN_ID: i64 = (NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER) as i64;
}

/// The profiler callback a net plugin received in `init` (or none).
#[derive(Debug, Clone, Copy, Default)]
pub struct NetProfiler {
    callback: ncclProfilerCallback_t,
}

/// A started network event; NULL inside when NCCL declined it. Stop it exactly once
/// (by value), on any thread.
#[derive(Debug)]
#[must_use = "a started network event must be stopped"]
pub struct NetEvent(*mut c_void);

// SAFETY: the handle is an opaque token NCCL's profiler resolves on any thread; the
// callback itself is thread-safe (NCCL calls it from proxy and helper threads).
unsafe impl Send for NetEvent {}

impl NetEvent {
    /// Whether a profiler accepted the event (a non-NULL handle).
    pub fn is_active(&self) -> bool {
        !self.0.is_null()
    }
}

impl NetProfiler {
    /// Wraps the callback from net `init` (NULL: reporting is off).
    pub const fn new(callback: ncclProfilerCallback_t) -> Self {
        Self { callback }
    }

    /// No profiler: every call is a no-op.
    pub const fn disabled() -> Self {
        Self { callback: None }
    }

    /// Whether NCCL gave a callback at all.
    pub fn is_enabled(&self) -> bool {
        self.callback.is_some()
    }

    /// Starts an event under the request whose profiler handle is `phandle` (the
    /// `phandle` NCCL passed to `isend`/`irecv`; NULL starts nothing). NCCL and the
    /// profiler read `descr` only during this call.
    ///
    /// # Safety
    /// `phandle` must be NULL or the profiler handle NCCL passed with the request
    /// being reported (NCCL dereferences it).
    pub unsafe fn start<D: NetDescriptor>(
        &self,
        phandle: *mut c_void,
        descr: &mut D,
    ) -> Result<NetEvent> {
        let mut handle: *mut c_void = std::ptr::null_mut();
        let Some(cb) = self.callback else {
            return Ok(NetEvent(handle));
        };
        if phandle.is_null() {
            return Ok(NetEvent(handle));
        }
        // SAFETY: `handle` is a writable out-pointer that NCCL may leave untouched
        // (it stays NULL); `descr` is live for the call and matches its id;
        // `phandle` is NCCL's (caller's contract).
        let rc = unsafe {
            cb(
                &mut handle,
                NET_EVENT_START,
                phandle,
                D::PLUGIN_ID,
                (descr as *mut D).cast(),
            )
        };
        if rc.is_ok() {
            Ok(NetEvent(handle))
        } else {
            Err(Error::new(
                rc,
                "profiler callback failed to start a net event",
            ))
        }
    }

    fn call(&self, event: &mut NetEvent, kind: i32, data: *mut c_void) -> Result<()> {
        let Some(cb) = self.callback else {
            return Ok(());
        };
        if event.0.is_null() {
            return Ok(());
        }
        // SAFETY: `event.0` is the handle NCCL gave on start; `data` is NULL or a
        // descriptor live for the call.
        let rc = unsafe { cb(&mut event.0, kind, std::ptr::null_mut(), 0, data) };
        if rc.is_ok() {
            Ok(())
        } else {
            Err(Error::new(rc, "profiler callback failed"))
        }
    }

    /// Records an update (NCCL's `NetPluginUpdate` state) with a new descriptor.
    pub fn update<D: NetDescriptor>(&self, event: &mut NetEvent, descr: &mut D) -> Result<()> {
        self.call(event, NET_EVENT_UPDATE, (descr as *mut D).cast())
    }

    /// Stops the event.
    pub fn stop(&self, mut event: NetEvent) -> Result<()> {
        self.call(&mut event, NET_EVENT_STOP, std::ptr::null_mut())
    }

    /// Records a final update and stops the event.
    pub fn update_and_stop<D: NetDescriptor>(
        &self,
        mut event: NetEvent,
        descr: &mut D,
    ) -> Result<()> {
        self.call(
            &mut event,
            NET_EVENT_UPDATE_AND_STOP,
            (descr as *mut D).cast(),
        )
    }
}

/// Profiler handles a [`RequestProfiler`] keeps for one grouped receive: NCCL's
/// own plugins take at most 8 buffers per receive (`maxRecvs`); the handles of
/// any further buffers are not kept, and their buffers report nothing.
pub const NET_PROFILER_GROUP_HANDLES: usize = 8;

/// The profiler callback bound to one request's `phandle`, so a net plugin can report
/// that request's events without `unsafe`. The export adapters build it from the
/// `phandle` NCCL passes to `isend`/`irecv` (v10+); `Send`, so a plugin may keep it
/// with the request and report from its progress thread.
///
/// A grouped receive has one handle per buffer (NCCL's `phandles[r]`):
/// [`start`](Self::start) reports under the first, and
/// [`for_buffer`](Self::for_buffer) gives the profiler of buffer `r`, as NCCL's IB
/// transport starts one event per buffer and QP.
#[derive(Debug, Clone, Copy)]
pub struct RequestProfiler {
    profiler: NetProfiler,
    phandles: [*mut c_void; NET_PROFILER_GROUP_HANDLES],
    n: usize,
}

// SAFETY: `phandles` are NCCL's per-request tokens, valid until the request completes
// and usable from any thread (NCCL's own socket plugin reports from helper threads).
unsafe impl Send for RequestProfiler {}

impl RequestProfiler {
    /// Binds `profiler` to one request.
    ///
    /// # Safety
    /// `phandle` must be NULL or the profiler handle NCCL passed with this request,
    /// and the value must not be used after the request completed.
    pub unsafe fn new(profiler: NetProfiler, phandle: *mut c_void) -> Self {
        // SAFETY: forwarded contract, for a group of one.
        unsafe { Self::new_grouped(profiler, &[phandle]) }
    }

    /// Binds `profiler` to a grouped receive: `phandles[r]` is buffer `r`'s handle
    /// (the first [`NET_PROFILER_GROUP_HANDLES`] are kept; none at all reports nothing).
    ///
    /// # Safety
    /// Every entry must be NULL or the profiler handle NCCL passed for that buffer
    /// of this request, and none may be used after the request completed.
    pub unsafe fn new_grouped(profiler: NetProfiler, phandles: &[*mut c_void]) -> Self {
        let n = phandles.len().min(NET_PROFILER_GROUP_HANDLES);
        let mut kept = [std::ptr::null_mut(); NET_PROFILER_GROUP_HANDLES];
        kept[..n].copy_from_slice(&phandles[..n]);
        Self {
            profiler,
            phandles: kept,
            n: n.max(1),
        }
    }

    /// Nothing to report to (no callback, or NCCL gave no handle).
    pub fn none() -> Self {
        Self {
            profiler: NetProfiler::disabled(),
            phandles: [std::ptr::null_mut(); NET_PROFILER_GROUP_HANDLES],
            n: 1,
        }
    }

    /// Whether events can reach a profiler at all (under any buffer's handle).
    pub fn is_enabled(&self) -> bool {
        self.profiler.is_enabled() && self.phandles[..self.n].iter().any(|p| !p.is_null())
    }

    /// Buffers whose handles this profiler holds (1 unless grouped).
    pub fn buffers(&self) -> usize {
        self.n
    }

    /// The profiler of buffer `r` of a grouped receive, reporting under that
    /// buffer's handle ([`none`](Self::none) past the handles kept).
    pub fn for_buffer(&self, r: usize) -> RequestProfiler {
        match self.phandles[..self.n].get(r) {
            // SAFETY: the handle came through `new_grouped`, whose contract covers it.
            Some(&p) => unsafe { Self::new(self.profiler, p) },
            None => Self::none(),
        }
    }

    /// Starts an event of this request under its first handle (see
    /// [`NetProfiler::start`]; [`for_buffer`](Self::for_buffer) for the others).
    pub fn start<D: NetDescriptor>(&self, descr: &mut D) -> Result<NetEvent> {
        // SAFETY: `new`'s contract: the handle is NCCL's for this live request.
        unsafe { self.profiler.start(self.phandles[0], descr) }
    }

    /// Records an update of an event of this request.
    pub fn update<D: NetDescriptor>(&self, event: &mut NetEvent, descr: &mut D) -> Result<()> {
        self.profiler.update(event, descr)
    }

    /// Stops an event of this request.
    pub fn stop(&self, event: NetEvent) -> Result<()> {
        self.profiler.stop(event)
    }
}
