//! cclkit's env plugin: `NCCL_*` values from a TOML file, for pinning a fleet's NCCL
//! settings. Packaged as `libnccl-env-cclkit.so`; select it with
//! `NCCL_ENV_PLUGIN=cclkit` and name the file with `CCLKIT_ENV_FILE`.
//!
//! # Precedence
//!
//! For a name NCCL asks about:
//! 1. a `[pinned]` entry of the file, if any (the point of pinning);
//! 2. otherwise the process environment, if the variable is set there;
//! 3. otherwise an `[env]` entry of the file;
//! 4. otherwise unset.
//!
//! Rule 2 before 3 is NCCL's own: its example env plugin answers from the process
//! environment, and NCCL applies `NCCL_CONF_FILE` / `~/.nccl.conf` / `/etc/nccl.conf`
//! with `setenv(…, overwrite = 0)`, so a variable set for the job wins over a file.
//! `[pinned]` is the explicit exception; a pinned value that overrides a different
//! process value is logged at WARN once, at `init`.
//!
//! # Failure
//!
//! `CCLKIT_ENV_FILE` unset or empty: the plugin passes the process environment
//! through (WARN at `init`). Set but unreadable, over [`file::MAX_FILE_BYTES`], or
//! malformed: `init` fails with `ncclInvalidUsage` and every problem as
//! `file:line: …`, which makes NCCL fail communicator creation: a fleet that pins its
//! settings must not run silently without them.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::borrow::Cow;
use std::ffi::{CStr, OsStr};
use std::path::Path;

use cclkit_abi::env::{Env, EnvInit, EnvValue, process_value};
use cclkit_abi::raw::common::subsys;
use cclkit_abi::{Error, Result, export_env, nccl_info, nccl_warn};

pub mod file;
pub mod text;

use file::{EnvFile, Section};
use text::cut;

/// The variable naming the TOML file (read from the process environment at `init`).
pub const ENV_FILE_VAR: &str = "CCLKIT_ENV_FILE";

/// Where a value NCCL reads came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A `[pinned]` entry of the file.
    Pinned,
    /// The process environment.
    Process,
    /// An `[env]` entry of the file.
    File,
}

/// The env plugin: an optional parsed file plus the process environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TomlEnv {
    file: Option<EnvFile>,
}

impl TomlEnv {
    /// A plugin over `file` (`None`: pass the process environment through).
    pub fn new(file: Option<EnvFile>) -> Self {
        Self { file }
    }

    /// Reads the file named by [`ENV_FILE_VAR`] (if set) and logs what it sets.
    pub fn from_process_env() -> Result<Self> {
        let Some(path) = std::env::var_os(ENV_FILE_VAR).filter(|p| !p.is_empty()) else {
            nccl_warn!(
                "cclkit-env: {ENV_FILE_VAR} is not set; passing the process environment through"
            );
            return Ok(Self::new(None));
        };
        let file = EnvFile::load(Path::new(&path))
            .map_err(|e| Error::invalid_usage(format!("cclkit-env: {e}")))?;
        let env = Self::new(Some(file));
        env.log_overrides();
        Ok(env)
    }

    /// The parsed file, if any.
    pub fn file(&self) -> Option<&EnvFile> {
        self.file.as_ref()
    }

    /// The value NCCL gets for `name` given its process value, and where it came from
    /// (the precedence rule of the crate docs).
    pub fn resolve<'a>(
        &'a self,
        name: &str,
        process: Option<EnvValue<'a>>,
    ) -> Option<(EnvValue<'a>, Source)> {
        let entry = self.file.as_ref().and_then(|f| f.get(name));
        let from_file = |e: &'a file::Entry| Cow::Borrowed(OsStr::new(e.value.as_str()));
        match (entry, process) {
            (Some(e), _) if e.section == Section::Pinned => Some((from_file(e), Source::Pinned)),
            (_, Some(p)) => Some((p, Source::Process)),
            (Some(e), None) => Some((from_file(e), Source::File)),
            (None, None) => None,
        }
    }

    /// Logs, once, each file entry and whether the process environment overrides it
    /// or is overridden by it. Values are cut to 80 characters.
    fn log_overrides(&self) {
        let Some(file) = &self.file else { return };
        let path = file.path().display();
        nccl_info!(
            subsys::ENV,
            "cclkit-env: {} variables from {path}",
            file.len()
        );
        for (name, entry) in file.entries() {
            let process = process_value(name);
            let process = process.as_deref().map(OsStr::to_string_lossy);
            let at = format!("{path}:{}", entry.line);
            match (entry.section, process) {
                (Section::Pinned, Some(p)) if p != entry.value.as_str() => nccl_warn!(
                    "cclkit-env: {name}={} in the process environment is overridden by the \
                     pinned {name}={} ({at})",
                    cut(&p),
                    cut(&entry.value)
                ),
                (Section::Env, Some(p)) => nccl_info!(
                    subsys::ENV,
                    "cclkit-env: {name}={} from the process environment wins over {} ({at})",
                    cut(&p),
                    cut(&entry.value)
                ),
                (section, _) => nccl_info!(
                    subsys::ENV,
                    "cclkit-env: {name}={} from {} ({at})",
                    cut(&entry.value),
                    section.header()
                ),
            }
        }
    }
}

impl Env for TomlEnv {
    const NAME: &'static CStr = c"cclkit-env-toml";

    fn init(args: EnvInit<'_>) -> Result<Self> {
        nccl_info!(
            subsys::ENV,
            "cclkit-env: loaded by NCCL {}{} (env ABI v{})",
            args.nccl_version,
            args.suffix,
            args.host_abi
        );
        Self::from_process_env()
    }

    fn get_env(&self, name: &str) -> Result<Option<EnvValue<'_>>> {
        // Only look at the process environment when no pin decides it.
        let pinned = self
            .file
            .as_ref()
            .and_then(|f| f.get(name))
            .is_some_and(|e| e.section == Section::Pinned);
        let process = if pinned { None } else { process_value(name) };
        Ok(self.resolve(name, process).map(|(v, _)| v))
    }
}

export_env!(TomlEnv);
