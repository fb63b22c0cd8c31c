//! A vendor's flow, end to end, in a temporary directory outside the workspace:
//! `cclkit new` → `cargo build --release --offline` (against this checkout's
//! `cclkit-abi` through `--sdk path:`) → `cclkit package` → `cclkit check` →
//! `cclkit perf --np 2 --net …`, plus the build-time refusal of `panic = "abort"`.
//!
//! The vendor crates build into one shared target directory,
//! `$CARGO_TARGET_TMPDIR/out-of-tree` (or `CCLKIT_OOT_TARGET`), so `cclkit-abi` and its
//! three dependencies compile once per checkout (about a minute cold on 2 cores, a
//! few seconds warm) and each plugin crate compiles on its own in seconds. Every
//! command runs under a deadline.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn shared_target() -> PathBuf {
    std::env::var_os("CCLKIT_OOT_TARGET")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("out-of-tree"))
}

/// Runs `cmd` to completion or kills it after `limit`; output is captured.
fn run(cmd: &mut Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let start = Instant::now();
    // Drain the pipes on threads so a chatty command cannot block on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let o = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut v);
        v
    });
    let e = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut v);
        v
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: o.join().expect("stdout thread"),
        stderr: e.join().expect("stderr thread"),
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", text(&o));
    o
}

fn cclkit(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    c.args(args);
    // What the variables would select must not leak in from the caller.
    for k in [
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_NET",
        "CCLKIT_STRICT",
    ] {
        c.env_remove(k);
    }
    c
}

/// `cclkit new KIND NAME` into `dir` against this checkout's SDK.
fn new_crate(dir: &Path, kind: &str, name: &str, extra: &[&str]) {
    let sdk = format!("path:{}", workspace().display());
    let mut args = vec!["new", kind, name, "--sdk", &sdk];
    let d = dir.display().to_string();
    args.extend(["--dir", &d]);
    args.extend(extra);
    let o = ok(run(&mut cclkit(&args), Duration::from_secs(30)));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("Cargo.toml src/lib.rs README.md .gitignore ci.sh"),
        "{out}"
    );
}

/// `cargo <verb> --release --offline` in a vendor crate, in the shared target dir.
fn cargo(dir: &Path, verb: &str, extra: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO"));
    c.arg(verb)
        .args(["--release", "--offline"])
        .args(extra)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", shared_target())
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS");
    run(&mut c, Duration::from_secs(480))
}

fn build(dir: &Path) -> Duration {
    let t = Instant::now();
    ok(cargo(dir, "build", &[]));
    t.elapsed()
}

