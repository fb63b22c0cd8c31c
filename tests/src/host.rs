//! A minimal NCCL-like host for the v8 and v12 net tables, for tests only.
//!
//! It calls the exported tables with NCCL's exact signatures (int sizes on v8,
//! size_t plus profiler handles on v12; per-comm init/finalize on v12, one init on
//! v8). The real, version-complete host adapter lives in `core`.

// Handles are passed straight back to the plugin, which must validate them: that is
// part of what the tests check, so these wrappers stay safe to call.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{CStr, c_int, c_void};
use std::path::Path;
use std::ptr::null_mut;

use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::net::v8::ncclNet_v8_t;
use cclkit_abi::raw::net::v12::ncclNet_v12_t;
use cclkit_abi::raw::net::{NCCL_NET_HANDLE_MAXSIZE, ncclNetCommConfig_v10_t};

/// A raw status turned into a `Result`, naming the call.
pub fn ok(what: &str, r: NcclResult) -> Result<(), String> {
    if r.is_ok() {
        Ok(())
    } else {
        Err(format!("{what} returned {r:?}"))
    }
}

enum Table {
    V8(&'static ncclNet_v8_t),
    V12(&'static ncclNet_v12_t),
}

/// A loaded net plugin driven through one table version.
pub struct NetHost {
    table: Table,
    ctx: *mut c_void,
    _lib: libloading::Library,
}

macro_rules! call {
    ($t:expr, $f:ident) => {
        $t.$f.ok_or_else(|| format!("{} is NULL", stringify!($f)))?
    };
}

impl NetHost {
    /// Loads `path` and initialises it through `ncclNetPlugin_v{version}` (8 or 12).
    pub fn open(path: &Path, version: u32) -> Result<Self, String> {
        // SAFETY: loading a plugin runs its initialisers; that is what is under test.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("dlopen {}: {e}", path.display()))?;
        let sym = format!("ncclNetPlugin_v{version}\0");
        // SAFETY: the symbol is a data object of the version's table type.
        let addr = unsafe { lib.get::<*const c_void>(sym.as_bytes()) }
            .map_err(|e| format!("dlsym {sym}: {e}"))?;
        let addr: *const c_void = *addr;
        let mut ctx = null_mut();
        let table = match version {
            // SAFETY: the library stays loaded as long as `self`.
            8 => Table::V8(unsafe { &*addr.cast::<ncclNet_v8_t>() }),
            // SAFETY: as above.
            12 => Table::V12(unsafe { &*addr.cast::<ncclNet_v12_t>() }),
            v => return Err(format!("test host drives v8 and v12, not v{v}")),
        };
        match &table {
            // SAFETY: NCCL's v8 init(logger).
            Table::V8(t) => ok("init", unsafe { call!(t, init)(None) })?,
            Table::V12(t) => {
                let mut cfg = ncclNetCommConfig_v10_t { trafficClass: -1 };
                // SAFETY: NCCL's v12 init(ctx, commId, config, logger, profiler).
                ok("init", unsafe {
                    call!(t, init)(&mut ctx, 1, &mut cfg, None, None)
                })?
            }
        }
        Ok(Self {
            table,
            ctx,
            _lib: lib,
        })
    }

    /// The table's `name`.
    pub fn name(&self) -> String {
        let p = match &self.table {
            Table::V8(t) => t.name,
            Table::V12(t) => t.name,
        };
        // SAFETY: plugins point `name` at a static C string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `listen(dev 0)`: the 128-byte handle and the listen comm.
    pub fn listen(&self) -> Result<([u8; NCCL_NET_HANDLE_MAXSIZE], *mut c_void), String> {
        let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        let mut lc = null_mut();
        let h = handle.as_mut_ptr().cast();
        // SAFETY: NCCL's calling convention: 128-byte handle, out-pointer.
        let r = unsafe {
            match &self.table {
                Table::V8(t) => call!(t, listen)(0, h, &mut lc),
                Table::V12(t) => call!(t, listen)(self.ctx, 0, h, &mut lc),
            }
        };
        ok("listen", r)?;
        Ok((handle, lc))
    }

    /// Polls `connect` with the same handle pointer until it yields a send comm.
    pub fn connect(
        &self,
        handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE],
        deadline: std::time::Instant,
    ) -> Result<*mut c_void, String> {
        let h = handle.as_mut_ptr().cast();
        loop {
            let mut sc = null_mut();
            let mut dev_comm = null_mut();
            // SAFETY: NCCL re-calls connect with the same handle pointer.
            let r = unsafe {
                match &self.table {
                    Table::V8(t) => call!(t, connect)(0, h, &mut sc, &mut dev_comm),
                    Table::V12(t) => call!(t, connect)(self.ctx, 0, h, &mut sc, &mut dev_comm),
                }
            };
            ok("connect", r)?;
            if !sc.is_null() {
                return Ok(sc);
            }
            if std::time::Instant::now() > deadline {
                return Err("connect did not complete in time".into());
            }
            std::thread::yield_now();
        }
    }

    /// Polls `accept` until it yields a receive comm.
    pub fn accept(
        &self,
        lc: *mut c_void,
        deadline: std::time::Instant,
    ) -> Result<*mut c_void, String> {
        loop {
            let mut rc = null_mut();
            let mut dev_comm = null_mut();
            // SAFETY: NCCL's accept(listenComm, recvComm, recvDevComm).
            let r = unsafe {
                match &self.table {
                    Table::V8(t) => call!(t, accept)(lc, &mut rc, &mut dev_comm),
                    Table::V12(t) => call!(t, accept)(lc, &mut rc, &mut dev_comm),
                }
            };
            ok("accept", r)?;
            if !rc.is_null() {
                return Ok(rc);
            }
            if std::time::Instant::now() > deadline {
                return Err("accept did not complete in time".into());
            }
            std::thread::yield_now();
        }
    }

    /// `regMr` of host memory.
    pub fn reg_mr(&self, comm: *mut c_void, buf: &mut [u8]) -> Result<*mut c_void, String> {
        let mut mh = null_mut();
        let (p, n) = (buf.as_mut_ptr().cast(), buf.len());
        // SAFETY: a live comm and a host buffer; v8 and v12 both take size_t.
        let r = unsafe {
            match &self.table {
                Table::V8(t) => {
                    call!(t, regMr)(comm, p, n, cclkit_abi::raw::common::ptr::HOST, &mut mh)
                }
                Table::V12(t) => {
                    call!(t, regMr)(comm, p, n, cclkit_abi::raw::common::ptr::HOST, &mut mh)
                }
            }
        };
        ok("regMr", r)?;
        Ok(mh)
    }

    /// `deregMr`.
    pub fn dereg_mr(&self, comm: *mut c_void, mh: *mut c_void) -> Result<(), String> {
        // SAFETY: a registration from reg_mr on this comm.
        let r = unsafe {
            match &self.table {
                Table::V8(t) => call!(t, deregMr)(comm, mh),
                Table::V12(t) => call!(t, deregMr)(comm, mh),
            }
        };
        ok("deregMr", r)
    }

    /// One `isend` attempt; `Ok(None)` means "retry".
    pub fn isend(
        &self,
        sc: *mut c_void,
        buf: &[u8],
        tag: c_int,
        mh: *mut c_void,
    ) -> Result<Option<*mut c_void>, String> {
        let mut req = null_mut();
        let p = buf.as_ptr().cast_mut().cast();
        // SAFETY: the buffer outlives the request (the caller tests it to completion).
        let r = unsafe {
            match &self.table {
                Table::V8(t) => {
                    let n = c_int::try_from(buf.len()).map_err(|_| "size > INT_MAX on v8")?;
                    call!(t, isend)(sc, p, n, tag, mh, &mut req)
                }
                Table::V12(t) => call!(t, isend)(sc, p, buf.len(), tag, mh, null_mut(), &mut req),
            }
        };
        ok("isend", r)?;
        Ok((!req.is_null()).then_some(req))
    }

    /// One single-buffer `irecv` attempt; `Ok(None)` means "retry".
    pub fn irecv(
        &self,
        rc: *mut c_void,
        buf: &mut [u8],
        tag: c_int,
        mh: *mut c_void,
    ) -> Result<Option<*mut c_void>, String> {
        let mut req = null_mut();
        let mut data = [buf.as_mut_ptr().cast::<c_void>()];
        let mut tags = [tag];
        let mut mhs = [mh];
        // SAFETY: arrays of one entry; the buffer outlives the request.
        let r = unsafe {
            match &self.table {
                Table::V8(t) => {
                    let mut sizes =
                        [c_int::try_from(buf.len()).map_err(|_| "size > INT_MAX on v8")?];
                    call!(t, irecv)(
                        rc,
                        1,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mhs.as_mut_ptr(),
                        &mut req,
                    )
                }
                Table::V12(t) => {
                    let mut sizes = [buf.len()];
                    let mut ph = [null_mut()];
                    call!(t, irecv)(
                        rc,
                        1,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mhs.as_mut_ptr(),
                        ph.as_mut_ptr(),
                        &mut req,
                    )
                }
            }
        };
        ok("irecv", r)?;
        Ok((!req.is_null()).then_some(req))
    }

    /// One `test`; `Ok(Some(size))` when done.
    pub fn test(&self, req: *mut c_void) -> Result<Option<usize>, String> {
        let mut done = 0;
        let mut sizes = [0 as c_int; 64];
        // SAFETY: a live request; sizes has room for NCCL's 64 entries.
        let r = unsafe {
            match &self.table {
                Table::V8(t) => call!(t, test)(req, &mut done, sizes.as_mut_ptr()),
                Table::V12(t) => call!(t, test)(req, &mut done, sizes.as_mut_ptr()),
            }
        };
        ok("test", r)?;
        Ok((done != 0).then_some(sizes[0] as usize))
    }

    /// Closes a send, receive or listen comm.
    pub fn close(&self, which: Close, comm: *mut c_void) -> Result<(), String> {
        // SAFETY: a live comm of that kind, never used again.
        let r = unsafe {
            match (&self.table, which) {
                (Table::V8(t), Close::Send) => call!(t, closeSend)(comm),
                (Table::V8(t), Close::Recv) => call!(t, closeRecv)(comm),
                (Table::V8(t), Close::Listen) => call!(t, closeListen)(comm),
                (Table::V12(t), Close::Send) => call!(t, closeSend)(comm),
                (Table::V12(t), Close::Recv) => call!(t, closeRecv)(comm),
                (Table::V12(t), Close::Listen) => call!(t, closeListen)(comm),
            }
        };
        ok("close", r)
    }
}

/// Which comm [`NetHost::close`] closes.
#[derive(Clone, Copy, Debug)]
pub enum Close {
    /// `closeSend`.
    Send,
    /// `closeRecv`.
    Recv,
    /// `closeListen`.
    Listen,
}

impl Drop for NetHost {
    fn drop(&mut self) {
        if let Table::V12(t) = &self.table
            && let Some(f) = t.finalize
        {
            // SAFETY: the ctx from init, finalized once.
            let _ = unsafe { f(self.ctx) };
        }
    }
}
