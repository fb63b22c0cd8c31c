//! One loaded env plugin: `init` once, `getEnv` from any thread, `finalize` once.

use std::ffi::{CString, c_char};
use std::fmt;
use std::sync::RwLock;

use super::super::library::Library;
use super::super::logger;
use super::table::RawEnv;
use super::{EnvError, MAX_VALUE_LEN};

/// What `init` is told about the host: NCCL passes its own `NCCL_MAJOR`, `NCCL_MINOR`,
/// `NCCL_PATCH` and `NCCL_SUFFIX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvInitArgs {
    /// `ncclMajor`.
    pub major: u8,
    /// `ncclMinor`.
    pub minor: u8,
    /// `ncclPatch`.
    pub patch: u8,
    /// `suffix` (NCCL's release suffix, usually empty).
    pub suffix: CString,
}

impl Default for EnvInitArgs {
    /// NCCL 2.30.7, the newest release whose env loader cclkit follows.
    fn default() -> Self {
        Self {
            major: 2,
            minor: 30,
            patch: 7,
            suffix: CString::default(),
        }
    }
}

/// Where the plugin is in its one-way life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Loaded,
    Initialized,
    /// `init` failed; NCCL still calls `getEnv`.
    InitFailed,
    Finalized,
}

/// A loaded env plugin. Dropping it calls `finalize` if `init` succeeded and
/// `finalize` was not called (NCCL does so from `atexit`), then closes the library.
pub struct EnvPlugin {
    raw: RawEnv,
    name: String,
    symbol: String,
    /// `getEnv` holds it shared, `init`/`finalize` exclusively, so `finalize` never
    /// runs while a `getEnv` is in flight.
    state: RwLock<State>,
    /// The suffix given to `init`, kept while the plugin lives: NCCL passes a string
    /// literal (`NCCL_SUFFIX`), so a plugin may keep the pointer.
    suffix: std::sync::OnceLock<std::ffi::CString>,
    // Keeps the code `raw` points into mapped; dropped after `raw`'s last use.
    library: Library,
}

impl fmt::Debug for EnvPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvPlugin")
            .field("name", &self.name)
            .field("symbol", &self.symbol)
            .field("library", &self.library.display_name())
            .finish_non_exhaustive()
    }
}

impl EnvPlugin {
    pub(super) fn new(raw: RawEnv, name: String, symbol: String, library: Library) -> Self {
        Self {
            raw,
            name,
            symbol,
            state: RwLock::new(State::Loaded),
            suffix: std::sync::OnceLock::new(),
            library,
        }
    }

    /// The table's `name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The exported symbol in use (`ncclEnvPlugin_v2` or `_v1`).
    pub fn symbol(&self) -> &str {
        &self.symbol
    }

    /// The ABI version in use.
    pub fn version(&self) -> u32 {
        self.raw.version()
    }

    /// The library the table lives in.
    pub fn library(&self) -> &Library {
        &self.library
    }

    /// Calls `init` once (v2 also gets the host logger). On failure the plugin stays
    /// callable through [`get_env`](Self::get_env), as in NCCL.
    pub fn init(&self, args: &EnvInitArgs) -> Result<(), EnvError> {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        if *state != State::Loaded {
            return Err(EnvError::AlreadyInitialized {
                plugin: self.name.clone(),
            });
        }
        let mark = logger::warn_mark();
        // `init` runs once, so this is always the caller's suffix.
        let suffix = self.suffix.get_or_init(|| args.suffix.clone()).as_ptr();
        // SAFETY: the library is mapped while `self` lives; the slot is checked for NULL
        // and called with the argument list of its version; `suffix` lives as long as
        // the plugin does.
        let code = unsafe {
            match self.raw {
                RawEnv::V1(t) => {
                    let init = t.as_ref().init.ok_or_else(|| self.null_slot("init"))?;
                    init(args.major, args.minor, args.patch, suffix)
                }
                RawEnv::V2(t) => {
                    let init = t.as_ref().init.ok_or_else(|| self.null_slot("init"))?;
                    init(args.major, args.minor, args.patch, suffix, logger::logger())
                }
            }
        };
        if code.is_ok() {
            *state = State::Initialized;
            tracing::info!(plugin = %self.name, symbol = %self.symbol, "env plugin initialised");
            return Ok(());
        }
        *state = State::InitFailed;
        Err(EnvError::InitFailed {
            plugin: self.name.clone(),
            code: code.0,
            plugin_message: logger::warn_since(mark),
        })
    }

