//! `ibv_query_port` with `active_speed_ex` (XDR and faster), as NCCL's
//! `ncclIbInitDevices` reads it: `active_speed_ex` when non-zero, else `active_speed`.
//!
//! The exported `ibv_query_port` symbol is the compat entry: it fills only the
//! prefix of `struct ibv_port_attr` that existed when the symbol was versioned.
//! `verbs.h`'s inline `ibv_query_port` instead calls the `query_port` op of the
//! extended `struct verbs_context` with the caller's struct size; libibverbs zeroes a
//! buffer of that size and lets the provider fill what it knows (rdma-core's
//! `__lib_query_port`). So this module calls the op with a 56-byte buffer whose last
//! word is `active_speed_ex` (rdma-core ≥ 50 defines it there; older libraries leave
//! it 0, which means "use `active_speed`"). The op is found the way
//! `verbs_get_ctx_op` finds it: the context's `abi_compat` marks an extended context,
//! the `size_t sz` just before the context says how far the provider's
//! `verbs_context` reaches back, and `query_port` is its member farthest back. Every
//! offset here is compared with the installed `verbs.h` in `sys::tests`.

use std::ffi::c_int;

use super::safe::{Context, VerbsError};
use super::sys::{ibv_context, ibv_port_attr};

/// `offsetof(struct ibv_context, abi_compat)`.
pub const CONTEXT_ABI_COMPAT_OFFSET: usize = 320;
/// `__VERBS_ABI_IS_EXTENDED`: `abi_compat` of a context that has a `verbs_context`.
pub const ABI_IS_EXTENDED: usize = usize::MAX;
/// Bytes from `verbs_context.query_port` to the embedded `ibv_context` (members are
/// added in front of `query_port`, so this distance never changes).
pub const VCTX_QUERY_PORT_BEFORE_CONTEXT: usize = 320;
/// Bytes from `verbs_context.sz` to the embedded `ibv_context`.
pub const VCTX_SZ_BEFORE_CONTEXT: usize = 8;
/// `sizeof(struct verbs_context) - offsetof(struct verbs_context, query_port)`: the
/// smallest `sz` of a `verbs_context` that has the op (`verbs_get_ctx_op`'s test).
pub const VCTX_SPAN_FROM_QUERY_PORT: usize = 648;

/// `struct ibv_port_attr` as rdma-core ≥ 50 defines it: the older struct followed by
/// `uint32_t active_speed_ex` (XDR is its bit 8, which `active_speed` cannot hold).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr_ex {
    /// The fields every rdma-core has.
    pub attr: ibv_port_attr,
    /// `active_speed_ex`; 0 when the library or provider does not report it.
    pub active_speed_ex: u32,
}
const _: () = assert!(std::mem::size_of::<ibv_port_attr_ex>() == 56);

/// The extended `query_port` op: `(context, port, attr, sizeof attr)`.
pub type QueryPortOp =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
/// The exported compat `ibv_query_port`.
pub type QueryPortCompat = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;

/// The context's extended `query_port` op, as `verbs_get_ctx_op` finds it; `None`
/// for a context without a `verbs_context`, or one too old to have the op.
///
/// # Safety
/// `ctx` must be a live context returned by `ibv_open_device`.
pub unsafe fn extended_query_port(ctx: *mut ibv_context) -> Option<QueryPortOp> {
    let base = ctx.cast::<u8>();
    // SAFETY: abi_compat lies inside the caller's live ibv_context (offset checked
    // against verbs.h).
    let compat = unsafe {
        base.add(CONTEXT_ABI_COMPAT_OFFSET)
            .cast::<usize>()
            .read_unaligned()
    };
    if compat != ABI_IS_EXTENDED {
        return None;
    }
    // SAFETY: an extended context is embedded in a verbs_context, whose `sz` directly
    // precedes it.
    let sz = unsafe {
        base.sub(VCTX_SZ_BEFORE_CONTEXT)
            .cast::<usize>()
            .read_unaligned()
    };
    if sz < VCTX_SPAN_FROM_QUERY_PORT {
        return None;
    }
    // SAFETY: `sz` says the provider's verbs_context reaches back to query_port.
    unsafe {
        base.sub(VCTX_QUERY_PORT_BEFORE_CONTEXT)
            .cast::<Option<QueryPortOp>>()
            .read_unaligned()
    }
}

/// Queries `port` with `active_speed_ex`: through the extended op when the context
/// has it, else through the compat symbol (`active_speed_ex` then 0). Returns the
/// raw return value (0 or an errno-style code) and the attributes.
///
/// # Safety
/// `ctx` must be a live context returned by `ibv_open_device`, and `compat` the
/// library's `ibv_query_port`.
pub unsafe fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    compat: QueryPortCompat,
) -> (c_int, ibv_port_attr_ex) {
    let mut out = ibv_port_attr_ex::default();
    // SAFETY: caller's contract; the out-pointer covers the size passed.
    let rc = unsafe {
        match extended_query_port(ctx) {
            Some(op) => op(
                ctx,
                port,
                (&mut out as *mut ibv_port_attr_ex).cast(),
                std::mem::size_of::<ibv_port_attr_ex>(),
            ),
            None => compat(ctx, port, &mut out.attr),
        }
    };
    (rc, out)
}

impl Context {
    /// `ibv_query_port` with `active_speed_ex` (0 when not reported).
    pub fn query_port_ex(&self, port: u8) -> Result<ibv_port_attr_ex, VerbsError> {
        // SAFETY: live context; the library's compat symbol.
        let (rc, attr) = unsafe { query_port_ex(self.as_raw(), port, self.verbs().query_port) };
        VerbsError::check("ibv_query_port", rc).map(|()| attr)
    }
}

