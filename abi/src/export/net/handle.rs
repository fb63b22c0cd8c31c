//! The handles the net export gives NCCL (comms, registrations, contexts) and the
//! checked way back from a raw pointer to the typed box behind it.
//!
//! Every handle is a `Box` of a `#[repr(C)]` struct whose first field is a tag, so a
//! NULL, stale or foreign pointer is reported as a bad handle instead of being used.

use std::ffi::c_void;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::net::Net;

/// Tag of a [`super::CtxBox`] (v11+ per-communicator context).
pub(crate) const CTX_TAG: u64 = u64::from_be_bytes(*b"cclk-ctx");
/// Tag of a listen comm.
pub(super) const LISTEN_TAG: u64 = u64::from_be_bytes(*b"cclk-lsn");
/// Tag of a send comm.
pub(super) const SEND_TAG: u64 = u64::from_be_bytes(*b"cclk-snd");
/// Tag of a receive comm.
pub(super) const RECV_TAG: u64 = u64::from_be_bytes(*b"cclk-rcv");
/// Tag of a memory registration.
pub(super) const MR_TAG: u64 = u64::from_be_bytes(*b"cclk-mr\0");
/// Written over a handle's tag when it is closed, so a second close fails cleanly.
const DEAD_TAG: u64 = u64::from_be_bytes(*b"cclk-dea");

/// A comm as handed to NCCL: tag first, so the kind can be read before the type is known.
#[repr(C)]
pub(super) struct CommBox<T: Net, C> {
    pub(super) tag: u64,
    pub(super) plugin: Arc<T>,
    pub(super) comm: C,
}

/// A memory registration as handed to NCCL, tag first like a comm.
#[repr(C)]
pub(super) struct MrBox<M> {
    pub(super) tag: u64,
    pub(super) mr: M,
}

/// Reads the tag at the start of a handle NCCL gave back.
///
/// # Safety
/// `ptr` must be NULL or point to readable memory of at least 8 bytes.
pub(super) unsafe fn tag_of(ptr: *mut c_void, what: &str) -> Result<u64> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and every handle we give out starts with an aligned u64.
    Ok(unsafe { ptr.cast::<u64>().read() })
}

/// Borrows a typed box from a handle after checking its tag.
///
/// # Safety
/// `ptr` must be NULL or a live handle; if its tag is `tag` it must be a `B` created here.
pub(super) unsafe fn borrow<'a, B>(ptr: *mut c_void, tag: u64, what: &str) -> Result<&'a mut B> {
    // SAFETY: forwarded contract.
    let found = unsafe { tag_of(ptr, what)? };
    if found != tag {
        return Err(Error::invalid_argument(format!(
            "{what} {ptr:p} is not a live handle of this plugin"
        )));
    }
    // SAFETY: the tag identifies a `B` allocated by this module and not yet freed.
    Ok(unsafe { &mut *ptr.cast::<B>() })
}

/// Takes back ownership of a typed box, marking the memory dead first.
///
/// # Safety
/// As [`borrow`]; the handle must not be used again by the caller.
pub(super) unsafe fn take<B>(ptr: *mut c_void, tag: u64, what: &str) -> Result<Box<B>> {
    // SAFETY: forwarded contract.
    unsafe { borrow::<B>(ptr, tag, what)? };
    // SAFETY: the tag was checked; writing the dead tag makes a second close fail
    // cleanly as long as the memory was not reused.
    unsafe {
        ptr.cast::<u64>().write(DEAD_TAG);
        Ok(Box::from_raw(ptr.cast::<B>()))
    }
}

/// Writes `value` to an out-pointer, failing on NULL.
///
/// # Safety
/// `out` must be NULL or valid for writes.
pub(super) unsafe fn put<V>(out: *mut V, value: V, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid_argument(format!(
            "{what} out-pointer is NULL"
        )));
    }
    // SAFETY: non-NULL and valid per contract.
    unsafe { out.write(value) };
    Ok(())
}
