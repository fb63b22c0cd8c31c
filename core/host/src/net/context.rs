//! One communicator's use of a net plugin: `init` … `finalize`, devices, properties,
//! listen and connect.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cclkit_abi::raw::net::{
    NCCL_NET_MAX_DEVS_PER_NIC_V11, NCCL_NET_MAX_DEVS_PER_NIC_V12, NCCL_NET_TRAFFIC_CLASS_UNDEF,
    ncclNetAttr_v11_t, ncclNetCommConfig_v10_t, ncclNetVDeviceProps_v9_t,
    ncclNetVDeviceProps_v12_t,
};

use super::comm::{Connecting, ListenComm};
use super::table::{Init, TableRef, common_slot};
use super::{CommConfig, ConnectHandle, NetError, NetPlugin, Properties, null, props};
use crate::logger;

/// A net plugin initialised for one communicator.
///
/// Dropping it finalizes the plugin for this communicator once its comms are closed:
/// `finalize(ctx)` for v11+, a refcount decrement for older versions (whose `init`
/// runs once while any context exists, as NCCL's shims do).
pub struct NetContext {
    /// The plugin and its context pointer, shared with the comms (raw layer).
    pub inner: Arc<CtxInner>,
}

pub struct CtxInner {
    pub plugin: NetPlugin,
    /// v11+: the plugin's context; v10: our config, passed to `connect`; else NULL.
    pub ctx: *mut c_void,
    /// Owns the v10 config that `ctx` points to.
    _config_v10: Option<Box<ncclNetCommConfig_v10_t>>,
    comm_id: u64,
    finalized: bool,
}

// SAFETY: `ctx` is an opaque value owned by the plugin, which NCCL hands to the plugin
// from any thread (listen on the main thread, connect on the proxy thread); the
// plugin must accept that (ABI contract). The boxed config is never mutated.
unsafe impl Send for CtxInner {}
// SAFETY: as above; `&CtxInner` only reads `ctx` and passes it to the plugin.
unsafe impl Sync for CtxInner {}

impl NetContext {
    pub(crate) fn init(
        plugin: NetPlugin,
        comm_id: u64,
        config: CommConfig,
    ) -> Result<Self, NetError> {
        let s = &plugin.shared;
        let init = s.raw.init().ok_or_else(|| s.missing("init"))?;
        let mut raw_config = ncclNetCommConfig_v10_t {
            trafficClass: config.traffic_class.unwrap_or(NCCL_NET_TRAFFIC_CLASS_UNDEF),
        };
        let mut ctx = null();
        let mut config_v10 = None;
        match init {
            Init::V11(f) => {
                let mark = logger::warn_mark();
                let prof = crate::profiler::callback::active();
                // SAFETY: v11+ `init(ctx, commId, config, logger, profiler)` with valid
                // out-pointer and config; the profiler callback may be NULL.
                let rc = unsafe { f(&mut ctx, comm_id, &mut raw_config, logger::logger(), prof) };
                s.check("init", mark, rc)?;
                if let Err(e) = completed(s) {
                    // net.cc `ncclNetPluginInit`: a plugin that fails after its `init`
                    // succeeded is finalized (when it has a `finalize` to call).
                    if let Some(fin) = s.raw.finalize() {
                        // SAFETY: `finalize(ctx)` once, with the ctx `init` returned.
                        let _ = unsafe { fin(ctx) };
                    }
                    return Err(e);
                }
            }
            Init::V10(_) | Init::V6(_) => {
                legacy_acquire(&plugin, init)?;
                if let Err(e) = completed(s) {
                    legacy_release(&plugin);
                    return Err(e);
                }
                if let Init::V10(_) = init {
                    // net_v10.cc: the config lives in a small allocation used as ctx.
                    let mut b = Box::new(raw_config);
                    ctx = (&mut *b as *mut ncclNetCommConfig_v10_t).cast();
                    config_v10 = Some(b);
                }
            }
        }
        Ok(Self {
            inner: Arc::new(CtxInner {
                plugin,
                ctx,
                _config_v10: config_v10,
                comm_id,
                finalized: false,
            }),
        })
    }

    /// The plugin this context belongs to.
    pub fn plugin(&self) -> &NetPlugin {
        &self.inner.plugin
    }

    /// The communicator id passed to `init`.
    pub fn comm_id(&self) -> u64 {
        self.inner.comm_id
    }

