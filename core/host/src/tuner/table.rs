//! A pointer to whichever `ncclTuner_vN_t` (v1–v7) a plugin exports.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use cclkit_abi::raw::tuner::{
    ncclTuner_v1_t, ncclTuner_v2_t, ncclTuner_v3_t, ncclTuner_v4_t, ncclTuner_v5_t, ncclTuner_v6_t,
    ncclTuner_v7_t,
};

use super::super::error::Cause;
use super::super::library::{Library, symbol_size};
use super::super::symbols::{self, Family};

/// The exported table, by version.
#[derive(Debug, Clone, Copy)]
pub enum RawTuner {
    /// ABI version 1.
    V1(NonNull<ncclTuner_v1_t>),
    /// ABI version 2.
    V2(NonNull<ncclTuner_v2_t>),
    /// ABI version 3.
    V3(NonNull<ncclTuner_v3_t>),
    /// ABI version 4.
    V4(NonNull<ncclTuner_v4_t>),
    /// ABI version 5.
    V5(NonNull<ncclTuner_v5_t>),
    /// ABI version 6.
    V6(NonNull<ncclTuner_v6_t>),
    /// ABI version 7 (NCCL source after 2.31).
    V7(NonNull<ncclTuner_v7_t>),
}

// SAFETY: a `RawTuner` only points at an immutable table inside a library that its
// owner (`TunerShared`) keeps loaded; NCCL calls tuners from any thread.
unsafe impl Send for RawTuner {}
// SAFETY: as above; the table is only read.
unsafe impl Sync for RawTuner {}

