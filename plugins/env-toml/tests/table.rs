//! The plugin through its exported `ncclEnvPlugin_v1` / `_v2` tables, as NCCL calls
//! them: in-process through the statics, and from the built cdylib with dlopen.

mod common;

use std::ffi::{CStr, CString, c_char};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::env::{ncclEnv_v1_t, ncclEnv_v2_t};
use cclkit_env_toml::file::MAX_FILE_BYTES;
use cclkit_env_toml::{ENV_FILE_VAR, ncclEnvPlugin_v1, ncclEnvPlugin_v2};
use common::{Rng, random_value, temp_path};

/// The plugin and the process environment are process-wide: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn set_var(name: &str, value: impl AsRef<std::ffi::OsStr>) {
    // SAFETY: every test of this binary that touches the environment holds SERIAL,
    // and the plugin reads it only from inside those tests.
    unsafe { std::env::set_var(name, value) };
}

fn remove_var(name: &str) {
    // SAFETY: as in `set_var`.
    unsafe { std::env::remove_var(name) };
}

/// The two tables as one interface (they share everything but `init`).
#[derive(Clone, Copy)]
enum Table {
    V1(&'static ncclEnv_v1_t),
    V2(&'static ncclEnv_v2_t),
}

impl Table {
    fn init(self) -> NcclResult {
        // SAFETY: NCCL's arguments: version numbers and a NUL-terminated suffix.
        unsafe {
            match self {
                Table::V1(t) => (t.init.expect("init"))(2, 28, 7, c"".as_ptr()),
                Table::V2(t) => (t.init.expect("init"))(2, 30, 7, c"+cuda13.0".as_ptr(), None),
            }
        }
    }

    fn get_ptr(self, name: &str) -> *const c_char {
        let f = match self {
            Table::V1(t) => t.getEnv,
            Table::V2(t) => t.getEnv,
        };
        let name = CString::new(name).expect("name");
        // SAFETY: a NUL-terminated name.
        unsafe { (f.expect("getEnv"))(name.as_ptr()) }
    }

    fn get(self, name: &str) -> Option<String> {
        let p = self.get_ptr(name);
        if p.is_null() {
            return None;
        }
        // SAFETY: non-NULL results are NUL-terminated and live until finalize.
        let value = unsafe { CStr::from_ptr(p) };
        Some(value.to_str().expect("UTF-8").to_owned())
    }

    fn finalize(self) -> NcclResult {
        let f = match self {
            Table::V1(t) => t.finalize,
            Table::V2(t) => t.finalize,
        };
        // SAFETY: no arguments.
        unsafe { (f.expect("finalize"))() }
    }
}

fn tables() -> [Table; 2] {
    [Table::V1(&ncclEnvPlugin_v1), Table::V2(&ncclEnvPlugin_v2)]
}

struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, contents: &[u8]) -> Self {
        let path = temp_path(tag);
        std::fs::write(&path, contents).expect("write env file");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn every_version_serves_random_files_with_the_precedence_rule() {
    let _s = serial();
    let mut rng = Rng::new();
    for table in tables() {
        let mut text = String::from("[env]\n");
        let mut defaults = Vec::new();
        for i in 0..1 + rng.below(20) {
            let (toml, value) = random_value(&mut rng);
            let name = format!("NCCL_CCLKIT_TEST_E{i}");
            text.push_str(&format!("{name} = {toml}\n"));
            defaults.push((name, value));
        }
        text.push_str("[pinned]\n");
        let mut pins = Vec::new();
        for i in 0..1 + rng.below(20) {
            let (toml, value) = random_value(&mut rng);
            let name = format!("NCCL_CCLKIT_TEST_P{i}");
            text.push_str(&format!("{name} = {toml}\n"));
            pins.push((name, value));
        }
        let file = TempFile::new("serve", text.as_bytes());
        set_var(ENV_FILE_VAR, &file.0);
        // Half of each kind is also set in the process environment.
        let overridden: Vec<bool> = (0..defaults.len() + pins.len())
            .map(|_| rng.below(2) == 1)
            .collect();
        let all = defaults.iter().chain(&pins);
        for ((name, _), set) in all.clone().zip(&overridden) {
            if *set {
                set_var(name, format!("process-{name}"));
            } else {
                remove_var(name);
            }
        }
        assert_eq!(table.init(), NcclResult::SUCCESS, "{text}");
        for (i, (name, value)) in defaults.iter().enumerate() {
            let want = if overridden[i] {
                format!("process-{name}")
            } else {
                value.clone()
            };
            assert_eq!(table.get(name), Some(want), "[env] {name}");
        }
        for (name, value) in &pins {
            assert_eq!(table.get(name).as_ref(), Some(value), "[pinned] {name}");
        }
        remove_var("NCCL_CCLKIT_TEST_NEVER_SET");
        assert_eq!(table.get("NCCL_CCLKIT_TEST_NEVER_SET"), None);
        assert_eq!(
            table.get("PATH"),
            std::env::var("PATH").ok(),
            "pass-through"
        );
        assert_eq!(table.finalize(), NcclResult::SUCCESS);
        for (name, _) in all {
            remove_var(name);
        }
    }
    remove_var(ENV_FILE_VAR);
}

#[test]
fn values_stay_valid_when_the_process_environment_changes() {
    let _s = serial();
    remove_var(ENV_FILE_VAR);
    let name = "NCCL_CCLKIT_TEST_CHANGING";
    for table in tables() {
        assert_eq!(table.init(), NcclResult::SUCCESS);
        let mut seen = Vec::new();
        for round in 0..7 {
            set_var(name, format!("value-{round}-{}", "z".repeat(round * 13)));
            let p = table.get_ptr(name);
            assert!(!p.is_null());
            seen.push((p, format!("value-{round}-{}", "z".repeat(round * 13))));
            // Every string handed out earlier still holds what it held.
            for (old, text) in &seen {
                // SAFETY: the export layer keeps every returned string until finalize.
                assert_eq!(unsafe { CStr::from_ptr(*old) }.to_str(), Ok(text.as_str()));
            }
        }
        set_var(name, "value-3-".to_owned() + &"z".repeat(39));
        assert_eq!(
            table.get_ptr(name),
            seen[3].0,
            "a value seen before reuses its string"
        );
        assert_eq!(table.finalize(), NcclResult::SUCCESS);
    }
    remove_var(name);
}

#[test]
fn bad_files_fail_init_and_nothing_is_served() {
    let _s = serial();
    let big = TempFile::new("big", &vec![b'#'; MAX_FILE_BYTES as usize + 1]);
    let malformed = TempFile::new("malformed", b"[env]\nNCCL_A = 1\nNCCL_B = {x = 1}\n");
    let missing = temp_path("missing");
    for table in tables() {
        for path in [big.0.as_path(), malformed.0.as_path(), missing.as_path()] {
            set_var(ENV_FILE_VAR, path);
            assert_eq!(
                table.init(),
                NcclResult::INVALID_USAGE,
                "{}",
                path.display()
            );
            // NCCL still calls getEnv after a failed init: everything reads as unset.
            set_var("NCCL_CCLKIT_TEST_X", "x");
            assert_eq!(table.get("NCCL_CCLKIT_TEST_X"), None);
            assert_eq!(table.finalize(), NcclResult::INVALID_USAGE);
        }
    }
    // An empty or unset variable means "no file": the process environment passes through.
    for unset in [Some(""), None] {
        match unset {
            Some(v) => set_var(ENV_FILE_VAR, v),
            None => remove_var(ENV_FILE_VAR),
        }
        let table = Table::V2(&ncclEnvPlugin_v2);
        assert_eq!(table.init(), NcclResult::SUCCESS);
        assert_eq!(table.get("NCCL_CCLKIT_TEST_X").as_deref(), Some("x"));
        assert_eq!(table.finalize(), NcclResult::SUCCESS);
    }
    remove_var("NCCL_CCLKIT_TEST_X");
}

/// The cdylib cargo built next to this test binary (target/<profile>/deps).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    [deps, deps.parent().unwrap_or(deps)]
        .iter()
        .map(|d| d.join("libcclkit_env_toml.so"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("libcclkit_env_toml.so not found next to {}", exe.display()))
}

#[test]
fn the_built_cdylib_exports_both_tables() {
    let _s = serial();
    let path = cdylib();
    let file = TempFile::new(
        "dlopen",
        b"[pinned]\nNCCL_CCLKIT_TEST_PIN = \"from-file\"\n",
    );
    set_var(ENV_FILE_VAR, &file.0);
    set_var("NCCL_CCLKIT_TEST_PIN", "from-process");
    // SAFETY: loading our own plugin, whose initialisers are plain Rust statics.
    let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen the cdylib");
    // SAFETY: the symbols are the `#[no_mangle]` statics of these types.
    let (v1, v2) = unsafe {
        let v1 = lib
            .get::<*const ncclEnv_v1_t>(b"ncclEnvPlugin_v1\0")
            .expect("v1");
        let v2 = lib
            .get::<*const ncclEnv_v2_t>(b"ncclEnvPlugin_v2\0")
            .expect("v2");
        (&**v1, &**v2)
    };
    // SAFETY: `name` is the plugin's static NUL-terminated name.
    assert_eq!(unsafe { CStr::from_ptr(v2.name) }, c"cclkit-env-toml");
    // The cdylib has its own state, separate from the statics of this binary.
    for table in [Table::V2(v2), Table::V1(v1)] {
        assert_eq!(table.init(), NcclResult::SUCCESS);
        assert_eq!(
            table.get("NCCL_CCLKIT_TEST_PIN").as_deref(),
            Some("from-file")
        );
        assert_eq!(table.finalize(), NcclResult::SUCCESS);
    }
    drop(lib);
    remove_var("NCCL_CCLKIT_TEST_PIN");
    remove_var(ENV_FILE_VAR);
}
