//! Net plugin selection (NCCL 2.30 `src/plugin/net.cc`, NCCL_ABI.md §3.2).

use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::{Attempt, Chosen, Origin, Outcome, SelectError, report};
use crate::config::{LoaderConfig, PluginKind};
use crate::error::{Cause, LoadError, OpenAttempt};
use crate::library::{Library, WeakLibrary};
use crate::net::{CommConfig, NetContext, NetPlugin, NetShared};
use crate::open::{entry_label, open_entry};
use crate::resolve::{self, Rule};
use cclkit_abi::raw::net::{NCCL_NET_DEVICE_UNPACK_VERSION, NetDeviceType};

/// The net plugins of a process (or of one `doctor` run), in NCCL's order.
pub struct NetRegistry {
    config: LoaderConfig,
    slots: Mutex<Vec<Slot>>,
    ignored: Vec<String>,
    /// The external net library opened last: where the tuner lookup searches.
    net_library: Mutex<Option<NetLib>>,
}

/// NCCL's record of the net plugin library it opened last (plugin_open.cc
/// `libNames[NET]`), which `ncclGetNetPluginLib` reopens for the tuner lookup. It is
/// set when a library opens, whether or not its net part turns out usable, and
/// cleared when that library is closed.
enum NetLib {
    /// NCCL keeps it open for the rest of the process: its net part failed after
    /// loading (`init`, `devices()`) or did not match `NCCL_NET`.
    Held(Library),
    /// Loaded for communicators: closed with the last of them (unless pinned).
    Live(WeakLibrary),
}

struct Slot {
    /// The setting entry (`None` = unset default, or the built-in).
    entry: Option<String>,
    label: String,
    state: State,
    /// Known after the first successful init since (re)load: `devices()` is only
    /// called then (net.cc `ncclNetPluginInit`).
    ndev: Option<usize>,
}

enum State {
    /// Not loaded (or unloaded after its last communicator).
    Ready,
    /// Loaded and shared by the live contexts.
    Loaded {
        plugin: Weak<NetShared>,
        /// Holds the library open when `NCCL_NET_PLUGIN_REF_COUNT` pins it.
        _pinned: Option<NetPlugin>,
        opens: Vec<OpenAttempt>,
        rule: Rule,
    },
    /// The built-in transport: always available.
    Builtin(NetPlugin),
    /// Load or init failed: never retried in this process.
    Failed(LoadError),
    /// Another external plugin was selected: never used in this process.
    Disabled { winner: String },
}

/// A usable plugin with the `dlopen` attempts and rule that produced it.
type Loaded = (NetPlugin, Vec<OpenAttempt>, Rule);

/// The outcome of a successful walk.
pub struct NetSelection {
    /// The chosen plugin, initialised for the communicator.
    pub context: NetContext,
    /// Every plugin considered, in order, ending with the chosen one.
    pub attempts: Vec<Attempt>,
    /// Number of devices of the chosen plugin (from its first init since load).
    pub devices: usize,
    /// True when an earlier plugin failed (the result is a fallback).
    pub fell_back: bool,
    /// Setting entries NCCL ignores (too many, too long).
    pub ignored: Vec<String>,
}

impl NetRegistry {
    /// The registry for `config`: its external entries, then the built-in transport
    /// if one was installed ([`NetPlugin::install_builtin`]).
    pub fn new(config: LoaderConfig) -> Self {
        let entries = resolve::net_entries(config.net_plugin.as_deref());
        let mut slots: Vec<Slot> = entries
            .entries
            .into_iter()
            .map(|e| Slot {
                label: entry_label(PluginKind::Net, config.flavor, e.value.as_deref()),
                entry: e.value,
                state: State::Ready,
                ndev: None,
            })
            .collect();
        if let Some(builtin) = NetPlugin::builtin() {
            slots.push(Slot {
                entry: None,
                label: format!("built-in {}", builtin.name()),
                state: State::Builtin(builtin),
                ndev: None,
            });
        }
        Self {
            config,
            slots: Mutex::new(slots),
            ignored: entries.ignored,
            net_library: Mutex::new(None),
        }
    }

