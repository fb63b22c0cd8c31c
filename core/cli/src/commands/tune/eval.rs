//! A tuner — a plugin library, a rule file, or none — turned into the reference
//! runtime's own [`Tuning`], so decisions are computed exactly as a communicator of
//! the given shape would compute them: the built-in cost table, `NCCL_ALGO` /
//! `NCCL_PROTO`, the tuner's `getCollInfo` and v6 `getChunkSize` through the real ABI,
//! the cheapest entry, the channel and chunk rules, per-call fallback.
//!
//! A rule file is handed to cclkit's tuner linked into this program (the same code
//! as `libnccl-tuner-cclkit.so`, called through its exported v6 table) with
//! `NCCL_TUNER_CONFIG_FILE` pointing at the file, as a real run would do.

use std::path::{Path, PathBuf};

use cclkit_abi::raw::common::{Func, Protocol};
use cclkit_tuner::config::{self, Format, format_size, names};
use serde::Serialize;

use super::{ShapeArgs, set_tuner_config_file};
use cclkit_host::open::open_entry;
use cclkit_host::tuner::{NvlDomainInfo, TunerPlugin};
use cclkit_host::{Library, LoadError, LoaderConfig, PluginKind};
use cclkit_runtime::ProtoParams;
use cclkit_runtime::tune::{Decision, ModelInputs, Source, Tuning, default_constants};

/// Communicator id handed to tuners by `cclkit tune` (ASCII "cclktune").
const COMM_ID: u64 = 0x6363_6c6b_7475_6e65;

/// What decides: a tuner library or a rule file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// A tuner library (path, or a name NCCL's rules resolve, e.g. `cclkit`).
    Library(String),
    /// A rule file (NCCL CSV or cclkit TOML) for cclkit's tuner.
    Rules(PathBuf),
}

impl Spec {
    /// A file starting with the ELF magic is a library, any other file a rule file; a
    /// name that is not a file is a rule file if it ends in `.conf`, `.csv` or `.toml`,
    /// otherwise a library name for the loader to resolve.
    pub fn classify(arg: &str) -> Self {
        let p = Path::new(arg);
        if p.is_file() {
            let mut magic = [0u8; 4];
            let elf = std::fs::File::open(p)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .is_ok()
                && magic == *b"\x7fELF";
            if elf {
                Self::Library(arg.to_owned())
            } else {
                Self::Rules(p.to_path_buf())
            }
        } else if p
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| ["conf", "csv", "toml"].contains(&e.to_ascii_lowercase().as_str()))
        {
            // A missing rule file: reading it reports "no such file" by name.
            Self::Rules(p.to_path_buf())
        } else {
            Self::Library(arg.to_owned())
        }
    }
}

/// The parameters of a communicator the tables are computed for.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Shape {
    /// Ranks.
    pub n_ranks: usize,
    /// Nodes.
    pub n_nodes: usize,
    /// Channels the communicator connected (the most a call may use).
    pub channels: usize,
    /// Network speed the built-in model uses, Mb/s.
    pub net_speed_mbps: u32,
    /// Network latency the built-in model uses, µs.
    pub net_latency_us: f64,
}

impl Shape {
    /// From the command line, checked.
    pub fn from_args(a: &ShapeArgs) -> Result<Self, String> {
        if a.nranks == 0 || a.nnodes == 0 || a.nnodes > a.nranks {
            return Err(format!(
                "--nranks {} --nnodes {}: need 1 <= nnodes <= nranks",
                a.nranks, a.nnodes
            ));
        }
        if !(1..=cclkit_runtime::config::MAX_CHANNELS).contains(&a.channels) {
            return Err(format!(
                "--channels {} is outside 1..={}",
                a.channels,
                cclkit_runtime::config::MAX_CHANNELS
            ));
        }
        if a.net_speed == 0 || !(a.net_latency.is_finite() && a.net_latency >= 0.0) {
            return Err("--net-speed must be positive and --net-latency not negative".into());
        }
        Ok(Self {
            n_ranks: a.nranks,
            n_nodes: a.nnodes,
            channels: a.channels,
            net_speed_mbps: a.net_speed,
            net_latency_us: a.net_latency,
        })
    }

    /// The built-in model's inputs, as a communicator derives them from its devices.
    fn model(&self) -> ModelInputs {
        ModelInputs {
            n_ranks: self.n_ranks,
            n_nodes: self.n_nodes,
            net_gbps: f64::from(self.net_speed_mbps) / 8000.0,
            net_lat_us: self.net_latency_us,
        }
    }

