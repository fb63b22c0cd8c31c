//! `doctor --nccl-version X.Y` / `--rccl-version X.Y`: explain the setup under one
//! release's loader rules (cclkit_host::releases): its default net library name,
//! whether it has env plugins at all, and whether it would load the versions the
//! walk chose (the walk itself uses cclkit's newest rules).

use std::fmt::Write as _;
use std::process::ExitCode;

use cclkit_host::config::{Flavor, LoaderConfig, PluginKind};
use cclkit_host::error::OpenOutcome;
use cclkit_host::releases::{self, HostRelease, ReleaseRules};
use cclkit_host::resolve;
use cclkit_host::select::Outcome;
use cclkit_host::symbols::Family;

use super::{DoctorReport, Section};

/// The release asked for by `--nccl-version` / `--rccl-version`; a bad value is
/// reported on stderr and gives the usage-error exit code.
pub fn from_args(args: &super::DoctorArgs) -> Result<Option<ReleaseRules>, ExitCode> {
    requested(args.nccl_version.as_deref(), args.rccl_version.as_deref()).map_err(|e| {
        eprintln!("cclkit doctor: {e}");
        ExitCode::from(2)
    })
}

/// The release asked for on the command line, if any.
pub fn requested(nccl: Option<&str>, rccl: Option<&str>) -> Result<Option<ReleaseRules>, String> {
    let (flavor, v) = match (nccl, rccl) {
        (Some(_), Some(_)) => return Err("give --nccl-version or --rccl-version, not both".into()),
        (Some(v), None) => (Flavor::Nccl, v),
        (None, Some(v)) => (Flavor::Rccl, v),
        (None, None) => return Ok(None),
    };
    releases::rules(HostRelease::parse(flavor, v)?).map(Some)
}

/// True when the release reads an env plugin (NCCL 2.28+; RCCL: not recorded, so yes).
pub fn has_env_plugins(rules: Option<&ReleaseRules>) -> bool {
    rules
        .is_none_or(|r| r.kinds.iter().any(|k| k.kind == "env") || r.release.flavor == Flavor::Rccl)
}

/// Resolves the env plugin (unless the release has none), then builds the
/// configuration from what NCCL would read, under the release's rules.
pub fn prepare(
    args: &super::DoctorArgs,
    rules: Option<&ReleaseRules>,
) -> (super::EnvView, LoaderConfig, bool) {
    super::contain::step("env plugin: loading and init (NCCL_ENV_PLUGIN resolution)");
    let view = super::EnvView::from_process(has_env_plugins(rules));
    let (config, injected) = configure(rules, super::config_for(args, view.loader_config()));
    (view, config, injected)
}

/// The configuration under the release's naming rules: its flavour, and its default
/// net library when `NCCL_NET_PLUGIN` is unset (a full `lib….so` name opens exactly as
/// the default does). The flag is true when that default was put in the setting.
pub fn configure(rules: Option<&ReleaseRules>, mut config: LoaderConfig) -> (LoaderConfig, bool) {
    let Some(rules) = rules else {
        return (config, false);
    };
    config.flavor = rules.release.flavor;
    let inject = config.net_plugin.is_none()
        && rules.net_default != resolve::default_name(PluginKind::Net, config.flavor);
    if inject {
        config.net_plugin = Some(rules.net_default.to_owned());
    }
    (config, inject)
}

/// Undoes what putting the default name in the setting changes in the report: the
/// variable is unset, and an absent default library is not a problem (NCCL is quiet).
fn uninject(report: &mut DoctorReport, default: &str) {
    for (k, v) in &mut report.settings {
        if k == "NCCL_NET_PLUGIN" {
            *v = None;
        }
    }
    let absent = report.net.steps.iter().any(|st| match &st.attempt.outcome {
        Outcome::Failed(e) => e
            .opens
            .iter()
            .all(|o| matches!(o.outcome, OpenOutcome::NotFound { .. })),
        _ => false,
    });
    if absent {
        let quiet = format!("NET: NCCL_NET_PLUGIN={default} cannot be used");
        report.problems.retain(|p| !p.starts_with(&quiet));
        report.net.fell_back = false;
    }
}