/// A borrowed view of the table, by version.
#[derive(Clone, Copy)]
pub enum TunerRef<'a> {
    /// ABI version 1.
    V1(&'a ncclTuner_v1_t),
    /// ABI version 2.
    V2(&'a ncclTuner_v2_t),
    /// ABI version 3.
    V3(&'a ncclTuner_v3_t),
    /// ABI version 4.
    V4(&'a ncclTuner_v4_t),
    /// ABI version 5.
    V5(&'a ncclTuner_v5_t),
    /// ABI version 6.
    V6(&'a ncclTuner_v6_t),
    /// ABI version 7.
    V7(&'a ncclTuner_v7_t),
}

impl RawTuner {
    /// Wraps the table at `addr` as version `version` (`None`: a version cclkit
    /// cannot drive).
    ///
    /// # Safety
    /// `addr` must point to a readable `ncclTuner_v<version>_t` that stays valid as
    /// long as the returned value is used.
    pub unsafe fn from_addr(addr: NonNull<c_void>, version: u32) -> Option<Self> {
        Some(match version {
            1 => RawTuner::V1(addr.cast()),
            2 => RawTuner::V2(addr.cast()),
            3 => RawTuner::V3(addr.cast()),
            4 => RawTuner::V4(addr.cast()),
            5 => RawTuner::V5(addr.cast()),
            6 => RawTuner::V6(addr.cast()),
            7 => RawTuner::V7(addr.cast()),
            _ => return None,
        })
    }

    /// The table, borrowed for as long as this value (whose owner keeps the library
    /// loaded).
    pub fn get(&self) -> TunerRef<'_> {
        // SAFETY (every arm): the pointer came from `find`/a `'static` table and points
        // to a live table of this version while the owner of this value lives.
        match *self {
            // SAFETY: see above.
            RawTuner::V1(p) => TunerRef::V1(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawTuner::V2(p) => TunerRef::V2(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawTuner::V3(p) => TunerRef::V3(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawTuner::V4(p) => TunerRef::V4(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawTuner::V5(p) => TunerRef::V5(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawTuner::V6(p) => TunerRef::V6(unsafe { p.as_ref() }),
            // SAFETY: see above.
            RawTuner::V7(p) => TunerRef::V7(unsafe { p.as_ref() }),
        }
    }

    /// The ABI version.
    pub fn version(self) -> u32 {
        match self {
            RawTuner::V1(_) => 1,
            RawTuner::V2(_) => 2,
            RawTuner::V3(_) => 3,
            RawTuner::V4(_) => 4,
            RawTuner::V5(_) => 5,
            RawTuner::V6(_) => 6,
            RawTuner::V7(_) => 7,
        }
    }

    /// The table's `name`, or `None` if NULL.
    pub fn name(self) -> Option<String> {
        let p = match self.get() {
            TunerRef::V1(t) => t.name,
            TunerRef::V2(t) => t.name,
            TunerRef::V3(t) => t.name,
            TunerRef::V4(t) => t.name,
            TunerRef::V5(t) => t.name,
            TunerRef::V6(t) => t.name,
            TunerRef::V7(t) => t.name,
        };
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-NULL `name` is a NUL-terminated string owned by the plugin and
        // valid while it is loaded.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// The first required slot (`init`, `getCollInfo`, `destroy`/`finalize`) that is NULL.
    pub fn check_required(self) -> Result<(), Cause> {
        let (init, coll, fin) = match self.get() {
            TunerRef::V1(t) => (
                t.init.is_some(),
                t.getCollInfo.is_some(),
                t.destroy.is_some(),
            ),
            TunerRef::V2(t) => (
                t.init.is_some(),
                t.getCollInfo.is_some(),
                t.destroy.is_some(),
            ),
            TunerRef::V3(t) => (
                t.init.is_some(),
                t.getCollInfo.is_some(),
                t.destroy.is_some(),
            ),
            TunerRef::V4(t) => (
                t.init.is_some(),
                t.getCollInfo.is_some(),
                t.destroy.is_some(),
            ),
            TunerRef::V5(t) => (
                t.init.is_some(),
                t.getCollInfo.is_some(),
                t.finalize.is_some(),
            ),
            TunerRef::V6(t) => (
                t.init.is_some(),
                t.getCollInfo.is_some(),
                t.finalize.is_some(),
            ),
            TunerRef::V7(t) => (
                t.init.is_some(),
                t.getCollInfo.is_some(),
                t.finalize.is_some(),
            ),
        };
        let slot = if !init {
            "init"
        } else if !coll {
            "getCollInfo"
        } else if !fin {
            if self.version() >= 5 {
                "finalize"
            } else {
                "destroy"
            }
        } else {
            return Ok(());
        };
        Err(Cause::MissingFunction { slot })
    }
}

/// The table found in a library.
pub(crate) struct Found {
    pub raw: RawTuner,
    pub symbol: String,
}

/// Looks for `ncclTunerPlugin_v6` … `_v2`, then `_v1` (tuner.cc; v1 is cclkit's
/// addition for NCCL 2.19–2.20 tuners).
pub(crate) fn find(lib: &Library) -> Result<Found, Cause> {
    // RCCL's loader tries v6 … v2: it has no v7, and never loaded v1.
    let rccl = super::layout::host_layout().is_rccl();
    for &version in Family::Tuner.accepted() {
        if rccl && matches!(version, 1 | 7) {
            continue;
        }
        let symbol = Family::Tuner.symbol(version);
        let Some(addr) = lib.data_symbol(&symbol) else {
            continue;
        };
        if let (Some(size), Some(expected)) = (symbol_size(addr), Family::Tuner.table_size(version))
            && size < expected
        {
            return Err(Cause::TableTooSmall {
                symbol,
                size,
                expected,
            });
        }
        // SAFETY: `addr` is the library's data symbol of this version, kept mapped by
        // the returned `Found`'s owner.
        let raw = unsafe { RawTuner::from_addr(addr, version) }.ok_or(Cause::NotLoaded)?;
        return Ok(Found { raw, symbol });
    }
    Err(Cause::NoSymbol {
        tried: Family::Tuner
            .accepted()
            .iter()
            .map(|&v| Family::Tuner.symbol(v))
            .collect(),
        exported: [Family::Net, Family::CollNet, Family::Tuner]
            .iter()
            .flat_map(|&f| symbols::exported(lib, f))
            .map(|e| e.symbol)
            .collect(),
    })
}
