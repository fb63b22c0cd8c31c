//! `--net NAME|PATH` and `--tuner NAME|PATH`: one meaning in every command.
//!
//! Each flag is what `NCCL_NET_PLUGIN` / `NCCL_TUNER_PLUGIN` would be set to, and is
//! resolved by NCCL's rules: the value as given (a path, or a name the dynamic linker
//! searches), then `libnccl-net-<value>.so` (`librccl-net-…` under RCCL naming) or
//! `libnccl-tuner-<value>.so`. `perf` and `doctor` take the whole setting (a comma
//! list for `--net`, `none`); `check` and `info` inspect one library, the one the
//! value resolves to.
//!
//! The one difference from the variables: a plugin asked for with a flag must be used.
//! `perf --net X` fails when X cannot be used, where `NCCL_NET_PLUGIN=X` keeps NCCL's
//! fallback to the built-in transport (and `perf` then says so in its header and in a
//! WARN on stderr).

use cclkit_host::net::CommConfig;
use cclkit_host::open::open_entry;
use cclkit_host::select::{NetRegistry, Outcome, TunerArgs, TunerRegistry};
use cclkit_host::tuner::NvlDomainInfo;
use cclkit_host::{LoaderConfig, PluginKind, resolve};

/// The plugin flags shared by `perf`, `doctor`, `check`, `info` (flatten this).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PluginArgs {
    /// Net plugin, exactly as NCCL_NET_PLUGIN would be set: a name (`template` finds
    /// libnccl-net-template.so on the library path) or a path. Unlike the variable, a
    /// plugin asked for here is never silently replaced by the built-in transport.
    #[arg(long, value_name = "NAME|PATH")]
    pub net: Option<String>,
    /// Tuner plugin, exactly as NCCL_TUNER_PLUGIN would be set: a name (`template`
    /// finds libnccl-tuner-template.so) or a path.
    #[arg(long, value_name = "NAME|PATH")]
    pub tuner: Option<String>,
}

impl PluginArgs {
    /// `config` with the flags in place of the environment's values.
    pub fn apply(&self, mut config: LoaderConfig) -> LoaderConfig {
        if let Some(n) = &self.net {
            config.net_plugin = Some(n.clone());
        }
        if let Some(t) = &self.tuner {
            config.tuner_plugin = Some(t.clone());
        }
        config
    }

    /// The one library `check`/`info` inspect: `positional` if given, else the file
    /// `--net` or `--tuner` resolves to (`Ok(None)`: none of the three was given).
    pub fn library(&self, positional: Option<&str>) -> Result<Option<String>, String> {
        let flag = match (&self.net, &self.tuner) {
            (Some(_), Some(_)) => return Err("give either --net or --tuner, not both".into()),
            (Some(n), None) => Some((PluginKind::Net, n)),
            (None, Some(t)) => Some((PluginKind::Tuner, t)),
            (None, None) => None,
        };
        match (positional, flag) {
            (Some(_), Some(_)) => Err("give the library or --net/--tuner, not both".into()),
            (Some(p), None) => Ok(Some(p.to_owned())),
            (None, None) => Ok(None),
            (None, Some((kind, value))) => resolve_one(kind, value).map(Some),
        }
    }
}

/// The library file `value` resolves to for `kind`, as NCCL would open it.
pub fn resolve_one(kind: PluginKind, value: &str) -> Result<String, String> {
    let flag = match kind {
        PluginKind::Net => "--net",
        PluginKind::Tuner => "--tuner",
    };
    if value.contains(',') || value.is_empty() || resolve::is_none(value) {
        return Err(format!(
            "{flag} {value}: name one plugin library here (lists and `none` are for perf and doctor)"
        ));
    }
    let flavor = LoaderConfig::from_env().flavor;
    let opened =
        open_entry(kind, flavor, Some(value)).map_err(|e| format!("{flag} {value}: {e}"))?;
    Ok(match opened.library.path() {
        Some(p) => p.display().to_string(),
        None => opened.library.display_name(),
    })
}

/// Lines for `perf`'s header: each plugin asked for by a variable and not used.
static NOT_USED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// What [`preflight`] found asked for and not used (empty before it ran).
pub fn not_used() -> &'static [String] {
    NOT_USED.get().map_or(&[], Vec::as_slice)
}

/// Makes the flags the process environment, so that this process, the ranks `--np`
/// starts, `Config::from_env` and the loader all see one setting.
///
/// # Safety
/// No other thread may exist yet (it sets environment variables).
pub unsafe fn settle_env(args: &PluginArgs) {
    for (kind, value) in [
        (PluginKind::Net, &args.net),
        (PluginKind::Tuner, &args.tuner),
    ] {
        if let Some(v) = value {
            // SAFETY: the caller guarantees no other thread exists yet, so nothing
            // reads the environment concurrently.
            unsafe { std::env::set_var(kind.env_var(), v) };
        }
    }
}

