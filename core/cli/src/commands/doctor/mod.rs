//! `cclkit doctor`: walks the exact plugin resolution NCCL (or RCCL) would do in this
//! environment and explains every step — names tried, the file that loads, its
//! exported versions and what each NCCL release would pick, missing shared-library
//! dependencies, device properties — ending with a one-line verdict. Exits non-zero
//! when the job would not get the plugin that was asked for.

use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use super::report::{DeviceReport, FileReport};
use crate::elf::deps::{Located, Resolver};
use cclkit_host::config::{Flavor, LoaderConfig, PluginKind};
use cclkit_host::error::{Cause, LoadError, OpenAttempt, OpenOutcome};
use cclkit_host::net::{CommConfig, NetPlugin};
use cclkit_host::resolve::{self, Rule};
use cclkit_host::select::{Attempt, NetRegistry, Outcome, TunerArgs, TunerRegistry};
use cclkit_host::tuner::NvlDomainInfo;

pub mod contain;
pub mod env;
use env::EnvView;
pub mod gdr;
pub mod profiler;
pub mod release;
mod render;
mod tuner;

/// Arguments of `cclkit doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// `--net`/`--tuner`: resolve these instead of the environment's settings.
    #[command(flatten)]
    pub plugins: super::plugin_args::PluginArgs,
    /// Follow RCCL's naming rules (`librccl-net-*.so` for net plugins).
    #[arg(long)]
    pub rccl: bool,
    /// Ranks per communicator handed to the tuner's init.
    #[arg(long, default_value_t = 16)]
    pub ranks: usize,
    /// Nodes per communicator handed to the tuner's init.
    #[arg(long, default_value_t = 2)]
    pub nodes: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Apply this NCCL release's loader rules (`2.24`, `2.28`, …).
    #[arg(long, value_name = "X.Y")]
    pub nccl_version: Option<String>,
    /// Apply this RCCL release's loader rules, named by ROCm version (`7.2`); implies --rccl.
    #[arg(long, value_name = "X.Y")]
    pub rccl_version: Option<String>,
    /// Run the plugin against cclkit's host-memory CUDA stand-in (docs/cuda-standin.md).
    #[arg(long)]
    pub cuda_standin: bool,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct DoctorReport {
    /// Naming rules followed.
    pub flavor: Flavor,
    /// The env plugin, resolved first; its values feed everything below.
    pub env: env::EnvReport,
    /// The release rules applied (`--nccl-version` / `--rccl-version`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release: Option<cclkit_host::releases::ReleaseRules>,
    /// The settings that matter, as seen (`None` = unset).
    pub settings: Vec<(String, Option<String>)>,
    /// Net resolution.
    pub net: Section,
    /// Tuner resolution.
    pub tuner: Section,
    /// Profiler resolution and the events its `init` asks for.
    pub profiler: profiler::ProfilerReport,
    /// GPUDirect RDMA: what `--device cuda` would do per GPU and net device.
    pub gpu: gdr::GdrReport,
    /// Legal but suspicious settings.
    pub notes: Vec<String>,
    /// What is wrong (non-empty ⇒ exit code 1).
    pub problems: Vec<String>,
    /// The one-line verdict.
    pub verdict: String,
}

/// One plugin kind's walk.
#[derive(Debug, Default, Serialize)]
pub struct Section {
    /// Every plugin considered, in order.
    pub steps: Vec<Step>,
    /// What was chosen, as one phrase.
    pub chosen: Option<String>,
    /// True when a requested plugin could not be used.
    pub fell_back: bool,
    /// Net: properties of every device of the chosen plugin.
    pub devices: Vec<DeviceReport>,
    /// Tuner: sample `getCollInfo` decisions.
    pub decisions: Vec<Decision>,
}

