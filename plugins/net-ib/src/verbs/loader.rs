//! `libibverbs.so.1`, opened at run time.
//!
//! The packaged plugin has no `DT_NEEDED` on libibverbs, so it loads on any machine;
//! without verbs, `init` fails with the loader's message and NCCL falls back. This is
//! how NCCL's own IB transport reaches verbs (`ibvwrap`/`ibvsymbols`).
//!
//! The library is opened once and never closed: provider libraries (libmlx5, …) that
//! libibverbs loads keep pointers into it, and NCCL may dlclose *this* plugin while
//! other code in the process still uses verbs. The leaked handle costs one mapping.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Mutex;

use super::sys::*;

/// Every libibverbs entry point the plugin calls (the library's exported symbols;
/// the `static inline` data-path calls go through `ibv_context::ops`). Each field is
/// the `ibv_` function of the same name, with verbs.h's signature.
#[allow(missing_docs)]
pub struct Verbs {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    /// The exported (compat) `ibv_query_port`: fills `ibv_port_attr` up to `flags`.
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    /// `ibv_reg_mr_iova2` (IBVERBS_1.8): needed for optional access flags such as
    /// relaxed ordering; absent on old rdma-core.
    pub reg_mr_iova2:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, u32) -> *mut ibv_mr>,
    /// `ibv_reg_dmabuf_mr` (IBVERBS_1.12); absent on old rdma-core.
    pub reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut c_void,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    /// `ibv_fork_init`: NCCL calls it at init (`ncclIbInitDevices`).
    pub fork_init: Option<unsafe extern "C" fn() -> c_int>,
    /// `ibv_is_fork_initialized` (IBVERBS_1.13): for the log and tests.
    pub is_fork_initialized: Option<unsafe extern "C" fn() -> c_int>,
    /// `ibv_get_async_event` (blocking unless `async_fd` is non-blocking).
    pub get_async_event: unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
    /// `ibv_ack_async_event`.
    pub ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
    /// `ibv_query_port_speed` (IBVERBS_1.16): the port's speed in 100 Mbps units,
    /// which NCCL prefers over the speed/width tables (covers XDR and beyond).
    pub query_port_speed: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut u64) -> c_int>,
    /// `ibv_query_ece` (IBVERBS_1.10); absent on old rdma-core.
    pub query_ece: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_ece) -> c_int>,
    /// `ibv_set_ece` (IBVERBS_1.10); absent on old rdma-core.
    pub set_ece: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_ece) -> c_int>,
}

/// The library name NCCL opens too (the runtime package's soname).
pub const LIBRARY: &str = "libibverbs.so.1";

static LOADED: Mutex<Option<&'static Verbs>> = Mutex::new(None);

/// The verbs table, opening the library on first success; a failure is retried on
/// the next call (a later `init` may run after the admin loaded the modules).
pub fn verbs() -> Result<&'static Verbs, String> {
    let mut slot = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = *slot {
        return Ok(v);
    }
    let v: &'static Verbs = Box::leak(Box::new(load()?));
    *slot = Some(v);
    Ok(v)
}

fn load() -> Result<Verbs, String> {
    // SAFETY: libibverbs' initialisers only set up its own state (it reads sysfs
    // lazily, in ibv_get_device_list).
    let lib = unsafe { libloading::Library::new(LIBRARY) }.map_err(|e| {
        format!("cannot load {LIBRARY} ({e}); is rdma-core (libibverbs1) installed?")
    })?;
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol has the C signature of the field it is assigned to
            // (declarations copied from verbs.h, types in `sys`).
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{LIBRARY} lacks {}: {e}", $name))?;
            *s
        }};
    }
    macro_rules! optional {
        ($name:literal) => {{
            // SAFETY: as in `sym!`.
            unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .ok()
                .map(|s| *s)
        }};
    }
    let verbs = Verbs {
        get_device_list: sym!("ibv_get_device_list"),
        free_device_list: sym!("ibv_free_device_list"),
        get_device_name: sym!("ibv_get_device_name"),
        open_device: sym!("ibv_open_device"),
        close_device: sym!("ibv_close_device"),
        query_device: sym!("ibv_query_device"),
        query_port: sym!("ibv_query_port"),
        query_gid: sym!("ibv_query_gid"),
        alloc_pd: sym!("ibv_alloc_pd"),
        dealloc_pd: sym!("ibv_dealloc_pd"),
        reg_mr: sym!("ibv_reg_mr"),
        reg_mr_iova2: optional!("ibv_reg_mr_iova2"),
        reg_dmabuf_mr: optional!("ibv_reg_dmabuf_mr"),
        dereg_mr: sym!("ibv_dereg_mr"),
        create_cq: sym!("ibv_create_cq"),
        destroy_cq: sym!("ibv_destroy_cq"),
        create_qp: sym!("ibv_create_qp"),
        modify_qp: sym!("ibv_modify_qp"),
        destroy_qp: sym!("ibv_destroy_qp"),
        fork_init: optional!("ibv_fork_init"),
        is_fork_initialized: optional!("ibv_is_fork_initialized"),
        get_async_event: sym!("ibv_get_async_event"),
        ack_async_event: sym!("ibv_ack_async_event"),
        query_port_speed: optional!("ibv_query_port_speed"),
        query_ece: optional!("ibv_query_ece"),
        set_ece: optional!("ibv_set_ece"),
    };
    // Never unloaded (see the module doc).
    std::mem::forget(lib);
    Ok(verbs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libibverbs1 is installed on the project's machines (libibverbs-dev depends on
    /// it): every required symbol must resolve, and the table is opened only once.
    #[test]
    fn loads_every_required_symbol_once() {
        let a = verbs().expect("libibverbs.so.1 with every required symbol");
        let b = verbs().unwrap();
        assert!(std::ptr::eq(a, b));
        // Debian 12's rdma-core 44 has both optional entry points.
        assert!(a.reg_mr_iova2.is_some());
        assert!(a.reg_dmabuf_mr.is_some());
        assert!(a.fork_init.is_some() && a.is_fork_initialized.is_some());
        assert!(a.query_ece.is_some() && a.set_ece.is_some());
    }
}
