//! The `Tuner` implementation NCCL talks to: settings and rule file read at init,
//! decisions through the compiled [`Engine`], a usage report at finalize.

use std::ffi::CStr;
use std::fmt::Write as _;

use cclkit_abi::raw::common::{Algorithm, Protocol, subsys};
use cclkit_abi::tuner::{CollInfo, CostTable, Tuner, TunerInit};
use cclkit_abi::{Result, nccl_info, nccl_warn};

use crate::config::{self, RuleSet, Severity};
use crate::engine::{Engine, Mode};
use crate::env::{CONFIG_FILE_VAR, ConfigSource, Settings};
use crate::model::{LinkParams, Model};

/// Diagnostics logged per file before the rest are summarised in one line.
const MAX_LOGGED_DIAGNOSTICS: usize = 20;

/// One communicator's tuner.
pub struct CclkitTuner {
    label: String,
    engine: Engine,
}

/// The rule file as read for one communicator.
enum Rules {
    /// No file (or none found).
    Absent,
    /// Read without errors.
    Good(RuleSet, String),
    /// Unreadable or with errors: the communicator falls back to the model.
    Bad,
}

fn read_rules(source: &ConfigSource, label: &str) -> Rules {
    let (path, explicit) = match source {
        ConfigSource::Explicit(p) => (p, true),
        ConfigSource::Default(p) => (p, false),
    };
    if !path.exists() {
        if explicit {
            nccl_warn!(
                "cclkit tuner ({label}): {CONFIG_FILE_VAR}={}: no such file; the model decides",
                path.display()
            );
            return Rules::Bad;
        }
        return Rules::Absent;
    }
    let parsed = match config::load(path) {
        Ok(p) => p,
        Err(e) => {
            nccl_warn!(
                "cclkit tuner ({label}): {}: cannot read: {e}; the model decides",
                path.display()
            );
            return Rules::Bad;
        }
    };
    for d in parsed.diagnostics.iter().take(MAX_LOGGED_DIAGNOSTICS) {
        nccl_warn!("cclkit tuner ({label}): {d}");
    }
    if parsed.diagnostics.len() > MAX_LOGGED_DIAGNOSTICS {
        nccl_warn!(
            "cclkit tuner ({label}): {}: {} more problems not shown",
            path.display(),
            parsed.diagnostics.len() - MAX_LOGGED_DIAGNOSTICS
        );
    }
    let errors = parsed
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    if errors > 0 {
        nccl_warn!(
            "cclkit tuner ({label}): {}: {errors} bad line(s); the file is not used and the model decides",
            path.display()
        );
        return Rules::Bad;
    }
    Rules::Good(parsed.rules, path.display().to_string())
}

impl CclkitTuner {
    /// Builds the tuner of one communicator from explicit settings (what `init`
    /// does after reading the environment). Never fails: every problem with the
    /// settings or the rule file is logged and the model takes over.
    pub fn with_settings(settings: &Settings, args: &TunerInit<'_>) -> Self {
        let label = match args.comm_id {
            Some(id) => format!("comm {id:#018x}"),
            None => format!("{} ranks/{} nodes", args.n_ranks, args.n_nodes),
        };
        for w in &settings.warnings {
            nccl_warn!("cclkit tuner ({label}): {w}");
        }
        let (rules, file, mode) = match read_rules(&settings.config, &label) {
            Rules::Good(r, f) => (r, Some(f), settings.mode),
            Rules::Absent => {
                if settings.mode == Mode::Rules {
                    nccl_warn!(
                        "cclkit tuner ({label}): CCLKIT_TUNER_MODE=rules but no rule file; NCCL decides"
                    );
                }
                let mode = match settings.mode {
                    Mode::Auto => Mode::Model,
                    m => m,
                };
                (RuleSet::default(), None, mode)
            }
            Rules::Bad => (RuleSet::default(), None, Mode::Model),
        };
        let params = LinkParams::with(&rules.model.overridden_by(&settings.model));
        let constants = args.constants.as_ref().map(|c| c.to_nccl());
        let model = Model::new(args.n_ranks, args.n_nodes, &params, constants.as_ref());
        let engine = Engine::new(&rules, args.n_ranks, args.n_nodes, mode, Some(model));
        let from = file.map_or_else(String::new, |f| {
            format!(
                ", {} of {} rules from {f} apply",
                engine.rule_count(),
                rules.rules.len()
            )
        });
        nccl_info!(
            subsys::TUNING,
            "cclkit tuner ({label}): {} ranks on {} nodes, mode {mode}{from}; model: \
             intra {} GB/s ({}), net {} GB/s +{} us, {}, {} channels, {} constants",
            args.n_ranks,
            args.n_nodes,
            params.intra_bw,
            params.intra_link.name(),
            params.net_bw,
            params.net_lat,
            params.arch.name(),
            params.channels,
            if args.constants.is_some() {
                "NCCL's"
            } else {
                "default"
            },
        );
        Self { label, engine }
    }

    /// The decision engine (for tests and `cclkit tune`).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn report(&self) -> String {
        let mut s = String::new();
        let (model, unchanged) = self.engine.fallback_stats();
        let mut taken_total = 0;
        let mut listed = 0;
        for r in self.engine.rule_stats() {
            taken_total += r.taken;
            if r.matched > 0 && listed < MAX_LOGGED_DIAGNOSTICS {
                listed += 1;
                let _ = write!(
                    s,
                    "; line {}: {} matched, {} taken",
                    r.line, r.matched, r.taken
                );
                if r.taken < r.matched {
                    let _ = write!(s, " (entry unsupported {} times)", r.matched - r.taken);
                }
            }
        }
        format!(
            "{taken_total} calls decided by rules, {model} by the model, {unchanged} left to NCCL{s}"
        )
    }
}

impl Tuner for CclkitTuner {
    const NAME: &'static CStr = c"cclkit";
    const HAS_CHUNK_SIZE: bool = true;

    fn init(args: TunerInit<'_>) -> Result<Self> {
        Ok(Self::with_settings(&Settings::from_env(), &args))
    }

    fn get_coll_info(
        &self,
        info: &CollInfo,
        table: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Result<()> {
        self.engine.decide(info, table, n_channels);
        Ok(())
    }

    fn get_chunk_size(
        &self,
        info: &CollInfo,
        algo: Algorithm,
        proto: Protocol,
        _n_channels: i32,
        chunk_size: &mut usize,
    ) -> Result<()> {
        if let Some((c, _)) = self.engine.chunk_size(info.func, info.n_bytes, algo, proto) {
            *chunk_size = usize::try_from(c).unwrap_or(usize::MAX);
        }
        Ok(())
    }

    fn finalize(self) -> Result<()> {
        nccl_info!(
            subsys::TUNING,
            "cclkit tuner ({}): {}",
            self.label,
            self.report()
        );
        Ok(())
    }
}