    /// The net plugin library NCCL's tuner lookup would search when no tuner library
    /// opens (tuner.cc → plugin_open.cc `ncclGetNetPluginLib`): the external net
    /// library opened last and still open, *including one whose net part was rejected*
    /// (0 devices, failed `init`), which NCCL never closes. `None` when no external net
    /// library was opened, or the one opened last was closed (no usable symbol, or
    /// unloaded after its last communicator).
    pub fn tuner_library(&self) -> Option<Library> {
        match &*self.net_library.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(NetLib::Held(l)) => Some(l.clone()),
            Some(NetLib::Live(w)) => w.upgrade(),
            None => None,
        }
    }

    /// Keeps `plugin`'s library open for the process, as NCCL does with a library whose
    /// net part it passed over, if it is still the one opened last.
    fn hold(&self, plugin: &NetPlugin) {
        let Some(lib) = plugin.library() else { return };
        let mut last = self.net_library.lock().unwrap_or_else(|p| p.into_inner());
        let same = match &*last {
            Some(NetLib::Live(w)) => w.upgrade().is_some_and(|l| Library::ptr_eq(&l, lib)),
            Some(NetLib::Held(l)) => Library::ptr_eq(l, lib),
            None => false,
        };
        if same {
            *last = Some(NetLib::Held(lib.clone()));
        }
    }

    /// The process-wide registry, configured from the environment on first use.
    pub fn global() -> &'static NetRegistry {
        static GLOBAL: OnceLock<NetRegistry> = OnceLock::new();
        GLOBAL.get_or_init(|| NetRegistry::new(LoaderConfig::from_env()))
    }

    /// The configuration this registry follows.
    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    /// Picks and initialises a net plugin for one communicator, as NCCL does: load
    /// (once), `init`, `devices() > 0` on the first init, device type of dev 0; the
    /// first plugin passing every step wins and disables the other external plugins.
    pub fn select(&self, comm_id: u64, config: CommConfig) -> Result<NetSelection, SelectError> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut attempts = Vec::new();
        let n = slots.len();
        for i in 0..n {
            let next = slots.get(i + 1).map_or_else(
                || "nothing (no NET plugin left)".to_owned(),
                |s| format!("'{}'", s.label),
            );
            let slot = &mut slots[i];
            let builtin = matches!(slot.state, State::Builtin(_));
            let label = slot.label.clone();
            let mut push = |outcome: Outcome| {
                attempts.push(Attempt {
                    label: label.clone(),
                    builtin,
                    outcome,
                })
            };
            let (plugin, opens, rule) = match self.loaded(slot) {
                Ok(Some(loaded)) => loaded,
                Ok(None) => {
                    // Failed earlier or disabled: recorded by `loaded`.
                    push(Outcome::Skipped(self.sticky_reason(slot)));
                    continue;
                }
                Err(e) => {
                    report(PluginKind::Net, &e, &next);
                    let failure = !e.is_default_absent();
                    push(if failure {
                        Outcome::Failed(e.clone())
                    } else {
                        Outcome::Skipped(e.clone())
                    });
                    slot.state = State::Failed(e);
                    if failure && self.config.strict {
                        return Err(SelectError::Strict {
                            kind: PluginKind::Net,
                            attempts,
                        });
                    }
                    continue;
                }
            };
            let path = plugin
                .library()
                .and_then(|l| l.path())
                .map(|p| p.display().to_string());
            let at = Some((plugin.symbol().to_owned(), plugin.version()));
            let err = |cause| {
                Origin {
                    kind: PluginKind::Net,
                    entry: &label,
                    opens: &opens,
                    path: path.clone(),
                    rule: Some(rule),
                    at: at.clone(),
                    name: Some(plugin.name().to_owned()),
                }
                .error(cause)
            };
            if let Some(wanted) = &self.config.net_name
                && !name_matches(&plugin, wanted)
            {
                self.hold(&plugin);
                push(Outcome::Skipped(err(Cause::NameMismatch {
                    name: plugin.name().to_owned(),
                    wanted: wanted.clone(),
                })));
                continue;
            }
            let (ctx, ndev) = match init_and_check(&plugin, comm_id, config, slot.ndev) {
                Ok(ok) => ok,
                Err((cause, sticky)) => {
                    let e = err(cause);
                    report(PluginKind::Net, &e, &next);
                    push(Outcome::Failed(e.clone()));
                    if sticky && !builtin {
                        slot.state = State::Failed(e);
                        // net.cc `ncclNetPluginInit` marks it disabled but never closes
                        // the library: the tuner lookup may still find a tuner there.
                        self.hold(&plugin);
                    }
                    if self.config.strict {
                        return Err(SelectError::Strict {
                            kind: PluginKind::Net,
                            attempts,
                        });
                    }
                    continue;
                }
            };
            slot.ndev = Some(ndev);
            let chosen = Chosen {
                name: plugin.name().to_owned(),
                version: plugin.version(),
                symbol: plugin.symbol().to_owned(),
                path,
                rule,
                opens,
            };
            push(Outcome::Selected(chosen));
            if !builtin {
                self.disable_others(&mut slots, i, plugin.name());
            }
            let fell_back = attempts.iter().any(Attempt::is_failure);
            if fell_back {
                tracing::warn!(
                    subsys = cclkit_abi::raw::common::subsys::NET,
                    "NET: using '{}' after {} plugin(s) could not be used (see the warnings above)",
                    plugin.name(),
                    attempts.iter().filter(|a| a.is_failure()).count()
                );
            } else {
                tracing::info!(
                    subsys = cclkit_abi::raw::common::subsys::NET
                        | cclkit_abi::raw::common::subsys::INIT,
                    "NET: using '{}' (v{}) for comm {comm_id:#x}",
                    plugin.name(),
                    plugin.version()
                );
            }
            return Ok(NetSelection {
                context: ctx,
                attempts,
                devices: ndev,
                fell_back,
                ignored: self.ignored.clone(),
            });
        }
        tracing::warn!("Failed to initialize any NET plugin");
        Err(SelectError::NoNet { attempts })
    }

    /// The slot's plugin, loading it if needed: `Ok(None)` for a sticky failure or a
    /// disabled slot, `Err` when loading fails now.
    fn loaded(&self, slot: &mut Slot) -> Result<Option<Loaded>, LoadError> {
        match &slot.state {
            State::Builtin(p) => return Ok(Some((p.clone(), Vec::new(), Rule::Builtin))),
            State::Failed(_) | State::Disabled { .. } => return Ok(None),
            State::Loaded {
                plugin,
                opens,
                rule,
                ..
            } => {
                if let Some(shared) = plugin.upgrade() {
                    return Ok(Some((NetPlugin { shared }, opens.clone(), *rule)));
                }
                // Unloaded after its last communicator: load again (and re-check devices).
            }
            State::Ready => {}
        }
        slot.ndev = None;
        let flavor = self.config.flavor;
        let opened = open_entry(PluginKind::Net, flavor, slot.entry.as_deref())?;
        let path = opened.library.path().map(|p| p.display().to_string());
        *self.net_library.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(NetLib::Live(opened.library.downgrade()));
        match NetPlugin::load(opened.library) {
            Ok(plugin) => {
                tracing::info!(
                    subsys = cclkit_abi::raw::common::subsys::NET
                        | cclkit_abi::raw::common::subsys::INIT,
                    "NET/Plugin: loaded '{}' ({}) from {}",
                    plugin.name(),
                    plugin.symbol(),
                    path.as_deref().unwrap_or("the main program")
                );
                slot.state = State::Loaded {
                    plugin: Arc::downgrade(&plugin.shared),
                    _pinned: self.config.pin_net_plugins.then(|| plugin.clone()),
                    opens: opened.opens.clone(),
                    rule: opened.rule,
                };
                Ok(Some((plugin, opened.opens, opened.rule)))
            }
            Err((cause, at)) => {
                // net.cc `ncclNetPluginLoad` closes a library without a usable table,
                // which clears NCCL's record of it.
                *self.net_library.lock().unwrap_or_else(|p| p.into_inner()) = None;
                Err(Origin {
                    kind: PluginKind::Net,
                    entry: &slot.label,
                    opens: &opened.opens,
                    path,
                    rule: Some(opened.rule),
                    at,
                    name: None,
                }
                .error(cause))
            }
        }
    }

    fn sticky_reason(&self, slot: &Slot) -> LoadError {
        let cause = match &slot.state {
            State::Failed(e) => Cause::FailedEarlier { reason: e.reason() },
            State::Disabled { winner } => Cause::Disabled {
                winner: winner.clone(),
            },
            _ => Cause::NotLoaded,
        };
        LoadError::new(PluginKind::Net, &slot.label, cause)
    }

    /// net.cc `ncclNetPluginDisableOtherExternal`.
    fn disable_others(&self, slots: &mut [Slot], winner: usize, name: &str) {
        let externals = slots.len() - 1;
        for (j, s) in slots.iter_mut().enumerate().take(externals) {
            if j != winner && matches!(s.state, State::Ready | State::Loaded { .. }) {
                s.state = State::Disabled {
                    winner: name.to_owned(),
                };
            }
        }
    }
}