/// One plugin considered by the walk.
#[derive(Debug, Serialize)]
pub struct Step {
    /// The attempt as the loader recorded it.
    #[serde(flatten)]
    pub attempt: Attempt,
    /// Each `dlopen`, with the file on disk when a load failed.
    pub opens: Vec<OpenStep>,
    /// What the loaded (or failing) file contains.
    pub file: Option<FileReport>,
    /// A likely intended name when nothing was found (a typo).
    pub hint: Option<String>,
}

/// One `dlopen` with what the disk says about it.
#[derive(Debug, Serialize)]
pub struct OpenStep {
    /// The attempt.
    #[serde(flatten)]
    pub open: OpenAttempt,
    /// Where the dynamic linker finds the file (for a load that failed although the
    /// file exists: then a dependency is usually missing).
    pub located: Option<Located>,
}

/// One sample tuner decision.
#[derive(Debug, Serialize)]
pub struct Decision {
    /// Collective.
    pub collective: String,
    /// Bytes.
    pub bytes: usize,
    /// "RING/SIMPLE", or the error.
    pub choice: Result<String, String>,
    /// Channels the tuner asked for (0 = NCCL's).
    pub channels: i32,
    /// The built-in model's own pick, where the tuner changed it.
    pub model: Option<String>,
}

/// Runs `cclkit doctor`.
pub fn run(args: &DoctorArgs) -> ExitCode {
    if let Some(code) = crate::standin::relaunch(args.cuda_standin, args.json, "doctor") {
        return code;
    }
    // The process environment only: doctor's own view below loads the env plugin.
    let config = config_for(args, LoaderConfig::from_lookup(|k| std::env::var(k).ok()));
    let plugins = format!(
        "net {}, tuner {}",
        config.net_plugin.as_deref().unwrap_or("(default)"),
        config.tuner_plugin.as_deref().unwrap_or("(default)")
    );
    let rules = match release::from_args(args) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if let Some(code) = contain::run_contained("doctor", &plugins, args.json) {
        return code;
    }
    // NCCL resolves NCCL_ENV_PLUGIN first and reads every other NCCL_* through it.
    let (view, config, injected) = release::prepare(args, rules.as_ref());
    let mut report = diagnose(&config, args.ranks, args.nodes, view);
    release::apply(&mut report, rules, &config, injected);
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("cclkit doctor: cannot encode JSON: {e}"),
        }
    } else {
        print!("{}", render::render(&report));
    }
    contain::step("exiting (the plugins' destructors run)");
    contain::done();
    if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The configuration to diagnose: the environment's, overridden by the flags. The
/// walk never stops early (strict mode only changes how the verdict reads).
pub fn config_for(args: &DoctorArgs, env: LoaderConfig) -> LoaderConfig {
    let mut c = args.plugins.apply(env);
    if args.rccl {
        c.flavor = Flavor::Rccl;
    }
    c
}

