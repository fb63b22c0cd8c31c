//! On a machine without RDMA (no `/dev/infiniband`, `ibv_get_device_list` → NULL with
//! ENOSYS, or no libibverbs at all) the plugin must load, and `init` must fail cleanly
//! with a message naming the cause, so NCCL (and cclkit's loader) fall back to another
//! transport. Checked two ways: through the exported tables in this process, and from
//! a C host that dlopens the built `.so` as NCCL does.
//!
//! The loader-side half (cclkit falls back to its socket transport) is tested in
//! `core`.

use std::ffi::{CStr, c_void};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use cclkit_abi::raw::common::NcclResult;

/// What this machine should make `init` say.
enum Expect {
    /// libibverbs.so.1 cannot be opened.
    NoLibrary,
    /// The library loads but the kernel has no uverbs (`ibv_get_device_list` → NULL).
    NoDevices,
    /// Real RDMA hardware: `init` succeeds when sysfs shows an active port.
    Hardware,
}

/// Active RDMA ports on this machine, counted from sysfs (`/sys/class/infiniband/
/// <dev>/ports/<n>/state` reads `4: ACTIVE`): a fact of the machine, not of the plugin.
fn active_ports() -> usize {
    let Ok(devs) = std::fs::read_dir("/sys/class/infiniband") else {
        return 0;
    };
    devs.flatten()
        .filter_map(|d| std::fs::read_dir(d.path().join("ports")).ok())
        .flat_map(|ports| ports.flatten())
        .filter(|p| {
            std::fs::read_to_string(p.path().join("state")).is_ok_and(|s| s.contains("ACTIVE"))
        })
        .count()
}

fn expectation() -> Expect {
    if cclkit_net_ib::verbs::loader::verbs().is_err() {
        Expect::NoLibrary
    } else if !Path::new("/dev/infiniband").exists() {
        Expect::NoDevices
    } else {
        Expect::Hardware
    }
}

fn assert_cause(msg: &str) {
    match expectation() {
        Expect::NoLibrary => assert!(msg.contains("cannot load libibverbs.so.1"), "{msg}"),
        Expect::NoDevices => {
            assert!(msg.contains("ibv_get_device_list returned NULL"), "{msg}");
            assert!(msg.contains("/dev/infiniband does not exist"), "{msg}");
        }
        Expect::Hardware => {}
    }
}

/// Captures `tracing` messages: without an NCCL logger the plugin logs there.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Msg(String);
        impl tracing::field::Visit for Msg {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    let _ = write!(self.0, "{v:?}");
                }
            }
        }
        let mut m = Msg(String::new());
        event.record(&mut m);
        self.0.lock().unwrap().push(m.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn init_through_the_v12_and_v8_tables_fails_cleanly_and_names_the_cause() {
    let capture = Capture::default();
    let (r12, ctx, r8, rdev, ndev) = tracing::subscriber::with_default(capture.clone(), || {
        let t12 = &cclkit_net_ib::ncclNetPlugin_v12;
        let t8 = &cclkit_net_ib::ncclNetPlugin_v8;
        // SAFETY: `name` points to the plugin's static NUL-terminated name.
        assert_eq!(unsafe { CStr::from_ptr(t12.name) }, c"cclkit-ib");
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(t8.name) }, c"cclkit-ib");
        // Called through the raw function pointers, as NCCL does.
        let init12 = t12.init.expect("v12 init");
        let init8 = t8.init.expect("v8 init");
        let devices8 = t8.devices.expect("v8 devices");
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid ctx out-pointer; NULL config/logger/profiler are allowed.
        let r12 = unsafe { init12(&mut ctx, 42, std::ptr::null_mut(), None, None) };
        // SAFETY: NULL logger is allowed.
        let r8 = unsafe { init8(None) };
        let mut n = -1;
        // SAFETY: valid out-pointer.
        let rdev = unsafe { devices8(&mut n) };
        (r12, ctx, r8, rdev, n)
    });
    let logs = capture.0.lock().unwrap().clone();
    if let Expect::Hardware = expectation() {
        // A machine with RDMA: what the hardware path must do, decided by sysfs.
        let active = active_ports();
        if active > 0 {
            assert_eq!(
                r12,
                NcclResult::SUCCESS,
                "{active} active port(s): {logs:?}"
            );
            assert!(!ctx.is_null(), "a context on success");
            assert_eq!(r8, NcclResult::SUCCESS, "{logs:?}");
            assert_eq!(rdev, NcclResult::SUCCESS);
            assert!(ndev >= 1, "devices() = {ndev} with {active} active port(s)");
        } else {
            assert_eq!(r12, NcclResult::SYSTEM_ERROR, "no active port: {logs:?}");
            assert!(ctx.is_null());
            let warns = logs
                .iter()
                .filter(|l| l.contains("no active port on the RDMA devices"))
                .count();
            assert_eq!(warns, 2, "one WARN per failed init: {logs:?}");
        }
        return;
    }
    assert_eq!(r12, NcclResult::SYSTEM_ERROR, "logs: {logs:?}");
    assert!(ctx.is_null(), "no context on failure");
    assert_eq!(r8, NcclResult::SYSTEM_ERROR);
    assert_ne!(
        rdev,
        NcclResult::SUCCESS,
        "devices() before a successful init"
    );
    assert_eq!(ndev, -1, "ndev untouched on failure");
    // One WARN per failed init (v12, then v8), each naming the cause.
    let inits: Vec<&String> = logs
        .iter()
        .filter(|l| l.starts_with("ncclNet.init: "))
        .collect();
    assert_eq!(inits.len(), 2, "{logs:?}");
    for line in &inits {
        assert_cause(line);
    }
    if let Expect::NoDevices = expectation() {
        assert!(
            inits[0].contains("os error 38"),
            "ENOSYS on this kind of machine: {}",
            inits[0]
        );
    }
}

