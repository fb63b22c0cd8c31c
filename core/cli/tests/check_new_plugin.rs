//! `make new-plugin KIND=net|tuner NAME=foo` (examples/new-plugin.sh), run on a copy
//! of the workspace sources: the new crate is renamed throughout, becomes a workspace
//! member with the right cdylib name, and enters the Makefile's packaging table.
//!
//! The full flow (build, `make package`, `cclkit check`) is the ignored test
//! `new_plugins_build_package_and_pass_cclkit_check` (a few minutes of compiling):
//! `cargo test -p cclkit-cli --test check_new_plugin -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace() -> PathBuf {
    cclkit_tests::cplugin::workspace()
}

/// Copies the workspace sources (no build outputs, no git) into `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let name = e.file_name();
        let name = name.to_string_lossy();
        if matches!(name.as_ref(), "target" | "build" | ".git") {
            continue;
        }
        let kind = e.file_type().expect("file type");
        if kind.is_dir() {
            copy_tree(&e.path(), &to.join(&*name));
        } else if kind.is_file() {
            std::fs::copy(e.path(), to.join(&*name)).expect("copy");
        }
    }
}

fn new_plugin(root: &Path, kind: &str, name: &str) -> Output {
    Command::new("bash")
        .arg(workspace().join("examples/new-plugin.sh"))
        .args([kind, name])
        .arg(root)
        .output()
        .expect("run new-plugin.sh")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn new_plugins_are_renamed_and_registered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    copy_tree(&workspace(), root);
    for (kind, name) in [("net", "my-net"), ("tuner", "foo")] {
        let out = new_plugin(root, kind, name);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let net = read(&root.join("plugins/my-net/src/lib.rs"));
    for want in [
        "pub struct MyNetNet",
        "const NAME: &'static CStr = c\"my-net\";",
        "std::env::var(\"MY_NET_IP\")",
        "\"my-net-send\"",
        "Properties::host(\"my-net\")",
        "export_net!(MyNetNet);",
    ] {
        assert!(net.contains(want), "missing {want:?}");
    }
    assert!(!net.to_lowercase().contains("template"), "{net}");
    let tuner = read(&root.join("plugins/foo/src/lib.rs"));
    for want in [
        "const NAME: &'static CStr = c\"foo\";",
        "env_number(\"FOO_THRESHOLD\", 65536)",
        "export_tuner!(FooTuner);",
    ] {
        assert!(tuner.contains(want), "missing {want:?}");
    }
    assert!(!tuner.to_lowercase().contains("template"));
    assert!(read(&root.join("plugins/my-net/Cargo.toml")).contains("name = \"nccl-net-my-net\""));
    assert!(read(&root.join("plugins/my-net/README.md")).contains("libnccl-net-my-net.so"));

    let makefile = read(&root.join("Makefile"));
    assert!(makefile.contains("cclkit_tuner_template:tuner:template \\\n  nccl_net_my_net:net:my-net \\\n  nccl_tuner_foo:tuner:foo\n"), "{makefile}");

    // Cargo sees two new members whose cdylibs carry the packaged names.
    let meta = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(root)
        .output()
        .expect("cargo metadata");
    assert!(
        meta.status.success(),
        "{}",
        String::from_utf8_lossy(&meta.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&meta.stdout).expect("metadata JSON");
    for (pkg, lib) in [
        ("nccl-net-my-net", "nccl_net_my_net"),
        ("nccl-tuner-foo", "nccl_tuner_foo"),
    ] {
        let p = v["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .find(|p| p["name"] == pkg)
            .unwrap_or_else(|| panic!("{pkg} is not a workspace member"));
        assert_eq!(p["targets"][0]["name"], lib);
        assert_eq!(p["targets"][0]["kind"][0], "cdylib");
    }
}

#[test]
fn bad_names_and_existing_plugins_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    copy_tree(&workspace(), root);
    for (kind, name, code) in [
        ("net", "Bad", 2),
        ("net", "9lives", 2),
        ("net", "trailing-", 2),
        ("net", "template", 2),
        ("net", "cclkit-x", 2),
        ("profiler", "foo", 2),
    ] {
        let out = new_plugin(root, kind, name);
        assert_eq!(out.status.code(), Some(code), "{kind} {name}");
    }
    assert!(new_plugin(root, "net", "again").status.success());
    let out = new_plugin(root, "tuner", "again");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("plugins/again already exists"));
}

/// The whole flow a vendor runs: create, build, package, check. Slow (compiles the
/// new crates and reuses the other packaged plugins), hence ignored by default.
#[test]
#[ignore]
fn new_plugins_build_package_and_pass_cclkit_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    copy_tree(&workspace(), root);
    assert!(new_plugin(root, "net", "acme").status.success());
    assert!(new_plugin(root, "tuner", "acme-tune").status.success());
    let target = root.join("target");
    let build = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "-p",
            "nccl-net-acme",
            "-p",
            "nccl-tuner-acme-tune",
        ])
        .current_dir(root)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("cargo build");
    assert!(build.success());
    // `make package` installs every PLUGINS entry: give it the other plugins as built.
    let lib_dir = std::env::var_os("CCLKIT_LIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("build/lib"));
    for (cdylib, packaged) in [
        ("libcclkit_net_socket.so", "libnccl-net-cclkit-socket.so"),
        ("libcclkit_net_ofi.so", "libnccl-net-cclkit-ofi.so"),
        ("libcclkit_net_ib.so", "libnccl-net-cclkit-ib.so"),
        ("libcclkit_tuner.so", "libnccl-tuner-cclkit.so"),
        ("libcclkit_net_template.so", "libnccl-net-template.so"),
        ("libcclkit_tuner_template.so", "libnccl-tuner-template.so"),
    ] {
        std::fs::copy(lib_dir.join(packaged), target.join("release").join(cdylib)).expect("copy");
    }
    let make = Command::new("make")
        .args(["-o", "build", "-o", "deps", "package"])
        .current_dir(root)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("make package");
    assert!(make.success());
    for lib in [
        "libnccl-net-acme.so",
        "librccl-net-acme.so",
        "libnccl-tuner-acme-tune.so",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_cclkit"))
            .args([
                "check",
                &root.join("build/lib").join(lib).display().to_string(),
            ])
            .output()
            .expect("cclkit check");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{lib}:\n{text}");
        assert!(
            text.lines().last().unwrap_or("").contains(" 0 failed"),
            "{text}"
        );
    }
}
