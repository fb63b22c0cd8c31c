//! One exported ABI version into the loader's host adapters.
//!
//! The loader picks the newest version a library exports, as NCCL does; the suite
//! checks every version, so it builds the adapters for the one asked for.

use std::path::Path;
use std::sync::{Arc, Mutex};

use cclkit_host::Library;
use cclkit_host::error::Cause;
use cclkit_host::library::symbol_size;
use cclkit_host::net::table::RawNet;
use cclkit_host::net::{NetPlugin, NetShared};
use cclkit_host::symbols::Family;
use cclkit_host::tuner::table::RawTuner;
use cclkit_host::tuner::{TunerPlugin, TunerShared};

/// `dlopen`s the library as NCCL does (`RTLD_NOW | RTLD_LOCAL`).
pub(crate) fn open(path: &Path) -> Result<Library, String> {
    Library::open(Some(&path.display().to_string())).map_err(|e| format!("dlopen failed: {e}"))
}

/// The address of `family`'s table of `version`, checked against its size.
fn table_addr(
    lib: &Library,
    family: Family,
    version: u32,
) -> Result<(String, std::ptr::NonNull<std::ffi::c_void>), String> {
    let symbol = family.symbol(version);
    let addr = lib
        .data_symbol(&symbol)
        .ok_or_else(|| format!("dlsym({symbol}) found nothing"))?;
    if let (Some(size), Some(expected)) = (symbol_size(addr), family.table_size(version))
        && size < expected
    {
        return Err(format!(
            "{symbol} is {size} bytes, smaller than the {expected}-byte v{version} table"
        ));
    }
    Ok((symbol, addr))
}

/// Explains a loader `Cause` found in a table.
fn cause_text(c: &Cause, symbol: &str) -> String {
    match c {
        Cause::NullName => format!("{symbol}.name is NULL (NCCL prints and compares it)"),
        Cause::MissingFunction { slot } => {
            format!("{symbol}.{slot} is NULL but NCCL calls it unconditionally")
        }
        other => format!("{symbol}: {other:?}"),
    }
}

/// The net plugin of `version` in `lib`.
pub(crate) fn net(lib: &Library, version: u32) -> Result<NetPlugin, String> {
    let (symbol, addr) = table_addr(lib, Family::Net, version)?;
    // SAFETY: `addr` is the data symbol of this version's table, at least the
    // table's size when the linker knows it; `lib` (kept in the plugin) keeps it mapped.
    let raw = unsafe { RawNet::from_addr(addr, version) }
        .ok_or_else(|| format!("net v{version} is not an ABI version cclkit can drive"))?;
    let name = raw
        .name()
        .ok_or_else(|| cause_text(&Cause::NullName, &symbol))?;
    // The rest of the table is checked after `init` (NetContext::init), as NCCL does.
    raw.check_before_init()
        .map_err(|c| cause_text(&c, &symbol))?;
    Ok(NetPlugin {
        shared: Arc::new(NetShared {
            raw,
            name: name.into(),
            symbol,
            library: Some(lib.clone()),
            builtin: false,
            legacy_refs: Mutex::new(0),
            collnet: None,
        }),
    })
}

/// The tuner of `version` in `lib`.
pub(crate) fn tuner(lib: &Library, version: u32) -> Result<TunerPlugin, String> {
    let (symbol, addr) = table_addr(lib, Family::Tuner, version)?;
    // SAFETY: `addr` is the data symbol of this version's table; `lib` (kept in the
    // plugin) keeps it mapped.
    let raw = unsafe { RawTuner::from_addr(addr, version) }
        .ok_or_else(|| format!("tuner v{version} is not an ABI version cclkit can drive"))?;
    let name = raw
        .name()
        .ok_or_else(|| cause_text(&Cause::NullName, &symbol))?;
    raw.check_required().map_err(|c| cause_text(&c, &symbol))?;
    Ok(TunerPlugin {
        shared: Arc::new(TunerShared {
            raw,
            name: name.into(),
            symbol,
            library: Some(lib.clone()),
            v1_refs: Mutex::new(0),
        }),
    })
}