/// The cdylib built with this test: cargo compiles the library's `cdylib` and `rlib`
/// in one rustc run into `target/<profile>/deps/`, next to this test binary.
fn plugin_so() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let so = deps.join("libcclkit_net_ib.so");
    assert!(so.exists(), "{} not built", so.display());
    so
}

fn build_host() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/nccl_host.c");
    let out = std::env::temp_dir().join(format!("cclkit-ib-nccl-host-{}", std::process::id()));
    let cc = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    out
}

fn run_host(host: &Path, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(host);
    cmd.arg(plugin_so())
        .env_remove("NCCL_IB_DISABLE")
        .env_remove("NCCL_IB_HCA");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the C host");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "host exited with {:?}\nstdout:\n{text}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn a_c_host_dlopens_the_plugin_and_init_fails_with_a_logged_reason() {
    let host = build_host();
    let text = run_host(&host, &[]);
    let disabled = run_host(&host, &[("NCCL_IB_DISABLE", "1")]);
    std::fs::remove_file(&host).ok();

    assert!(text.contains("NAME cclkit-ib\n"), "{text}");
    assert!(text.ends_with("DLCLOSED\n"), "no crash on dlclose: {text}");
    // NCCL_IB_DISABLE=1 holds on every machine, hardware or not.
    assert!(
        disabled.contains("LOG level=2 ncclNet.init: NET/cclkit-ib: disabled by NCCL_IB_DISABLE=1"),
        "{disabled}"
    );
    assert!(
        disabled.contains("V12_INIT 3 CTX null\n"),
        "internal error: {disabled}"
    );
    if let Expect::Hardware = expectation() {
        if active_ports() > 0 {
            assert!(text.contains("V12_INIT 0 CTX set\n"), "{text}");
            assert!(text.contains("V8_INIT 0\n"), "{text}");
            assert!(text.contains("V8_DEVICES 0 "), "{text}");
        } else {
            assert!(text.contains("V12_INIT 2 CTX null\n"), "{text}");
            assert!(
                text.contains("no active port on the RDMA devices"),
                "{text}"
            );
        }
        return;
    }
    // ncclSystemError = 2, NCCL_LOG_WARN = 2, no context handed out.
    assert!(text.contains("V12_INIT 2 CTX null\n"), "{text}");
    assert!(text.contains("V8_INIT 2\n"), "{text}");
    assert!(
        text.contains("V8_DEVICES 5 -1\n"),
        "ncclInvalidUsage, ndev untouched: {text}"
    );
    let warn = text
        .lines()
        .find(|l| l.starts_with("LOG level=2 ncclNet.init: "))
        .unwrap_or_else(|| panic!("no WARN through NCCL's logger: {text}"));
    assert_cause(warn);
    assert_eq!(
        text.matches("LOG level=2 ncclNet.init: ").count(),
        2,
        "{text}"
    );
}

#[test]
fn the_packaged_library_does_not_link_libibverbs() {
    let out = Command::new("readelf")
        .arg("-dW")
        .arg(plugin_so())
        .output()
        .expect("readelf (binutils) is needed for this check");
    assert!(out.status.success());
    let dynamic = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(!needed.is_empty(), "no NEEDED entries parsed: {dynamic}");
    assert!(
        needed.iter().all(|l| !l.contains("ibverbs")),
        "libibverbs must be opened at run time, not linked: {needed:?}"
    );
}
