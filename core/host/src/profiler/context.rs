//! One communicator's profiler context: `init`, events, `finalize`.

use std::ffi::{CString, c_int, c_void};
use std::fmt;
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cclkit_abi::profiler::{Event, EventState, StateArgs};
use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::profiler::{
    self as raw, ProfilerEventState, event as bit, ncclProfilerEventStateArgs_v1_t,
    ncclProfilerEventStateArgs_v4_t,
};

use super::ProfilerPlugin;
use super::encode::{self, Parents, Scratch, zeroed};
use super::encode_api;
use super::table::{ProfilerRef, RawProfiler};
use crate::logger;

/// A profiler's handle for one event: an opaque token, NULL when the event was not
/// started (masked out, declined, or the profiler failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EventHandle(pub usize);

impl EventHandle {
    /// No event.
    pub const NULL: EventHandle = EventHandle(0);

    /// Whether this is the NULL handle.
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }
}

/// What `init` is told about the communicator.
#[derive(Debug, Clone, Copy, Default)]
pub struct InitArgs<'a> {
    /// `commId` (v5+) / `commHash` (v4).
    pub comm_id: u64,
    /// The communicator's name, if the user set one.
    pub comm_name: Option<&'a str>,
    /// Nodes in the communicator.
    pub n_nodes: i32,
    /// Ranks in the communicator.
    pub n_ranks: i32,
    /// This rank.
    pub rank: i32,
}

/// A profiler call that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfilerError {
    /// The profiler's table name.
    pub plugin: Arc<str>,
    /// ABI version in use.
    pub version: u32,
    /// The slot called.
    pub call: &'static str,
    /// What it returned (raw `ncclResult_t`).
    pub code: NcclResult,
    /// The profiler's last WARN during the call.
    pub plugin_message: Option<String>,
}

impl fmt::Display for ProfilerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "profiler '{}' (v{}): {} returned {}",
            self.plugin, self.version, self.call, self.code
        )?;
        if let Some(m) = &self.plugin_message {
            write!(f, "; the plugin said: \"{m}\"")?;
        }
        Ok(())
    }
}

impl std::error::Error for ProfilerError {}

/// A profiler initialised for one communicator.
pub struct ProfilerContext {
    plugin: ProfilerPlugin,
    raw: RawProfiler,
    ctx: usize,
    comm_id: u64,
    mask: u64,
    rank: i32,
    errors: AtomicU64,
    finalized: AtomicBool,
    /// The communicator name given to `init` when it could not be kept for the
    /// process's life ([`encode::interned`]): the profiler may keep the pointer.
    _name: Option<CString>,
}

impl fmt::Debug for ProfilerContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ProfilerContext({:?}, mask {:#x})",
            self.plugin, self.mask
        )
    }
}

/// The mask bits that make NCCL start an event of type `ty`: its own, or any
/// type nested below it (profiler.cc starts a Coll when only ProxyStep is active, so
/// the step still has its ancestors).
pub const fn activated_by(ty: u64) -> u64 {
    const NET: u64 = bit::NET_PLUGIN;
    const STEP: u64 = bit::PROXY_STEP | NET;
    const OP: u64 = bit::PROXY_OP | STEP;
    const TASK: u64 = OP | bit::KERNEL_CH;
    const CE: u64 = bit::CE_COLL | bit::CE_SYNC | bit::CE_BATCH;
    match ty {
        bit::GROUP_API => {
            bit::GROUP_API
                | bit::COLL_API
                | bit::P2P_API
                | bit::KERNEL_LAUNCH
                | bit::GROUP
                | bit::COLL
                | bit::P2P
                | TASK
                | CE
        }
        bit::COLL_API => bit::COLL_API | bit::COLL | TASK | CE,
        bit::P2P_API => bit::P2P_API | bit::P2P | TASK,
        bit::GROUP => bit::GROUP | bit::COLL | bit::P2P | TASK,
        bit::COLL => bit::COLL | TASK,
        bit::P2P => bit::P2P | TASK,
        bit::PROXY_OP => OP,
        bit::PROXY_STEP => STEP,
        // profiler.cc starts the CeColl when any copy-engine bit is set: CeSync and
        // CeBatch are only sent under an accepted CeColl.
        bit::CE_COLL => CE,
        other => other,
    }
}

/// The highest state value each version defines (v1–v3 end at `ProxyCtrlAppendEnd`,
/// v4 adds 19–22, v5 23–24, v6 25–30, v7 31).
const fn last_state(version: u32) -> i32 {
    match version {
        1..=3 => 18,
        4 => 22,
        5 => 24,
        6 => 30,
        _ => 31,
    }
}

