//! Test harness: drives the plugin through its exported `ncclNetPlugin_v8/_v11/_v12`
//! tables with `cclkit-host`'s adapters (NCCL's calling conventions for each
//! version), plus helpers for data and processes.
#![allow(dead_code)]

pub mod child;
pub mod machine;
mod plugin;
pub mod roles;
pub mod script;

use std::ffi::c_int;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::NcclResult;

#[allow(unused_imports)]
pub use plugin::{PTR_CUDA, PTR_HOST, Plugin, Props, Ptr, Ver};

/// Tests one request until it completes or fails; `Err` carries the code.
pub fn wait_one(p: &Plugin, req: Ptr, timeout: Duration) -> Result<Vec<c_int>, NcclResult> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut sizes = [0 as c_int; 64];
        if p.test(req, &mut sizes)? {
            return Ok(sizes.to_vec());
        }
        assert!(
            Instant::now() < deadline,
            "request did not complete in {timeout:?}"
        );
    }
}

/// Deterministic random bytes for message `index` of a run with `seed`
/// (SplitMix64: fast even in debug builds, unlike a cryptographic generator).
pub fn pattern(seed: u64, index: u64, len: usize) -> Vec<u8> {
    let mut state = seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (len as u64) << 17;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut v = vec![0u8; len];
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&next().to_le_bytes());
    }
    let tail = chunks.into_remainder();
    let last = next().to_le_bytes();
    tail.copy_from_slice(&last[..tail.len()]);
    v
}

/// A fresh random seed.
pub fn seed() -> u64 {
    rand::random()
}

/// Open file descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Threads of this process, once the count has stopped changing.
///
/// `pthread_join` returns when the kernel clears the thread's tid, which is before
/// the task leaves `/proc/self/task`; on a loaded machine a thread joined a moment
/// ago can still be listed. So the count is read until it holds still for 100 ms
/// (five reads 20 ms apart), for at most 5 s, and the last read is returned.
pub fn thread_count() -> usize {
    let read = || {
        std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut last = read();
    let mut steady = 0;
    while steady < 5 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let now = read();
        steady = if now == last { steady + 1 } else { 0 };
        last = now;
    }
    last
}

/// The sizes the issue asks for.
pub const SIZES: [usize; 6] = [0, 1, 7, 4095, 64 * 1024 + 3, 16 << 20];

/// Calls `isend` until it posts (grouped mode returns NULL until the peer's
/// clear-to-send arrives).
///
/// # Safety
/// As [`Plugin::isend`].
pub unsafe fn send_now(
    p: &Plugin,
    comm: Ptr,
    data: *mut u8,
    len: usize,
    tag: c_int,
) -> Result<Ptr, NcclResult> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // SAFETY: forwarded contract.
        let r = unsafe { p.isend(comm, data, len, tag, null_mut()) }?;
        if !r.is_null() {
            return Ok(r);
        }
        assert!(Instant::now() < deadline, "isend never posted");
    }
}

/// Posts one receive of `cap` bytes and one send of `len` (to the peer, which may
/// be this process), testing both round-robin until each has finished; returns the
/// receive's and the send's outcomes.
pub fn truncate(
    p: &Plugin,
    send: Ptr,
    recv: Ptr,
    cap: usize,
    len: usize,
) -> (NcclResult, NcclResult) {
    let mut rbuf = vec![0u8; cap];
    let mut sbuf = pattern(1, 2, len);
    // SAFETY: both buffers outlive the requests (finished below).
    let rreq = unsafe { p.irecv(recv, &[(rbuf.as_mut_ptr(), cap)], &[0], &[null_mut()]) }.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut rres, mut sres): (Option<NcclResult>, Option<NcclResult>) = (None, None);
    let mut sreq: Ptr = null_mut();
    let outcome = |r: Result<bool, NcclResult>| match r {
        Ok(true) => Some(NcclResult::SUCCESS),
        Ok(false) => None,
        Err(e) => Some(e),
    };
    while rres.is_none() || sres.is_none() {
        assert!(Instant::now() < deadline, "truncation exchange stuck");
        if sres.is_none() && sreq.is_null() {
            // SAFETY: as above.
            match unsafe { p.isend(send, sbuf.as_mut_ptr(), len, 0, null_mut()) } {
                Ok(r) => sreq = r,
                Err(e) => sres = Some(e),
            }
        }
        let mut sizes = [0; 64];
        if sres.is_none() && !sreq.is_null() {
            sres = outcome(p.test(sreq, &mut sizes));
        }
        if rres.is_none() {
            rres = outcome(p.test(rreq, &mut sizes));
        }
    }
    (rres.unwrap_or_default(), sres.unwrap_or_default())
}
