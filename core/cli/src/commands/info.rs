//! `cclkit info LIB.so`: everything about one plugin library — file, symbols, the
//! version each NCCL release would pick, dependencies, table names, and the
//! properties of every device (for net plugins), an `init` check (for tuners and
//! env plugins) or the events `init` asks for (for profilers).

use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use super::doctor::contain;
use super::report::{DeviceReport, FileReport};
use crate::elf::deps::Resolver;
use cclkit_host::env::{EnvInitArgs, EnvOutcome};
use cclkit_host::kinds::Kind;
use cclkit_host::net::{CommConfig, NetPlugin};
use cclkit_host::profiler::ProfilerPlugin;
use cclkit_host::symbols::{self, Family};
use cclkit_host::tuner::{NvlDomainInfo, TunerPlugin};
use cclkit_host::{Cause, Library, LoadError, PluginKind};

/// Arguments of `cclkit info`.
#[derive(Debug, clap::Args)]
pub struct InfoArgs {
    /// The plugin library: a path, or a name the dynamic linker searches for.
    #[arg(required_unless_present_any = ["net", "tuner"])]
    pub library: Option<String>,
    /// `--net`/`--tuner NAME|PATH`: show the library this setting resolves to.
    #[command(flatten)]
    pub plugins: super::plugin_args::PluginArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Run the plugin against cclkit's host-memory CUDA stand-in (docs/cuda-standin.md).
    #[arg(long)]
    pub cuda_standin: bool,
    /// Only read and load the file: do not call the plugin's init/devices/properties.
    #[arg(long)]
    pub no_init: bool,
}

/// The `info` report.
#[derive(Debug, Serialize)]
pub struct InfoReport {
    /// The library as given.
    pub library: String,
    /// What the file contains (`None` if it was not found or not readable).
    pub file: Option<FileReport>,
    /// Why the file could not be read.
    pub file_error: Option<String>,
    /// `dlopen` error.
    pub load_error: Option<String>,
    /// The `name` of every exported versioned table.
    pub tables: Vec<TableName>,
    /// The net plugin, if the library has one.
    pub net: Option<NetInfo>,
    /// The tuner, if the library has one.
    pub tuner: Option<TunerInfo>,
    /// The profiler, if the library has one.
    pub profiler: Option<ProfilerInfo>,
    /// The env plugin, if the library has one.
    pub env: Option<EnvInfo>,
    /// Every plugin kind NCCL 2.31 loads that the library exports (issue 22).
    pub kinds: Vec<cclkit_host::kinds::Found>,
    /// Everything wrong, one line each.
    pub problems: Vec<String>,
}

/// A table's name.
#[derive(Debug, Serialize)]
pub struct TableName {
    /// Symbol.
    pub symbol: String,
    /// Its `name` field (`None` = NULL).
    pub name: Option<String>,
}

/// A net plugin seen through the version NCCL 2.30 would use.
#[derive(Debug, Serialize)]
pub struct NetInfo {
    /// Table name.
    pub name: Option<String>,
    /// Symbol used.
    pub symbol: Option<String>,
    /// Version used.
    pub version: Option<u32>,
    /// CollNet symbol, if exported.
    pub collnet: Option<String>,
    /// Why it cannot be used.
    pub error: Option<String>,
    /// Device count.
    pub ndev: Option<usize>,
    /// Every device.
    pub devices: Vec<DeviceReport>,
}

/// A tuner seen through the version NCCL 2.30 would use.
#[derive(Debug, Serialize)]
pub struct TunerInfo {
    /// Table name.
    pub name: Option<String>,
    /// Symbol used.
    pub symbol: Option<String>,
    /// Version used.
    pub version: Option<u32>,
    /// v6 `getChunkSize` present.
    pub has_chunk_size: bool,
    /// Why it cannot be used.
    pub error: Option<String>,
    /// `init` succeeded (not tried with `--no-init`).
    pub init_ok: Option<bool>,
}

/// A profiler seen through the newest version it exports (what NCCL loads).
#[derive(Debug, Default, Serialize)]
pub struct ProfilerInfo {
    /// Table name.
    pub name: Option<String>,
    /// Symbol used.
    pub symbol: Option<String>,
    /// The activation mask `init` returned (not asked with `--no-init`).
    pub mask: Option<u64>,
    /// The event types of the mask, by NCCL's names.
    pub events: Vec<&'static str>,
    /// Why it cannot be used.
    pub error: Option<String>,
}