impl ProfilerContext {
    /// `init` for one communicator. The activation mask the profiler writes is kept,
    /// limited to the bits this version can emit.
    pub fn init(plugin: &ProfilerPlugin, args: &InitArgs<'_>) -> Result<Self, ProfilerError> {
        let raw = plugin.raw();
        // NCCL passes its communicator's name, valid until the communicator is
        // destroyed, and profilers keep it (NCCL's example profiler logs it at
        // finalize): the name is kept for the process's life, or with the context.
        let kept = args.comm_name.and_then(encode::interned);
        let name = match (args.comm_name, kept) {
            (Some(n), None) => CString::new(n.replace('\0', "")).ok(),
            _ => None,
        };
        let name_ptr = kept.or(name.as_ref().map(|n| n.as_ptr())).unwrap_or(null());
        let log = logger::logger();
        let mut ctx: *mut c_void = null_mut();
        let mut mask: c_int = 0;
        let (id, nodes, ranks, rank) = (args.comm_id, args.n_nodes, args.n_ranks, args.rank);
        let mark = logger::warn_mark();
        // SAFETY: each version's `init` with its own argument order and valid
        // out-pointers; the name outlives the call. Slots were checked non-NULL at load.
        let rc = unsafe {
            match raw.get() {
                ProfilerRef::V1(t) => t.init.map(|f| f(&mut ctx, &mut mask)),
                ProfilerRef::V2(t) => t.init.map(|f| f(&mut ctx, &mut mask)),
                ProfilerRef::V3(t) => t.init.map(|f| f(&mut ctx, &mut mask)),
                ProfilerRef::V4(t) => t
                    .init
                    .map(|f| f(&mut ctx, &mut mask, name_ptr, id, nodes, ranks, rank, log)),
                ProfilerRef::V5(t) => t
                    .init
                    .map(|f| f(&mut ctx, id, &mut mask, name_ptr, nodes, ranks, rank, log)),
                ProfilerRef::V6(t) => t
                    .init
                    .map(|f| f(&mut ctx, id, &mut mask, name_ptr, nodes, ranks, rank, log)),
                ProfilerRef::V7(t) => t
                    .init
                    .map(|f| f(&mut ctx, id, &mut mask, name_ptr, nodes, ranks, rank, log)),
            }
        }
        .unwrap_or(NcclResult::INTERNAL_ERROR);
        if !rc.is_ok() {
            return Err(ProfilerError {
                plugin: plugin.name_arc(),
                version: raw.version(),
                call: "init",
                code: rc,
                plugin_message: logger::warn_since(mark),
            });
        }
        let mask = u64::from(mask as u32) & bit::known(raw.version());
        tracing::debug!(target: "cclkit::profiler", "profiler '{}' init: mask {mask:#x}", plugin.name());
        Ok(Self {
            plugin: plugin.clone(),
            raw,
            ctx: ctx as usize,
            comm_id: args.comm_id,
            mask,
            rank: args.rank,
            errors: AtomicU64::new(0),
            finalized: AtomicBool::new(false),
            _name: name,
        })
    }

    /// The communicator id `init` was given (`commId` / `commHash`): NCCL also puts
    /// it in v1–v3 Coll and P2p descriptors.
    pub fn comm_id(&self) -> u64 {
        self.comm_id
    }

    /// The activation mask (`ncclProfile*` bits) the profiler asked for.
    pub fn mask(&self) -> u64 {
        self.mask
    }

    /// Whether events of type `bits` are active.
    pub fn wants(&self, bits: u64) -> bool {
        self.mask & bits != 0
    }

    /// The rank given to `init` (descriptors carry it).
    pub fn rank(&self) -> i32 {
        self.rank
    }

    /// The plugin.
    pub fn plugin(&self) -> &ProfilerPlugin {
        &self.plugin
    }

