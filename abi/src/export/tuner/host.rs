//! Which constants struct the host behind a v5/v6 `init` allocated.
//!
//! The `constants` pointer carries no size. NCCL passes its 1152-byte struct to v5 and
//! v6; RCCL (which loads v6, then v5, and has no v7) passes its own wider struct to
//! both. The rule, in order:
//!
//! 1. `CCLKIT_FLAVOR=nccl` or `=rccl` names the host outright (cclkit's own host sets
//!    and honours the same variable when it emulates RCCL).
//! 2. Otherwise the host is RCCL when a `librccl.so*` is mapped into the process (found
//!    by walking the loaded objects, so an RTLD_LOCAL load is seen too), else NCCL.
//! 3. Under RCCL the algorithm count comes from `CCLKIT_RCCL_NUM_ALGO=7|8`. Without it,
//!    cclkit's own RCCL emulation (rule 1, no librccl loaded) uses 8, like cclkit's
//!    host; a real librccl of unknown vintage gets [`ConstantsLayout::RcclUnknown`],
//!    which reaches only the base latencies both RCCL layouts share.
//!
//! Limits: an RCCL renamed to something without `librccl` in its file name, or an NCCL
//! and an RCCL mapped into one process, are not told apart; set `CCLKIT_FLAVOR`.
//! RCCL's v6 header was not among the sources read: its loader tries v6 first and
//! NCCL's v6 constants are v5's typedef, so RCCL's v6 `init` is assumed to get the
//! same struct as its v5 `init`.

use std::ffi::{CStr, c_int, c_void};

use super::view::ConstantsLayout;

/// The layout of the constants a v5/v6 `init` receives in this process now.
pub fn v5_layout() -> ConstantsLayout {
    let flavor = std::env::var("CCLKIT_FLAVOR").ok();
    let algos = std::env::var("CCLKIT_RCCL_NUM_ALGO").ok();
    layout_for(flavor.as_deref(), algos.as_deref(), rccl_loaded)
}

/// The rule above with its inputs passed in (for tests).
pub fn layout_for(
    flavor: Option<&str>,
    rccl_num_algo: Option<&str>,
    rccl_loaded: impl FnOnce() -> bool,
) -> ConstantsLayout {
    let flavor = flavor.map(|f| f.trim().to_ascii_lowercase());
    let (rccl, emulated) = match flavor.as_deref() {
        Some("rccl") => (true, true),
        Some("nccl") => (false, false),
        _ => (rccl_loaded(), false),
    };
    if !rccl {
        return ConstantsLayout::Nccl;
    }
    match rccl_num_algo.map(str::trim) {
        Some("7") => ConstantsLayout::Rccl7,
        Some("8") => ConstantsLayout::Rccl8,
        _ if emulated => ConstantsLayout::Rccl8,
        _ => ConstantsLayout::RcclUnknown,
    }
}

/// True if an object whose file name starts with `librccl.so` is loaded.
pub fn rccl_loaded() -> bool {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid info for the duration of the callback and
        // `data` is the `bool` below.
        unsafe {
            let name = (*info).dlpi_name;
            if name.is_null() {
                return 0;
            }
            let bytes = CStr::from_ptr(name).to_bytes();
            let file = bytes.rsplit(|b| *b == b'/').next().unwrap_or(bytes);
            if file.starts_with(b"librccl.so") {
                *data.cast::<bool>() = true;
                return 1;
            }
        }
        0
    }
    let mut found = false;
    // SAFETY: `visit` only reads the loader's entries and writes `found`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut found).cast()) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConstantsLayout as L;

    #[test]
    fn rule_order() {
        assert_eq!(layout_for(None, None, || false), L::Nccl);
        assert_eq!(layout_for(None, Some("8"), || false), L::Nccl);
        assert_eq!(layout_for(None, None, || true), L::RcclUnknown);
        assert_eq!(layout_for(None, Some("7"), || true), L::Rccl7);
        assert_eq!(layout_for(Some("RCCL"), None, || false), L::Rccl8);
        assert_eq!(layout_for(Some("rccl"), Some("7"), || false), L::Rccl7);
        assert_eq!(layout_for(Some("nccl"), Some("8"), || true), L::Nccl);
        assert_eq!(layout_for(Some("bogus"), None, || true), L::RcclUnknown);
    }

    #[test]
    fn this_test_process_has_no_rccl() {
        assert!(!rccl_loaded());
    }
}
