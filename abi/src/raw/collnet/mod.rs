//! `ncclCollNet` ABI v6–v12 (NCCL_ABI.md §2.10): types only.
//!
//! Exported as `ncclCollNetPlugin_vN` from the same library as the net plugin and
//! searched independently of it (same v12→v6 order); its absence only disables CollNet.
//!
//! One file per version (`v6` … `v12`), as in `raw/net/`; each table is re-exported
//! here, so `raw::collnet::ncclCollNet_vN_t` names every version. The tables spell
//! their function-pointer slots out in full (no shared aliases) so the generated C
//! header keeps NCCL's inline prototypes.

mod v10;
mod v11;
mod v12;
mod v6;
mod v7;
mod v8;
mod v9;

pub use v6::ncclCollNet_v6_t;
pub use v7::ncclCollNet_v7_t;
pub use v8::ncclCollNet_v8_t;
pub use v9::ncclCollNet_v9_t;
pub use v10::ncclCollNet_v10_t;
pub use v11::ncclCollNet_v11_t;
pub use v12::ncclCollNet_v12_t;

/// Every CollNet ABI version NCCL 2.30 loads, newest first.
pub const VERSIONS: [u32; 7] = [12, 11, 10, 9, 8, 7, 6];

/// Exported symbol name of a CollNet table version, NUL-terminated.
pub const fn symbol(version: u32) -> Option<&'static str> {
    match version {
        12 => Some("ncclCollNetPlugin_v12\0"),
        11 => Some("ncclCollNetPlugin_v11\0"),
        10 => Some("ncclCollNetPlugin_v10\0"),
        9 => Some("ncclCollNetPlugin_v9\0"),
        8 => Some("ncclCollNetPlugin_v8\0"),
        7 => Some("ncclCollNetPlugin_v7\0"),
        6 => Some("ncclCollNetPlugin_v6\0"),
        _ => None,
    }
}
