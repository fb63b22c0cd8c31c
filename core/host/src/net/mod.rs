//! Net host adapter: one interface over whichever `ncclNet_vN_t` (v6–v12) a plugin
//! exports, doing what NCCL's version shims do (NCCL_ABI.md §2.12).
//!
//! ```text
//! NetPlugin ──init(comm_id, config)──▶ NetContext ──listen(dev)──▶ (handle, ListenComm)
//!                                        │                          └─accept()─▶ RecvComm
//!                                        └──connect(dev, handle)──▶ Connecting ─poll()─▶ SendComm
//! SendComm::isend / RecvComm::irecv ─▶ Request ─▶ comm.test(&mut req) ─▶ Some(Sizes)
//! ```
//!
//! * **Versions.** v11+ get a real per-communicator `init`/`finalize`; v6–v10 are
//!   initialised once while any context is alive (finalize = refcount decrement), and
//!   v10 gets its `ncclNetCommConfig` as the context passed to `connect`.
//! * **Size limits.** Calls an old ABI cannot express are refused with
//!   `ncclInternalError` before reaching the plugin, as NCCL's shims do: `regMr` of
//!   2 GiB or more for v6/v7, `isend`/`irecv` over 1 GiB for v6–v8; `test`/`iflush`
//!   sizes are `int` in every version.
//! * **Properties.** Older layouts are converted to the current one with the shims'
//!   defaults; the plugin writes into a buffer of exactly its version's size with
//!   canaries around it, and an overrun is an error.
//! * **Lifetimes.** A context keeps its plugin (and so its library) alive; a comm keeps
//!   its context alive; `finalize` runs after the last comm closes. Comms close on
//!   drop. Requests are inert tokens tested *through their comm* (`&mut` access), so
//!   one comm is never called from two threads at once (NCCL's contract).
//! * **Errors** are [`NetError`]s: the raw `ncclResult_t`, the call, the plugin's name
//!   and version, and the last WARN the plugin logged on this thread.
//! * **Pinned tables.** NCCL always takes a library's newest table; a plugin's own
//!   tests drive each table they export with [`NetPlugin::from_static`] (a table linked
//!   into the test, any version) or [`NetPlugin::load_version`] (one table of a `.so`).
//!
//! Trust: a plugin is foreign code running in this process. The adapters check what
//! can be checked (NULL slots, sizes, overruns, sentinel misuse), but a plugin that
//! breaks the ABI in other ways can still corrupt the process, as under NCCL.

use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex};

use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::net::v12::ncclNet_v12_t;

use super::config::PluginKind;
use super::error::{Cause, NetError};
use super::library::Library;
use super::logger;
use super::symbols::{self, Family};

mod comm;
mod context;
mod post;
mod props;
mod request;
mod statics;
pub mod table;

pub use comm::{Connecting, ListenComm, Mr, RecvBuffer, RecvComm, SendComm};
pub use context::NetContext;
pub use request::{Request, RequestId, Sizes};
pub use statics::NetTable;

/// The transport installed by [`NetPlugin::install_builtin`].
static BUILTIN: std::sync::OnceLock<&'static ncclNet_v12_t> = std::sync::OnceLock::new();
/// The per-communicator configuration passed to `init` (v11+) or `connect` (v10).
pub use cclkit_abi::net::CommConfig;
/// Device properties in the current (v12) shape.
pub use cclkit_abi::net::Properties;

use table::RawNet;

/// A net plugin ready to be initialised: a loaded library's table, or a built-in one.
///
/// Cloning is cheap and shares the library; the library is closed when the last
/// clone, context and comm are gone.
#[derive(Clone)]
pub struct NetPlugin {
    /// The table, name and library every clone shares (the raw layer, for conformance tools).
    pub shared: Arc<NetShared>,
}

/// What every clone of a [`NetPlugin`] shares: the raw table and what keeps it mapped.
pub struct NetShared {
    /// The version-tagged table pointer.
    pub raw: RawNet,
    /// The table's `name`, read once at load.
    pub name: Arc<str>,
    /// The exported symbol the table came from.
    pub symbol: String,
    /// Keeps the code `raw` points into mapped (`None` for tables built into the host).
    pub library: Option<Library>,
    /// True for the built-in fallback transport.
    pub builtin: bool,
    /// Live contexts of a pre-v11 plugin; its `init` runs when this goes 0 → 1.
    pub legacy_refs: Mutex<usize>,
    /// `ncclCollNetPlugin_vN` found in the same library, with its version.
    pub collnet: Option<(String, u32)>,
}

impl NetPlugin {
    /// Finds the net table in `library` (`ncclNetPlugin_v12` … `_v6`, first hit) and
    /// checks what NCCL needs before `init`: name and `init` non-NULL, object not
    /// smaller than its version's table. The other required slots are checked after
    /// `init` ([`NetContext`]), since a plugin may fill them in there. CollNet is
    /// looked up separately (its absence is normal).
    ///
    /// On error returns the cause with the symbol and version found, if any.
    pub fn load(library: Library) -> Result<Self, (Cause, Option<(String, u32)>)> {
        let found = table::find(&library).map_err(|c| (c, None))?;
        let at = Some((found.symbol.clone(), found.raw.version()));
        found.raw.check_before_init().map_err(|c| (c, at.clone()))?;
        let name = found.raw.name().ok_or((Cause::NullName, at))?;
        let collnet = Family::CollNet.accepted().iter().find_map(|&v| {
            let s = Family::CollNet.symbol(v);
            library.data_symbol(&s).map(|_| (s, v))
        });
        Ok(Self::new(
            found.raw,
            name,
            found.symbol,
            Some(library),
            false,
            collnet,
        ))
    }