    /// `devices()`: the number of devices (a negative count is an error).
    pub fn devices(&self) -> Result<usize, NetError> {
        let s = &self.inner.plugin.shared;
        let f = common_slot!(s.raw, devices).ok_or_else(|| s.missing("devices"))?;
        let mut n: c_int = 0;
        let mark = logger::warn_mark();
        // SAFETY: `devices(int*)` with a valid out-pointer.
        let rc = unsafe { f(&mut n) };
        s.check("devices", mark, rc)?;
        usize::try_from(n).map_err(|_| s.refuse("devices", format!("reported {n} devices")))
    }

    /// `getProperties(dev)`, converted to the current layout (see the module docs).
    pub fn properties(&self, dev: usize) -> Result<Properties, NetError> {
        props::get(&self.inner.plugin.shared, dev)
    }

    /// `listen(dev)`: returns the handle to send to the peer and the listening comm.
    pub fn listen(&self, dev: usize) -> Result<(ConnectHandle, ListenComm), NetError> {
        let s = &self.inner.plugin.shared;
        let d = dev_int(s, "listen", dev)?;
        let mut handle: ConnectHandle = [0; cclkit_abi::raw::net::NCCL_NET_HANDLE_MAXSIZE];
        let h = handle.as_mut_ptr().cast::<c_void>();
        let mut lc = null();
        let mark = logger::warn_mark();
        // SAFETY: `listen` of the table's version with a 128-byte handle
        // buffer and a valid out-pointer; `ctx` is this context's (v11+).
        let rc = unsafe {
            match s.raw.get() {
                TableRef::V6(t) => t.listen.map(|f| f(d, h, &mut lc)),
                TableRef::V7(t) => t.listen.map(|f| f(d, h, &mut lc)),
                TableRef::V8(t) => t.listen.map(|f| f(d, h, &mut lc)),
                TableRef::V9(t) => t.listen.map(|f| f(d, h, &mut lc)),
                TableRef::V10(t) => t.listen.map(|f| f(d, h, &mut lc)),
                TableRef::V11(t) => t.listen.map(|f| f(self.inner.ctx, d, h, &mut lc)),
                TableRef::V12(t) => t.listen.map(|f| f(self.inner.ctx, d, h, &mut lc)),
            }
        }
        .ok_or_else(|| s.missing("listen"))?;
        s.check("listen", mark, rc)?;
        let comm = ListenComm::new(Arc::clone(&self.inner), lc)
            .ok_or_else(|| s.refuse("listen", "returned success but no listenComm"))?;
        Ok((handle, comm))
    }

    /// Starts connecting to the peer that sent `handle`; drive it with
    /// [`Connecting::poll`] (connect is non-blocking since net v5).
    pub fn connect(&self, dev: usize, handle: &ConnectHandle) -> Connecting {
        Connecting::new(Arc::clone(&self.inner), dev, handle)
    }

    /// `setNetAttr(ctx, attr)` (v11+). Returns `Ok(false)` when the plugin has no such
    /// hook (NCCL ignores the result either way).
    pub fn set_net_attr(&self, attr: &ncclNetAttr_v11_t) -> Result<bool, NetError> {
        let s = &self.inner.plugin.shared;
        let f = match s.raw.get() {
            TableRef::V11(t) => t.setNetAttr,
            TableRef::V12(t) => t.setNetAttr,
            _ => None,
        };
        let Some(f) = f else { return Ok(false) };
        let mut a = *attr;
        let mark = logger::warn_mark();
        // SAFETY: `setNetAttr(ctx, attr*)` with this context and a valid attribute copy.
        let rc = unsafe { f(self.inner.ctx, &mut a) };
        s.check("setNetAttr", mark, rc).map(|()| true)
    }

    /// `makeVDevice(devs)` (v9+): fuses physical devices; returns the new device index,
    /// or `Ok(None)` if the plugin has no such hook.
    pub fn make_vdevice(&self, devs: &[i32]) -> Result<Option<usize>, NetError> {
        let s = &self.inner.plugin.shared;
        let max = if s.raw.version() >= 12 {
            NCCL_NET_MAX_DEVS_PER_NIC_V12
        } else {
            NCCL_NET_MAX_DEVS_PER_NIC_V11
        };
        if devs.is_empty() || devs.len() > max {
            return Err(s.refuse(
                "makeVDevice",
                format!(
                    "{} devices; net v{} fuses 1 to {max}",
                    devs.len(),
                    s.raw.version()
                ),
            ));
        }
        let mut d: c_int = -1;
        let mark = logger::warn_mark();
        let rc = match s.raw.get() {
            TableRef::V12(t) => t.makeVDevice.map(|f| {
                let mut v = ncclNetVDeviceProps_v12_t {
                    ndevs: devs.len() as c_int,
                    ..Default::default()
                };
                v.devs[..devs.len()].copy_from_slice(devs);
                // SAFETY: valid out-pointer and a v12 vProps with `ndevs` ≤ 8 entries.
                unsafe { f(&mut d, &mut v) }
            }),
            TableRef::V9(t) => t.makeVDevice.map(|f| make_v9(f, &mut d, devs)),
            TableRef::V10(t) => t.makeVDevice.map(|f| make_v9(f, &mut d, devs)),
            TableRef::V11(t) => t.makeVDevice.map(|f| make_v9(f, &mut d, devs)),
            _ => None,
        };
        let Some(rc) = rc else { return Ok(None) };
        s.check("makeVDevice", mark, rc)?;
        usize::try_from(d)
            .map(Some)
            .map_err(|_| s.refuse("makeVDevice", format!("returned device index {d}")))
    }

