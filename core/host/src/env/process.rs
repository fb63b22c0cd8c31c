//! The process's env plugin, loaded once, as NCCL's first parameter read does: every
//! `NCCL_*` value a host reads (except `NCCL_ENV_PLUGIN` itself) goes through it.
//!
//! The rule is the one `cclkit doctor` shows: with an external plugin loaded its
//! `getEnv` answer is final (a plugin passes the process value through itself); with
//! none (unset and no `libnccl-env.so`, `none`, or a library that does not open or
//! exports no env table) the process environment is read. Variables outside `NCCL_*`
//! (`CCLKIT_*`, `LD_LIBRARY_PATH`) are always read from the process.

use std::sync::{Mutex, OnceLock};

use super::{ENV_VAR, EnvError, EnvInitArgs, EnvOutcome, EnvResolution, resolve};

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// The process environment (no env plugin in use, or not an `NCCL_*` variable).
    Process,
    /// The env plugin's `getEnv` (which may have passed the process value through).
    EnvPlugin,
}

/// The environment as NCCL reads it in this process.
pub struct ProcessEnv {
    resolution: EnvResolution,
    init_error: Option<EnvError>,
    /// `getEnv` failures already logged (each once).
    warned: Mutex<Vec<String>>,
}

impl std::fmt::Debug for ProcessEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessEnv")
            .field("plugin", &self.plugin_label())
            .field("init_error", &self.init_error)
            .finish_non_exhaustive()
    }
}

/// True for names NCCL reads through the env plugin: `NCCL_*` except
/// `NCCL_ENV_PLUGIN`, which NCCL reads with `getenv` to find the plugin.
pub fn asks_plugin(name: &str) -> bool {
    name.starts_with("NCCL_") && name != ENV_VAR
}

/// The process-wide view: resolves `NCCL_ENV_PLUGIN` and calls the plugin's `init`
/// on first use, never again. A requested plugin that cannot be used is one WARN and
/// the process environment, as NCCL does; a failed `init` is one WARN and
/// [`ProcessEnv::init_error`] (NCCL fails every communicator creation with it).
pub fn process_env() -> &'static ProcessEnv {
    static ENV: OnceLock<ProcessEnv> = OnceLock::new();
    ENV.get_or_init(|| ProcessEnv::load(resolve()))
}

impl ProcessEnv {
    /// Loads and initialises the plugin a resolution found (for tests and tools that
    /// resolve a value of their own; hosts use [`process_env`]).
    pub fn load(resolution: EnvResolution) -> Self {
        let setting = resolution
            .setting
            .as_deref()
            .unwrap_or("(unset)")
            .to_owned();
        let init_error = match &resolution.outcome {
            EnvOutcome::Loaded { plugin, .. } => plugin.init(&EnvInitArgs::default()).err(),
            _ => None,
        };
        match (&resolution.outcome, &init_error) {
            (EnvOutcome::Loaded { .. }, Some(e)) => {
                tracing::warn!(target: "cclkit::env", "{e}");
            }
            (EnvOutcome::NotFound, _) if resolution.requested() => tracing::warn!(
                target: "cclkit::env",
                "ENV: {ENV_VAR}={setting} cannot be opened; using the process environment"
            ),
            (EnvOutcome::Unsupported { path, reason }, _) => tracing::warn!(
                target: "cclkit::env",
                "ENV: {ENV_VAR}={setting}: {path} {reason}; using the process environment"
            ),
            _ => {}
        }
        Self {
            resolution,
            init_error,
            warned: Mutex::new(Vec::new()),
        }
    }

    /// "'name' (NCCL_ENV_PLUGIN=value)" when an external plugin is in use.
    pub fn plugin_label(&self) -> Option<String> {
        let plugin = self.resolution.plugin()?;
        let setting = self.resolution.setting.as_deref().unwrap_or("(unset)");
        Some(format!("'{}' ({ENV_VAR}={setting})", plugin.name()))
    }

    /// The failed `init`, if any.
    pub fn init_error(&self) -> Option<&EnvError> {
        self.init_error.as_ref()
    }

    /// The value NCCL would read for `name`, and where it came from. A `getEnv`
    /// failure (value too long, not UTF-8) is one WARN and reads as unset.
    pub fn lookup(&self, name: &str) -> (Option<String>, ValueSource) {
        let Some(plugin) = self.resolution.plugin().filter(|_| asks_plugin(name)) else {
            return (std::env::var(name).ok(), ValueSource::Process);
        };
        match plugin.get_env(name) {
            Ok(v) => (v, ValueSource::EnvPlugin),
            Err(e) => {
                let line = e.to_string();
                let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
                if !warned.contains(&line) {
                    tracing::warn!(target: "cclkit::env", "{line}; {name} reads as unset");
                    warned.push(line);
                }
                (None, ValueSource::EnvPlugin)
            }
        }
    }

    /// The value alone.
    pub fn get(&self, name: &str) -> Option<String> {
        self.lookup(name).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::resolve_value;

    #[test]
    fn without_a_plugin_every_value_is_the_process_one() {
        let e = ProcessEnv::load(resolve_value(Some("cclkit-no-such-env")));
        assert!(e.plugin_label().is_none() && e.init_error().is_none());
        let (v, src) = e.lookup("PATH");
        assert_eq!((v, src), (std::env::var("PATH").ok(), ValueSource::Process));
        let (v, src) = e.lookup("NCCL_CCLKIT_SURELY_UNSET_VARIABLE");
        assert_eq!((v, src), (None, ValueSource::Process));
    }

    #[test]
    fn only_nccl_names_but_the_plugin_setting_ask_the_plugin() {
        assert!(asks_plugin("NCCL_ALGO") && asks_plugin("NCCL_NET_PLUGIN"));
        assert!(!asks_plugin(ENV_VAR) && !asks_plugin("CCLKIT_OP_TIMEOUT"));
        assert!(!asks_plugin("nccl_algo"));
    }
}
