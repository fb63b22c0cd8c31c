//! The env plugin step of `cclkit doctor`: NCCL resolves `NCCL_ENV_PLUGIN` before
//! anything else, and from then on reads every `NCCL_*` parameter through that
//! plugin's `getEnv`. Doctor does the same, so the net and tuner resolution it explains
//! uses the values the job would see, and it shows where each value came from.

use std::sync::Mutex;

use serde::Serialize;

use cclkit_host::config::LoaderConfig;
use cclkit_host::env::{self, EnvInitArgs, EnvOutcome, EnvPlugin, EnvResolution};
use cclkit_host::error::OpenOutcome;
use cclkit_host::resolve;

/// The variables doctor reads, shown with their source.
pub const VARIABLES: [&str; 14] = [
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_NET",
    "NCCL_NET_PLUGIN_REF_COUNT",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_DMABUF_ENABLE",
    "NCCL_NET_FORCE_FLUSH",
    "NCCL_GDR_FLUSH_DISABLE",
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
];

/// Where the value a job sees comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The process environment (no env plugin, or a name NCCL never asks it for).
    Process,
    /// The env plugin returned the process value unchanged.
    PassedThrough,
    /// The env plugin supplied, changed or hid the value.
    EnvPlugin,
    /// Unset everywhere.
    Unset,
}

/// One variable as doctor resolved it.
#[derive(Debug, Serialize)]
pub struct Variable {
    /// `NCCL_…`.
    pub name: String,
    /// What the job sees.
    pub value: Option<String>,
    /// The process environment's value.
    pub process: Option<String>,
    /// Where `value` came from.
    pub source: Source,
}

/// The env plugin section of the report.
#[derive(Debug, Serialize)]
pub struct EnvReport {
    /// Resolution: setting, every `dlopen`, outcome.
    pub resolution: EnvResolution,
    /// "'name' v2 (path)" when an external plugin is in use.
    pub chosen: Option<String>,
    /// The `init` error, if it failed.
    pub init_error: Option<String>,
    /// Every variable doctor uses.
    pub variables: Vec<Variable>,
    /// Legal but surprising facts.
    pub notes: Vec<String>,
    /// What breaks the job (failed init, requested plugin unusable, bad values).
    pub problems: Vec<String>,
}

/// The environment as NCCL would read it: through the env plugin when one is loaded.
pub struct EnvView {
    /// False for a release without env plugins.
    enabled: bool,
    resolution: EnvResolution,
    init_error: Option<String>,
    /// `getEnv` failures, reported once each.
    errors: Mutex<Vec<String>>,
}

impl EnvView {
    /// Resolves `NCCL_ENV_PLUGIN` from the process environment and initialises the
    /// plugin it names, as NCCL's first parameter read does. With `enabled` false (a
    /// release without env plugins) nothing is opened and every value is the process's.
    pub fn from_process(enabled: bool) -> Self {
        let resolution = if enabled {
            env::resolve()
        } else {
            EnvResolution {
                setting: std::env::var(env::ENV_VAR).ok(),
                opens: Vec::new(),
                outcome: EnvOutcome::Disabled,
            }
        };
        let init_error = match &resolution.outcome {
            EnvOutcome::Loaded { plugin, .. } => plugin
                .init(&EnvInitArgs::default())
                .err()
                .map(|e| e.to_string()),
            _ => None,
        };
        Self {
            enabled,
            resolution,
            init_error,
            errors: Mutex::new(Vec::new()),
        }
    }

    fn plugin(&self) -> Option<&EnvPlugin> {
        self.resolution.plugin()
    }

    /// The value NCCL would see. `NCCL_ENV_PLUGIN` and variables outside `NCCL_*`
    /// come from the process; NCCL keeps asking a plugin whose `init` failed.
    pub fn get(&self, name: &str) -> Option<String> {
        let process = std::env::var(name).ok();
        let Some(plugin) = self.plugin().filter(|_| env::asks_plugin(name)) else {
            return process;
        };
        match plugin.get_env(name) {
            Ok(v) => v,
            Err(e) => {
                let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
                let e = format!("ENV: {e}");
                if !errors.contains(&e) {
                    errors.push(e);
                }
                None
            }
        }
    }

    /// The loader configuration built from what NCCL would see.
    pub fn loader_config(&self) -> LoaderConfig {
        LoaderConfig::from_lookup(|k| self.get(k))
    }

