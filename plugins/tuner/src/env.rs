//! Environment settings, read once per `init`.
//!
//! | variable | meaning |
//! | --- | --- |
//! | `NCCL_TUNER_CONFIG_FILE` | rule file (CSV or TOML); default `nccl_tuner.conf` in the CWD if present |
//! | `CCLKIT_TUNER_MODE` | `rules`, `model` or `auto` (default) |
//! | `CCLKIT_TUNER_INTRA_BW` | model: intra-node bus bandwidth per GPU, GB/s |
//! | `CCLKIT_TUNER_NET_BW` | model: network bandwidth per node, GB/s |
//! | `CCLKIT_TUNER_NET_LAT` | model: extra latency per network step, µs |
//! | `CCLKIT_TUNER_INTRA_LINK` | model: `nvlink` or `pci` |
//! | `CCLKIT_TUNER_ARCH` | model: `volta`, `ampere`, `hopper` or `blackwell` |
//! | `CCLKIT_TUNER_CHANNELS` | model: channels assumed for per-channel ceilings |

use std::path::PathBuf;

use crate::config::ModelSettings;
use crate::engine::Mode;
use crate::hw::{Arch, IntraLink};

/// NCCL's variable naming the rule file.
pub const CONFIG_FILE_VAR: &str = "NCCL_TUNER_CONFIG_FILE";
/// The file NCCL's example reads when the variable is unset.
pub const DEFAULT_CONFIG_FILE: &str = "nccl_tuner.conf";

const KNOWN: [&str; 7] = [
    "CCLKIT_TUNER_MODE",
    "CCLKIT_TUNER_INTRA_BW",
    "CCLKIT_TUNER_NET_BW",
    "CCLKIT_TUNER_NET_LAT",
    "CCLKIT_TUNER_INTRA_LINK",
    "CCLKIT_TUNER_ARCH",
    "CCLKIT_TUNER_CHANNELS",
];

/// Where the rule file comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// Named by `NCCL_TUNER_CONFIG_FILE` (missing = warning).
    Explicit(PathBuf),
    /// `nccl_tuner.conf` in the working directory, if it exists.
    Default(PathBuf),
}

/// Everything the tuner reads from the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Decision mode.
    pub mode: Mode,
    /// Rule file.
    pub config: ConfigSource,
    /// Model overrides (win over a TOML `[model]` table).
    pub model: ModelSettings,
    /// Problems with the variables (each names the variable); all were ignored.
    pub warnings: Vec<String>,
}

impl Settings {
    /// Reads the process environment.
    pub fn from_env() -> Self {
        Self::from_vars(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// Reads settings from `(name, value)` pairs.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut s = Self {
            mode: Mode::Auto,
            config: ConfigSource::Default(PathBuf::from(DEFAULT_CONFIG_FILE)),
            model: ModelSettings::default(),
            warnings: Vec::new(),
        };
        let mut vars: Vec<(String, String)> = vars.into_iter().collect();
        vars.sort();
        for (k, v) in vars {
            if k == CONFIG_FILE_VAR {
                if !v.is_empty() {
                    s.config = ConfigSource::Explicit(PathBuf::from(v));
                }
                continue;
            }
            if !k.starts_with("CCLKIT_TUNER_") {
                continue;
            }
            let r = match k.as_str() {
                "CCLKIT_TUNER_MODE" => Mode::parse(&v).map(|m| s.mode = m),
                "CCLKIT_TUNER_INTRA_BW" => positive(&v).map(|x| s.model.intra_bw = Some(x)),
                "CCLKIT_TUNER_NET_BW" => positive(&v).map(|x| s.model.net_bw = Some(x)),
                "CCLKIT_TUNER_NET_LAT" => non_negative(&v).map(|x| s.model.net_lat = Some(x)),
                "CCLKIT_TUNER_INTRA_LINK" => {
                    IntraLink::parse(&v).map(|x| s.model.intra_link = Some(x))
                }
                "CCLKIT_TUNER_ARCH" => Arch::parse(&v).map(|x| s.model.arch = Some(x)),
                "CCLKIT_TUNER_CHANNELS" => match v.trim().parse::<u32>() {
                    Ok(c) if (1..=1024).contains(&c) => {
                        s.model.channels = Some(c);
                        Ok(())
                    }
                    _ => Err(format!("\"{v}\" is not a channel count (1 to 1024)")),
                },
                _ => Err(format!(
                    "unknown variable, ignored (known: {})",
                    KNOWN.join(", ")
                )),
            };
            if let Err(e) = r {
                s.warnings.push(format!("{k}: {e}"));
            }
        }
        s
    }
}

fn number(v: &str) -> Result<f64, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| format!("\"{v}\" is not a number"))
}

fn positive(v: &str) -> Result<f64, String> {
    number(v).and_then(|x| {
        if x > 0.0 {
            Ok(x)
        } else {
            Err(format!("{v} must be greater than 0"))
        }
    })
}

fn non_negative(v: &str) -> Result<f64, String> {
    number(v).and_then(|x| {
        if x >= 0.0 {
            Ok(x)
        } else {
            Err(format!("{v} must not be negative"))
        }
    })
}
