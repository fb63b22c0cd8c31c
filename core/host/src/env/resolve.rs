//! Which env plugin NCCL uses: `NCCL_ENV_PLUGIN` from the process environment, the
//! names tried, and the outcome (NCCL 2.30.7 `src/plugin/env.cc` `ncclEnvPluginLoad`
//! and `plugin_open.cc`).

use serde::Serialize;

use super::super::error::{OpenAttempt, OpenOutcome};
use super::super::library::Library;
use super::super::resolve::{self as names, Candidate, MAX_NAME_LEN, Rule};
use super::EnvPlugin;
use super::table::{self, FindError};

/// The variable naming the env plugin. NCCL reads it with `getenv`, never through a
/// plugin.
pub const ENV_VAR: &str = "NCCL_ENV_PLUGIN";

/// The library-name prefix of env plugins (`pluginPrefix` in plugin_open.cc).
pub const PREFIX: &str = "libnccl-env";

/// What NCCL ends up with for a setting.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum EnvOutcome {
    /// `NCCL_ENV_PLUGIN=none` (any case): the built-in plugin (`getenv`), nothing opened.
    Disabled,
    /// No candidate name opened: the built-in plugin.
    NotFound,
    /// A library opened but exports neither `ncclEnvPlugin_v2` nor `_v1` (or a table
    /// too small): NCCL closes it and uses the built-in plugin.
    Unsupported {
        /// The file that opened.
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// An external env plugin is in use.
    Loaded {
        /// The plugin (not yet initialised).
        #[serde(skip)]
        plugin: EnvPlugin,
        /// The file that opened.
        path: String,
        /// The symbol found.
        symbol: String,
        /// Its version.
        version: u32,
        /// The table's `name`.
        name: String,
    },
}

/// The whole resolution, for reports: the setting, every `dlopen` tried, the outcome.
#[derive(Debug, Serialize)]
pub struct EnvResolution {
    /// `NCCL_ENV_PLUGIN` as set in the process environment (`None` = unset).
    pub setting: Option<String>,
    /// Every `dlopen` tried, in order.
    pub opens: Vec<OpenAttempt>,
    /// The outcome.
    pub outcome: EnvOutcome,
}

impl EnvResolution {
    /// The loaded plugin, if an external one is in use.
    pub fn plugin(&self) -> Option<&EnvPlugin> {
        match &self.outcome {
            EnvOutcome::Loaded { plugin, .. } => Some(plugin),
            _ => None,
        }
    }

    /// True when the setting was given (so a missing library is the user's problem,
    /// not the quiet default; NCCL logs `ATTN` for an unsupported requested library).
    pub fn requested(&self) -> bool {
        self.setting.is_some()
    }
}

/// The names NCCL passes to `dlopen` for `NCCL_ENV_PLUGIN=value` (unset or empty:
/// `libnccl-env.so`; `none`: nothing; else the value, then `libnccl-env-<value>.so`
/// unless the value is a path or a full `lib….so` name; a prefix of `STATIC_PLUGIN`
/// means the main program).
pub fn candidates(value: Option<&str>) -> Vec<Candidate> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return vec![Candidate {
            name: Some(format!("{PREFIX}.so")),
            rule: Rule::Default,
        }];
    };
    if names::is_none(value) {
        return Vec::new();
    }
    let verbatim = cut(value);
    let mut out = vec![if names::is_static_plugin(verbatim) {
        Candidate {
            name: None,
            rule: Rule::StaticPlugin,
        }
    } else {
        Candidate {
            name: Some(verbatim.to_owned()),
            rule: Rule::Verbatim,
        }
    }];
    if names::wants_prefix_form(value) {
        out.push(Candidate {
            name: Some(cut(&format!("{PREFIX}-{value}.so")).to_owned()),
            rule: Rule::PrefixForm,
        });
    }
    out
}

/// Resolves the env plugin from the process environment, as NCCL does.
pub fn resolve() -> EnvResolution {
    resolve_value(std::env::var(ENV_VAR).ok().as_deref())
}