    /// `getEnv(name)`, the returned string copied before this returns (`None`: unset).
    pub fn get_env(&self, name: &str) -> Result<Option<String>, EnvError> {
        let cname = CString::new(name).map_err(|_| EnvError::BadName {
            name: name.escape_debug().to_string(),
        })?;
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        if *state == State::Finalized {
            return Err(EnvError::Finalized {
                plugin: self.name.clone(),
            });
        }
        // SAFETY: mapped library, NULL-checked slot, NUL-terminated argument; the
        // shared lock keeps `finalize` from running until the value is copied.
        let value = unsafe {
            let get = match self.raw {
                RawEnv::V1(t) => t.as_ref().getEnv,
                RawEnv::V2(t) => t.as_ref().getEnv,
            }
            .ok_or_else(|| self.null_slot("getEnv"))?;
            get(cname.as_ptr())
        };
        if value.is_null() {
            return Ok(None);
        }
        // SAFETY: the ABI keeps a returned string valid until finalize (excluded by the
        // lock) or the next getEnv of this name; a concurrent getEnv of the same name
        // is NCCL's own race too, and is why the value is copied here at once.
        let bytes = unsafe { bounded_c_str(value) }.ok_or_else(|| EnvError::ValueTooLong {
            plugin: self.name.clone(),
            name: name.to_owned(),
        })?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| EnvError::ValueNotUtf8 {
                plugin: self.name.clone(),
                name: name.to_owned(),
            })
    }

    /// Calls `finalize` (once; a NULL slot is skipped, as NCCL does). Later `getEnv`
    /// calls are refused.
    pub fn finalize(&self) -> Result<(), EnvError> {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        if *state == State::Finalized {
            return Ok(());
        }
        *state = State::Finalized;
        // SAFETY: mapped library; no getEnv is in flight (exclusive lock).
        let finalize = unsafe {
            match self.raw {
                RawEnv::V1(t) => t.as_ref().finalize,
                RawEnv::V2(t) => t.as_ref().finalize,
            }
        };
        let Some(finalize) = finalize else {
            return Ok(());
        };
        // SAFETY: as above; `finalize` takes no arguments.
        let code = unsafe { finalize() };
        if code.is_ok() {
            Ok(())
        } else {
            Err(EnvError::FinalizeFailed {
                plugin: self.name.clone(),
                code: code.0,
            })
        }
    }

    /// True once `init` succeeded and before `finalize`.
    pub fn is_initialized(&self) -> bool {
        *self.state.read().unwrap_or_else(|p| p.into_inner()) == State::Initialized
    }

    fn null_slot(&self, slot: &'static str) -> EnvError {
        EnvError::NullSlot {
            plugin: self.name.clone(),
            symbol: self.symbol.clone(),
            slot,
        }
    }
}

impl Drop for EnvPlugin {
    fn drop(&mut self) {
        let state = *self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        // NCCL registers its atexit finalize only after a successful init.
        if state == State::Initialized
            && let Err(e) = self.finalize()
        {
            tracing::warn!("{e}");
        }
    }
}

/// Copies a NUL-terminated string of at most [`MAX_VALUE_LEN`] bytes.
///
/// # Safety
/// `p` must be readable up to its NUL or to `MAX_VALUE_LEN` bytes, whichever is first.
unsafe fn bounded_c_str(p: *const c_char) -> Option<Vec<u8>> {
    // SAFETY: the caller guarantees the bytes up to the NUL (or the bound) are readable.
    let len = unsafe { libc::strnlen(p, MAX_VALUE_LEN + 1) };
    if len > MAX_VALUE_LEN {
        return None;
    }
    // SAFETY: `len` bytes were just found readable.
    Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec())
}
