//! Tuner plugin selection (NCCL 2.30 `src/plugin/tuner.cc`, NCCL_ABI.md §3.3).

use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::{Attempt, Chosen, Origin, Outcome, SelectError, report};
use crate::config::{LoaderConfig, PluginKind};
use crate::error::{Cause, LoadError, OpenAttempt, OpenOutcome};
use crate::library::Library;
use crate::open::{entry_label, open_entry};
use crate::resolve::{self, Rule};
use crate::tuner::{NvlDomainInfo, TunerConstants, TunerContext, TunerPlugin, TunerShared};

/// Label of the built-in cost model in reports.
pub const BUILTIN_MODEL: &str = "built-in cost model";

/// The tuner of a process (or of one `doctor` run): loaded once, shared by
/// communicators, closed with the last one, reloaded by the next.
pub struct TunerRegistry {
    config: LoaderConfig,
    state: Mutex<State>,
}

enum State {
    Ready,
    Loaded {
        plugin: Weak<TunerShared>,
        label: String,
        opens: Vec<OpenAttempt>,
        rule: Rule,
    },
    /// Loading failed: sticky for the process (tuner.cc `tunerPluginLoadFailed`).
    Failed {
        error: LoadError,
        /// False when only the defaults were absent (not a fallback).
        failure: bool,
    },
}

/// A usable tuner with its label, `dlopen` attempts and rule.
type Found = (TunerPlugin, String, Vec<OpenAttempt>, Rule);

/// The outcome of a tuner walk for one communicator.
pub struct TunerSelection {
    /// The plugin's context, or `None` for the built-in cost model.
    pub tuner: Option<TunerContext>,
    /// Every step, ending with the chosen tuner or the built-in model.
    pub attempts: Vec<Attempt>,
    /// True when a tuner that was asked for could not be used.
    pub fell_back: bool,
}

/// Per-communicator facts a tuner's `init` receives.
#[derive(Debug, Clone, Copy)]
pub struct TunerArgs {
    /// Ranks in the communicator.
    pub n_ranks: usize,
    /// Nodes in the communicator.
    pub n_nodes: usize,
    /// Communicator id (hash).
    pub comm_id: u64,
    /// NVLink-domain layout.
    pub nvl: NvlDomainInfo,
}

