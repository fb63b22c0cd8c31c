//! Env plugin host adapter: resolve `NCCL_ENV_PLUGIN`, load `ncclEnvPlugin_v2` or
//! `_v1`, and drive `init` / `getEnv` / `finalize` the way NCCL 2.28.7 – 2.30.7 does
//! (`src/plugin/env.cc`; docs/env-plugin.md).
//!
//! * [`resolve()`] reads the setting exactly as NCCL does: from the process environment
//!   only, `none` (any case) for the built-in plugin, otherwise the names of every NCCL
//!   plugin (`value`, then `libnccl-env-<value>.so`; unset: `libnccl-env.so`).
//! * A library that opens but exports no env table is closed and the built-in plugin
//!   is used ([`EnvOutcome::Unsupported`]), as NCCL does.
//! * [`EnvPlugin::init`] passes NCCL's version and, for v2, the host logger. A failed
//!   `init` is an error but the plugin stays usable for `getEnv`, because NCCL keeps
//!   calling it (it does not fall back).
//! * [`EnvPlugin::get_env`] copies the returned string at once, bounded, so nothing
//!   depends on how long the plugin keeps it alive.

use std::fmt;

use cclkit_abi::raw::common::NcclResult;
use serde::Serialize;

mod plugin;
mod process;
pub mod resolve;
mod table;

pub use plugin::{EnvInitArgs, EnvPlugin};
pub use process::{ProcessEnv, ValueSource, asks_plugin, process_env};
pub use resolve::{ENV_VAR, EnvOutcome, EnvResolution, resolve, resolve_value};
pub use table::RawEnv;

/// The longest value [`EnvPlugin::get_env`] copies (1 MiB): a longer string (or one
/// without a NUL) is refused rather than read without end.
pub const MAX_VALUE_LEN: usize = 1 << 20;

/// What went wrong with an env plugin, naming the plugin and the call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum EnvError {
    /// The table's `init` or `getEnv` slot is NULL (NCCL would crash calling it).
    NullSlot {
        /// The plugin's table name.
        plugin: String,
        /// The exported symbol.
        symbol: String,
        /// `init` or `getEnv`.
        slot: &'static str,
    },
    /// `init` returned an error; NCCL fails every later communicator creation with it.
    InitFailed {
        /// The plugin's table name.
        plugin: String,
        /// The raw `ncclResult_t`.
        code: i32,
        /// The last WARN the plugin logged during `init`.
        plugin_message: Option<String>,
    },
    /// `init` was called a second time (NCCL calls it once per process).
    AlreadyInitialized {
        /// The plugin's table name.
        plugin: String,
    },
    /// `finalize` returned an error.
    FinalizeFailed {
        /// The plugin's table name.
        plugin: String,
        /// The raw `ncclResult_t`.
        code: i32,
    },
    /// `getEnv` after `finalize`: the plugin's strings are gone.
    Finalized {
        /// The plugin's table name.
        plugin: String,
    },
    /// A variable name containing a NUL byte (cannot be passed to C).
    BadName {
        /// The name, escaped.
        name: String,
    },
    /// `getEnv` returned a string longer than [`MAX_VALUE_LEN`].
    ValueTooLong {
        /// The plugin's table name.
        plugin: String,
        /// The variable asked for.
        name: String,
    },
    /// `getEnv` returned bytes that are not UTF-8.
    ValueNotUtf8 {
        /// The plugin's table name.
        plugin: String,
        /// The variable asked for.
        name: String,
    },
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NullSlot {
                plugin,
                symbol,
                slot,
            } => write!(f, "ENV plugin '{plugin}' ({symbol}): {slot} is NULL"),
            Self::InitFailed {
                plugin,
                code,
                plugin_message,
            } => {
                write!(
                    f,
                    "ENV plugin '{plugin}': init failed: {}; NCCL fails every \
                     communicator creation of the process with it",
                    code_text(*code)
                )?;
                match plugin_message {
                    Some(m) => write!(f, " (plugin said: {m})"),
                    None => Ok(()),
                }
            }
            Self::AlreadyInitialized { plugin } => {
                write!(f, "ENV plugin '{plugin}': init called twice")
            }
            Self::FinalizeFailed { plugin, code } => write!(
                f,
                "ENV plugin '{plugin}': finalize failed: {}",
                code_text(*code)
            ),
            Self::Finalized { plugin } => {
                write!(f, "ENV plugin '{plugin}': getEnv after finalize")
            }
            Self::BadName { name } => write!(f, "variable name {name} contains a NUL byte"),
            Self::ValueTooLong { plugin, name } => write!(
                f,
                "ENV plugin '{plugin}': getEnv({name}) returned more than {MAX_VALUE_LEN} \
                 bytes without a NUL"
            ),
            Self::ValueNotUtf8 { plugin, name } => write!(
                f,
                "ENV plugin '{plugin}': getEnv({name}) returned a value that is not UTF-8"
            ),
        }
    }
}

impl std::error::Error for EnvError {}

/// "ncclInternalError (3)" for a raw result code.
fn code_text(code: i32) -> String {
    match NcclResult(code).name() {
        Some(n) => format!("{n} ({code})"),
        None => format!("unknown ncclResult_t {code}"),
    }
}