/// Walks the resolution for `config` and builds the report.
pub fn diagnose(config: &LoaderConfig, ranks: usize, nodes: usize, view: EnvView) -> DoctorReport {
    let resolver = Resolver::from_env();
    let walk = LoaderConfig {
        strict: false,
        ..config.clone()
    };
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    for (kind, value) in [
        (PluginKind::Net, &config.net_plugin),
        (PluginKind::Tuner, &config.tuner_plugin),
    ] {
        if let Some(v) = value {
            let entries: Vec<&str> = match kind {
                PluginKind::Net => v.split(',').filter(|e| !e.is_empty()).collect(),
                PluginKind::Tuner => vec![v.as_str()],
            };
            for e in entries {
                notes.extend(resolve::pitfalls(kind, e));
            }
        }
    }

    // NET
    cclkit_runtime::install_builtin_net();
    let registry = NetRegistry::new(walk.clone());
    let mut net = Section::default();
    // Keeps the chosen net library open while the tuner lookup searches it.
    let mut chosen_net: Option<NetPlugin> = None;
    contain::step("net plugin: loading and init (NCCL_NET_PLUGIN resolution)");
    match registry.select(0x0cc1_c17d_0c70_0001, CommConfig::default()) {
        Ok(sel) => {
            notes.extend(
                sel.ignored
                    .iter()
                    .map(|i| format!("NCCL_NET_PLUGIN entry ignored: {i}")),
            );
            net.steps = steps(&sel.attempts, &resolver, config.flavor);
            net.fell_back = sel.fell_back;
            let p = sel.context.plugin().clone();
            net.chosen = Some(describe_net(&p, sel.devices));
            contain::step("net plugin: getProperties of every device");
            for dev in 0..sel.devices {
                match sel.context.properties(dev) {
                    Ok(props) => net.devices.push(DeviceReport::new(dev, &props)),
                    Err(e) => problems.push(format!("NET: properties of device {dev}: {e}")),
                }
            }
            chosen_net = Some(p);
        }
        Err(e) => {
            net.steps = steps(e.attempts(), &resolver, config.flavor);
            net.fell_back = true;
            problems.push(format!(
                "NET: {}",
                e.to_string().lines().next().unwrap_or("no plugin")
            ));
        }
    }
    if net.fell_back {
        problems.push(net_fallback_problem(config, &net));
    }

    // TUNER
    let tuners = TunerRegistry::new(walk);
    let mut tuner = Section::default();
    // NCCL hands a v5+ tuner its model constants to read and rewrite: the real
    // defaults, as the runtime does, not zeros.
    let mut constants = cclkit_runtime::tune::default_constants();
    let args = TunerArgs {
        n_ranks: ranks,
        n_nodes: nodes,
        comm_id: 0x0cc1_c17d_0c70_0001,
        nvl: NvlDomainInfo {
            nNvlDomains: nodes.max(1) as i32,
            minRanksPerNvlDomain: (ranks / nodes.max(1)) as i32,
            maxRanksPerNvlDomain: (ranks / nodes.max(1)) as i32,
        },
    };
    contain::step("tuner: loading and init (NCCL_TUNER_PLUGIN resolution)");
    match tuners.select(registry.tuner_library().as_ref(), args, &mut constants) {
        Ok(sel) => {
            tuner.steps = steps(&sel.attempts, &resolver, config.flavor);
            tuner.fell_back = sel.fell_back;
            tuner.chosen = Some(match &sel.tuner {
                Some(t) => format!(
                    "'{}' v{} ({})",
                    t.plugin().name(),
                    t.plugin().version(),
                    t.plugin()
                        .library()
                        .map_or_else(|| "linked in".to_owned(), |l| l.display_name())
                ),
                None => cclkit_host::select::BUILTIN_MODEL.to_owned(),
            });
            if let Some(mut ctx) = sel.tuner {
                contain::step("tuner: getCollInfo on sample collectives");
                let model = tuner::model_inputs(ranks, nodes, &net.devices);
                let channels = net.devices.len().max(2);
                tuner.decisions = tuner::sample_decisions(&mut ctx, model, channels, &constants);
                for d in &tuner.decisions {
                    if let Err(e) = &d.choice {
                        problems.push(format!(
                            "TUNER: getCollInfo({} {} B): {e}",
                            d.collective, d.bytes
                        ));
                    }
                }
            }
        }
        Err(e) => {
            tuner.steps = steps(e.attempts(), &resolver, config.flavor);
            tuner.fell_back = true;
        }
    }
    if tuner.fell_back {
        problems.push(format!(
            "TUNER: the requested tuner cannot be used; the job would use the built-in cost \
             model. Reason: {}",
            first_failure(&tuner).unwrap_or_default()
        ));
    }
    for s in net.steps.iter().chain(&tuner.steps) {
        if matches!(s.attempt.outcome, Outcome::Selected(_))
            && let Some(f) = &s.file
        {
            problems.extend(
                f.problems
                    .iter()
                    .map(|p| format!("{}: {p}", s.attempt.label)),
            );
        }
    }
    notes.extend(net.steps.iter().chain(&tuner.steps).filter_map(|st| {
        st.hint
            .as_ref()
            .map(|h| format!("{}: {h}", st.attempt.label))
    }));
    if config.strict && (net.fell_back || tuner.fell_back) {
        notes.push("CCLKIT_STRICT=1: cclkit would refuse to start with this setup".into());
    }

    // PROFILER (NCCL loads it per communicator, after the net plugin)
    let (profiler, more_problems, more_notes) = profiler::report(
        view.get(cclkit_host::profiler::ENV),
        chosen_net.as_ref().and_then(NetPlugin::library),
        ranks,
        nodes,
    );
    problems.extend(more_problems);
    notes.extend(more_notes);

    let gpu = gdr::report(&net.devices, &|k| view.get(k));
    problems.extend(gpu.problem.clone());
    let env = view.report();
    problems.splice(0..0, env.problems.iter().cloned());
    notes.extend(env.notes.iter().cloned());

    let verdict = verdict(&net, &tuner, &profiler, &problems);
    DoctorReport {
        flavor: config.flavor,
        env,
        release: None,
        settings: settings(config),
        net,
        tuner,
        profiler,
        gpu,
        notes,
        problems,
        verdict,
    }
}

