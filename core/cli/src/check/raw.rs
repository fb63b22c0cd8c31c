//! The raw plugin calls the checks need and the safe adapters deliberately prevent:
//! `listen`/`connect` with the 128-byte handle inside canaries (at one address for
//! every re-call), closing a raw send comm, and the heap accounting of the leak checks.
//!
//! Every `unsafe` block calls a slot of the plugin's own table version with the
//! argument shapes NCCL uses; pointers handed over stay valid for the call (the
//! handle buffer for as long as the connection is being made).

use std::ffi::c_void;

use cclkit_abi::raw::net::{NCCL_NET_HANDLE_MAXSIZE, ncclNetDeviceHandle_v7_t};

use super::{Stop, fail};
use cclkit_host::logger;
use cclkit_host::net::table::{TableRef, common_slot};
use cclkit_host::net::{ListenComm, NetContext};

/// Canary bytes on each side of a guarded handle.
const GUARD: usize = 64;

/// The byte at position `i` of a guard area.
const fn canary(i: usize) -> u8 {
    (0xA7 ^ (i as u8).wrapping_mul(0x45)) | 0x01
}

/// A 128-byte connect handle between canaries, at a fixed heap address.
pub(crate) struct GuardedHandle {
    buf: Box<[u8; GUARD + NCCL_NET_HANDLE_MAXSIZE + GUARD]>,
}

impl GuardedHandle {
    /// A zeroed handle.
    pub fn new() -> Self {
        let mut buf = Box::new([0u8; GUARD + NCCL_NET_HANDLE_MAXSIZE + GUARD]);
        for i in 0..GUARD {
            buf[i] = canary(i);
            buf[GUARD + NCCL_NET_HANDLE_MAXSIZE + i] = canary(i);
        }
        Self { buf }
    }

    /// A guarded copy of `bytes`.
    pub fn from_bytes(bytes: &[u8; NCCL_NET_HANDLE_MAXSIZE]) -> Self {
        let mut h = Self::new();
        h.buf[GUARD..GUARD + NCCL_NET_HANDLE_MAXSIZE].copy_from_slice(bytes);
        h
    }

    /// The handle's address (the same for the whole life of this value).
    pub fn ptr(&mut self) -> *mut c_void {
        self.buf[GUARD..].as_mut_ptr().cast()
    }

    /// The 128 handle bytes.
    pub fn bytes(&self) -> [u8; NCCL_NET_HANDLE_MAXSIZE] {
        let mut out = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        out.copy_from_slice(&self.buf[GUARD..GUARD + NCCL_NET_HANDLE_MAXSIZE]);
        out
    }

    /// `Err` naming how far outside the 128 bytes the plugin wrote.
    pub fn check(&self, call: &str) -> Result<(), Stop> {
        let before = (0..GUARD).filter(|&i| self.buf[i] != canary(i)).count();
        let after = (0..GUARD)
            .rev()
            .find(|&i| self.buf[GUARD + NCCL_NET_HANDLE_MAXSIZE + i] != canary(i))
            .map_or(0, |i| i + 1);
        if after > 0 {
            return fail!(
                "{call} wrote at least {after} bytes past the end of the \
                 {NCCL_NET_HANDLE_MAXSIZE}-byte handle (NCCL_NET_HANDLE_MAXSIZE): the \
                 handle and any connect state kept in it must fit 128 bytes"
            );
        }
        if before > 0 {
            return fail!("{call} wrote {before} bytes before the handle buffer");
        }
        Ok(())
    }
}