/// `NCCL_NET` matches the table name case-insensitively; cclkit's built-in socket
/// transport also answers to NCCL's name for its socket transport, "Socket".
fn name_matches(plugin: &NetPlugin, wanted: &str) -> bool {
    plugin.name().eq_ignore_ascii_case(wanted)
        || (plugin.is_builtin() && wanted.eq_ignore_ascii_case("Socket"))
}

/// `init`, `devices()` on the first init since load, then the device-type check on
/// device 0. The error says whether the failure is sticky (NCCL disables the plugin
/// for init/devices failures; a device-type mismatch is re-checked per communicator).
fn init_and_check(
    plugin: &NetPlugin,
    comm_id: u64,
    config: CommConfig,
    ndev: Option<usize>,
) -> Result<(NetContext, usize), (Cause, bool)> {
    let ctx = plugin
        .init(comm_id, config)
        .map_err(|e| (Cause::Call(Box::new(e)), true))?;
    let ndev = match ndev {
        Some(n) => n,
        None => match ctx.devices() {
            Ok(0) => return Err((Cause::NoDevices { ndev: 0 }, true)),
            Ok(n) => n,
            Err(e) => return Err((Cause::Call(Box::new(e)), true)),
        },
    };
    let props = ctx
        .properties(0)
        .map_err(|e| (Cause::Call(Box::new(e)), false))?;
    let ok = props.device_type == NetDeviceType::HOST
        || (props.device_type == NetDeviceType::UNPACK
            && props.device_version == NCCL_NET_DEVICE_UNPACK_VERSION);
    if !ok {
        return Err((
            Cause::DeviceType {
                device_type: props.device_type.0,
                device_version: props.device_version,
            },
            false,
        ));
    }
    Ok((ctx, ndev))
}