    /// Profiler calls that returned an error so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    fn failed(&self, call: &'static str, rc: NcclResult) {
        if self.errors.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                target: "cclkit::profiler",
                "profiler '{}' (v{}): {call} returned {rc}; the event is dropped (further errors are counted, not logged)",
                self.plugin.name(),
                self.raw.version()
            );
        }
    }

    fn outcome(&self, call: &'static str, rc: Option<NcclResult>, h: *mut c_void) -> EventHandle {
        match rc {
            Some(rc) if rc.is_ok() => EventHandle(h as usize),
            Some(rc) => {
                self.failed(call, rc);
                EventHandle::NULL
            }
            None => EventHandle::NULL,
        }
    }

    /// `startEvent`: NULL when neither the event's type nor a descendant's is in the
    /// mask ([`activated_by`]), the version cannot express it, or the profiler
    /// declined or failed.
    pub fn start(&self, ev: &Event<'_>, parents: Parents) -> EventHandle {
        if self.mask & activated_by(ev.kind.type_bit()) == 0 {
            return EventHandle::NULL;
        }
        let mut sc = Scratch::default();
        let mut h: *mut c_void = null_mut();
        let c = self.ctx as *mut c_void;
        macro_rules! go {
            ($t:expr, $enc:expr) => {
                $enc(ev, parents, &mut sc)
                    .and_then(|mut d| $t.startEvent.map(|f| f(c, &mut h, &mut d)))
            };
        }
        // SAFETY: the descriptor is complete for its version and lives (with its
        // strings in `sc`) until the call returns; `h` is a writable out-pointer.
        let rc = unsafe {
            match self.raw.get() {
                ProfilerRef::V1(t) => go!(t, encode::v1),
                ProfilerRef::V2(t) => go!(t, encode::v2),
                ProfilerRef::V3(t) => go!(t, encode::v3),
                ProfilerRef::V4(t) => go!(t, encode::v4),
                ProfilerRef::V5(t) => go!(t, encode_api::v5),
                ProfilerRef::V6(t) => go!(t, encode_api::v6),
                ProfilerRef::V7(t) => go!(t, encode_api::v7),
            }
        };
        self.outcome("startEvent", rc, h)
    }

    /// Starts a NetPlugin event (v3+) under `parent` with the net plugin's own
    /// descriptor `data` (read by the profiler only during the call).
    pub fn start_net(&self, parent: EventHandle, plugin_id: i64, data: *mut c_void) -> EventHandle {
        if self.mask & bit::NET_PLUGIN == 0 {
            return EventHandle::NULL;
        }
        let net = raw::ncclProfilerNetPluginDescr_v3_t {
            id: plugin_id,
            data,
        };
        let mut h: *mut c_void = null_mut();
        let c = self.ctx as *mut c_void;
        macro_rules! go {
            ($t:expr, $ty:ty) => {{
                let mut d: $ty = zeroed();
                d.type_ = bit::NET_PLUGIN as _;
                d.parentObj = parent.0 as *mut c_void;
                d.rank = self.rank;
                d.u.netPlugin = net;
                $t.startEvent.map(|f| f(c, &mut h, &mut d))
            }};
        }
        use cclkit_abi::raw::profiler::{v3, v4, v5, v6, v7};
        // SAFETY: a complete NetPlugin descriptor of the table's version; `data` is
        // the net plugin's descriptor, live during its callback (which calls this).
        let rc = unsafe {
            match self.raw.get() {
                ProfilerRef::V1(_) | ProfilerRef::V2(_) => None,
                ProfilerRef::V3(t) => go!(t, v3::ncclProfilerEventDescr_v3_t),
                ProfilerRef::V4(t) => go!(t, v4::ncclProfilerEventDescr_v4_t),
                ProfilerRef::V5(t) => go!(t, v5::ncclProfilerEventDescr_v5_t),
                ProfilerRef::V6(t) => go!(t, v6::ncclProfilerEventDescr_v6_t),
                ProfilerRef::V7(t) => go!(t, v7::ncclProfilerEventDescr_v7_t),
            }
        };
        self.outcome("startEvent", rc, h)
    }

    /// `recordEventState`; a no-op on a NULL handle and for states the version does
    /// not define.
    pub fn record(&self, h: EventHandle, state: &EventState) {
        record_raw(self.raw, h, state, |rc| self.failed("recordEventState", rc));
    }

    /// `stopEvent`; a no-op on a NULL handle.
    pub fn stop(&self, h: EventHandle) {
        stop_raw(self.raw, h, |rc| self.failed("stopEvent", rc));
    }

    /// `finalize` (once; dropping the context does it too).
    pub fn finalize(&self) -> Result<(), ProfilerError> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let c = self.ctx as *mut c_void;
        let f = match self.raw.get() {
            ProfilerRef::V1(t) => t.finalize,
            ProfilerRef::V2(t) => t.finalize,
            ProfilerRef::V3(t) => t.finalize,
            ProfilerRef::V4(t) => t.finalize,
            ProfilerRef::V5(t) => t.finalize,
            ProfilerRef::V6(t) => t.finalize,
            ProfilerRef::V7(t) => t.finalize,
        };
        let mark = logger::warn_mark();
        // SAFETY: the context came from this table's `init` and is finalized once.
        let rc = f.map_or(NcclResult::INTERNAL_ERROR, |f| unsafe { f(c) });
        if rc.is_ok() {
            Ok(())
        } else {
            Err(ProfilerError {
                plugin: self.plugin.name_arc(),
                version: self.raw.version(),
                call: "finalize",
                code: rc,
                plugin_message: logger::warn_since(mark),
            })
        }
    }
}

