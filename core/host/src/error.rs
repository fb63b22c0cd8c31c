//! The loader's two error types: [`CallError`] (a plugin call failed) and [`LoadError`]
//! (a plugin could not be used: not found, no usable symbol, failed init, …).
//!
//! Both say exactly what happened, with the plugin's own last WARN message when it
//! logged one, because "the job silently used the slow transport" is the failure this
//! loader exists to prevent.

use std::fmt;
use std::sync::Arc;

use cclkit_abi::raw::common::NcclResult;
use serde::Serialize;

use super::config::PluginKind;
use super::resolve::Rule;

/// A call into a plugin failed (or the host refused to make it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// The kind of plugin called.
    pub kind: PluginKind,
    /// The plugin's table `name`.
    pub plugin: Arc<str>,
    /// The ABI version of the table in use.
    pub version: u32,
    /// The table slot ("init", "isend", "getCollInfo", …).
    pub call: &'static str,
    /// The `ncclResult_t` the plugin returned (raw), or the code the host chose when it
    /// refused the call (e.g. a size an old ABI cannot carry, as NCCL's shims refuse it).
    pub code: NcclResult,
    /// The last WARN the plugin logged on this thread during the call.
    pub plugin_message: Option<String>,
    /// The host's explanation when the failure was detected by the host.
    pub detail: Option<String>,
}

/// Errors of net host adapters.
pub type NetError = CallError;
/// Errors of tuner host adapters.
pub type TunerError = CallError;

impl CallError {
    /// The code as NCCL's name and number ("ncclInternalError (3)").
    pub fn code_text(&self) -> String {
        match self.code.name() {
            Some(n) => format!("{n} ({})", self.code.0),
            None => format!("unknown ncclResult_t {}", self.code.0),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} plugin '{}' (v{}): {} failed: {}",
            self.kind.label(),
            self.plugin,
            self.version,
            self.call,
            self.code_text()
        )?;
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        if let Some(m) = &self.plugin_message {
            write!(f, "; the plugin said: \"{m}\"")?;
        }
        Ok(())
    }
}

impl std::error::Error for CallError {}

impl From<CallError> for cclkit_abi::Error {
    fn from(e: CallError) -> Self {
        cclkit_abi::Error::new(e.code, e.to_string())
    }
}

impl Serialize for CallError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("CallError", 6)?;
        st.serialize_field("call", self.call)?;
        st.serialize_field("code", &self.code.0)?;
        st.serialize_field("code_name", &self.code.name())?;
        st.serialize_field("plugin_message", &self.plugin_message)?;
        st.serialize_field("detail", &self.detail)?;
        st.serialize_field("message", &self.to_string())?;
        st.end()
    }
}

/// One `dlopen` the loader tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenAttempt {
    /// The string passed to `dlopen` (`None` = the main program).
    pub name: Option<String>,
    /// The resolution rule that produced it.
    pub rule: Rule,
    /// What happened.
    pub outcome: OpenOutcome,
}

impl OpenAttempt {
    /// The name as shown in reports.
    pub fn shown_name(&self) -> &str {
        self.name
            .as_deref()
            .unwrap_or("(main program, dlopen(NULL))")
    }
}

/// The result of one `dlopen`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum OpenOutcome {
    /// Loaded; `path` is the file the dynamic linker mapped.
    Loaded {
        /// The mapped file, if known.
        path: Option<String>,
    },
    /// No such file (NCCL lists these as "Could not find").
    NotFound {
        /// `dlerror()` text.
        error: String,
    },
    /// The file exists but could not be loaded (missing dependency, bad ELF, …).
    Failed {
        /// `dlerror()` text.
        error: String,
    },
}

/// Why a plugin was not used.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "cause", rename_all = "snake_case")]
pub enum Cause {
    /// No candidate name could be opened (see the attempts).
    NotLoaded,
    /// The library has none of the versioned symbols this host accepts.
    NoSymbol {
        /// Symbols tried, newest first.
        tried: Vec<String>,
        /// Plugin symbols the library does export (e.g. only `ncclNetPlugin_v5`).
        exported: Vec<String>,
    },
    /// The table's `name` is NULL (NCCL would crash comparing or printing it).
    NullName,
    /// The exported table object is smaller than its version's table.
    TableTooSmall {
        /// The symbol.
        symbol: String,
        /// `st_size` of the symbol.
        size: usize,
        /// The size of the version's table.
        expected: usize,
    },
    /// A function the host must call is NULL in the table.
    MissingFunction {
        /// The slot name.
        slot: &'static str,
    },
    /// A call failed (init, devices, getProperties, …).
    Call(Box<CallError>),
    /// `devices()` reported no device.
    NoDevices {
        /// The count reported.
        ndev: i32,
    },
    /// Device 0 has a device type this host cannot drive.
    DeviceType {
        /// `netDeviceType` (raw).
        device_type: i32,
        /// `netDeviceVersion`.
        device_version: i32,
    },
    /// The plugin does not match `NCCL_NET` (not a failure; reported for completeness).
    NameMismatch {
        /// The plugin's name.
        name: String,
        /// The requested `NCCL_NET`.
        wanted: String,
    },
    /// Another external plugin was selected earlier in this process (net.cc
    /// `ncclNetPluginDisableOtherExternal`).
    Disabled {
        /// The plugin that won.
        winner: String,
    },
    /// The setting is `none`: no external plugin (NCCL 2.28+).
    SetToNone {
        /// The variable.
        var: String,
    },
    /// This plugin failed earlier in the process; NCCL never retries it.
    FailedEarlier {
        /// The original reason.
        reason: String,
    },
    /// No external net plugin library is open, so there is none to search for a tuner
    /// (plugin_open.cc `ncclGetNetPluginLib`).
    NoNetLibrary,
}

