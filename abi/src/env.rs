//! The `Env` trait env plugin authors implement (`NCCL_ENV_PLUGIN`).
//!
//! One `impl Env` plus [`export_env!`](crate::export_env) publishes
//! `ncclEnvPlugin_v1` and `_v2`. NCCL asks the env plugin for **every** parameter it
//! reads, so an implementation that answers `None` for a name hides the process
//! environment's value of it: pass the process environment through (see
//! [`process_value`]) for names the plugin has no opinion about.
//!
//! # Lifetime of returned values
//!
//! NCCL keeps the `const char*` that `getEnv` returned and may read it until
//! `finalize` or the next `getEnv` of the same name. The export layer gives a
//! stronger guarantee, so a plugin never has to think about it: every value is copied
//! into a NUL-terminated string owned by the export layer, the same name and value
//! always return the same address, and **no returned string is freed or changed
//! before `finalize`** (a name whose value changes gets a new string; the old one is
//! kept). Memory therefore grows only with the number of distinct values returned in
//! one `init` … `finalize` cycle.

use std::borrow::Cow;
use std::ffi::{CStr, OsStr};
use std::fmt;

use crate::error::Result;

/// A value returned by [`Env::get_env`]: borrowed from the plugin or owned.
pub type EnvValue<'a> = Cow<'a, OsStr>;

/// The NCCL release that loaded the plugin, as `init` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NcclVersion {
    /// `NCCL_MAJOR`.
    pub major: u8,
    /// `NCCL_MINOR`.
    pub minor: u8,
    /// `NCCL_PATCH`.
    pub patch: u8,
}

impl NcclVersion {
    /// `NCCL_VERSION_CODE` as NCCL computes it since 2.9 (`2.30.7` → 23007).
    pub const fn code(self) -> u32 {
        self.major as u32 * 10000 + self.minor as u32 * 100 + self.patch as u32
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What `init` receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvInit<'a> {
    /// Env ABI version the host called through (2 for NCCL 2.30.7, 1 before).
    pub host_abi: u32,
    /// The loading NCCL's version.
    pub nccl_version: NcclVersion,
    /// NCCL's version suffix (`NCCL_SUFFIX`, often empty); lossy if not UTF-8.
    pub suffix: &'a str,
}

/// An environment plugin, written once and exported as every env ABI version.
///
/// NCCL creates one instance per process (`init`), asks it for values from any
/// thread (`get_env`, hence `Sync`), and drops it from an `atexit` handler
/// (`finalize`).
pub trait Env: Sized + Send + Sync + 'static {
    /// The plugin's name (NCCL logs it at INFO).
    const NAME: &'static CStr;

    /// Creates the process's env plugin. An error makes NCCL fail every
    /// `ncclGetUniqueId` / `ncclCommInit*` of the process with its code, so return one
    /// only for a configuration that must not run (a broken pinned file, say).
    fn init(args: EnvInit<'_>) -> Result<Self>;

    /// The value of `name`, or `None` for "unset". An error is logged at WARN and
    /// reads as unset. Must not block: NCCL calls it on its hot init paths.
    fn get_env(&self, name: &str) -> Result<Option<EnvValue<'_>>>;

    /// Releases the plugin; the values it returned are freed right after.
    fn finalize(self) -> Result<()> {
        Ok(())
    }
}

/// `name`'s value in the process environment (what NCCL's built-in env plugin
/// returns), for implementations that pass it through.
pub fn process_value(name: &str) -> Option<EnvValue<'static>> {
    // A name std refuses (empty, `=` or NUL inside) cannot be set, so it is unset.
    if name.is_empty() || name.contains(['=', '\0']) {
        return None;
    }
    std::env::var_os(name).map(Cow::Owned)
}