impl TunerRegistry {
    /// A registry following `config`.
    pub fn new(config: LoaderConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State::Ready),
        }
    }

    /// The process-wide registry, configured from the environment on first use.
    pub fn global() -> &'static TunerRegistry {
        static GLOBAL: OnceLock<TunerRegistry> = OnceLock::new();
        GLOBAL.get_or_init(|| TunerRegistry::new(LoaderConfig::from_env()))
    }

    /// Finds the tuner for one communicator and initialises it. `net_library` is the
    /// library NCCL searches when no tuner library opens: take it from
    /// [`NetRegistry::tuner_library`](super::NetRegistry::tuner_library) after the net
    /// walk, which (like NCCL) returns the external net library opened last even when
    /// its net part was rejected and the communicator uses another transport.
    /// A tuner whose `init` fails leaves this communicator on the built-in model
    /// (NCCL would fail the communicator; cclkit falls back loudly instead).
    pub fn select(
        &self,
        net_library: Option<&Library>,
        args: TunerArgs,
        constants: &mut TunerConstants,
    ) -> Result<TunerSelection, SelectError> {
        let mut attempts = Vec::new();
        let found = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            self.find(&mut state, net_library, &mut attempts)
        };
        let strict = |attempts: Vec<Attempt>| SelectError::Strict {
            kind: PluginKind::Tuner,
            attempts,
        };
        if attempts.iter().any(Attempt::is_failure) && self.config.strict {
            return Err(strict(attempts));
        }
        let Some((plugin, label, opens, rule)) = found else {
            return Ok(builtin(attempts));
        };
        let path = plugin
            .library()
            .and_then(|l| l.path())
            .map(|p| p.display().to_string());
        match plugin.init(
            args.n_ranks,
            args.n_nodes,
            args.comm_id,
            args.nvl,
            constants,
        ) {
            Ok(ctx) => {
                attempts.push(Attempt {
                    label,
                    builtin: false,
                    outcome: Outcome::Selected(Chosen {
                        name: plugin.name().to_owned(),
                        version: plugin.version(),
                        symbol: plugin.symbol().to_owned(),
                        path,
                        rule,
                        opens,
                    }),
                });
                let fell_back = attempts.iter().any(Attempt::is_failure);
                Ok(TunerSelection {
                    tuner: Some(ctx),
                    attempts,
                    fell_back,
                })
            }
            Err(e) => {
                let err = Origin {
                    kind: PluginKind::Tuner,
                    entry: &label,
                    opens: &opens,
                    path,
                    rule: Some(rule),
                    at: Some((plugin.symbol().to_owned(), plugin.version())),
                    name: Some(plugin.name().to_owned()),
                }
                .error(Cause::Call(Box::new(e)));
                report(PluginKind::Tuner, &err, BUILTIN_MODEL);
                attempts.push(Attempt {
                    label,
                    builtin: false,
                    outcome: Outcome::Failed(err),
                });
                if self.config.strict {
                    return Err(strict(attempts));
                }
                Ok(builtin(attempts))
            }
        }
    }

    /// The loaded tuner, loading it if needed; records every step in `attempts`.
    fn find(
        &self,
        state: &mut State,
        net: Option<&Library>,
        attempts: &mut Vec<Attempt>,
    ) -> Option<Found> {
        let value = self.config.tuner_plugin.as_deref();
        let label = entry_label(PluginKind::Tuner, self.config.flavor, value);
        if value.is_some_and(resolve::is_none) {
            let cause = Cause::SetToNone {
                var: PluginKind::Tuner.env_var().to_owned(),
            };
            attempts.push(skipped(
                &label,
                LoadError::new(PluginKind::Tuner, &label, cause),
            ));
            return None;
        }
        match state {
            State::Loaded {
                plugin,
                label,
                opens,
                rule,
            } => {
                if let Some(shared) = plugin.upgrade() {
                    return Some((TunerPlugin { shared }, label.clone(), opens.clone(), *rule));
                }
            }
            State::Failed { error, failure } => {
                let cause = Cause::FailedEarlier {
                    reason: error.reason(),
                };
                let e = LoadError::new(PluginKind::Tuner, &error.entry, cause);
                attempts.push(if *failure {
                    failed(&label, e)
                } else {
                    skipped(&label, e)
                });
                return None;
            }
            State::Ready => {}
        }
        match self.load(value, &label, net, attempts) {
            Some((plugin, label, opens, rule)) => {
                *state = State::Loaded {
                    plugin: Arc::downgrade(&plugin.shared),
                    label: label.clone(),
                    opens: opens.clone(),
                    rule,
                };
                Some((plugin, label, opens, rule))
            }
            None => {
                // The sticky reason: what failed, not the empty net-library step.
                let reason = attempts
                    .iter()
                    .rev()
                    .find(|a| match &a.outcome {
                        Outcome::Failed(e) | Outcome::Skipped(e) => {
                            !matches!(e.cause, Cause::NoNetLibrary)
                        }
                        Outcome::Selected(_) => false,
                    })
                    .or(attempts.last());
                if let Some(Outcome::Failed(e) | Outcome::Skipped(e)) = reason.map(|a| &a.outcome) {
                    *state = State::Failed {
                        error: e.clone(),
                        failure: attempts.iter().any(Attempt::is_failure),
                    };
                }
                None
            }
        }
    }

    /// tuner.cc: open `NCCL_TUNER_PLUGIN` (or `libnccl-tuner.so`); if nothing opens,
    /// look in the net plugin's library; then find `ncclTunerPlugin_v6` … `_v1`.
    fn load(
        &self,
        value: Option<&str>,
        label: &str,
        net: Option<&Library>,
        attempts: &mut Vec<Attempt>,
    ) -> Option<Found> {
        let next = BUILTIN_MODEL;
        let (library, opens, rule, label) =
            match open_entry(PluginKind::Tuner, self.config.flavor, value) {
                Ok(o) => (o.library, o.opens, o.rule, label.to_owned()),
                Err(e) => {
                    let in_net = net.cloned();
                    let next_label = match &in_net {
                        Some(l) => format!("the net plugin library {}", l.display_name()),
                        None => next.to_owned(),
                    };
                    report(PluginKind::Tuner, &e, &next_label);
                    attempts.push(if e.is_default_absent() {
                        skipped(label, e)
                    } else {
                        failed(label, e)
                    });
                    let Some(library) = in_net else {
                        // The step NCCL takes next, shown even when there is nothing
                        // to search (doctor lists it).
                        let label = "tuner in net plugin library";
                        let e = LoadError::new(PluginKind::Tuner, label, Cause::NoNetLibrary);
                        attempts.push(skipped(label, e));
                        return None;
                    };
                    let opens = vec![OpenAttempt {
                        name: library.requested().map(str::to_owned),
                        rule: Rule::NetLibrary,
                        outcome: OpenOutcome::Loaded {
                            path: library.path().map(|p| p.display().to_string()),
                        },
                    }];
                    let label = format!("tuner in net library {}", library.display_name());
                    (library, opens, Rule::NetLibrary, label)
                }
            };
        let path = library.path().map(|p| p.display().to_string());
        match TunerPlugin::load(library) {
            Ok(p) => {
                tracing::info!(
                    subsys = cclkit_abi::raw::common::subsys::TUNING
                        | cclkit_abi::raw::common::subsys::INIT,
                    "TUNER/Plugin: loaded '{}' ({}) from {}",
                    p.name(),
                    p.symbol(),
                    path.as_deref().unwrap_or("the main program")
                );
                Some((p, label, opens, rule))
            }
            Err((cause, at)) => {
                // A net library without tuner symbols is the ordinary case, not a failure.
                let ordinary = rule == Rule::NetLibrary && matches!(cause, Cause::NoSymbol { .. });
                let e = Origin {
                    kind: PluginKind::Tuner,
                    entry: &label,
                    opens: &opens,
                    path,
                    rule: Some(rule),
                    at,
                    name: None,
                }
                .error(cause);
                if ordinary {
                    tracing::info!(
                        subsys = cclkit_abi::raw::common::subsys::TUNING,
                        "{e}; using {next}"
                    );
                    attempts.push(skipped(&label, e));
                } else {
                    report(PluginKind::Tuner, &e, next);
                    attempts.push(failed(&label, e));
                }
                None
            }
        }
    }
}

fn skipped(label: &str, e: LoadError) -> Attempt {
    Attempt {
        label: label.to_owned(),
        builtin: false,
        outcome: Outcome::Skipped(e),
    }
}

fn failed(label: &str, e: LoadError) -> Attempt {
    Attempt {
        label: label.to_owned(),
        builtin: false,
        outcome: Outcome::Failed(e),
    }
}

/// The built-in cost model as the final attempt.
fn builtin(mut attempts: Vec<Attempt>) -> TunerSelection {
    attempts.push(Attempt {
        label: BUILTIN_MODEL.to_owned(),
        builtin: true,
        outcome: Outcome::Selected(Chosen {
            name: BUILTIN_MODEL.to_owned(),
            version: 0,
            symbol: String::new(),
            path: None,
            rule: Rule::Builtin,
            opens: Vec::new(),
        }),
    });
    let fell_back = attempts.iter().any(Attempt::is_failure);
    if fell_back {
        tracing::warn!(
            subsys = cclkit_abi::raw::common::subsys::TUNING,
            "TUNER: using the {BUILTIN_MODEL} because the requested tuner could not be used \
             (see the warnings above)"
        );
    }
    TunerSelection {
        tuner: None,
        attempts,
        fell_back,
    }
}