/// Resolves the env plugin for a given `NCCL_ENV_PLUGIN` value (`None` = unset).
/// Opening a library runs its constructors; nothing of the plugin is called.
pub fn resolve_value(setting: Option<&str>) -> EnvResolution {
    let mut opens = Vec::new();
    let done = |opens, outcome| EnvResolution {
        setting: setting.map(str::to_owned),
        opens,
        outcome,
    };
    if setting.is_some_and(names::is_none) {
        return done(opens, EnvOutcome::Disabled);
    }
    for c in candidates(setting) {
        let library = match Library::open(c.name.as_deref()) {
            Ok(l) => l,
            Err(e) => {
                opens.push(OpenAttempt {
                    name: c.name.clone(),
                    rule: c.rule,
                    outcome: if e.not_found {
                        OpenOutcome::NotFound { error: e.message }
                    } else {
                        OpenOutcome::Failed { error: e.message }
                    },
                });
                continue;
            }
        };
        let path = library.display_name();
        opens.push(OpenAttempt {
            name: c.name.clone(),
            rule: c.rule,
            outcome: OpenOutcome::Loaded {
                path: library.path().map(|p| p.display().to_string()),
            },
        });
        // NCCL stops at the first library that opens, usable or not.
        let outcome = match table::find(&library) {
            Ok((raw, symbol)) => {
                let name = raw.name().unwrap_or_else(|| "(unnamed)".to_owned());
                let plugin = EnvPlugin::new(raw, name.clone(), symbol.clone(), library);
                EnvOutcome::Loaded {
                    version: raw.version(),
                    plugin,
                    path,
                    symbol,
                    name,
                }
            }
            Err(FindError::NoSymbol) => EnvOutcome::Unsupported {
                path,
                reason: "exports neither ncclEnvPlugin_v2 nor ncclEnvPlugin_v1".to_owned(),
            },
            Err(FindError::TooSmall { symbol, size }) => EnvOutcome::Unsupported {
                path,
                reason: format!("{symbol} is {size} bytes, smaller than the 32-byte table"),
            },
        };
        return done(opens, outcome);
    }
    done(opens, EnvOutcome::NotFound)
}

/// NCCL copies names with `snprintf(buf, 255, …)`.
fn cut(s: &str) -> &str {
    if s.len() <= MAX_NAME_LEN {
        return s;
    }
    let mut at = MAX_NAME_LEN;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    &s[..at]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(v: Option<&str>) -> Vec<(Option<String>, Rule)> {
        candidates(v)
            .into_iter()
            .map(|c| (c.name, c.rule))
            .collect()
    }

    #[test]
    fn names_follow_plugin_open() {
        let s = |x: &str| Some(x.to_owned());
        assert_eq!(shown(None), [(s("libnccl-env.so"), Rule::Default)]);
        assert_eq!(shown(Some("")), [(s("libnccl-env.so"), Rule::Default)]);
        assert!(shown(Some("NoNe")).is_empty());
        assert_eq!(
            shown(Some("cclkit")),
            [
                (s("cclkit"), Rule::Verbatim),
                (s("libnccl-env-cclkit.so"), Rule::PrefixForm)
            ]
        );
        assert_eq!(
            shown(Some("/x/libfoo.so")),
            [(s("/x/libfoo.so"), Rule::Verbatim)]
        );
        assert_eq!(shown(Some("libfoo.so")), [(s("libfoo.so"), Rule::Verbatim)]);
        assert_eq!(shown(Some("static"))[0], (None, Rule::StaticPlugin));
    }

    #[test]
    fn long_names_are_cut_like_snprintf() {
        let long = "é".repeat(200);
        let c = candidates(Some(&long));
        assert!(
            c.iter()
                .all(|c| c.name.as_ref().is_some_and(|n| n.len() <= MAX_NAME_LEN))
        );
        assert_eq!(c[0].name.as_ref().map(String::len), Some(254));
    }

    #[test]
    fn none_opens_nothing_and_a_missing_library_is_not_found() {
        let r = resolve_value(Some("NONE"));
        assert!(matches!(r.outcome, EnvOutcome::Disabled) && r.opens.is_empty());
        let r = resolve_value(Some("cclkit-no-such-env"));
        assert!(matches!(r.outcome, EnvOutcome::NotFound));
        let tried: Vec<_> = r.opens.iter().map(|a| a.shown_name().to_owned()).collect();
        assert_eq!(
            tried,
            ["cclkit-no-such-env", "libnccl-env-cclkit-no-such-env.so"]
        );
    }

    #[test]
    fn a_library_without_env_symbols_is_unsupported() {
        let r = resolve_value(Some("libc.so.6"));
        match r.outcome {
            EnvOutcome::Unsupported { reason, .. } => assert!(reason.contains("ncclEnvPlugin_v2")),
            other => panic!("{other:?}"),
        }
    }
}