/// A plugin could not be used, with everything needed to explain why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadError {
    /// Net or tuner.
    pub kind: PluginKind,
    /// The setting entry that was resolved (`libnccl-net.so` when unset).
    pub entry: String,
    /// Every `dlopen` tried for the entry, in order.
    pub opens: Vec<OpenAttempt>,
    /// The file that loaded, if one did.
    pub path: Option<String>,
    /// The rule that produced the name that loaded.
    pub rule: Option<Rule>,
    /// The versioned symbol in use, if one was found.
    pub symbol: Option<String>,
    /// Its version.
    pub version: Option<u32>,
    /// The plugin's table name, if read.
    pub plugin_name: Option<String>,
    /// What went wrong.
    pub cause: Cause,
}

impl LoadError {
    /// An error with only the entry and cause filled in.
    pub fn new(kind: PluginKind, entry: impl Into<String>, cause: Cause) -> Self {
        Self {
            kind,
            entry: entry.into(),
            opens: Vec::new(),
            path: None,
            rule: None,
            symbol: None,
            version: None,
            plugin_name: None,
            cause,
        }
    }

    /// The reason alone, without the `KIND plugin ENTRY:` prefix.
    pub fn reason(&self) -> String {
        match &self.cause {
            Cause::NotLoaded => {
                let tried: Vec<String> = self
                    .opens
                    .iter()
                    .map(|a| {
                        let name = a.shown_name();
                        match &a.outcome {
                            // dlerror() text, without the name it starts with.
                            OpenOutcome::NotFound { error } | OpenOutcome::Failed { error } => {
                                let e = error.strip_prefix(&format!("{name}: ")).unwrap_or(error);
                                format!("{name} ({e})")
                            }
                            OpenOutcome::Loaded { .. } => format!("{name} (loaded)"),
                        }
                    })
                    .collect();
                format!("could not load the library; tried: {}", tried.join(", "))
            }
            Cause::NoSymbol { tried, exported } => {
                let mut s = format!("{} exports none of {}", self.where_(), tried.join(", "));
                if exported.is_empty() {
                    s.push_str(" (no plugin symbols at all)");
                } else {
                    s.push_str(&format!(" (it exports only {})", exported.join(", ")));
                }
                s
            }
            Cause::NullName => format!("{}: the plugin table's name is NULL", self.what()),
            Cause::TableTooSmall {
                symbol,
                size,
                expected,
            } => format!(
                "{symbol} in {} is {size} bytes, but that version's table is {expected} bytes \
                 (built against a different header?)",
                self.where_()
            ),
            Cause::MissingFunction { slot } => {
                format!(
                    "{}: the table's required '{slot}' function is NULL",
                    self.what()
                )
            }
            Cause::Call(e) => e.to_string(),
            Cause::NoDevices { ndev } => format!(
                "{}: devices() reported {ndev} devices; a plugin needs at least one",
                self.what()
            ),
            Cause::DeviceType {
                device_type,
                device_version,
            } => format!(
                "{}: device 0 has netDeviceType {device_type} (version {device_version}); \
                 only HOST, or UNPACK version 7, can be used",
                self.what()
            ),
            Cause::NameMismatch { name, wanted } => {
                format!("plugin name '{name}' does not match NCCL_NET={wanted}")
            }
            Cause::Disabled { winner } => {
                format!("disabled: external plugin '{winner}' was selected earlier in this process")
            }
            Cause::SetToNone { var } => format!("{var}=none: no external plugin"),
            Cause::FailedEarlier { reason } => {
                format!("failed earlier in this process (not retried): {reason}")
            }
            Cause::NoNetLibrary => {
                "no external net plugin library is open, so there is none to search".to_owned()
            }
        }
    }

    /// True when nothing was found under the default name of an unset variable: the
    /// ordinary configuration, not worth a warning.
    pub fn is_default_absent(&self) -> bool {
        matches!(self.cause, Cause::NotLoaded)
            && !self.opens.is_empty()
            && self.opens.iter().all(|a| {
                a.rule == Rule::Default && matches!(a.outcome, OpenOutcome::NotFound { .. })
            })
    }

    fn where_(&self) -> String {
        if self.rule == Some(Rule::StaticPlugin) {
            return "the main program (dlopen(NULL))".to_owned();
        }
        self.path.clone().unwrap_or_else(|| self.entry.clone())
    }

    fn what(&self) -> String {
        match (&self.plugin_name, &self.symbol) {
            (Some(n), Some(s)) => format!("'{n}' ({s} in {})", self.where_()),
            (None, Some(s)) => format!("{s} in {}", self.where_()),
            _ => self.where_(),
        }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} plugin {}: {}",
            self.kind.label(),
            self.entry,
            self.reason()
        )
    }
}

impl std::error::Error for LoadError {}