    /// The report section; consumes the view (the plugin is finalized when dropped).
    pub fn report(self) -> EnvReport {
        let variables = VARIABLES
            .iter()
            .map(|&name| {
                let value = self.get(name);
                let process = std::env::var(name).ok();
                let source = match (self.plugin().is_some() && env::asks_plugin(name), &value) {
                    (false, Some(_)) => Source::Process,
                    (false, None) => Source::Unset,
                    (true, None) if process.is_none() => Source::Unset,
                    (true, v) if *v == process => Source::PassedThrough,
                    (true, _) => Source::EnvPlugin,
                };
                Variable {
                    name: name.to_owned(),
                    value,
                    process,
                    source,
                }
            })
            .collect::<Vec<_>>();
        let mut notes = Vec::new();
        let mut problems = self
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(e) = &self.init_error {
            problems.push(e.clone());
        }
        let setting = self.resolution.setting.as_deref().unwrap_or("(unset)");
        if !self.enabled && self.resolution.requested() {
            notes.push(format!(
                "NCCL_ENV_PLUGIN={setting} is ignored: this release has no env plugins"
            ));
        }
        match &self.resolution.outcome {
            EnvOutcome::NotFound if self.resolution.requested() => problems.push(format!(
                "ENV: NCCL_ENV_PLUGIN={setting} cannot be opened; NCCL would use its built-in \
                 env plugin (the process environment) without an error"
            )),
            EnvOutcome::Unsupported { path, reason } => {
                let line = format!(
                    "ENV: {path} {reason}; NCCL closes it and uses its built-in env plugin"
                );
                if self.resolution.requested() {
                    problems.push(line);
                } else {
                    notes.push(line);
                }
            }
            _ => {}
        }
        for v in &variables {
            if v.name.starts_with("NCCL_DEBUG") && v.source == Source::EnvPlugin {
                notes.push(format!(
                    "{} comes from the env plugin, but NCCL reads its logging settings before \
                     the plugin is initialised: set it in the process environment",
                    v.name
                ));
            }
        }
        let chosen = match &self.resolution.outcome {
            EnvOutcome::Loaded {
                name,
                version,
                path,
                ..
            } => Some(format!("'{name}' v{version} ({path})")),
            _ => None,
        };
        EnvReport {
            resolution: self.resolution,
            chosen,
            init_error: self.init_error,
            variables,
            notes,
            problems,
        }
    }
}

/// Renders the section (after the settings line).
pub fn render(o: &mut String, r: &EnvReport) {
    use std::fmt::Write as _;
    let setting = r.resolution.setting.as_deref();
    let _ = writeln!(
        o,
        "\nENV (NCCL_ENV_PLUGIN{}, resolved first)",
        setting.map_or_else(|| " unset".to_owned(), |v| format!("={v}"))
    );
    for a in &r.resolution.opens {
        let what = match &a.outcome {
            OpenOutcome::Loaded { path } => {
                format!("loaded {}", path.as_deref().unwrap_or("(main program)"))
            }
            OpenOutcome::NotFound { .. } => "not found".to_owned(),
            OpenOutcome::Failed { error } => format!("failed: {error}"),
        };
        let _ = writeln!(
            o,
            "  dlopen(\"{}\") [{}]: {what}",
            a.shown_name(),
            a.rule.describe()
        );
    }
    let outcome = match (&r.resolution.outcome, &r.chosen) {
        (EnvOutcome::Disabled, _) if !setting.is_some_and(resolve::is_none) => {
            "this release has no env plugins: process environment".into()
        }
        (EnvOutcome::Disabled, _) => "none: built-in env plugin (process environment)".into(),
        (EnvOutcome::Loaded { .. }, Some(c)) => format!("selected {c}"),
        (EnvOutcome::Unsupported { reason, .. }, _) => {
            format!("{reason}: built-in env plugin (process environment)")
        }
        _ => "no env plugin library: built-in env plugin (process environment)".into(),
    };
    let _ = writeln!(o, "  -> {outcome}");
    if let Some(e) = &r.init_error {
        let _ = writeln!(o, "  init FAILED: {e}");
    }
    for v in &r.variables {
        let value = v
            .value
            .as_deref()
            .map_or("unset".to_owned(), |x| format!("{x:?}"));
        let from = match v.source {
            Source::Process => "process".to_owned(),
            Source::PassedThrough => "process, passed through by the env plugin".to_owned(),
            Source::EnvPlugin => match &v.process {
                Some(p) => format!("env plugin (process has {p:?})"),
                None => "env plugin".to_owned(),
            },
            Source::Unset => continue,
        };
        let _ = writeln!(o, "  {} = {value}  [{from}]", v.name);
    }
}
