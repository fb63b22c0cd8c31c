//! `ncclEnv` ABI v1–v2: the environment plugin (`NCCL_ENV_PLUGIN`, library prefix
//! `libnccl-env`).
//!
//! NCCL resolves every `NCCL_*` parameter through `getEnv` of the loaded env plugin
//! (its built-in one just calls `getenv`). Both versions are the same four slots;
//! v2 adds NCCL's logger as the last argument of `init`.
//!
//! | NCCL | symbols tried (first hit wins) |
//! | --- | --- |
//! | ≤ 2.28.3 | none (no env plugin support) |
//! | 2.28.7 – 2.30.4 | `ncclEnvPlugin_v1` |
//! | 2.30.7 | `ncclEnvPlugin_v2`, then `ncclEnvPlugin_v1` |
//!
//! Call protocol (NCCL's `src/plugin/env.cc`): the library is opened once per
//! process on the first parameter read, `init` is called once (a failure makes every
//! later `ncclGetUniqueId`/`ncclCommInit*` fail with that code, although NCCL's README
//! says it falls back), `getEnv` is called from any thread, and `finalize` runs from an
//! `atexit` handler before the library is closed. A pointer returned by `getEnv` must
//! stay valid until `finalize` or the next `getEnv` of the same name.

use core::ffi::c_char;

use super::common::NcclResult;

pub mod v1;
pub mod v2;

pub use v1::ncclEnv_v1_t;
pub use v2::ncclEnv_v2_t;

/// `finalize(void)` of v1/v2.
pub type EnvFinalize = Option<unsafe extern "C" fn() -> NcclResult>;

/// `getEnv(name)` of v1/v2: a NUL-terminated value, or NULL when unset.
pub type EnvGetEnv = Option<unsafe extern "C" fn(name: *const c_char) -> *const c_char>;

/// Every env ABI version, newest first (the order NCCL 2.30.7 tries them).
pub const VERSIONS: [u32; 2] = [2, 1];

/// Exported symbol name of an env table version, NUL-terminated.
pub const fn symbol(version: u32) -> Option<&'static str> {
    match version {
        2 => Some("ncclEnvPlugin_v2\0"),
        1 => Some("ncclEnvPlugin_v1\0"),
        _ => None,
    }
}

/// The NCCL releases that load a given env table version (for `doctor` and docs).
pub const fn releases(version: u32) -> Option<&'static str> {
    match version {
        2 => Some("2.30.7 and later"),
        1 => Some("2.28.7 and later (the only one before 2.30.7)"),
        _ => None,
    }
}
