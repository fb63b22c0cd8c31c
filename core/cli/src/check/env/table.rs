//! Raw calls into one exported `ncclEnvPlugin_vN` table, as NCCL 2.30.7 makes them.
//!
//! The host adapter (`cclkit_host::env::EnvPlugin`) refuses what NCCL never does
//! (NULL or NUL-containing names); the checks need those calls too, so they go
//! through the table directly. Every returned value is read with a length bound.

use std::ffi::{CStr, CString, c_char};
use std::ptr::NonNull;

use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::env::{ncclEnv_v1_t, ncclEnv_v2_t};
use cclkit_host::Library;
use cclkit_host::library::symbol_size;
use cclkit_host::symbols::Family;

/// Longest value read back (the host adapter's bound too).
pub(super) const MAX_VALUE: usize = 1 << 20;

/// The table of one version, with the library that keeps it mapped.
pub(super) struct Table {
    version: u32,
    addr: NonNull<ncclEnv_v1_t>,
    /// The exported symbol.
    pub symbol: String,
    _lib: Library,
}

/// A `getEnv` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer {
    /// NULL: unset.
    Unset,
    /// A NUL-terminated value (bytes without the NUL).
    Value(Vec<u8>),
    /// No NUL within [`MAX_VALUE`] bytes.
    TooLong,
}

// SAFETY: the table is immutable data in a library `Table` keeps mapped; NCCL calls
// `getEnv` from any thread, which is what the checks exercise.
unsafe impl Sync for Table {}
// SAFETY: as above; nothing in a table is tied to a thread.
unsafe impl Send for Table {}

impl Answer {
    /// How a message shows it.
    pub fn show(&self) -> String {
        match self {
            Answer::Unset => "NULL (unset)".into(),
            Answer::Value(v) if v.len() <= 80 => format!("{:?}", String::from_utf8_lossy(v)),
            Answer::Value(v) => format!("a {}-byte value", v.len()),
            Answer::TooLong => format!("a string with no NUL in its first {MAX_VALUE} bytes"),
        }
    }
}

impl Table {
    /// `dlsym` of `ncclEnvPlugin_v<version>`, checked against the 32-byte table size.
    pub fn open(lib: Library, version: u32) -> Result<Self, String> {
        let symbol = Family::Env.symbol(version);
        let addr = lib
            .data_symbol(&symbol)
            .ok_or_else(|| format!("dlsym({symbol}) found nothing"))?;
        let expected = std::mem::size_of::<ncclEnv_v1_t>();
        if let Some(size) = symbol_size(addr)
            && size < expected
        {
            return Err(format!(
                "{symbol} is {size} bytes, smaller than the {expected}-byte table NCCL reads"
            ));
        }
        if !matches!(version, 1 | 2) {
            return Err(format!(
                "env v{version} is not an ABI version cclkit can drive"
            ));
        }
        Ok(Self {
            version,
            addr: addr.cast(),
            symbol,
            _lib: lib,
        })
    }

    fn v1(&self) -> &ncclEnv_v1_t {
        // SAFETY: the library (kept in `self`) maps at least 32 bytes there; v1 and v2
        // share the layout of every slot but `init`'s signature.
        unsafe { self.addr.as_ref() }
    }

    /// The table's `name`, `None` for NULL.
    pub fn name(&self) -> Option<String> {
        let p = self.v1().name;
        // SAFETY: a non-NULL name is a NUL-terminated string in the plugin's data.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// Which of `init`, `getEnv`, `finalize` are non-NULL.
    pub fn slots(&self) -> (bool, bool, bool) {
        let t = self.v1();
        (t.init.is_some(), t.getEnv.is_some(), t.finalize.is_some())
    }

    /// `init(2, 30, 7, "")` as NCCL 2.30.7 calls it (v2 also gets the host logger).
    pub fn init(&self) -> Result<NcclResult, String> {
        let suffix = c"";
        // SAFETY: slot NULL-checked; the argument list of this version.
        unsafe {
            if self.version == 2 {
                let t = self.addr.cast::<ncclEnv_v2_t>().as_ref();
                let f = t.init.ok_or("init is NULL")?;
                Ok(f(2, 30, 7, suffix.as_ptr(), cclkit_host::logger::logger()))
            } else {
                let f = self.v1().init.ok_or("init is NULL")?;
                Ok(f(2, 30, 7, suffix.as_ptr()))
            }
        }
    }

    fn get_fn(&self) -> Result<FnGet, String> {
        self.v1().getEnv.ok_or_else(|| "getEnv is NULL".into())
    }

    /// `getEnv(name)`.
    pub fn get(&self, name: &str) -> Result<Answer, String> {
        let c = CString::new(name).map_err(|_| format!("{name:?} holds a NUL"))?;
        // SAFETY: NUL-terminated name.
        unsafe { self.get_raw(c.as_ptr()) }
    }

    /// `getEnv(name)` with any pointer, NULL included.
    ///
    /// # Safety
    /// `name` is NULL or NUL-terminated.
    pub unsafe fn get_raw(&self, name: *const c_char) -> Result<Answer, String> {
        let f = self.get_fn()?;
        // SAFETY: caller's contract on `name`.
        let v = unsafe { f(name) };
        if v.is_null() {
            return Ok(Answer::Unset);
        }
        // SAFETY: the ABI promises a NUL-terminated string; reading stops at the NUL
        // or the bound (a plugin returning garbage crashes this child, not the run).
        Ok(unsafe { bounded(v) })
    }

    /// `finalize()`, `None` when the slot is NULL (NCCL skips it).
    pub fn finalize(&self) -> Option<NcclResult> {
        let f: FnFin = self.v1().finalize?;
        // SAFETY: no arguments; called once by the checks.
        Some(unsafe { f() })
    }
}

/// The function inside `cclkit_abi::raw::env::EnvGetEnv`.
type FnGet = unsafe extern "C" fn(*const c_char) -> *const c_char;
/// The function inside `cclkit_abi::raw::env::EnvFinalize`.
type FnFin = unsafe extern "C" fn() -> NcclResult;

/// The bytes at `p` up to its NUL, at most [`MAX_VALUE`].
///
/// # Safety
/// `p` is readable up to its NUL or [`MAX_VALUE`] bytes.
unsafe fn bounded(p: *const c_char) -> Answer {
    let mut out = Vec::new();
    for i in 0..=MAX_VALUE {
        // SAFETY: caller's contract.
        let b = unsafe { p.add(i).cast::<u8>().read() };
        if b == 0 {
            return Answer::Value(out);
        }
        out.push(b);
    }
    Answer::TooLong
}
