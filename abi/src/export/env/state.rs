//! The live env plugin and the strings handed to NCCL (the lifetime rule of
//! [`crate::env`]).

use std::collections::HashMap;
use std::ffi::{CString, c_char};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

use crate::env::{Env, EnvInit};
use crate::error::{Error, Result};
use crate::raw::common::subsys;

/// One `init` … `finalize` cycle: the plugin and every string returned in it.
struct Live<T> {
    plugin: T,
    /// Per name, every distinct value returned so far. A `CString`'s buffer never
    /// moves when the `Vec` grows, so each pointer handed out stays valid until the
    /// cycle ends.
    handed_out: Mutex<HashMap<Box<str>, Vec<CString>>>,
}

/// Process-wide state of an exported env plugin.
pub struct EnvState<T> {
    // Readers are `getEnv` calls; `finalize` takes it for writing, so it waits for
    // every in-flight `getEnv` before any string is freed.
    live: RwLock<Option<Live<T>>>,
    warned_idle: AtomicBool,
}

impl<T> EnvState<T> {
    /// Empty state (const, for a `static`).
    pub const fn new() -> Self {
        Self {
            live: RwLock::new(None),
            warned_idle: AtomicBool::new(false),
        }
    }

    /// Drops the instance without `finalize`; run when the library is unloaded.
    pub fn unload(&self) {
        let mut live = self.live.write().unwrap_or_else(PoisonError::into_inner);
        *live = None;
    }

    /// True between a successful `init` and `finalize`.
    pub fn is_live(&self) -> bool {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

impl<T> Default for EnvState<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Env> EnvState<T> {
    /// `init`: creates the instance. A second `init` before `finalize` is refused and
    /// keeps the first instance, whose strings NCCL may still hold.
    ///
    /// No lock is held while `T::init` runs: it may log through NCCL's logger, and a
    /// logger that read a parameter back through `getEnv` must not deadlock (it reads
    /// "unset" instead).
    pub fn init(&self, args: EnvInit<'_>) -> Result<()> {
        let twice = || {
            Error::invalid_usage("init called again before finalize; keeping the first instance")
        };
        if self.is_live() {
            return Err(twice());
        }
        let plugin = T::init(args)?;
        {
            let mut live = self.live.write().unwrap_or_else(PoisonError::into_inner);
            if live.is_some() {
                // A concurrent init won; NCCL never does this, but stay consistent.
                return Err(twice());
            }
            *live = Some(Live {
                plugin,
                handed_out: Mutex::new(HashMap::new()),
            });
        }
        crate::nccl_info!(
            subsys::ENV,
            "{} initialised for NCCL {} through ncclEnvPlugin_v{}",
            T::NAME.to_string_lossy(),
            args.nccl_version,
            args.host_abi
        );
        Ok(())
    }

    /// `getEnv`: the value's address, NULL for unset. Outside `init` … `finalize`
    /// every name reads as unset (warned once): NCCL still calls `getEnv` after a
    /// failed `init`.
    pub fn get(&self, name: &str) -> Result<*const c_char> {
        let live = self.live.read().unwrap_or_else(PoisonError::into_inner);
        let Some(live) = live.as_ref() else {
            drop(live);
            // Logged without the lock held, in case the logger reads a parameter back.
            if !self.warned_idle.swap(true, Ordering::Relaxed) {
                crate::nccl_warn!(
                    "{}: getEnv({name}) outside init…finalize; every variable reads as unset",
                    T::NAME.to_string_lossy()
                );
            }
            return Ok(std::ptr::null());
        };
        let Some(value) = live.plugin.get_env(name)? else {
            return Ok(std::ptr::null());
        };
        let bytes = value.as_encoded_bytes();
        if bytes.contains(&0) {
            return Err(Error::invalid_usage(format!(
                "the value of {name} contains a NUL byte; reading it as unset"
            )));
        }
        let mut handed_out = live
            .handed_out
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(same) = handed_out
            .get(name)
            .and_then(|values| values.iter().find(|s| s.as_bytes() == bytes))
        {
            return Ok(same.as_ptr());
        }
        let owned = CString::new(bytes)
            .map_err(|_| Error::internal(format!("the value of {name} contains a NUL byte")))?;
        let ptr = owned.as_ptr();
        handed_out.entry(name.into()).or_default().push(owned);
        Ok(ptr)
    }

    /// `finalize`: waits for in-flight `getEnv` calls, finalizes the plugin, then
    /// frees every string it handed out.
    pub fn finalize(&self) -> Result<()> {
        let taken = self
            .live
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match taken {
            Some(live) => {
                let Live { plugin, handed_out } = live;
                let result = plugin.finalize();
                drop(handed_out);
                result
            }
            None => Err(Error::invalid_usage("finalize without a successful init")),
        }
    }

    /// Strings handed out in the current cycle (0 outside one); for tests and `check`.
    pub fn handed_out(&self) -> usize {
        let live = self.live.read().unwrap_or_else(PoisonError::into_inner);
        live.as_ref().map_or(0, |l| {
            l.handed_out
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .map(Vec::len)
                .sum()
        })
    }
}
