//! A pointer to whichever `ncclNet_vN_t` a plugin exports, and typed reads of its slots.
//!
//! Slots are read at call time, never copied at load: NCCL uses a v12 table in place,
//! and some plugins fill their table inside `init`.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use cclkit_abi::raw::net::{fns, v6, v7, v8, v9, v10, v11, v12};

use super::super::FnOf;
use super::super::error::Cause;
use super::super::library::{Library, symbol_size};
use super::super::symbols::{self, Family};

/// The exported table, by version.
#[derive(Debug, Clone, Copy)]
pub enum RawNet {
    /// ABI version 6.
    V6(NonNull<v6::ncclNet_v6_t>),
    /// ABI version 7.
    V7(NonNull<v7::ncclNet_v7_t>),
    /// ABI version 8.
    V8(NonNull<v8::ncclNet_v8_t>),
    /// ABI version 9.
    V9(NonNull<v9::ncclNet_v9_t>),
    /// ABI version 10.
    V10(NonNull<v10::ncclNet_v10_t>),
    /// ABI version 11.
    V11(NonNull<v11::ncclNet_v11_t>),
    /// ABI version 12.
    V12(NonNull<v12::ncclNet_v12_t>),
}

// SAFETY: a `RawNet` only points at an immutable table inside a library that its owner
// (`NetShared`) keeps loaded; NCCL calls plugin tables from any thread.
unsafe impl Send for RawNet {}
// SAFETY: as above; reads of the table do not race with writes (tables are not
// written after the plugin's `init`, which happens-before any other use).
unsafe impl Sync for RawNet {}