    /// NVLink domains as the runtime reports them: one per node, ranks spread evenly.
    fn nvl(&self) -> NvlDomainInfo {
        let n = i32::try_from(self.n_ranks).unwrap_or(i32::MAX);
        let nodes = i32::try_from(self.n_nodes).unwrap_or(i32::MAX).max(1);
        NvlDomainInfo {
            nNvlDomains: nodes,
            minRanksPerNvlDomain: n / nodes,
            maxRanksPerNvlDomain: (n + nodes - 1) / nodes,
        }
    }
}

/// One communicator's decisions, with what decides them.
pub struct Evaluator {
    /// What decides ("built-in cost model", "TemplateTuner v6 (ncclTunerPlugin_v6) from …").
    pub label: String,
    /// The tuner has a v6 `getChunkSize`.
    pub has_chunk_size: bool,
    /// The host layout the tuner was given (constants, cost-table width); `None` for
    /// the built-in model.
    pub layout: Option<cclkit_host::tuner::ConstantsLayout>,
    tuning: Tuning,
    max_channels: usize,
    params: [ProtoParams; 3],
}

/// `NCCL_ALGO` / `NCCL_PROTO` as a communicator reads them.
fn forced() -> (Option<String>, Option<String>) {
    (
        std::env::var("NCCL_ALGO").ok(),
        std::env::var("NCCL_PROTO").ok(),
    )
}

fn proto_params() -> Result<[ProtoParams; 3], String> {
    let env = |k: &str| std::env::var(k).ok();
    let p = |proto| ProtoParams::new(proto, &env).map_err(|e| e.to_string());
    Ok([p(Protocol::LL)?, p(Protocol::LL128)?, p(Protocol::SIMPLE)?])
}

impl Evaluator {
    /// The runtime with no tuner plugin: its built-in cost model decides.
    pub fn builtin(shape: &Shape) -> Result<Self, String> {
        let mut tuning = Tuning::new(None, default_constants(), shape.model(), false);
        let (a, p) = forced();
        tuning.force(a, p);
        Ok(Self {
            label: "built-in cost model".to_owned(),
            has_chunk_size: false,
            layout: None,
            tuning,
            max_channels: shape.channels,
            params: proto_params()?,
        })
    }

    /// The runtime with `plugin` initialised for `shape` (it may rewrite the model
    /// constants, as in a real run).
    pub fn with_plugin(plugin: &TunerPlugin, shape: &Shape, label: String) -> Result<Self, String> {
        let mut constants = default_constants();
        let ctx = plugin
            .init(
                shape.n_ranks,
                shape.n_nodes,
                COMM_ID,
                shape.nvl(),
                &mut constants,
            )
            .map_err(|e| format!("{label}: init failed: {e}"))?;
        let layout = Some(ctx.layout());
        let mut tuning = Tuning::new(Some(ctx), constants, shape.model(), false);
        let (a, p) = forced();
        tuning.force(a, p);
        Ok(Self {
            label,
            has_chunk_size: plugin.has_chunk_size(),
            layout,
            tuning,
            max_channels: shape.channels,
            params: proto_params()?,
        })
    }

    /// A tuner library or a rule file (see the module docs), for `shape`.
    ///
    /// A rule file is read first and any error in it is returned with its line (the
    /// plugin would silently use its model instead).
    pub fn open(spec: &Spec, shape: &Shape) -> Result<Self, String> {
        match spec {
            Spec::Library(name) => {
                let plugin = load_library(name)?;
                let path = plugin
                    .library()
                    .and_then(Library::path)
                    .map_or_else(|| name.clone(), |p| p.display().to_string());
                let label = format!(
                    "{} v{} ({}) from {path}",
                    plugin.name(),
                    plugin.version(),
                    plugin.symbol()
                );
                Self::with_plugin(&plugin, shape, label)
            }
            Spec::Rules(path) => {
                let parsed = read_rules(path)?;
                set_tuner_config_file(path);
                let plugin = TunerPlugin::from_static_v6(&cclkit_tuner::ncclTunerPlugin_v6);
                let mode = std::env::var("CCLKIT_TUNER_MODE").unwrap_or_else(|_| "auto".into());
                let label = format!(
                    "cclkit tuner (mode {mode}) with {} rule(s) from {} ({})",
                    parsed.rules.rules.len(),
                    path.display(),
                    match parsed.format {
                        Format::Csv => "NCCL CSV",
                        Format::Toml => "cclkit TOML",
                    }
                );
                Self::with_plugin(&plugin, shape, label)
            }
        }
    }

    /// What the runtime would run `func` on `bytes` (the size a tuner is asked about) with.
    pub fn decide(&self, func: Func, bytes: u64) -> Result<Decision, String> {
        let bytes = usize::try_from(bytes).map_err(|_| format!("{bytes} bytes is too large"))?;
        let params = |p: Protocol| {
            self.params[match p {
                Protocol::LL => 0,
                Protocol::LL128 => 1,
                _ => 2,
            }]
        };
        self.tuning
            .decide(func, bytes, self.max_channels, &params)
            .map_err(|e| e.to_string())
    }

