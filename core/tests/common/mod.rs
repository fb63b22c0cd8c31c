//! Test helpers: build C plugins at test time, read their counters, capture logs,
//! find the packaged Rust plugins.
#![allow(dead_code)]

use std::ffi::{CString, c_char, c_long};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use cclkit::plugin::LoaderConfig;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The C fixture sources.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A temporary directory of plugins built for one test.
pub struct Plugins {
    pub dir: tempfile::TempDir,
}

impl Plugins {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `cc -shared` of `sources` into `name` with extra arguments.
    pub fn cc(&self, name: &str, sources: &[PathBuf], args: &[String]) -> PathBuf {
        let out = self.path(name);
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let status = Command::new(&cc)
            .args([
                "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o",
            ])
            .arg(&out)
            .args(sources)
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("cannot run the C compiler '{cc}': {e}"));
        assert!(status.success(), "compiling {name} failed: {status}");
        out
    }

    /// The mock net plugin (fixtures/net_mock.c) for one version, with `-D` defines.
    pub fn net(&self, name: &str, version: u32, defines: &[&str]) -> PathBuf {
        let mut args = vec![format!("-DNET_VERSION={version}")];
        args.extend(defines.iter().map(|d| format!("-D{d}")));
        self.cc(name, &[fixture("net_mock.c")], &args)
    }

    /// The mock tuner (fixtures/tuner_mock.c) for one version.
    pub fn tuner(&self, name: &str, version: u32, defines: &[&str]) -> PathBuf {
        let mut args = vec![format!("-DTUNER_VERSION={version}")];
        args.extend(defines.iter().map(|d| format!("-D{d}")));
        self.cc(name, &[fixture("tuner_mock.c")], &args)
    }

    /// One library exporting a mock net plugin and a mock tuner.
    pub fn net_and_tuner(&self, name: &str, net: u32, tuner: u32) -> PathBuf {
        self.cc(
            name,
            &[fixture("net_mock.c"), fixture("tuner_mock.c")],
            &[
                format!("-DNET_VERSION={net}"),
                format!("-DTUNER_VERSION={tuner}"),
            ],
        )
    }

    /// A library from inline C source.
    pub fn c_source(&self, name: &str, source: &str, args: &[String]) -> PathBuf {
        let src = self.path(&format!("{name}.c"));
        std::fs::write(&src, source).expect("write source");
        self.cc(name, &[src], args)
    }
}

/// Calls `fn_name(what)` in the already loaded library at `path` (never loads it).
fn call<T>(path: &Path, fn_name: &str, what: &str) -> T {
    use libloading::os::unix::{Library, RTLD_NOW};
    // SAFETY: RTLD_NOLOAD only returns an existing handle (no initialisers run).
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | libc::RTLD_NOLOAD) }
        .unwrap_or_else(|e| panic!("{} is not loaded: {e}", path.display()));
    let name = CString::new(what).expect("name");
    // SAFETY: the fixtures define these functions with exactly this signature.
    unsafe {
        let f = lib
            .get::<unsafe extern "C" fn(*const c_char) -> T>(fn_name.as_bytes())
            .expect("counter function");
        f(name.as_ptr())
    }
}

/// A counter of the mock net plugin at `path` (which must be loaded).
pub fn counter(path: &Path, what: &str) -> c_long {
    call::<c_long>(path, "mock_counter", what)
}

/// A value recorded by the mock tuner at `path` (which must be loaded).
pub fn tuner_value(path: &Path, what: &str) -> f64 {
    call::<f64>(path, "tuner_mock_value", what)
}

/// A loader configuration with only the given settings.
pub fn config(net: Option<&str>, tuner: Option<&str>) -> LoaderConfig {
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

/// A packaged Rust plugin (`make package` installs them into `<workspace>/build/lib`;
/// `CCLKIT_LIB_DIR` overrides the directory).
pub fn rust_plugin(name: &str) -> PathBuf {
    let dir = std::env::var_os("CCLKIT_LIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../build/lib"));
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run `make package` at the workspace root (it installs every \
         plugin into build/lib), or point CCLKIT_LIB_DIR at a directory holding {name}",
        p.display()
    );
    p
}

/// The path as the string a setting takes.
pub fn s(p: &Path) -> String {
    p.display().to_string()
}