fn package(lib: &str, dest: &Path) -> String {
    let so = shared_target().join("release").join(lib);
    let o = ok(run(
        &mut cclkit(&[
            "package",
            &so.display().to_string(),
            "--dest",
            &dest.display().to_string(),
        ]),
        Duration::from_secs(30),
    ));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn check(lib: &Path) {
    let o = ok(run(
        &mut cclkit(&["check", &lib.display().to_string(), "--no-valgrind"]),
        Duration::from_secs(300),
    ));
    let out = String::from_utf8_lossy(&o.stdout);
    let last = out.lines().last().unwrap_or("");
    assert!(
        last.contains(" 0 failed") && last.ends_with("passed"),
        "{out}"
    );
}

#[test]
fn net_plugin_from_nothing_to_perf() {
    let tmp = tempfile::tempdir().expect("tempdir");
    assert!(
        !tmp.path()
            .starts_with(workspace().canonicalize().expect("root"))
    );
    let dir = tmp.path().join("acme");
    let lib = tmp.path().join("lib");
    let start = Instant::now();
    new_crate(&dir, "net", "acme", &[]);
    let built = build(&dir);
    let installed = package("libnccl_net_acme.so", &lib);
    for name in ["libnccl-net-acme.so", "librccl-net-acme.so"] {
        assert!(
            lib.join(name).is_file(),
            "{name} not installed:\n{installed}"
        );
        assert!(installed.contains(name), "{installed}");
    }
    assert!(
        installed.contains("net v6 v7 v8 v9 v10 v11 v12"),
        "{installed}"
    );
    check(&lib.join("libnccl-net-acme.so"));
    eprintln!(
        "new → build ({built:?}) → package → check: {:?}",
        start.elapsed()
    );

    // perf over the vendor's plugin, named by path and by NCCL name.
    let so = lib.join("libnccl-net-acme.so").display().to_string();
    let perf = [
        "perf", "--np", "2", "-b", "8", "-e", "64K", "-f", "16", "-n", "2", "-w", "1",
    ];
    let mut by_path: Vec<&str> = perf.to_vec();
    by_path.extend(["--net", &so, "--json", "-"]);
    let o = ok(run(&mut cclkit(&by_path), Duration::from_secs(120)));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("perf JSON");
    assert_eq!(v["net"], "acme v12", "{v}");
    let rows = v["tests"][0]["results"].as_array().expect("rows");
    assert_eq!(rows.len(), 4, "{v}");
    assert!(rows.iter().all(|r| r["out_of_place"]["nwrong"] == 0), "{v}");
    let mut by_name: Vec<&str> = perf.to_vec();
    by_name.extend(["--net", "acme"]);
    let mut c = cclkit(&by_name);
    c.env("LD_LIBRARY_PATH", &lib);
    let o = ok(run(&mut c, Duration::from_secs(120)));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("net 'acme' v12"), "{out}");
    assert!(!out.contains("WARNING"), "{out}");

    // Asked for with --net and unusable: fail, never fall back.
    let mut missing: Vec<&str> = perf.to_vec();
    missing.extend(["--net", "no-such-vendor"]);
    let o = run(&mut cclkit(&missing), Duration::from_secs(60));
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--net no-such-vendor: this plugin cannot be used"),
        "{err}"
    );
    assert!(err.contains("libnccl-net-no-such-vendor.so"), "{err}");
    // Asked for by the variable: NCCL's fallback, said in the header and in a WARN.
    let mut c = cclkit(&perf);
    c.env("NCCL_NET_PLUGIN", "no-such-vendor");
    let o = ok(run(&mut c, Duration::from_secs(120)));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("# WARNING: NET: NCCL_NET_PLUGIN=no-such-vendor was not used"),
        "{out}"
    );
    assert!(out.contains("net 'cclkit-socket'"), "{out}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("NCCL_NET_PLUGIN=no-such-vendor was not used"),
        "{err}"
    );
}

#[test]
fn tuner_and_inline_net_templates_build_and_pass() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let lib = tmp.path().join("lib");
    let tuner = tmp.path().join("tune");
    let inline = tmp.path().join("inline");
    new_crate(&tuner, "tuner", "acme-tune", &[]);
    new_crate(&inline, "net", "acme-poll", &["--template", "inline"]);
    build(&tuner);
    build(&inline);
    // What each crate's ci.sh runs first: the renamed code is formatted, and clippy
    // with -D warnings passes (no workspace lints are inherited, none are broken).
    for dir in [&tuner, &inline] {
        let mut fmt = Command::new(env!("CARGO"));
        fmt.args(["fmt", "--check"]).current_dir(dir);
        ok(run(&mut fmt, Duration::from_secs(60)));
    }
    ok(cargo(&inline, "clippy", &["--", "-D", "warnings"]));
    assert!(package("libnccl_tuner_acme_tune.so", &lib).contains("tuner v1 v2 v3 v4 v5 v6"));
    assert!(package("libnccl_net_acme_poll.so", &lib).contains("libnccl-net-acme-poll.so"));
    check(&lib.join("libnccl-tuner-acme-tune.so"));
    check(&lib.join("libnccl-net-acme-poll.so"));

    // perf through both, with a threshold inside a power-of-two class: every JSON row
    // is one of the tuner report's decisions, at a size inside that entry's range.
    let (t, n) = (
        lib.join("libnccl-tuner-acme-tune.so").display().to_string(),
        lib.join("libnccl-net-acme-poll.so").display().to_string(),
    );
    let mut c = cclkit(&[
        "perf", "--np", "2", "-b", "60000", "-e", "72000", "-i", "2000", "-n", "2", "-w", "1",
        "--net", &n, "--tuner", &t, "--json", "-",
    ]);
    c.env("ACME_TUNE_THRESHOLD", "66000");
    let o = ok(run(&mut c, Duration::from_secs(180)));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("perf JSON");
    assert_eq!(v["net"], "acme-poll v12", "{v}");
    assert!(
        v["tuner"].as_str().unwrap_or("").starts_with("acme-tune"),
        "{v}"
    );
    let report = v["tuner_report"].as_array().expect("tuner_report");
    let rows = v["tests"][0]["results"].as_array().expect("rows");
    assert_eq!(rows.len(), 7, "{v}");
    for r in rows {
        let size = r["size"].as_u64().expect("size");
        let m = &r["out_of_place"];
        let covering: Vec<&serde_json::Value> = report
            .iter()
            .filter(|e| {
                e["func"] == "AllReduce"
                    && e["min_bytes"].as_u64() <= Some(size)
                    && e["max_bytes"].as_u64() >= Some(size)
            })
            .collect();
        assert!(
            covering.iter().any(|e| e["algo"] == m["algo"]
                && e["proto"] == m["proto"]
                && e["channels"] == m["channels"]),
            "row at {size} B ran {m} but the report says {covering:?}"
        );
    }
    // The case: a threshold inside a power-of-two class. Every entry lies on
    // one side of it with the tuner's choice for that side, and both sides are there.
    let side = |e: &serde_json::Value| {
        let (lo, hi) = (e["min_bytes"].as_u64(), e["max_bytes"].as_u64());
        let pick = (
            e["algo"].as_str(),
            e["proto"].as_str(),
            e["source"].as_str(),
        );
        if hi < Some(66_000) && pick == (Some("TREE"), Some("LL"), Some("Tuner")) {
            Some(false)
        } else if lo >= Some(66_000) && pick == (Some("RING"), Some("SIMPLE"), Some("Tuner")) {
            Some(true)
        } else {
            None
        }
    };
    let sides: Vec<Option<bool>> = report.iter().map(side).collect();
    assert!(sides.iter().all(Option::is_some), "{report:?}");
    assert!(
        sides.contains(&Some(false)) && sides.contains(&Some(true)),
        "{report:?}"
    );
    let calls: u64 = report.iter().filter_map(|e| e["calls"].as_u64()).sum();
    assert!(calls >= 7 * 3, "{report:?}");
}

