//! Net export: the process-wide state behind the tables and the version adapters.
//!
//! `export_net!(T)` instantiates `vN::table::<T>()` for every version; each table's
//! `extern "C"` fns are thin shims (argument shapes, narrowing) over the shared
//! operations in `ops`, which own every raw-pointer conversion.

use std::ffi::{CString, c_char};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::net::{CommConfig, InitArgs, Net};
use crate::profiler::net::NetProfiler;

pub mod channel;
mod handle;
mod ops;
mod props;
mod shims;
pub mod v10;
pub mod v11;
pub mod v12;
pub mod v6;
pub mod v7;
pub mod v8;
pub mod v9;

/// Connects a `Net` type to its process-wide state; implemented by `export_net!`.
pub trait NetExport: Net {
    /// The state shared by every exported table of this plugin.
    fn state() -> &'static NetState<Self>;
}

/// A communicator context as handed to NCCL (v11+) or kept for older hosts.
#[repr(C)]
pub(crate) struct CtxBox<T: Net> {
    tag: u64,
    plugin: Arc<T>,
    ctx: T::Context,
}

/// Process-wide state of an exported plugin: the instance, its refcount, the
/// contexts older hosts never see, and the strings properties point to.
pub struct NetState<T: Net> {
    inner: Mutex<Inner<T>>,
    /// The profiler callback from the last v10+ `init` (0: none), read without the
    /// lock on every `isend`/`irecv`.
    profiler: AtomicUsize,
}

/// The function type inside `ncclProfilerCallback_t`.
type ProfilerFn = unsafe extern "C" fn(
    *mut *mut std::ffi::c_void,
    std::ffi::c_int,
    *mut std::ffi::c_void,
    i64,
    *mut std::ffi::c_void,
) -> crate::raw::common::NcclResult;

struct Inner<T: Net> {
    plugin: Option<Arc<T>>,
    /// Live v11+ contexts, plus one while a pre-v11 host has initialised us.
    refs: usize,
    /// The context of pre-v11 hosts (v6–v10 `listen`/`connect` have none).
    legacy: Option<Arc<CtxBox<T>>>,
    /// v10 passes a config to `connect`: one context per traffic class seen.
    by_traffic_class: Vec<(Option<i32>, Arc<CtxBox<T>>)>,
    /// Property strings; NCCL keeps the pointers, so they live until unload.
    strings: Vec<CString>,
}

impl<T: Net> NetState<T> {
    /// Empty state (const, for a `static`).
    pub const fn new() -> Self {
        Self {
            profiler: AtomicUsize::new(0),
            inner: Mutex::new(Inner {
                plugin: None,
                refs: 0,
                legacy: None,
                by_traffic_class: Vec::new(),
                strings: Vec::new(),
            }),
        }
    }

    /// Keeps the profiler callback NCCL passed to v10+ `init`.
    pub(crate) fn set_profiler(&self, cb: crate::raw::common::ncclProfilerCallback_t) {
        self.profiler
            .store(cb.map_or(0, |f| f as usize), Ordering::Release);
    }