    /// Calls for which the tuner failed and the built-in choice was used.
    pub fn fallbacks(&self) -> u64 {
        self.tuning.fallbacks()
    }
}

/// Opens a tuner library the way `NCCL_TUNER_PLUGIN=<name>` would.
pub fn load_library(name: &str) -> Result<TunerPlugin, String> {
    let flavor = LoaderConfig::from_env().flavor;
    let opened = open_entry(PluginKind::Tuner, flavor, Some(name)).map_err(|e| e.to_string())?;
    let lib = opened.library;
    TunerPlugin::load(lib.clone()).map_err(|(cause, at)| {
        let mut e = LoadError::new(PluginKind::Tuner, lib.display_name(), cause);
        e.path = lib.path().map(|p| p.display().to_string());
        if let Some((s, v)) = at {
            e.symbol = Some(s);
            e.version = Some(v);
        }
        e.to_string()
    })
}

/// Reads a rule file; any error (with its line) fails.
pub fn read_rules(path: &Path) -> Result<config::Parsed, String> {
    let parsed = config::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !parsed.is_ok() {
        let errs: Vec<String> = parsed.errors().map(ToString::to_string).collect();
        return Err(format!(
            "{} has errors (cclkit's tuner would not use it):\n  {}",
            path.display(),
            errs.join("\n  ")
        ));
    }
    for w in &parsed.diagnostics {
        eprintln!("cclkit tune: {w}");
    }
    Ok(parsed)
}

/// `ring/simple/2`, plus `@512K` when `chunk` is asked for.
pub fn short(d: &Decision, chunk: bool) -> String {
    let mut s = format!(
        "{}/{}/{}",
        names::algorithm_name(d.algo),
        names::protocol_name(d.proto),
        d.channels
    );
    if chunk {
        s.push('@');
        s.push_str(&format_size(d.chunk as u64));
    }
    s
}

/// Whether two decisions run the same way (who decided does not matter).
pub fn same(a: &Decision, b: &Decision) -> bool {
    (a.algo, a.proto, a.channels, a.chunk) == (b.algo, b.proto, b.channels, b.chunk)
}

/// A decision for JSON output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DecisionJson {
    /// Algorithm (NCCL's lower-case name).
    pub algo: &'static str,
    /// Protocol.
    pub proto: &'static str,
    /// Channels.
    pub channels: usize,
    /// Chunk bytes.
    pub chunk: usize,
    /// `model`, `tuner` or `fallback`.
    pub source: &'static str,
}

impl From<&Decision> for DecisionJson {
    fn from(d: &Decision) -> Self {
        Self {
            algo: names::algorithm_name(d.algo),
            proto: names::protocol_name(d.proto),
            channels: d.channels,
            chunk: d.chunk,
            source: match d.source {
                Source::Model => "model",
                Source::Tuner => "tuner",
                Source::Fallback => "fallback",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_told_apart_by_content_then_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("rules.conf.so");
        std::fs::write(&lib, b"\x7fELF\x02\x01\x01").unwrap();
        let text = dir.path().join("rules");
        std::fs::write(&text, "allreduce,0,-1,ring,ll,1,-1,-1\n").unwrap();
        let s = |p: &Path| p.display().to_string();
        assert_eq!(Spec::classify(&s(&lib)), Spec::Library(s(&lib)));
        assert_eq!(Spec::classify(&s(&text)), Spec::Rules(text.clone()));
        let missing = dir.path().join("gone.TOML");
        assert_eq!(Spec::classify(&s(&missing)), Spec::Rules(missing.clone()));
        assert_eq!(Spec::classify("cclkit"), Spec::Library("cclkit".into()));
        assert_eq!(
            Spec::classify("libnccl-tuner-x.so"),
            Spec::Library("libnccl-tuner-x.so".into())
        );
    }

    #[test]
    fn shapes_are_checked() {
        let a = |nranks, nnodes, channels| ShapeArgs {
            nranks,
            nnodes,
            channels,
            net_speed: 10_000,
            net_latency: 20.0,
        };
        assert!(Shape::from_args(&a(8, 1, 2)).is_ok());
        assert!(Shape::from_args(&a(2, 4, 2)).is_err());
        assert!(Shape::from_args(&a(0, 0, 2)).is_err());
        assert!(Shape::from_args(&a(8, 1, 0)).is_err());
        assert!(Shape::from_args(&a(8, 1, 33)).is_err());
        let nvl = Shape::from_args(&a(10, 3, 2)).unwrap().nvl();
        assert_eq!(
            (
                nvl.nNvlDomains,
                nvl.minRanksPerNvlDomain,
                nvl.maxRanksPerNvlDomain
            ),
            (3, 3, 4)
        );
    }
}