/// `listen(dev)` into a guarded handle; the listen comm is wrapped by the adapter.
pub(crate) fn listen(
    ctx: &NetContext,
    dev: i32,
    handle: &mut GuardedHandle,
) -> Result<ListenComm, Stop> {
    let inner = &ctx.inner;
    let s = &inner.plugin.shared;
    let (c, h) = (inner.ctx, handle.ptr());
    let mut lc: *mut c_void = std::ptr::null_mut();
    let mark = logger::warn_mark();
    // SAFETY: the version's `listen` with a 128-byte handle (guarded), a valid
    // out-pointer and this context (v11+).
    let rc = unsafe {
        match s.raw.get() {
            TableRef::V6(t) => t.listen.map(|f| f(dev, h, &mut lc)),
            TableRef::V7(t) => t.listen.map(|f| f(dev, h, &mut lc)),
            TableRef::V8(t) => t.listen.map(|f| f(dev, h, &mut lc)),
            TableRef::V9(t) => t.listen.map(|f| f(dev, h, &mut lc)),
            TableRef::V10(t) => t.listen.map(|f| f(dev, h, &mut lc)),
            TableRef::V11(t) => t.listen.map(|f| f(c, dev, h, &mut lc)),
            TableRef::V12(t) => t.listen.map(|f| f(c, dev, h, &mut lc)),
        }
    }
    .ok_or_else(|| Stop::Fail("listen is NULL".into()))?;
    handle.check("listen")?;
    s.check("listen", mark, rc)?;
    ListenComm::new(std::sync::Arc::clone(inner), lc)
        .ok_or_else(|| Stop::Fail("listen returned ncclSuccess but a NULL listenComm".into()))
}

/// A send comm from a raw `connect`, closed (`closeSend`) on drop.
pub(crate) struct RawSend<'a> {
    ctx: &'a NetContext,
    comm: *mut c_void,
}

impl RawSend<'_> {
    /// Closes now and returns the plugin's result.
    pub fn close(mut self) -> Result<(), Stop> {
        self.close_inner()
    }

    fn close_inner(&mut self) -> Result<(), Stop> {
        let comm = std::mem::replace(&mut self.comm, std::ptr::null_mut());
        if comm.is_null() {
            return Ok(());
        }
        let s = &self.ctx.inner.plugin.shared;
        let f =
            common_slot!(s.raw, closeSend).ok_or_else(|| Stop::Fail("closeSend is NULL".into()))?;
        let mark = logger::warn_mark();
        // SAFETY: closes a send comm this plugin's connect returned, exactly once.
        let rc = unsafe { f(comm) };
        s.check("closeSend", mark, rc).map_err(Stop::from)
    }
}

impl Drop for RawSend<'_> {
    fn drop(&mut self) {
        let _ = self.close_inner();
    }
}

/// One raw `connect` attempt with the guarded handle (the same address every time)
/// and `sendDevComm` pointing to NULL, as NCCL does for host transports.
pub(crate) fn connect<'a>(
    ctx: &'a NetContext,
    dev: i32,
    handle: &mut GuardedHandle,
) -> Result<Option<RawSend<'a>>, Stop> {
    let inner = &ctx.inner;
    let s = &inner.plugin.shared;
    let (c, h) = (inner.ctx, handle.ptr());
    let mut sc: *mut c_void = std::ptr::null_mut();
    let mut devh: *mut ncclNetDeviceHandle_v7_t = std::ptr::null_mut();
    let mark = logger::warn_mark();
    // SAFETY: the version's `connect` with the stable guarded handle, valid
    // out-pointers and this context (v11+) or its config allocation (v10).
    let rc = unsafe {
        match s.raw.get() {
            TableRef::V6(t) => t.connect.map(|f| f(dev, h, &mut sc)),
            TableRef::V7(t) => t.connect.map(|f| f(dev, h, &mut sc, &mut devh)),
            TableRef::V8(t) => t.connect.map(|f| f(dev, h, &mut sc, &mut devh)),
            TableRef::V9(t) => t.connect.map(|f| f(dev, h, &mut sc, &mut devh)),
            TableRef::V10(t) => t.connect.map(|f| f(dev, c.cast(), h, &mut sc, &mut devh)),
            TableRef::V11(t) => t.connect.map(|f| f(c, dev, h, &mut sc, &mut devh)),
            TableRef::V12(t) => t.connect.map(|f| f(c, dev, h, &mut sc, &mut devh)),
        }
    }
    .ok_or_else(|| Stop::Fail("connect is NULL".into()))?;
    let comm = (!sc.is_null()).then_some(RawSend { ctx, comm: sc });
    handle.check("connect")?;
    s.check("connect", mark, rc)?;
    Ok(comm)
}