fn settings(config: &LoaderConfig) -> Vec<(String, Option<String>)> {
    vec![
        ("NCCL_NET_PLUGIN".into(), config.net_plugin.clone()),
        ("NCCL_TUNER_PLUGIN".into(), config.tuner_plugin.clone()),
        ("NCCL_NET".into(), config.net_name.clone()),
        (
            "CCLKIT_STRICT".into(),
            config.strict.then(|| "1".to_owned()),
        ),
        (
            "LD_LIBRARY_PATH".into(),
            std::env::var("LD_LIBRARY_PATH").ok(),
        ),
    ]
}

/// Adds what the disk says to each attempt.
fn steps(attempts: &[Attempt], resolver: &Resolver, flavor: Flavor) -> Vec<Step> {
    attempts
        .iter()
        .map(|a| {
            let opens_src: &[OpenAttempt] = match &a.outcome {
                Outcome::Selected(c) => &c.opens,
                Outcome::Failed(e) | Outcome::Skipped(e) => &e.opens,
            };
            let mut file_path: Option<PathBuf> = None;
            let opens = opens_src
                .iter()
                .map(|o| {
                    let located = match &o.outcome {
                        OpenOutcome::Loaded { path } => {
                            file_path = path.as_ref().map(PathBuf::from);
                            None
                        }
                        OpenOutcome::Failed { .. } => {
                            let l = o.name.as_deref().and_then(|n| resolver.locate(n, None));
                            if let Some(l) = &l {
                                file_path = Some(PathBuf::from(&l.path));
                            }
                            l
                        }
                        OpenOutcome::NotFound { .. } => None,
                    };
                    OpenStep {
                        open: o.clone(),
                        located,
                    }
                })
                .collect();
            // The net library was already described in the NET section.
            let same_as_net = opens_src
                .iter()
                .any(|o| o.rule == cclkit_host::resolve::Rule::NetLibrary);
            let file = file_path
                .filter(|_| !same_as_net)
                .and_then(|p| FileReport::inspect(&p, resolver).ok());
            let hint = match &a.outcome {
                Outcome::Failed(e) | Outcome::Skipped(e) => suggest(e, flavor, resolver),
                Outcome::Selected(_) => None,
            };
            Step {
                attempt: a.clone(),
                opens,
                file,
                hint,
            }
        })
        .collect()
}

