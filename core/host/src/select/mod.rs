//! The per-process selection walk NCCL does for each communicator, with every attempt
//! kept (for `cclkit doctor`) and every fallback reported at WARN.
//!
//! * [`NetRegistry`]: external net plugins in `NCCL_NET_PLUGIN` order, then the
//!   built-in socket transport (net.cc `ncclNetInit`).
//! * [`TunerRegistry`]: `NCCL_TUNER_PLUGIN`, else a tuner inside the net plugin's
//!   library, else the built-in cost model (tuner.cc `ncclTunerPluginLoad`).
//!
//! A registry is a value, not a global: build one from a [`LoaderConfig`](crate::LoaderConfig) (tests and
//! `doctor` build their own), or use [`NetRegistry::global`] for the process.
//!
//! What counts as a *fallback* (WARN, and an error under `CCLKIT_STRICT=1`): a plugin
//! that was asked for — by name, or present under its default name — and could not be
//! used. An unset variable whose default library simply does not exist is the normal
//! configuration and is reported at INFO only.

use std::fmt;

use serde::Serialize;

use super::config::PluginKind;
use super::error::{Cause, LoadError, OpenAttempt};
use super::resolve::Rule;

mod net;
mod tuner;

pub use net::{NetRegistry, NetSelection};
pub use tuner::{BUILTIN_MODEL, TunerArgs, TunerRegistry, TunerSelection};

/// One plugin the walk considered, and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// What was tried: the setting entry, or "built-in …".
    pub label: String,
    /// True for a transport/model built into cclkit.
    pub builtin: bool,
    /// The outcome.
    pub outcome: Outcome,
}

/// The outcome of one [`Attempt`].
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// This plugin was chosen.
    Selected(Chosen),
    /// The plugin could not be used (a fallback follows).
    Failed(LoadError),
    /// Passed over without a failure (name filter, disabled, `none`, or the default
    /// library of an unset variable is absent).
    Skipped(LoadError),
}

/// The plugin a walk chose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Chosen {
    /// The table's name.
    pub name: String,
    /// ABI version in use.
    pub version: u32,
    /// Symbol in use.
    pub symbol: String,
    /// File it came from (`None` for built-ins).
    pub path: Option<String>,
    /// The rule that produced the name that loaded.
    pub rule: Rule,
    /// The `dlopen` attempts that led to it.
    pub opens: Vec<OpenAttempt>,
}

impl Attempt {
    /// True for a failure that makes the result a fallback.
    pub fn is_failure(&self) -> bool {
        matches!(self.outcome, Outcome::Failed(_))
    }

    /// One line for logs and reports.
    pub fn summary(&self) -> String {
        match &self.outcome {
            Outcome::Selected(c) => format!(
                "{}: selected '{}' ({}){}",
                self.label,
                c.name,
                c.symbol,
                c.path
                    .as_deref()
                    .map(|p| format!(" from {p}"))
                    .unwrap_or_default()
            ),
            Outcome::Failed(e) => format!("{}: FAILED: {}", self.label, e.reason()),
            Outcome::Skipped(e) => format!("{}: skipped: {}", self.label, e.reason()),
        }
    }
}

/// The walk could not produce a usable plugin.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum SelectError {
    /// No net plugin, external or built-in, could be used (NCCL: "Failed to initialize
    /// any NET plugin", ncclInvalidUsage).
    NoNet {
        /// Every attempt.
        attempts: Vec<Attempt>,
    },
    /// `CCLKIT_STRICT=1` and the walk had to fall back.
    Strict {
        /// Net or tuner.
        kind: PluginKind,
        /// The attempts so far, ending with the failure.
        attempts: Vec<Attempt>,
    },
}

impl SelectError {
    /// The attempts made.
    pub fn attempts(&self) -> &[Attempt] {
        match self {
            SelectError::NoNet { attempts } | SelectError::Strict { attempts, .. } => attempts,
        }
    }
}

impl fmt::Display for SelectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SelectError::NoNet { .. } => f.write_str("Failed to initialize any NET plugin")?,
            SelectError::Strict { kind, .. } => write!(
                f,
                "CCLKIT_STRICT=1: refusing to fall back from a {} plugin that could not be used",
                kind.label()
            )?,
        }
        for a in self.attempts() {
            write!(f, "\n  {}", a.summary())?;
        }
        Ok(())
    }
}

impl std::error::Error for SelectError {}

impl From<SelectError> for cclkit_abi::Error {
    fn from(e: SelectError) -> Self {
        cclkit_abi::Error::invalid_usage(e.to_string())
    }
}

/// Logs a failed attempt: WARN when the user asked for the plugin, INFO when only the
/// default name of an unset variable was absent.
fn report(kind: PluginKind, err: &LoadError, next: &str) {
    let subsys = match kind {
        PluginKind::Net => cclkit_abi::raw::common::subsys::NET,
        PluginKind::Tuner => cclkit_abi::raw::common::subsys::TUNING,
    } | cclkit_abi::raw::common::subsys::INIT;
    if err.is_default_absent() {
        tracing::info!(subsys, "{err}; using {next}");
    } else {
        tracing::warn!(subsys, "{err}; falling back to {next}");
    }
}

/// Where a plugin came from: the context of a [`LoadError`] found after it opened.
struct Origin<'a> {
    kind: PluginKind,
    entry: &'a str,
    opens: &'a [OpenAttempt],
    path: Option<String>,
    rule: Option<Rule>,
    at: Option<(String, u32)>,
    name: Option<String>,
}

impl Origin<'_> {
    /// The error for `cause`, with everything known about the plugin.
    fn error(&self, cause: Cause) -> LoadError {
        let mut e = LoadError::new(self.kind, self.entry, cause);
        e.opens = self.opens.to_vec();
        e.path = self.path.clone();
        e.rule = self.rule;
        if let Some((s, v)) = &self.at {
            e.symbol = Some(s.clone());
            e.version = Some(*v);
        }
        e.plugin_name = self.name.clone();
        e
    }
}