#[cfg(test)]
mod tests {
    use super::super::device::choose_speed_mbps;
    use super::*;

    /// A stand-in for a provider's `verbs_context` + `ibv_context`, 8-aligned.
    struct FakeVctx {
        words: Vec<u64>,
    }

    impl FakeVctx {
        fn new(sz: usize, op: Option<QueryPortOp>, extended: bool) -> Self {
            let mut words = vec![0u64; (VCTX_QUERY_PORT_BEFORE_CONTEXT + 400) / 8];
            words[0] = op.map_or(0, |f| f as usize as u64);
            words[(VCTX_QUERY_PORT_BEFORE_CONTEXT - VCTX_SZ_BEFORE_CONTEXT) / 8] = sz as u64;
            let ctx_word = VCTX_QUERY_PORT_BEFORE_CONTEXT / 8;
            words[ctx_word + CONTEXT_ABI_COMPAT_OFFSET / 8] =
                if extended { ABI_IS_EXTENDED as u64 } else { 0 };
            Self { words }
        }

        fn ctx(&mut self) -> *mut ibv_context {
            // SAFETY: in bounds of the vector.
            unsafe {
                self.words
                    .as_mut_ptr()
                    .cast::<u8>()
                    .add(VCTX_QUERY_PORT_BEFORE_CONTEXT)
                    .cast()
            }
        }
    }

    /// rdma-core ≥ 50 with an XDR port: fills `active_speed_ex` when the size allows.
    unsafe extern "C" fn new_lib(
        _: *mut ibv_context,
        port: u8,
        attr: *mut ibv_port_attr,
        len: usize,
    ) -> c_int {
        if port != 1 {
            return libc::EINVAL;
        }
        // SAFETY: the caller passes `len` writable bytes.
        unsafe {
            std::ptr::write_bytes(attr.cast::<u8>(), 0, len);
            (*attr).active_speed = 0x80; // NDR bit: what an 8-bit field can say
            (*attr).active_width = 2; // 4x
            if len >= 56 {
                attr.cast::<u8>()
                    .add(52)
                    .cast::<u32>()
                    .write_unaligned(0x100);
            }
        }
        0
    }

    /// rdma-core < 50 (`__lib_query_port` zeroes `len`, the provider fills 52 bytes).
    unsafe extern "C" fn old_lib(
        _: *mut ibv_context,
        _: u8,
        attr: *mut ibv_port_attr,
        len: usize,
    ) -> c_int {
        // SAFETY: as above.
        unsafe {
            std::ptr::write_bytes(attr.cast::<u8>(), 0, len);
            (*attr).active_speed = 0x20; // EDR
            (*attr).active_width = 2;
        }
        0
    }

    unsafe extern "C" fn compat(_: *mut ibv_context, _: u8, attr: *mut ibv_port_attr) -> c_int {
        // SAFETY: one writable ibv_port_attr.
        unsafe {
            (*attr).active_speed = 0x40; // HDR
            (*attr).active_width = 1; // 1x
        }
        0
    }

    fn speed(a: &ibv_port_attr_ex) -> i32 {
        choose_speed_mbps(
            None,
            a.attr.active_speed,
            a.active_speed_ex,
            a.attr.active_width,
        )
    }

    #[test]
    fn xdr_is_read_from_active_speed_ex_through_the_extended_op() {
        let mut v = FakeVctx::new(VCTX_SPAN_FROM_QUERY_PORT, Some(new_lib), true);
        // SAFETY: the fake context is laid out as a verbs_context.
        let (rc, a) = unsafe { query_port_ex(v.ctx(), 1, compat) };
        assert_eq!(rc, 0);
        assert_eq!(a.active_speed_ex, 0x100);
        assert_eq!(speed(&a), 800_000, "XDR 4x, not NDR from active_speed");
        // SAFETY: as above.
        let (rc, _) = unsafe { query_port_ex(v.ctx(), 2, compat) };
        assert_eq!(rc, libc::EINVAL, "the op's error is returned");
    }

    #[test]
    fn an_older_library_leaves_active_speed_ex_zero_and_active_speed_counts() {
        let mut v = FakeVctx::new(VCTX_SPAN_FROM_QUERY_PORT + 64, Some(old_lib), true);
        // SAFETY: as above.
        let (rc, a) = unsafe { query_port_ex(v.ctx(), 1, compat) };
        assert_eq!((rc, a.active_speed_ex), (0, 0));
        assert_eq!(speed(&a), 100_000, "EDR 4x");
    }

    #[test]
    fn contexts_without_the_op_use_the_compat_symbol() {
        for (sz, op, extended) in [
            (
                VCTX_SPAN_FROM_QUERY_PORT,
                Some(new_lib as QueryPortOp),
                false,
            ),
            (VCTX_SPAN_FROM_QUERY_PORT - 8, Some(new_lib), true),
            (VCTX_SPAN_FROM_QUERY_PORT, None, true),
        ] {
            let mut v = FakeVctx::new(sz, op, extended);
            // SAFETY: as above.
            let (rc, a) = unsafe { query_port_ex(v.ctx(), 1, compat) };
            assert_eq!(
                (rc, a.active_speed_ex),
                (0, 0),
                "sz {sz} extended {extended}"
            );
            assert_eq!(speed(&a), 50_000, "HDR 1x from the compat symbol");
        }
    }
}