    /// Finalizes now if no comm is open and returns `Ok(true)`; otherwise returns
    /// `Ok(false)` and the finalize happens when the last comm closes.
    pub fn finalize(self) -> Result<bool, NetError> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => inner.finalize().map(|()| true),
            Err(_) => Ok(false),
        }
    }
}

type MakeV9 = unsafe extern "C" fn(
    *mut c_int,
    *mut ncclNetVDeviceProps_v9_t,
) -> cclkit_abi::raw::common::NcclResult;

fn make_v9(f: MakeV9, d: &mut c_int, devs: &[i32]) -> cclkit_abi::raw::common::NcclResult {
    let mut v = ncclNetVDeviceProps_v9_t {
        ndevs: devs.len() as c_int,
        ..Default::default()
    };
    v.devs[..devs.len()].copy_from_slice(devs);
    // SAFETY: valid out-pointer and a v9 vProps with `ndevs` ≤ 4 entries (checked).
    unsafe { f(d, &mut v) }
}

/// Pre-v11 `init`: run the plugin's `init` only when no context is alive.
fn legacy_acquire(plugin: &NetPlugin, init: Init) -> Result<(), NetError> {
    let s = &plugin.shared;
    let mut refs = s.legacy_refs.lock().unwrap_or_else(|p| p.into_inner());
    if *refs == 0 {
        let mark = logger::warn_mark();
        let rc = match init {
            // SAFETY: pre-v11 `init(logger[, profiler])`; the profiler may be NULL.
            Init::V6(f) => unsafe { f(logger::logger()) },
            // SAFETY: as above.
            Init::V10(f) => unsafe { f(logger::logger(), crate::profiler::callback::active()) },
            Init::V11(_) => return Ok(()),
        };
        s.check("init", mark, rc)?;
    }
    *refs += 1;
    Ok(())
}

/// Undoes [`legacy_acquire`] for a context that was never made.
fn legacy_release(plugin: &NetPlugin) {
    let mut refs = plugin
        .shared
        .legacy_refs
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    *refs = refs.saturating_sub(1);
}

/// The second half of NCCL's table check: the slots NCCL calls unconditionally after
/// `init` must be there now (a plugin may fill them in during `init`).
fn completed(s: &super::NetShared) -> Result<(), NetError> {
    s.raw.check_after_init().map_err(|c| {
        let slot = match c {
            crate::error::Cause::MissingFunction { slot } => slot,
            _ => "a required function",
        };
        s.refuse(
            "init",
            format!(
                "init returned success but the v{} table's '{slot}' is still NULL \
                 (NCCL calls it right after init)",
                s.raw.version()
            ),
        )
    })
}

/// A device index as the C `int` the ABI takes.
pub(crate) fn dev_int(
    s: &super::NetShared,
    call: &'static str,
    dev: usize,
) -> Result<c_int, NetError> {
    c_int::try_from(dev).map_err(|_| s.refuse(call, format!("device {dev} out of range")))
}

impl CtxInner {
    fn finalize(&mut self) -> Result<(), NetError> {
        if std::mem::replace(&mut self.finalized, true) {
            return Ok(());
        }
        let s = &self.plugin.shared;
        match s.raw.get() {
            TableRef::V11(_) | TableRef::V12(_) => {
                let f = s.raw.finalize().ok_or_else(|| s.missing("finalize"))?;
                let mark = logger::warn_mark();
                // SAFETY: `finalize(ctx)` once, with the ctx `init` returned.
                let rc = unsafe { f(self.ctx) };
                s.check("finalize", mark, rc)
            }
            _ => {
                let mut refs = s.legacy_refs.lock().unwrap_or_else(|p| p.into_inner());
                *refs = refs.saturating_sub(1);
                Ok(())
            }
        }
    }
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        if let Err(e) = self.finalize() {
            tracing::warn!(subsys = cclkit_abi::raw::common::subsys::NET, "{e}");
        }
    }
}