#[test]
fn panic_abort_is_refused_at_build_time() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("guard");
    new_crate(&dir, "tuner", "guard", &[]);
    let manifest = dir.join("Cargo.toml");
    let cargo_toml = std::fs::read_to_string(&manifest).expect("Cargo.toml");
    assert!(cargo_toml.contains("panic = \"unwind\""), "{cargo_toml}");
    std::fs::write(
        &manifest,
        cargo_toml.replace("panic = \"unwind\"", "panic = \"abort\""),
    )
    .expect("write Cargo.toml");
    // `cargo check` evaluates cfg(panic) like a build, without generating code.
    let o = cargo(&dir, "check", &[]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for want in [
        "this plugin is built with `panic = \"abort\"`",
        "kill the whole NCCL job",
        "features = [\"allow-panic-abort\"]",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    // The documented opt-out builds.
    ok(cargo(
        &dir,
        "check",
        &["--features", "cclkit-abi/allow-panic-abort"],
    ));

    // Built as generated (unwinding), a panic in a plugin call reaches NCCL's log with
    // its message and location, and the call fails instead of the process.
    let lib_rs = dir.join("src/lib.rs");
    let code = std::fs::read_to_string(&lib_rs).expect("lib.rs");
    let hook = "        let (algo, proto) = if info.n_bytes < self.threshold {";
    assert!(code.contains(hook), "template changed: {code}");
    let boom =
        "        assert!(info.n_bytes != 4096, \"boom: refusing {} bytes\", info.n_bytes);\n";
    std::fs::write(&lib_rs, code.replace(hook, &format!("{boom}{hook}"))).expect("write");
    std::fs::write(&manifest, &cargo_toml).expect("restore Cargo.toml");
    build(&dir);
    let lib = tmp.path().join("lib");
    package("libnccl_tuner_guard.so", &lib);
    let so = lib.join("libnccl-tuner-guard.so").display().to_string();
    let mut show = cclkit(&["tune", "show", "--tuner", &so, "-b", "4096", "-e", "4096"]);
    show.env("NCCL_DEBUG", "WARN");
    let o = run(&mut show, Duration::from_secs(60));
    let all = text(&o);
    assert!(
        all.contains("plugin panicked: boom: refusing 4096 bytes at src/lib.rs:"),
        "{all}"
    );
}