impl Drop for ProfilerContext {
    fn drop(&mut self) {
        if let Err(e) = self.finalize() {
            tracing::warn!(target: "cclkit::profiler", "{e}");
        }
    }
}

/// `recordEventState` through `raw` (shared with the net-plugin callback).
pub(super) fn record_raw(
    raw: RawProfiler,
    h: EventHandle,
    state: &EventState,
    failed: impl Fn(NcclResult),
) {
    let v = raw.version();
    if h.is_null() || state.state.0 < 0 || state.state.0 > last_state(v) {
        return;
    }
    let e = h.0 as *mut c_void;
    // Every version gets a valid arguments pointer: profilers read it without checks.
    let mut a1: ncclProfilerEventStateArgs_v1_t = zeroed();
    let mut a4: ncclProfilerEventStateArgs_v4_t = zeroed();
    match state.args {
        StateArgs::None => {}
        StateArgs::ProxyOp { trans_size, steps } => {
            a1.proxyOp = raw::ncclProfilerProxyOpStateArgs_v1_t {
                transSize: trans_size,
                steps,
            };
            a4.proxyStep.transSize = trans_size;
        }
        StateArgs::ProxyStep { trans_size } => {
            a1.proxyOp = raw::ncclProfilerProxyOpStateArgs_v1_t {
                transSize: trans_size,
                steps: 0,
            };
            a4.proxyStep.transSize = trans_size;
        }
        StateArgs::ProxyCtrl { appended_proxy_ops } => {
            a1.proxyCtrl.appendedProxyOps = appended_proxy_ops;
            a4.proxyCtrl.appendedProxyOps = appended_proxy_ops;
        }
        StateArgs::NetPlugin { data } => a4.netPlugin.data = data as *mut c_void,
        StateArgs::Timer { ptimer } => a4.kernelCh.pTimer = ptimer,
    }
    let s: ProfilerEventState = state.state;
    // SAFETY: `e` came from this table's `startEvent`; the arguments live for the call.
    let rc = unsafe {
        match raw.get() {
            ProfilerRef::V1(t) => t.recordEventState.map(|f| f(e, s, &mut a1)),
            ProfilerRef::V2(t) => t.recordEventState.map(|f| f(e, s, &mut a1)),
            ProfilerRef::V3(t) => t.recordEventState.map(|f| f(e, s, &mut a1)),
            ProfilerRef::V4(t) => t.recordEventState.map(|f| f(e, s, &mut a4)),
            ProfilerRef::V5(t) => t.recordEventState.map(|f| f(e, s, &mut a4)),
            ProfilerRef::V6(t) => t.recordEventState.map(|f| f(e, s, &mut a4)),
            ProfilerRef::V7(t) => t.recordEventState.map(|f| f(e, s, &mut a4)),
        }
    };
    if let Some(rc) = rc.filter(|rc| !rc.is_ok()) {
        failed(rc);
    }
}

/// `stopEvent` through `raw` (shared with the net-plugin callback).
pub(super) fn stop_raw(raw: RawProfiler, h: EventHandle, failed: impl Fn(NcclResult)) {
    if h.is_null() {
        return;
    }
    let f = match raw.get() {
        ProfilerRef::V1(t) => t.stopEvent,
        ProfilerRef::V2(t) => t.stopEvent,
        ProfilerRef::V3(t) => t.stopEvent,
        ProfilerRef::V4(t) => t.stopEvent,
        ProfilerRef::V5(t) => t.stopEvent,
        ProfilerRef::V6(t) => t.stopEvent,
        ProfilerRef::V7(t) => t.stopEvent,
    };
    let Some(f) = f else { return };
    // SAFETY: `h` came from this table's `startEvent`.
    let rc = unsafe { f(h.0 as *mut c_void) };
    if !rc.is_ok() {
        failed(rc);
    }
}
