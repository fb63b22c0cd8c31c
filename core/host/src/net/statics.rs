//! Net plugins reached without the name walk: a table linked into the program (any
//! version), or one chosen version of a loaded library.
//!
//! NCCL itself only ever takes the newest table a library exports. Plugin crates test
//! every table they export, so their tests need to pick one: `from_static(&ncclNetPlugin_v8)`
//! drives a statically linked v8 table through the same adapter NCCL's v8 shim is
//! modelled on, and [`NetPlugin::load_version`] does the same for a `.so`.

use std::ptr::NonNull;

use cclkit_abi::raw::net::{v6, v7, v8, v9, v10, v11, v12};

use super::NetPlugin;
use super::table::RawNet;
use crate::error::Cause;
use crate::library::{Library, symbol_size};
use crate::symbols::Family;

mod sealed {
    pub trait Sealed {}
}

/// An `ncclNet_vN_t` type the adapters drive (v6 to v12). Sealed: implemented for the
/// ABI crate's table types only.
pub trait NetTable: sealed::Sealed + Sync + 'static {
    /// The ABI version of this table type.
    const VERSION: u32;
    /// The version-tagged pointer to `table`.
    fn raw(table: &'static Self) -> RawNet;
}

macro_rules! net_table {
    ($($module:ident :: $ty:ident => $variant:ident, $version:literal;)*) => {$(
        impl sealed::Sealed for $module::$ty {}
        impl NetTable for $module::$ty {
            const VERSION: u32 = $version;
            fn raw(table: &'static Self) -> RawNet {
                RawNet::$variant(NonNull::from(table))
            }
        }
    )*};
}

net_table! {
    v6::ncclNet_v6_t => V6, 6;
    v7::ncclNet_v7_t => V7, 7;
    v8::ncclNet_v8_t => V8, 8;
    v9::ncclNet_v9_t => V9, 9;
    v10::ncclNet_v10_t => V10, 10;
    v11::ncclNet_v11_t => V11, 11;
    v12::ncclNet_v12_t => V12, 12;
}

impl NetPlugin {
    /// A plugin whose table of any version (v6–v12) is linked into this program, e.g.
    /// a plugin crate's own `ncclNetPlugin_v8` in its tests. It is driven exactly like
    /// a loaded one, including the pre-v11 rule that `init` runs once while any
    /// context of this `NetPlugin` is alive.
    pub fn from_static<T: NetTable>(table: &'static T) -> Self {
        let raw = T::raw(table);
        let name = raw.name().unwrap_or_else(|| "(unnamed)".to_owned());
        Self::new(raw, name, Family::Net.symbol(T::VERSION), None, false, None)
    }

    /// Like [`load`](Self::load), but uses `ncclNetPlugin_v<version>` even when the
    /// library exports a newer table (NCCL always takes the newest; a plugin's tests
    /// check each table it exports). The same checks as `load` apply.
    pub fn load_version(library: Library, version: u32) -> Result<Self, Cause> {
        let symbol = Family::Net.symbol(version);
        let addr = Family::Net
            .accepted()
            .contains(&version)
            .then(|| library.data_symbol(&symbol))
            .flatten()
            .ok_or_else(|| Cause::NoSymbol {
                tried: vec![symbol.clone()],
                exported: crate::symbols::exported(&library, Family::Net)
                    .into_iter()
                    .map(|e| e.symbol)
                    .collect(),
            })?;
        if let (Some(size), Some(expected)) = (symbol_size(addr), Family::Net.table_size(version))
            && size < expected
        {
            return Err(Cause::TableTooSmall {
                symbol,
                size,
                expected,
            });
        }
        // SAFETY: a data symbol of at least the table's size (checked when the size is
        // known) in `library`, which the returned plugin keeps loaded.
        let raw = unsafe { RawNet::from_addr(addr, version) }.ok_or(Cause::NotLoaded)?;
        raw.check_before_init()?;
        let name = raw.name().ok_or(Cause::NullName)?;
        Ok(Self::new(raw, name, symbol, Some(library), false, None))
    }
}