/// An env plugin seen through the newest version it exports (what NCCL loads).
#[derive(Debug, Default, Serialize)]
pub struct EnvInfo {
    /// Table name.
    pub name: Option<String>,
    /// Symbol used.
    pub symbol: Option<String>,
    /// `init` and `finalize` succeeded (not tried with `--no-init`).
    pub init_ok: Option<bool>,
    /// Why it cannot be used.
    pub error: Option<String>,
}

/// Runs `cclkit info`.
pub fn run(args: &InfoArgs) -> ExitCode {
    if let Some(code) = crate::standin::relaunch(args.cuda_standin, args.json, "info") {
        return code;
    }
    let library = match args.plugins.library(args.library.as_deref()) {
        Ok(Some(l)) => l,
        Ok(None) => {
            eprintln!("cclkit info: no library given");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("cclkit info: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(code) = super::doctor::contain::run_contained("info", &library, args.json) {
        return code;
    }
    let report = inspect(&library, !args.no_init);
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("cclkit info: cannot encode JSON: {e}"),
        }
    } else {
        print!("{}", render(&report));
    }
    contain::step("exiting (the plugin's destructors run)");
    contain::done();
    if report.problems.is_empty() && cclkit_host::kinds::nothing_checkable(&report.kinds) {
        // Only kinds cclkit names but does not drive: nothing could be checked.
        return ExitCode::from(cclkit_host::kinds::EXIT_NOTHING_CHECKED);
    }
    if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Builds the report for `library`; `call_plugin` allows init/devices/properties.
pub fn inspect(library: &str, call_plugin: bool) -> InfoReport {
    let resolver = Resolver::from_env();
    let mut report = InfoReport {
        library: library.to_owned(),
        file: None,
        file_error: None,
        load_error: None,
        tables: Vec::new(),
        net: None,
        tuner: None,
        profiler: None,
        env: None,
        kinds: Vec::new(),
        problems: Vec::new(),
    };
    let path = if library.contains('/') {
        Some(PathBuf::from(library))
    } else {
        resolver
            .locate(library, None)
            .map(|l| PathBuf::from(l.path))
    };
    match path.as_deref().map(|p| FileReport::inspect(p, &resolver)) {
        Some(Ok(f)) => {
            report.problems.extend(f.problems.iter().cloned());
            report.file = Some(f);
        }
        Some(Err(e)) => report.file_error = Some(e),
        None => {
            report.file_error = Some(format!(
                "{library}: not found in LD_LIBRARY_PATH, /etc/ld.so.cache or the default directories"
            ))
        }
    }
    contain::step("dlopen (the library's constructors run)");
    let lib = match Library::open(Some(library)) {
        Ok(l) => l,
        Err(e) => {
            report.problems.push(format!("dlopen failed: {e}"));
            report.load_error = Some(e.message);
            return report;
        }
    };
    for family in [Family::Net, Family::CollNet, Family::Tuner] {
        for e in symbols::exported(&lib, family) {
            report.tables.push(TableName {
                name: symbols::table_name(&lib, &e.symbol),
                symbol: e.symbol,
            });
        }
    }
    let has = |f: Family| {
        report
            .tables
            .iter()
            .any(|t| t.symbol.starts_with(f.prefix()))
    };
    let (has_net, has_tuner) = (has(Family::Net), has(Family::Tuner));
    report.kinds = cclkit_host::kinds::classify(&lib);
    let has_kind = |k: Kind| report.kinds.iter().any(|f| f.kind == k && f.nccl_loads);
    let (has_profiler, has_env) = (has_kind(Kind::Profiler), has_kind(Kind::Env));
    let other_kinds_only = cclkit_host::kinds::nothing_checkable(&report.kinds);
    // A library of no kind NCCL loads is looked at as a net plugin, the kind
    // `NCCL_NET_PLUGIN` names, so the report says why NCCL would not use it.
    if has_net || !(has_tuner || has_profiler || has_env || other_kinds_only) {
        report.net = Some(net_info(&lib, call_plugin));
    }
    if has_tuner {
        report.tuner = Some(tuner_info(&lib, call_plugin));
    }
    if has_profiler {
        report.profiler = Some(profiler_info(&lib, call_plugin));
    }
    if has_env {
        report.env = Some(env_info(&lib, call_plugin));
    }
    let errors: Vec<String> = report
        .net
        .iter()
        .filter_map(|n| n.error.clone())
        .chain(report.tuner.iter().filter_map(|t| t.error.clone()))
        .chain(report.profiler.iter().filter_map(|p| p.error.clone()))
        .chain(report.env.iter().filter_map(|e| e.error.clone()))
        .collect();
    report.problems.extend(errors);
    report
}

fn load_error_text(
    kind: PluginKind,
    lib: &Library,
    cause: Cause,
    at: Option<(String, u32)>,
) -> String {
    let mut e = LoadError::new(kind, lib.display_name(), cause);
    e.path = lib.path().map(|p| p.display().to_string());
    if let Some((s, v)) = at {
        e.symbol = Some(s);
        e.version = Some(v);
    }
    e.to_string()
}

fn net_info(lib: &Library, call: bool) -> NetInfo {
    let mut info = NetInfo {
        name: None,
        symbol: None,
        version: None,
        collnet: None,
        error: None,
        ndev: None,
        devices: Vec::new(),
    };
    contain::step("net plugin: reading its table");
    let plugin = match NetPlugin::load(lib.clone()) {
        Ok(p) => p,
        Err((cause, at)) => {
            info.error = Some(load_error_text(PluginKind::Net, lib, cause, at));
            return info;
        }
    };
    info.name = Some(plugin.name().to_owned());
    info.symbol = Some(plugin.symbol().to_owned());
    info.version = Some(plugin.version());
    info.collnet = plugin.collnet().map(|(s, _)| s.to_owned());
    if !call {
        return info;
    }
    contain::step("net plugin: init");
    let ctx = match plugin.init(0, CommConfig::default()) {
        Ok(c) => c,
        Err(e) => {
            info.error = Some(e.to_string());
            return info;
        }
    };
    contain::step("net plugin: devices and getProperties");
    match ctx.devices() {
        Ok(n) => {
            info.ndev = Some(n);
            if n == 0 {
                info.error =
                    Some("devices() reported 0 devices: NCCL would not use this plugin".into());
            }
            for dev in 0..n {
                match ctx.properties(dev) {
                    Ok(p) => info.devices.push(DeviceReport::new(dev, &p)),
                    Err(e) => {
                        info.error.get_or_insert_with(|| e.to_string());
                    }
                }
            }
        }
        Err(e) => info.error = Some(e.to_string()),
    }
    info
}

fn tuner_info(lib: &Library, call: bool) -> TunerInfo {
    let mut info = TunerInfo {
        name: None,
        symbol: None,
        version: None,
        has_chunk_size: false,
        error: None,
        init_ok: None,
    };
    contain::step("tuner: reading its table");
    let plugin = match TunerPlugin::load(lib.clone()) {
        Ok(p) => p,
        Err((cause, at)) => {
            info.error = Some(load_error_text(PluginKind::Tuner, lib, cause, at));
            return info;
        }
    };
    info.name = Some(plugin.name().to_owned());
    info.symbol = Some(plugin.symbol().to_owned());
    info.version = Some(plugin.version());
    info.has_chunk_size = plugin.has_chunk_size();
    if call {
        let mut constants = cclkit_runtime::tune::default_constants();
        let nvl = NvlDomainInfo {
            nNvlDomains: 1,
            minRanksPerNvlDomain: 8,
            maxRanksPerNvlDomain: 8,
        };
        contain::step("tuner: init");
        match plugin.init(8, 1, 0, nvl, &mut constants) {
            Ok(ctx) => {
                info.init_ok = Some(true);
                if let Err(e) = ctx.finalize() {
                    info.error = Some(e.to_string());
                }
            }
            Err(e) => {
                info.init_ok = Some(false);
                info.error = Some(e.to_string());
            }
        }
    }
    info
}

fn profiler_info(lib: &Library, call: bool) -> ProfilerInfo {
    let mut info = ProfilerInfo::default();
    contain::step("profiler: reading its table");
    let plugin = match ProfilerPlugin::from_library(lib.clone()) {
        Ok(p) => p,
        Err(e) => {
            info.error = Some(e.to_string());
            return info;
        }
    };
    info.name = Some(plugin.name().to_owned());
    info.symbol = Some(plugin.symbol().to_owned());
    if call {
        // The shape `info` gives tuners: 8 ranks on one node.
        match super::doctor::profiler::init_mask(&plugin, 8, 1) {
            Ok((mask, events)) => {
                info.mask = Some(mask);
                info.events = events;
            }
            Err(e) => info.error = Some(format!("profiler init failed: {e}")),
        }
    }
    info
}

fn env_info(lib: &Library, call: bool) -> EnvInfo {
    let mut info = EnvInfo::default();
    contain::step("env plugin: reading its table");
    // NCCL_ENV_PLUGIN set to the file: the value is tried first and opens it.
    let path = lib.path().map(|p| p.display().to_string());
    let resolution =
        cclkit_host::env::resolve_value(Some(&path.unwrap_or_else(|| lib.display_name())));
    let plugin = match &resolution.outcome {
        EnvOutcome::Loaded { plugin, .. } => plugin,
        EnvOutcome::Unsupported { reason, .. } => {
            info.error = Some(format!("env plugin: {reason}"));
            return info;
        }
        EnvOutcome::Disabled | EnvOutcome::NotFound => {
            info.error = Some("env plugin: the library did not open again by its path".into());
            return info;
        }
    };
    info.name = Some(plugin.name().to_owned());
    info.symbol = Some(plugin.symbol().to_owned());
    if call {
        contain::step("env plugin: init and finalize");
        let done = plugin
            .init(&EnvInitArgs::default())
            .and_then(|()| plugin.finalize());
        info.init_ok = Some(done.is_ok());
        if let Err(e) = done {
            info.error = Some(e.to_string());
        }
    }
    info
}

/// The text form of a report.
pub fn render(r: &InfoReport) -> String {
    let mut out = format!("{}\n", r.library);
    if let Some(f) = &r.file {
        for l in f.lines("  ") {
            out.push_str(&l);
            out.push('\n');
        }
    }
    if let Some(e) = &r.file_error {
        out.push_str(&format!("  file: {e}\n"));
    }
    if let Some(e) = &r.load_error {
        out.push_str(&format!("  dlopen: FAILED: {e}\n"));
    }
    for t in &r.tables {
        out.push_str(&format!(
            "  {} name: {}\n",
            t.symbol,
            t.name
                .as_deref()
                .map_or("(NULL)".to_owned(), |n| format!("\"{n}\""))
        ));
    }
    if !r.kinds.is_empty() {
        let kinds: Vec<String> = r.kinds.iter().map(|k| k.label()).collect();
        out.push_str(&format!("  plugin kinds: {}\n", kinds.join(", ")));
    }
    for line in r.kinds.iter().filter_map(|k| k.not_checked()) {
        out.push_str(&format!("  {line}\n"));
    }
    if let Some(n) = &r.net {
        match (&n.name, &n.symbol) {
            (Some(name), Some(sym)) => out.push_str(&format!(
                "  net plugin '{name}' through {sym}{}\n",
                n.collnet
                    .as_deref()
                    .map(|c| format!(" (CollNet: {c})"))
                    .unwrap_or_default()
            )),
            _ => out.push_str("  net plugin: none usable\n"),
        }
        if let Some(nd) = n.ndev {
            out.push_str(&format!("    {nd} device(s)\n"));
        }
        for d in &n.devices {
            out.push_str(&format!("    {}\n", d.line()));
        }
        if let Some(e) = &n.error {
            out.push_str(&format!("    ERROR: {e}\n"));
        }
    }
    if let Some(t) = &r.tuner {
        if let (Some(name), Some(sym)) = (&t.name, &t.symbol) {
            out.push_str(&format!(
                "  tuner '{name}' through {sym}{}{}\n",
                if t.has_chunk_size {
                    " (with getChunkSize)"
                } else {
                    ""
                },
                match t.init_ok {
                    Some(true) => ": init ok",
                    Some(false) => ": init FAILED",
                    None => "",
                }
            ));
        }
        if let Some(e) = &t.error {
            out.push_str(&format!("    ERROR: {e}\n"));
        }
    }
    if let Some(p) = &r.profiler {
        if let (Some(name), Some(sym)) = (&p.name, &p.symbol) {
            out.push_str(&format!("  profiler '{name}' through {sym}\n"));
        }
        if let Some(m) = p.mask {
            let line = super::doctor::profiler::mask_line(m, &p.events);
            out.push_str(&format!("    {line}\n"));
        }
        if let Some(e) = &p.error {
            out.push_str(&format!("    ERROR: {e}\n"));
        }
    }
    if let Some(e) = &r.env {
        if let (Some(name), Some(sym)) = (&e.name, &e.symbol) {
            let init = match e.init_ok {
                Some(true) => ": init and finalize ok",
                Some(false) => ": init or finalize FAILED",
                None => "",
            };
            out.push_str(&format!("  env plugin '{name}' through {sym}{init}\n"));
        }
        if let Some(err) = &e.error {
            out.push_str(&format!("    ERROR: {err}\n"));
        }
    }
    if r.problems.is_empty() {
        out.push_str("  verdict: OK\n");
    } else {
        out.push_str(&format!("  verdict: {} problem(s)\n", r.problems.len()));
        for p in &r.problems {
            out.push_str(&format!("    - {p}\n"));
        }
    }
    out
}