/// Resolves every plugin a `perf` rank was asked for (by flag or variable) once,
/// through the same loader walk as the communicator, before it joins. A plugin asked
/// for with a flag that cannot be used is an error; one asked for by a variable is a
/// WARN on stderr and a line in the header ([`not_used`]), and the run goes on with
/// NCCL's fallback.
pub fn preflight(args: &PluginArgs) -> Result<(), String> {
    let config = args.apply(LoaderConfig::from_env());
    let asked = |v: &Option<String>| {
        v.clone()
            .filter(|v| !v.trim().is_empty() && !resolve::is_none(v))
    };
    let (net_asked, tuner_asked) = (asked(&config.net_plugin), asked(&config.tuner_plugin));
    let mut lines = Vec::new();
    if net_asked.is_none() && tuner_asked.is_none() {
        let _ = NOT_USED.set(lines);
        return Ok(());
    }
    cclkit_runtime::install_builtin_net();
    // A private registry: the process-wide one, which the communicator uses, is left
    // untouched, so the communicator loads and initialises the plugin as NCCL would.
    let nets = NetRegistry::new(config.clone());
    let mut chosen_net = None;
    let net = Asked {
        label: "NET",
        flag: "--net",
        var: "NCCL_NET_PLUGIN",
        by_flag: args.net.is_some(),
    };
    match nets.select(PREFLIGHT_COMM_ID, CommConfig::default()) {
        Ok(sel) => {
            if let Some(v) = &net_asked
                && sel.fell_back
            {
                let used = sel.context.plugin().name().to_owned();
                lines.push(net.refuse(v, &first_failure(&sel.attempts), &used)?);
            }
            chosen_net = Some(sel.context);
        }
        Err(e) => {
            let v = net_asked.as_deref().unwrap_or("(default)");
            lines.push(net.refuse(v, &e.to_string(), "nothing")?);
        }
    }
    if let Some(v) = &tuner_asked {
        let tuner = Asked {
            label: "TUNER",
            flag: "--tuner",
            var: "NCCL_TUNER_PLUGIN",
            by_flag: args.tuner.is_some(),
        };
        let tuners = TunerRegistry::new(config);
        let mut constants = cclkit_runtime::tune::default_constants();
        let shape = TunerArgs {
            n_ranks: 2,
            n_nodes: 1,
            comm_id: PREFLIGHT_COMM_ID,
            nvl: NvlDomainInfo {
                nNvlDomains: 1,
                minRanksPerNvlDomain: 2,
                maxRanksPerNvlDomain: 2,
            },
        };
        let net_library = chosen_net.as_ref().and_then(|c| c.plugin().library());
        let builtin = cclkit_host::select::BUILTIN_MODEL;
        match tuners.select(net_library, shape, &mut constants) {
            Ok(sel) if sel.tuner.is_some() => {}
            Ok(sel) => lines.push(tuner.refuse(v, &first_failure(&sel.attempts), builtin)?),
            Err(e) => lines.push(tuner.refuse(v, &e.to_string(), builtin)?),
        }
    }
    drop(chosen_net);
    let _ = NOT_USED.set(lines);
    Ok(())
}

/// Communicator id of the preflight walk (ASCII "cclkpref").
const PREFLIGHT_COMM_ID: u64 = u64::from_be_bytes(*b"cclkpref");

/// How one plugin kind was asked for.
struct Asked {
    label: &'static str,
    flag: &'static str,
    var: &'static str,
    by_flag: bool,
}

impl Asked {
    /// Refuses (flag) or reports (variable) a plugin that was asked for and not used.
    fn refuse(&self, value: &str, why: &str, used: &str) -> Result<String, String> {
        if self.by_flag {
            return Err(format!(
                "{} {value}: this plugin cannot be used ({why}); a plugin asked for with {} \
                 is never replaced by another (set {} instead to keep NCCL's fallback)",
                self.flag, self.flag, self.var
            ));
        }
        let line = format!(
            "{}: {}={value} was not used ({why}); running on '{used}' instead",
            self.label, self.var
        );
        tracing::warn!(target: "cclkit::perf", "{line}");
        Ok(line)
    }
}

/// The reason the walk fell back: the first failed attempt, else the first skipped one.
fn first_failure(attempts: &[cclkit_host::select::Attempt]) -> String {
    let pick = |failed: bool| {
        attempts.iter().find_map(|a| match &a.outcome {
            Outcome::Failed(e) if failed && !a.builtin => Some(e.to_string()),
            Outcome::Skipped(e) if !failed && !a.builtin => Some(e.to_string()),
            _ => None,
        })
    };
    pick(true)
        .or_else(|| pick(false))
        .unwrap_or_else(|| "no reason recorded".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(net: Option<&str>, tuner: Option<&str>) -> PluginArgs {
        PluginArgs {
            net: net.map(Into::into),
            tuner: tuner.map(Into::into),
        }
    }

    #[test]
    fn flags_override_the_environment_settings() {
        let env = LoaderConfig {
            net_plugin: Some("from-env".into()),
            tuner_plugin: Some("tuner-env".into()),
            ..LoaderConfig::default()
        };
        let c = args(Some("ib,socket"), None).apply(env.clone());
        assert_eq!(c.net_plugin.as_deref(), Some("ib,socket"));
        assert_eq!(c.tuner_plugin.as_deref(), Some("tuner-env"));
        assert_eq!(args(None, None).apply(env.clone()), env);
    }

    #[test]
    fn one_library_for_check_and_info() {
        assert_eq!(args(None, None).library(None), Ok(None));
        assert_eq!(
            args(None, None).library(Some("x.so")),
            Ok(Some("x.so".into()))
        );
        assert!(args(Some("a"), Some("b")).library(None).is_err());
        assert!(args(Some("a"), None).library(Some("x.so")).is_err());
        let e = args(Some("a,b"), None).library(None).unwrap_err();
        assert!(e.contains("name one plugin library"), "{e}");
        assert!(args(None, Some("none")).library(None).is_err());
        let e = args(Some("cclkit-no-such-7f3a"), None)
            .library(None)
            .unwrap_err();
        assert!(
            e.contains("libnccl-net-cclkit-no-such-7f3a.so"),
            "every name NCCL tries is listed: {e}"
        );
        // A path resolves to itself, as dlopen would open it.
        let so = cclkit_tests::plugin("libnccl-tuner-template.so");
        let got = args(None, Some(&so.display().to_string())).library(None);
        assert_eq!(got, Ok(Some(so.display().to_string())));
    }
}
