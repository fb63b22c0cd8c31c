//! Profiler host adapter: loads an `ncclProfiler_v7` … `_v1` table as NCCL's
//! `plugin/profiler.cc` does and drives it through one interface.
//!
//! * Resolution ([`candidates`]): `NCCL_PROFILER_PLUGIN` unset ⇒ `libnccl-profiler.so`;
//!   `none` (any case) ⇒ no profiler; otherwise the value verbatim, then
//!   `libnccl-profiler-<value>.so` unless the value is a path or a `lib….so` name
//!   (plugin_open.cc). NCCL finally looks for a profiler inside the net plugin's
//!   library: [`ProfilerPlugin::load_with`] takes that library as a fallback.
//! * Versions: the newest exported table wins (v7, then v6 … v1).
//! * Per communicator, [`ProfilerContext::init`] passes the version's `init`
//!   arguments and keeps the activation mask the profiler wrote. As in NCCL, an
//!   event is started when its own bit or a descendant's is in the mask
//!   ([`activated_by`]); otherwise its handle is NULL, which the caller treats like
//!   a profiler that declined the event.
//! * Events are typed [`Event`](cclkit_abi::profiler::Event)s encoded into the
//!   version's descriptor; states a version does not know are not sent to it.
//! * A NULL handle is legal everywhere: stopping or recording on it is a no-op.
//!   A failing profiler call is reported once at WARN and the event gets a NULL
//!   handle; profiling never fails a communicator (NCCL continues without it too).

use std::sync::Arc;

use crate::library::{Library, OpenError};
use crate::resolve;

pub mod callback;
mod context;
pub mod encode;
pub mod encode_api;
pub mod table;

pub use context::{EventHandle, InitArgs, ProfilerContext, ProfilerError, activated_by};
pub use encode::Parents;
use table::RawProfiler;

/// The environment variable naming the profiler.
pub const ENV: &str = "NCCL_PROFILER_PLUGIN";

/// The names `dlopen` is tried with for a value of `NCCL_PROFILER_PLUGIN`, in order;
/// empty when profiling is off (`none`). `None` in the list is the main program
/// (`STATIC_PLUGIN`).
pub fn candidates(value: Option<&str>) -> Vec<Option<String>> {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return vec![Some("libnccl-profiler.so".to_owned())];
    };
    if resolve::is_none(v) {
        return Vec::new();
    }
    let mut out = vec![(!resolve::is_static_plugin(v)).then(|| v.to_owned())];
    if resolve::wants_prefix_form(v) {
        out.push(Some(format!("libnccl-profiler-{v}.so")));
    }
    out
}

/// A loaded profiler table, shared by every communicator's context.
#[derive(Clone)]
pub struct ProfilerPlugin {
    shared: Arc<Shared>,
}

struct Shared {
    raw: RawProfiler,
    name: Arc<str>,
    symbol: String,
    /// Keeps the table mapped; also [`ProfilerPlugin::library`].
    _library: Option<Library>,
}

/// Why no profiler was loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// `NCCL_PROFILER_PLUGIN=none`.
    Disabled,
    /// No candidate library could be opened (each name with its `dlerror`).
    NotFound(Vec<(String, String)>),
    /// A library was opened but exports no usable profiler table.
    Unsupported {
        /// The library.
        library: String,
        /// What is wrong.
        reason: String,
    },
}

impl std::fmt::Display for LoadOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadOutcome::Disabled => write!(f, "{ENV}=none: profiling disabled"),
            LoadOutcome::NotFound(tries) => {
                write!(f, "no profiler library found")?;
                for (n, e) in tries {
                    write!(f, "; {n}: {e}")?;
                }
                Ok(())
            }
            LoadOutcome::Unsupported { library, reason } => {
                write!(
                    f,
                    "external profiler plugin {library} is unsupported: {reason}"
                )
            }
        }
    }
}

impl ProfilerPlugin {
    /// Loads the profiler `NCCL_PROFILER_PLUGIN` names.
    pub fn from_env() -> Result<Self, LoadOutcome> {
        // Through the env plugin, as NCCL reads every NCCL_* parameter.
        Self::load_with(crate::env::process_env().get(ENV).as_deref(), None)
    }

    /// Loads the profiler for a value of `NCCL_PROFILER_PLUGIN`; when no candidate
    /// opens, looks inside `net_library` (NCCL's fallback to the net plugin's file).
    pub fn load_with(
        value: Option<&str>,
        net_library: Option<&Library>,
    ) -> Result<Self, LoadOutcome> {
        let names = candidates(value);
        if names.is_empty() {
            return Err(LoadOutcome::Disabled);
        }
        let mut tries = Vec::new();
        let mut opened = None;
        for n in &names {
            match Library::open(n.as_deref()) {
                Ok(lib) => {
                    opened = Some(lib);
                    break;
                }
                Err(OpenError { message, .. }) => tries.push((
                    n.clone().unwrap_or_else(|| "(main program)".into()),
                    message,
                )),
            }
        }
        let lib = match (opened, net_library) {
            (Some(l), _) => l,
            (None, Some(net)) if table::find(net).is_some() => net.clone(),
            (None, _) => return Err(LoadOutcome::NotFound(tries)),
        };
        Self::from_library(lib)
    }

    /// Finds the newest profiler table in `lib` and checks its name and slots.
    pub fn from_library(lib: Library) -> Result<Self, LoadOutcome> {
        Self::from_library_version(lib, None)
    }

    /// As [`from_library`](Self::from_library), but the table of `version` when
    /// given (`cclkit check` drives every exported version).
    pub fn from_library_version(lib: Library, version: Option<u32>) -> Result<Self, LoadOutcome> {
        let unsupported = |reason: String| LoadOutcome::Unsupported {
            library: lib.display_name(),
            reason,
        };
        let found = match version {
            Some(v) => table::find_version(&lib, v),
            None => table::find(&lib),
        };
        let Some((raw, symbol)) = found else {
            let what = version.map_or_else(
                || "ncclProfiler_v7 … _v1 table".to_owned(),
                |v| format!("ncclProfiler_v{v} table"),
            );
            return Err(unsupported(format!("exports no {what}")));
        };
        let name = raw
            .name()
            .ok_or_else(|| unsupported(format!("{symbol}.name is NULL or not a C string")))?;
        if let Some(slot) = raw.missing_slot() {
            return Err(unsupported(format!("{symbol}.{slot} is NULL")));
        }
        tracing::info!(target: "cclkit::profiler", "loaded profiler '{name}' ({symbol}) from {}", lib.display_name());
        Ok(Self {
            shared: Arc::new(Shared {
                raw,
                name: name.into(),
                symbol,
                _library: Some(lib),
            }),
        })
    }

    /// The table's `name`.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The ABI version in use.
    pub fn version(&self) -> u32 {
        self.shared.raw.version()
    }

    /// The exported symbol the table came from.
    pub fn symbol(&self) -> &str {
        &self.shared.symbol
    }

    /// The library the table came from (`None` for a table linked into the program).
    pub fn library(&self) -> Option<&Library> {
        self.shared._library.as_ref()
    }

    pub(crate) fn raw(&self) -> RawProfiler {
        self.shared.raw
    }

    pub(crate) fn name_arc(&self) -> Arc<str> {
        Arc::clone(&self.shared.name)
    }
}

impl std::fmt::Debug for ProfilerPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProfilerPlugin({} v{})", self.name(), self.version())
    }
}
