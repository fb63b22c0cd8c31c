//! Loader configuration: every environment variable the loader reads, read in one place.
//!
//! Library code takes a [`LoaderConfig`] value instead of reading the environment, so
//! tests (and `cclkit doctor --net …`) can describe a setup without touching the
//! process environment.

use std::fmt;

use serde::Serialize;

/// Which library's naming rules to follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// NVIDIA NCCL: `libnccl-net*.so`, `libnccl-tuner*.so`.
    #[default]
    Nccl,
    /// AMD RCCL: `librccl-net*.so` for net plugins, `libnccl-*` for the rest.
    Rccl,
}

impl Flavor {
    /// Parses `nccl` / `rccl` (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "nccl" => Some(Self::Nccl),
            "rccl" => Some(Self::Rccl),
            _ => None,
        }
    }

    /// The library this flavour imitates, for messages ("NCCL" or "RCCL").
    pub fn library(self) -> &'static str {
        match self {
            Self::Nccl => "NCCL",
            Self::Rccl => "RCCL",
        }
    }
}

/// The kinds of plugin the loader resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginKind {
    /// `ncclNet` (and `ncclCollNet`, found in the same library).
    Net,
    /// `ncclTuner`.
    Tuner,
}

impl PluginKind {
    /// NCCL's name for the kind in log lines ("NET", "TUNER").
    pub fn label(self) -> &'static str {
        match self {
            Self::Net => "NET",
            Self::Tuner => "TUNER",
        }
    }

    /// The environment variable naming the plugin.
    pub fn env_var(self) -> &'static str {
        match self {
            Self::Net => "NCCL_NET_PLUGIN",
            Self::Tuner => "NCCL_TUNER_PLUGIN",
        }
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Everything that decides which plugins load (one value per process or per doctor run).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LoaderConfig {
    /// NCCL or RCCL naming (`CCLKIT_FLAVOR`).
    pub flavor: Flavor,
    /// `NCCL_NET_PLUGIN` exactly as set (`None` when unset).
    pub net_plugin: Option<String>,
    /// `NCCL_TUNER_PLUGIN` exactly as set (`None` when unset).
    pub tuner_plugin: Option<String>,
    /// `NCCL_NET`: only plugins whose table `name` matches (case-insensitively) are used.
    pub net_name: Option<String>,
    /// `CCLKIT_STRICT=1`: any fallback is a hard error instead of a WARN.
    pub strict: bool,
    /// `NCCL_NET_PLUGIN_REF_COUNT` > 0 pins external net libraries (never dlclosed).
    pub pin_net_plugins: bool,
}

impl LoaderConfig {
    /// Reads the environment as NCCL does: `NCCL_*` through the process's env plugin
    /// when one is loaded ([`crate::env::process_env`]), the rest from the process.
    pub fn from_env() -> Self {
        let env = crate::env::process_env();
        Self::from_lookup(|k| env.get(k))
    }

    /// Builds a configuration from any variable lookup (`None` = unset).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let flavor = match get("CCLKIT_FLAVOR") {
            Some(v) => Flavor::parse(&v).unwrap_or_else(|| {
                tracing::warn!(
                    "CCLKIT_FLAVOR={v} is neither 'nccl' nor 'rccl'; using NCCL naming rules"
                );
                Flavor::Nccl
            }),
            None => Flavor::Nccl,
        };
        Self {
            flavor,
            net_plugin: get("NCCL_NET_PLUGIN"),
            tuner_plugin: get("NCCL_TUNER_PLUGIN"),
            net_name: get("NCCL_NET").filter(|s| !s.is_empty()),
            strict: get("CCLKIT_STRICT").is_some_and(|v| is_true(&v)),
            pin_net_plugins: get("NCCL_NET_PLUGIN_REF_COUNT")
                .and_then(|v| v.trim().parse::<i64>().ok())
                .is_some_and(|n| n > 0),
        }
    }

    /// The configured value for a plugin kind.
    pub fn plugin_value(&self, kind: PluginKind) -> Option<&str> {
        match kind {
            PluginKind::Net => self.net_plugin.as_deref(),
            PluginKind::Tuner => self.tuner_plugin.as_deref(),
        }
    }
}

/// `1`, `true`, `yes`, `on` (case-insensitive) are true; anything else is false.
fn is_true(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> LoaderConfig {
        LoaderConfig::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_environment_is_plain_nccl() {
        assert_eq!(cfg(&[]), LoaderConfig::default());
    }

    #[test]
    fn reads_every_variable() {
        let c = cfg(&[
            ("CCLKIT_FLAVOR", "RCCL"),
            ("NCCL_NET_PLUGIN", "a,b"),
            ("NCCL_TUNER_PLUGIN", "none"),
            ("NCCL_NET", "Socket"),
            ("CCLKIT_STRICT", "1"),
            ("NCCL_NET_PLUGIN_REF_COUNT", "2"),
        ]);
        assert_eq!(c.flavor, Flavor::Rccl);
        assert_eq!(c.net_plugin.as_deref(), Some("a,b"));
        assert_eq!(c.tuner_plugin.as_deref(), Some("none"));
        assert_eq!(c.net_name.as_deref(), Some("Socket"));
        assert!(c.strict);
        assert!(c.pin_net_plugins);
    }

    #[test]
    fn strict_needs_a_true_value() {
        assert!(!cfg(&[("CCLKIT_STRICT", "0")]).strict);
        assert!(cfg(&[("CCLKIT_STRICT", "yes")]).strict);
        assert!(!cfg(&[("NCCL_NET_PLUGIN_REF_COUNT", "0")]).pin_net_plugins);
    }
}
