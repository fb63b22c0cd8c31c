//! Test helpers: loader configurations and captured logs; C plugins built at test
//! time and packaged Rust plugins come from `cclkit_tests`.
// Each test binary uses its own subset of these helpers and re-exports.
#![allow(dead_code, unused_imports)]

use std::sync::{Arc, Mutex};

use cclkit_host::LoaderConfig;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

pub use cclkit_tests::cplugin::{Plugins, counter, fixture, s, tuner_value};
pub use cclkit_tests::plugin as rust_plugin;

/// Installs cclkit's socket plugin as the built-in fallback transport, as the runtime
/// does; returns it.
pub fn builtin() -> cclkit_host::net::NetPlugin {
    cclkit_host::net::NetPlugin::install_builtin(&cclkit_net_socket::ncclNetPlugin_v12);
    cclkit_host::net::NetPlugin::builtin().expect("installed")
}

/// A loader configuration with only the given settings (the built-in transport
/// installed, so registries made from it end with it).
pub fn config(net: Option<&str>, tuner: Option<&str>) -> LoaderConfig {
    builtin();
    LoaderConfig {
        net_plugin: net.map(str::to_owned),
        tuner_plugin: tuner.map(str::to_owned),
        ..LoaderConfig::default()
    }
}

/// Log lines captured from `tracing`.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<(Level, String)>>>);

impl Logs {
    pub fn warnings(&self) -> Vec<String> {
        self.at(Level::WARN)
    }

    pub fn at(&self, level: Level) -> Vec<String> {
        self.0
            .lock()
            .expect("logs")
            .iter()
            .filter(|(l, _)| *l == level)
            .map(|(_, m)| m.clone())
            .collect()
    }
}

struct Capture(Logs);

struct Msg(String);

impl Visit for Msg {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut m = Msg(String::new());
        event.record(&mut m);
        self.0
            .0
            .lock()
            .expect("logs")
            .push((*event.metadata().level(), m.0));
    }
}

/// Runs `f` with every `tracing` event of this thread captured.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, Logs) {
    let logs = Logs::default();
    let sub = tracing_subscriber::registry().with(Capture(logs.clone()));
    let r = tracing::subscriber::with_default(sub, f);
    (r, logs)
}
