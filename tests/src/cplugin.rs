//! C plugins built at test time from the fixtures in `tests/fixtures/` (mock net and
//! tuner plugins, broken plugins, NCCL-faithful plugins), against the committed ABI
//! header, warnings as errors. Shared by the tests of every crate.

use std::ffi::{CString, c_char, c_long};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A C fixture source, e.g. `fixture("net_mock.c")` or `fixture("broken/cnet.c")`.
pub fn fixture(name: &str) -> PathBuf {
    workspace().join("tests/fixtures").join(name)
}

/// The directory of the committed C header `cclkit_abi.h`.
pub fn abi_include() -> PathBuf {
    workspace().join("abi/include")
}

/// A temporary directory of plugins built for one test.
pub struct Plugins {
    /// Where the libraries are written; removed on drop.
    pub dir: tempfile::TempDir,
}

impl Default for Plugins {
    fn default() -> Self {
        Self::new()
    }
}

impl Plugins {
    /// A fresh temporary directory.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// `name` inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `cc -shared` of `sources` into `name` with extra arguments (warnings as errors).
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

    /// A fixture compiled against the ABI header (`-I abi/include`), with `-D` defines.
    pub fn with_header(&self, name: &str, source: &str, defines: &[&str]) -> PathBuf {
        let mut args = vec![
            format!("-I{}", abi_include().display()),
            "-std=gnu11".to_owned(),
        ];
        args.extend(defines.iter().map(|d| format!("-D{d}")));
        self.cc(name, &[fixture(source)], &args)
    }

    /// The mock net plugin (`net_mock.c`) for one version, with `-D` defines.
    pub fn net(&self, name: &str, version: u32, defines: &[&str]) -> PathBuf {
        let mut args = vec![format!("-DNET_VERSION={version}")];
        args.extend(defines.iter().map(|d| format!("-D{d}")));
        self.cc(name, &[fixture("net_mock.c")], &args)
    }

    /// The mock tuner (`tuner_mock.c`) for one version.
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

/// The path as the string a setting takes.
pub fn s(p: &Path) -> String {
    p.display().to_string()
}
