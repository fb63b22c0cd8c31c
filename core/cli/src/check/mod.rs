//! `cclkit check`: the GPU-free conformance suite for net and tuner plugins.
//!
//! The parent process never loads the plugin. It reads the library's dynamic symbols
//! (ELF), lists every check for every ABI version the library exports, and runs each
//! check in a **child process** (the `cclkit` binary re-executed with a hidden
//! `--child` argument). A plugin that crashes, aborts or hangs therefore fails one
//! check, with its signal or timeout and the last step it reached, and the run goes on.
//!
//! ```text
//! parent: ELF symbols ─▶ jobs (family × version × check) ─▶ N workers
//!            └─ worker: spawn `cclkit check LIB --child net.sendrecv --version 12`
//!                  child: load the version's table, run the check, print one result line
//!                  (two-process checks spawn `--peer` processes of their own)
//! ```
//!
//! | module | job |
//! | --- | --- |
//! | [`runner`] | the parent: exports, jobs, workers |
//! | `process` | one child: process group, time limit, exit/signal/timeout → result |
//! | `valgrind` | the tuner leak check under valgrind |
//! | `child` | the child: protocol lines, watchdog, dispatch |
//! | [`report`] | results, the text table and the JSON report |
//! | `load` | one exported version into the loader's host adapters |
//! | `raw` | the raw calls the safe adapters deliberately prevent |
//! | `net`, `tuner`, `env`, `profiler` | the checks themselves |
//! | `peer`, `netns` | two-process checks over loopback and across network namespaces |
//!
//! Checks come in two classes ([`Class`]): **contract** checks call the plugin only
//! as NCCL does (NCCL_ABI.md §2.11b: oldest request tested first, registered
//! `mhandle`s, receives never smaller than the send, the version's request limit,
//! NULL requests retried while the other side progresses, teardown with requests in
//! flight as `ncclCommAbort` does) and decide the verdict; **probes** do what NCCL
//! never does and only WARN (FAIL under `--strict`). The net request engine that
//! keeps to NCCL's discipline is `net::flow`; every setup and data call is timed by
//! `net::timing`. The verdict ([`Verdict`]) tells passed, failed and nothing tested
//! apart, and is the exit status of `cclkit check`.
//!
//! The checks build on the loader's host adapters ([`cclkit_host::net`],
//! [`cclkit_host::tuner`]), which already guard property and cost-table buffers
//! with canaries, refuse a left-over optional-completion sentinel and keep the
//! connect handle at one address; `raw` adds only what an adapter cannot do safely.

mod child;
mod env;
mod load;
mod net;
mod netns;
mod peer;
mod process;
mod profiler;
mod raw;
pub mod report;
mod rng;
pub mod runner;
mod tuner;
mod valgrind;

use std::fmt;

pub use child::{ChildArgs, run_child};
pub use peer::run_peer;
pub use report::{CheckResult, Report, Status, Verdict};
pub use runner::{Event, Options, run};

/// A plugin family the suite checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `ncclNetPlugin_vN`.
    Net,
    /// `ncclTunerPlugin_vN`.
    Tuner,
    /// `ncclProfiler_vN`.
    Profiler,
    /// `ncclEnvPlugin_vN`.
    Env,
}

impl Family {
    /// "net" / "tuner".
    pub fn label(self) -> &'static str {
        match self {
            Family::Net => "net",
            Family::Tuner => "tuner",
            Family::Profiler => "profiler",
            Family::Env => "env",
        }
    }

    /// The loader's symbol family.
    pub(crate) fn symbols(self) -> cclkit_host::symbols::Family {
        match self {
            Family::Net => cclkit_host::symbols::Family::Net,
            Family::Tuner => cclkit_host::symbols::Family::Tuner,
            Family::Profiler => cclkit_host::symbols::Family::Profiler,
            Family::Env => cclkit_host::symbols::Family::Env,
        }
    }

    /// Versions the suite (and the loader's adapters) can drive, newest first.
    pub fn checkable(self) -> &'static [u32] {
        match self {
            Family::Net => &[12, 11, 10, 9, 8, 7, 6],
            Family::Tuner => &[7, 6, 5, 4, 3, 2, 1],
            Family::Profiler => &[7, 6, 5, 4, 3, 2, 1],
            Family::Env => &[2, 1],
        }
    }

    /// Parses "net" / "tuner".
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "net" => Some(Family::Net),
            "tuner" => Some(Family::Tuner),
            "profiler" => Some(Family::Profiler),
            "env" => Some(Family::Env),
            _ => None,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// What a check's outcome means for the verdict.
///
/// NCCL calls a plugin in a narrow, documented way (NCCL_ABI.md §2.11b). A check that
/// stays inside that discipline proves something NCCL will do; a check that steps
/// outside it only shows how robust the plugin is to hosts that are not NCCL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Calls the plugin only as NCCL does: a failure is a defect NCCL would hit, and
    /// decides the verdict.
    Contract,
    /// Does what NCCL never does: a failure is a WARN (a FAIL under `--strict`).
    Probe,
}

impl Class {
    /// "contract" / "probe".
    pub fn label(self) -> &'static str {
        match self {
            Class::Contract => "contract",
            Class::Probe => "probe",
        }
    }
}

/// One check of the suite.
#[derive(Clone, Copy)]
pub struct CheckDef {
    /// Short name (`sendrecv`), unique within its family.
    pub name: &'static str,
    /// The family it belongs to.
    pub family: Family,
    /// Contract check or robustness probe.
    pub class: Class,
    /// One line saying what it proves.
    pub about: &'static str,
    /// The NCCL behaviour the check rests on (contract) or departs from (probe).
    pub nccl: &'static str,
    /// Runs in the child process.
    pub(crate) run: fn(&child::Env) -> Checked,
}

impl fmt::Debug for CheckDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.family, self.name)
    }
}

/// Every check, net first, in the order they are reported.
pub fn all_checks() -> Vec<CheckDef> {
    net::CHECKS
        .iter()
        .chain(tuner::CHECKS)
        .chain(profiler::CHECKS)
        .chain(env::CHECKS)
        .copied()
        .collect()
}

/// The check `family.name`, if it exists.
pub fn find_check(family: Family, name: &str) -> Option<CheckDef> {
    all_checks()
        .into_iter()
        .find(|c| c.family == family && c.name == name)
}

/// How a check ends in the child: `Ok(detail)` is a PASS.
pub(crate) type Checked = Result<String, Stop>;

/// A check that did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The plugin broke a rule: the message says which and how.
    Fail(String),
    /// The check cannot run here: the message says why.
    Skip(String),
}

impl Stop {
    /// Prefixes the message with what the check was doing.
    pub fn context(self, what: &str) -> Self {
        match self {
            Stop::Fail(m) => Stop::Fail(format!("{what}: {m}")),
            Stop::Skip(m) => Stop::Skip(format!("{what}: {m}")),
        }
    }
}

impl From<cclkit_host::CallError> for Stop {
    fn from(e: cclkit_host::CallError) -> Self {
        Stop::Fail(e.to_string())
    }
}

/// `Err(Stop::Fail(..))` with a formatted message.
macro_rules! fail {
    ($($arg:tt)*) => { Err($crate::check::Stop::Fail(format!($($arg)*))) };
}
pub(crate) use fail;