/// Bytes of heap in use (glibc `mallinfo2`, summed over its arenas; blocks served by
/// `mmap` are not included). Other threads' frees show up too, hence [`LeakMeter`]'s
/// windows.
pub(crate) fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads allocator statistics.
    unsafe { libc::mallinfo2() }.uordblks
}

/// Heap samples taken every `window` operations: a leak grows the heap in every
/// window, while a one-off allocation (a cache, a buffer a helper thread happened to
/// take from this arena) shows up in one window only.
pub(crate) struct LeakMeter {
    window: usize,
    samples: Vec<usize>,
}

impl LeakMeter {
    /// Samples every `window` operations, starting now.
    pub fn start(window: usize) -> Self {
        Self {
            window: window.max(1),
            samples: vec![heap_in_use()],
        }
    }

    /// Call after each operation `i` (counted from 1).
    pub fn tick(&mut self, i: usize) {
        if i % self.window == 0 {
            self.samples.push(heap_in_use());
        }
    }

    /// Total growth over the measured windows (may be 0).
    pub fn total(&self) -> usize {
        match (self.samples.first(), self.samples.last()) {
            (Some(a), Some(b)) => b.saturating_sub(*a),
            _ => 0,
        }
    }

    /// `Some(bytes per operation)` when every window grew by at least `min_per_op`
    /// bytes per operation (and there were at least 3 windows).
    pub fn steady_leak(&self, min_per_op: usize) -> Option<usize> {
        if self.samples.len() < 4 {
            return None;
        }
        let every = self
            .samples
            .windows(2)
            .all(|w| w[1].saturating_sub(w[0]) >= min_per_op * self.window);
        let ops = self.window * (self.samples.len() - 1);
        every.then(|| self.total() / ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_reports_overruns() {
        let mut h = GuardedHandle::new();
        assert!(h.check("x").is_ok());
        let p = h.ptr().cast::<u8>();
        // SAFETY: writes inside the guard area this value owns.
        unsafe { p.add(NCCL_NET_HANDLE_MAXSIZE + 3).write(0) };
        let Err(Stop::Fail(m)) = h.check("connect") else {
            panic!("no overrun reported")
        };
        assert!(
            m.contains("connect wrote at least 4 bytes past the end"),
            "{m}"
        );
        let mut bytes = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        bytes[5] = 9;
        assert_eq!(GuardedHandle::from_bytes(&bytes).bytes(), bytes);
    }

    #[test]
    fn leak_meter_needs_growth_in_every_window() {
        let m = LeakMeter {
            window: 10,
            samples: vec![0, 1000, 2000, 3000, 4000],
        };
        assert_eq!(m.steady_leak(64), Some(100));
        let once = LeakMeter {
            window: 10,
            samples: vec![0, 72_000, 72_000, 72_000, 72_000],
        };
        assert_eq!(once.steady_leak(64), None);
        assert_eq!(once.total(), 72_000);
    }

    #[test]
    fn heap_accounting_sees_allocations() {
        // Other tests of this binary allocate and free concurrently: one of a few tries
        // must see the allocation.
        let seen = (0..20).any(|_| {
            let before = heap_in_use();
            let v: Vec<u8> = Vec::with_capacity(64 * 1024);
            let grew = heap_in_use() >= before + 60 * 1024;
            drop(std::hint::black_box(v));
            grew
        });
        assert!(seen, "mallinfo2 never saw a 64 KiB allocation");
    }
}