    /// Installs the process's built-in fallback transport: the v12 table that every
    /// [`NetRegistry`](crate::select::NetRegistry) made afterwards puts last in its
    /// walk, as NCCL puts its internal socket transport. The runtime hands cclkit's
    /// socket plugin over here; the host itself links no transport. The first table
    /// installed stays; returns whether `table` is the installed one.
    pub fn install_builtin(table: &'static ncclNet_v12_t) -> bool {
        std::ptr::eq(*BUILTIN.get_or_init(|| table), table)
    }

    /// The built-in fallback transport, driven through its exported v12 table exactly
    /// like an external plugin; `None` until one is installed.
    pub fn builtin() -> Option<Self> {
        BUILTIN
            .get()
            .map(|table| Self::from_static_v12(table, true))
    }

    /// A plugin whose v12 table is linked into this program (in-process Rust plugins).
    pub fn from_static_v12(table: &'static ncclNet_v12_t, builtin: bool) -> Self {
        let raw = RawNet::V12(std::ptr::NonNull::from(table));
        let name = raw.name().unwrap_or_else(|| "(unnamed)".to_owned());
        Self::new(raw, name, Family::Net.symbol(12), None, builtin, None)
    }

    fn new(
        raw: RawNet,
        name: String,
        symbol: String,
        library: Option<Library>,
        builtin: bool,
        collnet: Option<(String, u32)>,
    ) -> Self {
        Self {
            shared: Arc::new(NetShared {
                raw,
                name: name.into(),
                symbol,
                library,
                builtin,
                legacy_refs: Mutex::new(0),
                collnet,
            }),
        }
    }

    /// The table's `name` (what `NCCL_NET` is matched against).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The net ABI version in use.
    pub fn version(&self) -> u32 {
        self.shared.raw.version()
    }

    /// The symbol in use (`ncclNetPlugin_v12`).
    pub fn symbol(&self) -> &str {
        &self.shared.symbol
    }

    /// The library the table lives in (`None` for built-in tables).
    pub fn library(&self) -> Option<&Library> {
        self.shared.library.as_ref()
    }

    /// True for cclkit's built-in transport.
    pub fn is_builtin(&self) -> bool {
        self.shared.builtin
    }

    /// The CollNet symbol and version exported by the same library, if any.
    pub fn collnet(&self) -> Option<(&str, u32)> {
        self.shared.collnet.as_ref().map(|(s, v)| (s.as_str(), *v))
    }

    /// Initialises the plugin for one communicator (see [`NetContext`]).
    pub fn init(&self, comm_id: u64, config: CommConfig) -> Result<NetContext, NetError> {
        NetContext::init(self.clone(), comm_id, config)
    }

    /// True if both handles share one loaded table.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.shared, &b.shared)
    }

    /// Every versioned plugin symbol of this plugin's library.
    pub fn exported(&self) -> Vec<symbols::Exported> {
        match &self.shared.library {
            Some(lib) => [Family::Net, Family::CollNet, Family::Tuner]
                .iter()
                .flat_map(|&f| symbols::exported(lib, f))
                .collect(),
            None => Vec::new(),
        }
    }
}

impl fmt::Debug for NetPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetPlugin")
            .field("name", &self.name())
            .field("version", &self.version())
            .field("library", &self.shared.library)
            .finish()
    }
}

impl NetShared {
    /// Turns a plugin return code into a result, quoting the plugin's WARN since `mark`.
    pub fn check(&self, call: &'static str, mark: u64, rc: NcclResult) -> Result<(), NetError> {
        if rc.is_ok() {
            return Ok(());
        }
        Err(NetError {
            kind: PluginKind::Net,
            plugin: Arc::clone(&self.name),
            version: self.raw.version(),
            call,
            code: rc,
            plugin_message: logger::warn_since(mark),
            detail: None,
        })
    }

    /// An error for a call the host refuses or cannot make (code `ncclInternalError`).
    pub fn refuse(&self, call: &'static str, detail: impl Into<String>) -> NetError {
        self.refuse_with(call, NcclResult::INTERNAL_ERROR, detail)
    }

    /// Like [`refuse`](Self::refuse) with an explicit code.
    pub fn refuse_with(
        &self,
        call: &'static str,
        code: NcclResult,
        detail: impl Into<String>,
    ) -> NetError {
        NetError {
            kind: PluginKind::Net,
            plugin: Arc::clone(&self.name),
            version: self.raw.version(),
            call,
            code,
            plugin_message: None,
            detail: Some(detail.into()),
        }
    }

    /// The error for a NULL slot.
    pub fn missing(&self, call: &'static str) -> NetError {
        self.refuse(
            call,
            format!(
                "the plugin's v{} table has no '{call}' function",
                self.raw.version()
            ),
        )
    }
}

/// The handle bytes shipped to the peer (`NCCL_NET_HANDLE_MAXSIZE`).
pub type ConnectHandle = [u8; cclkit_abi::raw::net::NCCL_NET_HANDLE_MAXSIZE];

/// A NULL `void*` of the right type for out-parameters.
pub(crate) fn null() -> *mut c_void {
    std::ptr::null_mut()
}