/// A borrowed view of the table, by version.
#[derive(Clone, Copy)]
pub enum TableRef<'a> {
    /// ABI version 6.
    V6(&'a v6::ncclNet_v6_t),
    /// ABI version 7.
    V7(&'a v7::ncclNet_v7_t),
    /// ABI version 8.
    V8(&'a v8::ncclNet_v8_t),
    /// ABI version 9.
    V9(&'a v9::ncclNet_v9_t),
    /// ABI version 10.
    V10(&'a v10::ncclNet_v10_t),
    /// ABI version 11.
    V11(&'a v11::ncclNet_v11_t),
    /// ABI version 12.
    V12(&'a v12::ncclNet_v12_t),
}

/// Reads a slot whose type is the same in every version (exported as
/// [`common_slot`](crate::net::table::common_slot)).
#[doc(hidden)]
#[macro_export]
macro_rules! __net_common_slot {
    ($raw:expr, $field:ident) => {{
        use $crate::net::table::TableRef as T;
        match $raw.get() {
            T::V6(t) => t.$field,
            T::V7(t) => t.$field,
            T::V8(t) => t.$field,
            T::V9(t) => t.$field,
            T::V10(t) => t.$field,
            T::V11(t) => t.$field,
            T::V12(t) => t.$field,
        }
    }};
}
/// Reads a slot whose type is the same in every version: `common_slot!(raw, isend)`.
pub use crate::__net_common_slot as common_slot;

impl RawNet {
    /// The table, borrowed for as long as this `RawNet` (whose owner keeps the
    /// library loaded, see the type's invariant).
    pub fn get(&self) -> TableRef<'_> {
        // SAFETY (every arm): the pointer came from `from_addr`/a `'static` table and
        // points to a live, immutable table of this version while the owner of this
        // `RawNet` lives; tables are not written after the plugin's `init`.
        match *self {
            // SAFETY: see above.
            RawNet::V6(p) => TableRef::V6(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawNet::V7(p) => TableRef::V7(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawNet::V8(p) => TableRef::V8(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawNet::V9(p) => TableRef::V9(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawNet::V10(p) => TableRef::V10(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawNet::V11(p) => TableRef::V11(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawNet::V12(p) => TableRef::V12(unsafe { p.as_ref() }),
        }
    }

    /// The ABI version.
    pub fn version(self) -> u32 {
        match self {
            RawNet::V6(_) => 6,
            RawNet::V7(_) => 7,
            RawNet::V8(_) => 8,
            RawNet::V9(_) => 9,
            RawNet::V10(_) => 10,
            RawNet::V11(_) => 11,
            RawNet::V12(_) => 12,
        }
    }

    /// Wraps the table at `addr` as version `version`.
    ///
    /// # Safety
    /// `addr` must point to a readable `ncclNet_v<version>_t` that stays valid as long
    /// as the returned value is used.
    pub unsafe fn from_addr(addr: NonNull<c_void>, version: u32) -> Option<Self> {
        Some(match version {
            6 => RawNet::V6(addr.cast()),
            7 => RawNet::V7(addr.cast()),
            8 => RawNet::V8(addr.cast()),
            9 => RawNet::V9(addr.cast()),
            10 => RawNet::V10(addr.cast()),
            11 => RawNet::V11(addr.cast()),
            12 => RawNet::V12(addr.cast()),
            _ => return None,
        })
    }

    /// The table's `name`, or `None` if NULL.
    pub fn name(self) -> Option<String> {
        let p = common_slot!(self, name);
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-NULL `name` is a NUL-terminated string owned by the plugin and
        // valid while it is loaded (ABI contract, NCCL_ABI.md §2.8).
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// The `init` slot, whichever shape this version has.
    pub(crate) fn init(self) -> Option<Init> {
        match self.get() {
            TableRef::V6(t) => t.init.map(Init::V6),
            TableRef::V7(t) => t.init.map(Init::V6),
            TableRef::V8(t) => t.init.map(Init::V6),
            TableRef::V9(t) => t.init.map(Init::V6),
            TableRef::V10(t) => t.init.map(Init::V10),
            TableRef::V11(t) => t.init.map(Init::V11),
            TableRef::V12(t) => t.init.map(Init::V11),
        }
    }

    /// What NCCL needs before it calls `init`: a `name` (printed and compared with
    /// `NCCL_NET`) and an `init`. Every other slot may still be NULL here: several
    /// plugins (the IB/UCX plugin among them) export a table holding only these two
    /// and fill in the rest inside `init`, and NCCL's shims copy the other slots only
    /// after `init` returned (net_v6.cc … net_v11.cc; v12 is read in place).
    pub fn check_before_init(self) -> Result<(), Cause> {
        if common_slot!(self, name).is_null() {
            return Err(Cause::NullName);
        }
        if self.init().is_none() {
            return Err(Cause::MissingFunction { slot: "init" });
        }
        Ok(())
    }

    /// What NCCL calls unconditionally after a successful `init`: `devices`,
    /// `getProperties` and, from v11, `finalize`. The first NULL one is an error.
    pub fn check_after_init(self) -> Result<(), Cause> {
        let missing = |slot: &'static str| Err(Cause::MissingFunction { slot });
        if common_slot!(self, devices).is_none() {
            return missing("devices");
        }
        let has_props = match self.get() {
            TableRef::V6(t) => t.getProperties.is_some(),
            TableRef::V7(t) => t.getProperties.is_some(),
            TableRef::V8(t) => t.getProperties.is_some(),
            TableRef::V9(t) => t.getProperties.is_some(),
            TableRef::V10(t) => t.getProperties.is_some(),
            TableRef::V11(t) => t.getProperties.is_some(),
            TableRef::V12(t) => t.getProperties.is_some(),
        };
        if !has_props {
            return missing("getProperties");
        }
        match self.get() {
            TableRef::V11(t) if t.finalize.is_none() => missing("finalize"),
            TableRef::V12(t) if t.finalize.is_none() => missing("finalize"),
            _ => Ok(()),
        }
    }

    /// Both steps at once, for a table that must be complete without `init` (one
    /// built into the program). A loaded plugin is checked in two steps instead:
    /// [`check_before_init`](Self::check_before_init) at load,
    /// [`check_after_init`](Self::check_after_init) once `init` succeeded.
    pub fn check_required(self) -> Result<(), Cause> {
        self.check_before_init()?;
        self.check_after_init()
    }

    /// The `finalize` slot (v11+ only).
    pub fn finalize(self) -> fns::Finalize {
        match self.get() {
            TableRef::V11(t) => t.finalize,
            TableRef::V12(t) => t.finalize,
            _ => None,
        }
    }
}

/// The shapes of `init`.
#[derive(Clone, Copy)]
pub(crate) enum Init {
    /// `init(logger)` (v6–v9).
    V6(FnOf<fns::InitV6>),
    /// `init(logger, profiler)` (v10).
    V10(FnOf<fns::InitV10>),
    /// `init(ctx, commId, config, logger, profiler)` (v11+).
    V11(FnOf<fns::InitV11>),
}

/// The table found in a library.
pub(crate) struct Found {
    pub raw: RawNet,
    pub symbol: String,
}

/// Looks for `ncclNetPlugin_v12` … `_v6` in order (net.cc `ncclNetPluginLoad`).
pub(crate) fn find(lib: &Library) -> Result<Found, Cause> {
    for &version in Family::Net.accepted() {
        let symbol = Family::Net.symbol(version);
        let Some(addr) = lib.data_symbol(&symbol) else {
            continue;
        };
        if let (Some(size), Some(expected)) = (symbol_size(addr), Family::Net.table_size(version))
            && size < expected
        {
            return Err(Cause::TableTooSmall {
                symbol,
                size,
                expected,
            });
        }
        // SAFETY: the symbol is a data object of at least the table's size (checked when
        // the size is known) in `lib`, which the caller keeps loaded with the table.
        let raw = unsafe { RawNet::from_addr(addr, version) }.ok_or(Cause::NotLoaded)?;
        return Ok(Found { raw, symbol });
    }
    Err(Cause::NoSymbol {
        tried: Family::Net
            .accepted()
            .iter()
            .map(|&v| Family::Net.symbol(v))
            .collect(),
        exported: [Family::Net, Family::CollNet, Family::Tuner]
            .iter()
            .flat_map(|&f| symbols::exported(lib, f))
            .map(|e| e.symbol)
            .collect(),
    })
}