    /// The profiler callback, disabled when none was given.
    pub(crate) fn profiler(&self) -> NetProfiler {
        let raw = self.profiler.load(Ordering::Acquire);
        if raw == 0 {
            return NetProfiler::disabled();
        }
        // SAFETY: only `set_profiler` stores here, and only the address of a
        // non-NULL `ncclProfilerCallback_t` function.
        let f = unsafe { std::mem::transmute::<usize, ProfilerFn>(raw) };
        NetProfiler::new(Some(f))
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        // A panic while holding the lock leaves consistent data (every update is a
        // single assignment), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The instance, created on first use.
    fn acquire(&self, inner: &mut Inner<T>, host_abi: u32) -> Result<Arc<T>> {
        if let Some(p) = &inner.plugin {
            return Ok(Arc::clone(p));
        }
        let plugin = Arc::new(T::init(&InitArgs {
            host_abi,
            profiler: self.profiler(),
        })?);
        inner.plugin = Some(Arc::clone(&plugin));
        Ok(plugin)
    }

    /// The instance if `init` was called.
    pub(crate) fn plugin(&self) -> Result<Arc<T>> {
        self.lock().plugin.clone().ok_or_else(|| {
            Error::invalid_usage("called before init() (or after the last finalize())")
        })
    }

    /// Pre-v11 `init`: create the instance and the legacy context once.
    pub(crate) fn init_legacy(&self, host_abi: u32) -> Result<()> {
        let mut inner = self.lock();
        if inner.legacy.is_some() {
            return Ok(());
        }
        let plugin = self.acquire(&mut inner, host_abi)?;
        let ctx = plugin.open_context(0, CommConfig::default())?;
        inner.legacy = Some(Arc::new(CtxBox {
            tag: handle::CTX_TAG,
            plugin,
            ctx,
        }));
        inner.refs += 1;
        Ok(())
    }

    /// v11+ `init`: one context per communicator.
    pub(crate) fn open_context(
        &self,
        host_abi: u32,
        comm_id: u64,
        config: CommConfig,
    ) -> Result<Box<CtxBox<T>>> {
        let mut inner = self.lock();
        let plugin = self.acquire(&mut inner, host_abi)?;
        match plugin.open_context(comm_id, config) {
            Ok(ctx) => {
                inner.refs += 1;
                Ok(Box::new(CtxBox {
                    tag: handle::CTX_TAG,
                    plugin,
                    ctx,
                }))
            }
            Err(e) => {
                if inner.refs == 0 {
                    inner.plugin = None;
                }
                Err(e)
            }
        }
    }

    /// v11+ `finalize`: close the context; drop the instance after the last one.
    #[allow(clippy::boxed_local)] // the box is what NCCL held; it is unpacked here
    pub(crate) fn close_context(&self, ctx: Box<CtxBox<T>>) -> Result<()> {
        let CtxBox { plugin, ctx, .. } = *ctx;
        let closed = plugin.close_context(ctx);
        let mut inner = self.lock();
        inner.refs = inner.refs.saturating_sub(1);
        if inner.refs == 0 {
            inner.plugin = None;
        }
        closed
    }

    /// Context for pre-v11 `listen`/`connect`.
    pub(crate) fn legacy_context(&self) -> Result<Arc<CtxBox<T>>> {
        self.lock()
            .legacy
            .clone()
            .ok_or_else(|| Error::invalid_usage("called before init()"))
    }

    /// v10 `connect(config)`: the context for that traffic class.
    pub(crate) fn context_for(&self, config: CommConfig) -> Result<Arc<CtxBox<T>>> {
        let mut inner = self.lock();
        if config.traffic_class.is_none() {
            return inner
                .legacy
                .clone()
                .ok_or_else(|| Error::invalid_usage("connect() called before init()"));
        }
        if let Some((_, c)) = inner
            .by_traffic_class
            .iter()
            .find(|(tc, _)| *tc == config.traffic_class)
        {
            return Ok(Arc::clone(c));
        }
        let plugin = inner
            .plugin
            .clone()
            .ok_or_else(|| Error::invalid_usage("connect() called before init()"))?;
        let ctx = Arc::new(CtxBox {
            tag: handle::CTX_TAG,
            ctx: plugin.open_context(0, config)?,
            plugin,
        });
        inner
            .by_traffic_class
            .push((config.traffic_class, Arc::clone(&ctx)));
        Ok(ctx)
    }

    /// A pointer to a NUL-terminated copy of `s` that stays valid until unload.
    pub(crate) fn intern(&self, s: &str) -> *mut c_char {
        let mut inner = self.lock();
        if let Some(found) = inner.strings.iter().find(|c| c.to_bytes() == s.as_bytes()) {
            return found.as_ptr().cast_mut();
        }
        let owned = CString::new(s.replace('\0', "")).unwrap_or_default();
        let ptr = owned.as_ptr().cast_mut();
        inner.strings.push(owned);
        ptr
    }

    /// Drops everything; run when the library is unloaded (`.fini_array`).
    pub fn unload(&self) {
        let mut inner = self.lock();
        inner.by_traffic_class.clear();
        inner.legacy = None;
        inner.plugin = None;
        inner.refs = 0;
        inner.strings.clear();
    }
}

impl<T: Net> Default for NetState<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Publishes `ncclNetPlugin_v6` … `ncclNetPlugin_v12` for a [`Net`](crate::net::Net) type.
///
/// ```ignore
/// cclkit_abi::export_net!(MyNet);
/// ```
/// Each symbol is an immutable data object (what NCCL's `dlsym` expects). The
/// plugin's process-wide state is dropped when the library is unloaded.
#[macro_export]
macro_rules! export_net {
    ($ty:ty) => {
        $crate::__cclkit_refuse_panic_abort!();
        impl $crate::export::net::NetExport for $ty {
            fn state() -> &'static $crate::export::net::NetState<Self> {
                static STATE: $crate::export::net::NetState<$ty> =
                    $crate::export::net::NetState::new();
                &STATE
            }
        }

        /// `ncclNetPlugin_v12` (NCCL 2.30).
        #[unsafe(no_mangle)]
        pub static ncclNetPlugin_v12: $crate::raw::net::v12::ncclNet_v12_t =
            $crate::export::net::v12::table::<$ty>();
        /// `ncclNetPlugin_v11` (NCCL 2.28–2.29).
        #[unsafe(no_mangle)]
        pub static ncclNetPlugin_v11: $crate::raw::net::v11::ncclNet_v11_t =
            $crate::export::net::v11::table::<$ty>();
        /// `ncclNetPlugin_v10` (NCCL 2.26–2.27).
        #[unsafe(no_mangle)]
        pub static ncclNetPlugin_v10: $crate::raw::net::v10::ncclNet_v10_t =
            $crate::export::net::v10::table::<$ty>();
        /// `ncclNetPlugin_v9` (NCCL 2.24–2.25).
        #[unsafe(no_mangle)]
        pub static ncclNetPlugin_v9: $crate::raw::net::v9::ncclNet_v9_t =
            $crate::export::net::v9::table::<$ty>();
        /// `ncclNetPlugin_v8` (NCCL 2.20–2.23).
        #[unsafe(no_mangle)]
        pub static ncclNetPlugin_v8: $crate::raw::net::v8::ncclNet_v8_t =
            $crate::export::net::v8::table::<$ty>();
        /// `ncclNetPlugin_v7` (NCCL 2.19).
        #[unsafe(no_mangle)]
        pub static ncclNetPlugin_v7: $crate::raw::net::v7::ncclNet_v7_t =
            $crate::export::net::v7::table::<$ty>();
        /// `ncclNetPlugin_v6` (NCCL 2.13–2.18).
        #[unsafe(no_mangle)]
        pub static ncclNetPlugin_v6: $crate::raw::net::v6::ncclNet_v6_t =
            $crate::export::net::v6::table::<$ty>();

        const _: () = {
            extern "C" fn cclkit_net_unload() {
                <$ty as $crate::export::net::NetExport>::state().unload();
                $crate::export::guard::uninstall_hook();
            }
            #[used]
            #[unsafe(link_section = ".fini_array")]
            static CCLKIT_NET_FINI: extern "C" fn() = cclkit_net_unload;
        };
    };
}
