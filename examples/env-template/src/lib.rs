//! A small but real env plugin: overrides from one variable, the rest passed through.
//!
//! Copy this crate to start an env plugin. `CCLKIT_TEMPLATE_OVERRIDES` holds
//! `NAME=value` pairs separated by `;` (for example
//! `NCCL_SOCKET_IFNAME=eth0;NCCL_BUFFSIZE=8388608`); those values win, every other
//! variable comes from the process environment as with NCCL's built-in env plugin.
//! `export_env!` publishes it as `ncclEnvPlugin_v1` and `_v2`, and keeps every
//! returned string alive until `finalize`, so `get_env` may return borrowed data.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::{CStr, OsStr};

use cclkit_abi::env::{Env, EnvInit, EnvValue, process_value};
use cclkit_abi::raw::common::subsys;
use cclkit_abi::{Error, Result, export_env, nccl_info};

/// The variable holding the overrides.
pub const OVERRIDES_VAR: &str = "CCLKIT_TEMPLATE_OVERRIDES";

/// The process's env plugin.
pub struct TemplateEnv {
    overrides: HashMap<String, String>,
}

impl TemplateEnv {
    /// Parses `NAME=value;NAME=value`; empty items are skipped, a name must start
    /// with `NCCL_` and appear once.
    pub fn parse(text: &str) -> Result<Self> {
        let mut overrides = HashMap::new();
        for item in text.split(';').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((name, value)) = item.split_once('=') else {
                return Err(Error::invalid_usage(format!(
                    "{OVERRIDES_VAR}: `{item}` is not NAME=value"
                )));
            };
            let name = name.trim();
            if !name.starts_with("NCCL_") || name.contains('\0') {
                return Err(Error::invalid_usage(format!(
                    "{OVERRIDES_VAR}: `{name}` is not an NCCL_* variable"
                )));
            }
            if value.contains('\0') {
                return Err(Error::invalid_usage(format!(
                    "{OVERRIDES_VAR}: the value of {name} contains NUL"
                )));
            }
            if overrides
                .insert(name.to_owned(), value.to_owned())
                .is_some()
            {
                return Err(Error::invalid_usage(format!(
                    "{OVERRIDES_VAR}: {name} is given twice"
                )));
            }
        }
        Ok(Self { overrides })
    }

    /// Number of overridden variables.
    pub fn len(&self) -> usize {
        self.overrides.len()
    }

    /// True when nothing is overridden.
    pub fn is_empty(&self) -> bool {
        self.overrides.is_empty()
    }
}

impl Env for TemplateEnv {
    const NAME: &'static CStr = c"TemplateEnv";

    fn init(args: EnvInit<'_>) -> Result<Self> {
        let text = std::env::var(OVERRIDES_VAR).unwrap_or_default();
        let env = Self::parse(&text)?;
        nccl_info!(
            subsys::ENV,
            "template env plugin: NCCL {}, {} overrides",
            args.nccl_version,
            env.len()
        );
        Ok(env)
    }

    fn get_env(&self, name: &str) -> Result<Option<EnvValue<'_>>> {
        Ok(match self.overrides.get(name) {
            Some(v) => Some(Cow::Borrowed(OsStr::new(v.as_str()))),
            None => process_value(name),
        })
    }
}

export_env!(TemplateEnv);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_win_and_bad_items_are_refused() {
        let env = TemplateEnv::parse(" NCCL_A=1 ; ;NCCL_B=x=y;").expect("valid");
        assert_eq!(env.len(), 2);
        let a = env.get_env("NCCL_A").expect("ok").expect("set");
        assert_eq!(a, OsStr::new("1"));
        let b = env.get_env("NCCL_B").expect("ok").expect("set");
        assert_eq!(b, OsStr::new("x=y"));
        for bad in ["NCCL_A", "CUDA_X=1", "NCCL_A=1;NCCL_A=2"] {
            assert!(TemplateEnv::parse(bad).is_err(), "{bad}");
        }
        assert!(TemplateEnv::parse("").expect("empty").is_empty());
        // Everything else is the process environment's.
        let path = env.get_env("PATH").expect("ok").map(Cow::into_owned);
        assert_eq!(path, std::env::var_os("PATH"));
        assert_eq!(
            env.get_env("NCCL_CCLKIT_TEMPLATE_NEVER_SET").expect("ok"),
            None
        );
    }
}
