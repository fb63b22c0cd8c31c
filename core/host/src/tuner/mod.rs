//! Tuner host adapter: one interface over `ncclTuner_v1_t` … `ncclTuner_v6_t`.
//!
//! * `init` gets the right argument order per version (v2–v4: context last; v5/v6:
//!   context first, plus the communicator id, NVLink-domain info and the model
//!   constants, which the tuner may rewrite: NCCL's 1152 bytes, RCCL's 1632/1488
//!   under `CCLKIT_FLAVOR=rccl` (see [`layout`]), v7 NCCL's 1272).
//! * `getCollInfo` always works on NCCL's flat `float[7][3]` cost table; for v1/v2
//!   tuners, which return an algorithm/protocol instead, the adapter does what NCCL's
//!   `tuner_v2.cc` shim does (derive CollNet/NVLS support from the table, then set the
//!   chosen entry to 0.0 if it is not ignored).
//! * The constants and the cost table are handed over inside canary-guarded buffers;
//!   a tuner that writes past them, or enables an entry NCCL left at -1 (unsupported
//!   for this call), gets an error naming what it did.
//! * v1 has no context: it is initialised once while any context exists and
//!   `destroy`ed with the last one.

use std::fmt;
use std::sync::{Arc, Mutex};

use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::tuner::ncclTuner_v6_t;

use super::config::PluginKind;
use super::error::{Cause, TunerError};
use super::library::Library;
use super::logger;
use super::symbols::Family;

mod context;
pub mod layout;
pub mod table;

/// NVLink-domain information passed to v5+ `init`.
pub use cclkit_abi::raw::tuner::ncclNvlDomainInfo_v5_t as NvlDomainInfo;
/// NCCL's tuning-model constants (1152 bytes) passed to v5+ `init`.
pub use cclkit_abi::raw::tuner::ncclTunerConstants_v5_t as TunerConstants;
pub use context::{COST_TABLE_LEN, CostTable, TunerContext};
pub use layout::ConstantsLayout;

use table::RawTuner;

/// A tuner plugin ready to be initialised per communicator.
#[derive(Clone)]
pub struct TunerPlugin {
    /// The table, name and library every clone shares (the raw layer, for conformance tools).
    pub shared: Arc<TunerShared>,
}

/// What every clone of a [`TunerPlugin`] shares: the raw table and what keeps it mapped.
pub struct TunerShared {
    /// The version-tagged table pointer.
    pub raw: RawTuner,
    /// The table's `name`, read once at load.
    pub name: Arc<str>,
    /// The exported symbol the table came from.
    pub symbol: String,
    /// Keeps the code `raw` points into mapped (`None` for linked-in tables).
    pub library: Option<Library>,
    /// Live contexts of a v1 tuner (process-global ABI).
    pub v1_refs: Mutex<usize>,
}

impl TunerPlugin {
    /// Finds the tuner table in `library` (`ncclTunerPlugin_v6` … `_v2`, then `_v1`)
    /// and checks its name and required slots.
    pub fn load(library: Library) -> Result<Self, (Cause, Option<(String, u32)>)> {
        let found = table::find(&library).map_err(|c| (c, None))?;
        let at = Some((found.symbol.clone(), found.raw.version()));
        let name = found.raw.name().ok_or((Cause::NullName, at.clone()))?;
        found.raw.check_required().map_err(|c| (c, at))?;
        Ok(Self::new(found.raw, name, found.symbol, Some(library)))
    }

    /// A tuner whose v6 table is linked into this program.
    pub fn from_static_v6(table: &'static ncclTuner_v6_t) -> Self {
        let raw = RawTuner::V6(std::ptr::NonNull::from(table));
        let name = raw.name().unwrap_or_else(|| "(unnamed)".to_owned());
        Self::new(raw, name, Family::Tuner.symbol(6), None)
    }

    fn new(raw: RawTuner, name: String, symbol: String, library: Option<Library>) -> Self {
        Self {
            shared: Arc::new(TunerShared {
                raw,
                name: name.into(),
                symbol,
                library,
                v1_refs: Mutex::new(0),
            }),
        }
    }

    /// The table's `name`.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The tuner ABI version in use.
    pub fn version(&self) -> u32 {
        self.shared.raw.version()
    }

    /// The symbol in use (`ncclTunerPlugin_v6`).
    pub fn symbol(&self) -> &str {
        &self.shared.symbol
    }

    /// The library the table lives in.
    pub fn library(&self) -> Option<&Library> {
        self.shared.library.as_ref()
    }

    /// True if the table has `getChunkSize` (v6, optional).
    pub fn has_chunk_size(&self) -> bool {
        match self.shared.raw.get() {
            table::TunerRef::V6(t) => t.getChunkSize.is_some(),
            table::TunerRef::V7(t) => t.getChunkSize.is_some(),
            _ => false,
        }
    }

    /// Initialises the tuner for one communicator (see [`TunerContext`]).
    ///
    /// `constants` is NCCL's model: the tuner (v5+) may rewrite it, and the new
    /// values are copied back only if the tuner stayed inside the struct. The struct
    /// handed over is the emulated host's ([`layout::host_layout`]: NCCL's, or RCCL's
    /// under `CCLKIT_FLAVOR=rccl`).
    pub fn init(
        &self,
        n_ranks: usize,
        n_nodes: usize,
        comm_id: u64,
        nvl: NvlDomainInfo,
        constants: &mut TunerConstants,
    ) -> Result<TunerContext, TunerError> {
        self.init_as(
            layout::host_layout(),
            n_ranks,
            n_nodes,
            comm_id,
            nvl,
            constants,
        )
    }

    /// As [`init`](Self::init), emulating the host whose constants layout is `layout`
    /// (`Nccl`, `Rccl7` or `Rccl8`; v7 tuners always get NCCL's v7 struct).
    pub fn init_as(
        &self,
        layout: ConstantsLayout,
        n_ranks: usize,
        n_nodes: usize,
        comm_id: u64,
        nvl: NvlDomainInfo,
        constants: &mut TunerConstants,
    ) -> Result<TunerContext, TunerError> {
        TunerContext::init(
            self.clone(),
            n_ranks,
            n_nodes,
            comm_id,
            nvl,
            constants,
            layout,
        )
    }
}

impl fmt::Debug for TunerPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TunerPlugin")
            .field("name", &self.name())
            .field("version", &self.version())
            .field("library", &self.shared.library)
            .finish()
    }
}

impl TunerShared {
    /// Turns a return code into a result, quoting the tuner's WARN since `mark`.
    pub fn check(&self, call: &'static str, mark: u64, rc: NcclResult) -> Result<(), TunerError> {
        if rc.is_ok() {
            return Ok(());
        }
        Err(TunerError {
            kind: PluginKind::Tuner,
            plugin: Arc::clone(&self.name),
            version: self.raw.version(),
            call,
            code: rc,
            plugin_message: logger::warn_since(mark),
            detail: None,
        })
    }

    /// An error the host detected (code `ncclInternalError`).
    pub fn refuse(&self, call: &'static str, detail: impl Into<String>) -> TunerError {
        TunerError {
            kind: PluginKind::Tuner,
            plugin: Arc::clone(&self.name),
            version: self.raw.version(),
            call,
            code: NcclResult::INTERNAL_ERROR,
            plugin_message: None,
            detail: Some(detail.into()),
        }
    }
}