/// Adds what the release would do differently to the report, and the rules.
pub fn apply(
    report: &mut DoctorReport,
    rules: Option<ReleaseRules>,
    config: &LoaderConfig,
    injected: bool,
) {
    let Some(rules) = rules else {
        return;
    };
    if injected {
        uninject(report, rules.net_default);
    }
    let label = rules.release.label();
    for (section, kind, family) in [
        (&report.net, "net", Family::Net),
        (&report.tuner, "tuner", Family::Tuner),
    ] {
        let Some(tries) = rules
            .kinds
            .iter()
            .find(|k| k.kind == kind)
            .and_then(|k| k.tries)
        else {
            continue;
        };
        if let Some(p) = version_problem(section, family, tries, &label) {
            report.problems.push(p);
        }
    }
    let loads_profilers = rules.kinds.iter().any(|k| k.kind == "profiler");
    if !loads_profilers {
        // The release never opens a profiler: nothing found or wrong with one matters.
        report.profiler.release_has_none = true;
        report.problems.retain(|p| !p.starts_with("PROFILER:"));
        report.notes.retain(|n| !n.starts_with("PROFILER:"));
    }
    if rules.none_disables == Some(false) {
        for (var, v) in [
            ("NCCL_NET_PLUGIN", &config.net_plugin),
            ("NCCL_TUNER_PLUGIN", &config.tuner_plugin),
        ] {
            if v.as_deref().is_some_and(resolve::is_none) {
                report.problems.push(format!(
                    "{label}: {var}=none is not special before 2.28: it looks for a \
                     library named 'none' instead of disabling the plugin"
                ));
            }
        }
    }
    report
        .notes
        .extend(rules.notes.iter().map(|n| format!("{label}: {n}")));
    report.verdict = super::verdict(
        &report.net,
        &report.tuner,
        &report.profiler,
        &report.problems,
    );
    report.release = Some(rules);
}

/// A problem when the release would not load the version the walk selected.
fn version_problem(s: &Section, family: Family, tries: &[u32], label: &str) -> Option<String> {
    let step = s
        .steps
        .iter()
        .find(|st| matches!(st.attempt.outcome, Outcome::Selected(_)) && !st.attempt.builtin)?;
    let Outcome::Selected(chosen) = &step.attempt.outcome else {
        return None;
    };
    if tries.contains(&chosen.version) {
        return None;
    }
    let exported: Vec<u32> = step.file.as_ref().map_or_else(
        || vec![chosen.version],
        |f| {
            f.symbols
                .iter()
                .filter(|x| x.family == family)
                .map(|x| x.version)
                .collect()
        },
    );
    let list = |v: &[u32]| {
        v.iter()
            .map(|x| format!("v{x}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let instead = tries.iter().find(|v| exported.contains(v));
    Some(match instead {
        Some(v) => format!(
            "{label} would load {}{v}, not v{} (it tries {})",
            family.prefix(),
            chosen.version,
            list(tries)
        ),
        None => format!(
            "{label} cannot use '{}': it tries {} and the library exports {}",
            step.attempt.label,
            list(tries),
            list(&exported)
        ),
    })
}

/// Renders the rules applied.
pub fn render(o: &mut String, r: &ReleaseRules) {
    let _ = writeln!(
        o,
        "\nRules of {} (the walk below follows cclkit's newest rules; what this release \
         does differently is listed under Notes and Problems):",
        r.release.label()
    );
    let _ = writeln!(o, "  NCCL_NET_PLUGIN unset opens {}", r.net_default);
    for k in &r.kinds {
        let tries = k.tries.map_or_else(
            || "versions not recorded".to_owned(),
            |t| {
                t.iter()
                    .map(|v| format!("v{v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        );
        let note = k.note.map(|n| format!(" ({n})")).unwrap_or_default();
        let _ = writeln!(o, "  {}: {tries}{note}", k.kind);
    }
}
