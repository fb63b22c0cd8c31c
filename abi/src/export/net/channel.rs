//! RCCL's channel id, passed through the device-handle argument of `connect`/`accept`.
//!
//! NCCL passes `ncclNetDeviceHandle_t**` there (a slot a device-offload plugin may
//! fill, or NULL). RCCL instead passes a pointer to its `ncclNet_ctxt_t`,
//! `struct { uint32_t chId; }` (used by AMD's AINIC RoCE plugins to spread channels
//! over queue pairs). cclkit's export layer reads those 4 bytes, and only when the
//! host is RCCL (the rule of [`crate::export::tuner::host`]: `CCLKIT_FLAVOR`, else a
//! mapped `librccl.so`); it never writes through the argument under either host. A
//! Rust plugin asks for the value with [`rccl_channel`] inside its `connect`/`accept`.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::OnceLock;

thread_local! {
    /// The channel id of the `connect`/`accept` running on this thread.
    static CHANNEL: Cell<Option<u32>> = const { Cell::new(None) };
}

/// RCCL's channel id for the `connect` or `accept` call being served on this thread:
/// `Some` only while inside that call, when the host is RCCL and passed a context.
/// Read-only: the plugin cannot write anything back through the argument.
pub fn rccl_channel() -> Option<u32> {
    CHANNEL.with(Cell::get)
}

/// Whether the host is RCCL: `CCLKIT_FLAVOR` when set, else whether a `librccl.so`
/// is mapped (looked up once: RCCL is loaded before it calls any plugin).
fn host_is_rccl() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    match std::env::var("CCLKIT_FLAVOR")
        .ok()
        .map(|f| f.to_ascii_lowercase())
    {
        Some(f) if f == "rccl" => true,
        Some(f) if f == "nccl" => false,
        _ => *LOADED.get_or_init(crate::export::tuner::host::rccl_loaded),
    }
}

/// The channel id carried by the device-handle argument, per the host rule above.
///
/// # Safety
/// `arg` is the host's `sendDevComm`/`recvDevComm` argument: NULL, or (under RCCL)
/// a readable `ncclNet_ctxt_t`, or (under NCCL) a readable pointer slot (8 bytes).
pub(crate) unsafe fn decode(arg: *mut c_void, rccl: bool) -> Option<u32> {
    if !rccl || arg.is_null() {
        return None;
    }
    // SAFETY: caller's contract: at least 4 readable bytes; possibly unaligned for a
    // hostile host, hence the unaligned read. Never written.
    Some(unsafe { arg.cast::<u32>().read_unaligned() })
}

/// Runs `f` with [`rccl_channel`] answering what `arg` carries.
///
/// # Safety
/// As [`decode`].
pub(crate) unsafe fn with_channel<R>(arg: *mut c_void, f: impl FnOnce() -> R) -> R {
    // SAFETY: forwarded contract.
    let ch = unsafe { decode(arg, host_is_rccl()) };
    let prev = CHANNEL.with(|c| c.replace(ch));
    struct Restore(Option<u32>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CHANNEL.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(prev);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoded_only_under_rccl_and_never_written() {
        let mut ctxt: [u32; 2] = [0x0000_002a, 0xdead_beef];
        let p = ctxt.as_mut_ptr().cast::<c_void>();
        // SAFETY: 8 readable bytes.
        unsafe {
            assert_eq!(decode(p, true), Some(42));
            assert_eq!(decode(p, false), None);
            assert_eq!(decode(std::ptr::null_mut(), true), None);
        }
        assert_eq!(ctxt, [42, 0xdead_beef]);
    }

    #[test]
    fn scoped_to_the_call() {
        assert_eq!(rccl_channel(), None);
        // SAFETY: NULL is always allowed.
        let inside = unsafe { with_channel(std::ptr::null_mut(), rccl_channel) };
        assert_eq!(inside, None);
        assert_eq!(rccl_channel(), None);
    }
}