/// For a plain name that was not found anywhere: the installed plugin whose name is
/// closest (`NCCL_NET_PLUGIN=ofi` vs `libnccl-net-aws-ofi.so`, a typo, …).
fn suggest(e: &LoadError, flavor: Flavor, resolver: &Resolver) -> Option<String> {
    let all_absent = e
        .opens
        .iter()
        .all(|o| o.rule == Rule::PrefixForm || o.rule == Rule::Verbatim)
        && e.opens
            .iter()
            .all(|o| matches!(o.outcome, OpenOutcome::NotFound { .. }));
    if !matches!(e.cause, Cause::NotLoaded) || !all_absent || e.entry.contains('/') {
        return None;
    }
    let prefix = format!("{}-", resolve::prefix(e.kind, flavor));
    let want = e.entry.as_str();
    let (d, name, path) = resolver
        .files_with_prefix(&prefix)
        .into_iter()
        .filter_map(|(file, path)| {
            let v = file.strip_prefix(&prefix)?.strip_suffix(".so")?.to_owned();
            Some((distance(want, &v), v, path))
        })
        .min_by_key(|(d, _, _)| *d)?;
    let var = e.kind.env_var();
    if d == 0 {
        return Some(format!(
            "{} exists, but the dynamic linker did not find it: is its directory in \
             LD_LIBRARY_PATH, or is /etc/ld.so.cache stale (run ldconfig)?",
            path.display()
        ));
    }
    (d <= (want.len().max(name.len()) / 3).max(2)).then(|| {
        format!(
            "did you mean {var}={name}? ({} is installed)",
            path.display()
        )
    })
}

/// Levenshtein distance (names are short).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn describe_net(p: &NetPlugin, ndev: usize) -> String {
    format!(
        "'{}' v{} ({}, {ndev} device{})",
        p.name(),
        p.version(),
        match p.library() {
            Some(l) => l.display_name(),
            None => "built into cclkit".to_owned(),
        },
        if ndev == 1 { "" } else { "s" }
    )
}

fn first_failure(s: &Section) -> Option<String> {
    s.steps.iter().find_map(|st| match &st.attempt.outcome {
        Outcome::Failed(e) => Some(e.to_string()),
        _ => None,
    })
}

fn net_fallback_problem(config: &LoaderConfig, net: &Section) -> String {
    let failed = net
        .steps
        .iter()
        .find(|st| st.attempt.is_failure())
        .map(|st| st.attempt.label.clone());
    let asked = match (&config.net_plugin, failed) {
        (Some(v), Some(l)) if *v != l => format!("'{l}' (from NCCL_NET_PLUGIN={v}) cannot be used"),
        (Some(v), _) => format!("NCCL_NET_PLUGIN={v} cannot be used"),
        (None, _) => format!(
            "{} exists but cannot be used",
            resolve::default_name(PluginKind::Net, config.flavor)
        ),
    };
    let to = net.chosen.clone().unwrap_or_else(|| "nothing".into());
    format!(
        "NET: {asked}; the job would fall back to {to}. Reason: {}",
        first_failure(net).unwrap_or_default()
    )
}

fn verdict(
    net: &Section,
    tuner: &Section,
    profiler: &profiler::ProfilerReport,
    problems: &[String],
) -> String {
    let net_s = net
        .chosen
        .clone()
        .unwrap_or_else(|| "no usable net plugin".into());
    let tuner_s = tuner
        .chosen
        .clone()
        .unwrap_or_else(|| "built-in cost model".into());
    if problems.is_empty() {
        // The profiler only when one is loaded: most jobs run without one.
        let prof = match (&profiler.chosen, profiler.release_has_none) {
            (Some(p), false) => format!("; PROFILER {p}"),
            _ => String::new(),
        };
        format!("OK: NET {net_s}; TUNER {tuner_s}{prof}")
    } else {
        let more = match problems.len() {
            1 => String::new(),
            n => format!(
                " (+{} more problem{})",
                n - 1,
                if n == 2 { "" } else { "s" }
            ),
        };
        let first = problems[0]
            .split(". Reason:")
            .next()
            .unwrap_or(&problems[0]);
        format!("PROBLEM: {first}{more}")
    }
}

#[cfg(test)]
mod tests {
    use super::distance;

    #[test]
    fn edit_distance() {
        assert_eq!(distance("tmplate", "template"), 1);
        assert_eq!(distance("ofi", "aws-ofi"), 4);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("same", "same"), 0);
    }
}
