//! `cclkit new net|tuner NAME` (what `make new-plugin` runs): the crate it writes is
//! standalone — cargo sees one cdylib package of its own, whatever directory it sits
//! in — renamed throughout, and bad names or occupied directories are refused.
//!
//! Building, packaging, checking and benchmarking such a crate is
//! `tests/out_of_tree.rs`.

use std::path::Path;
use std::process::{Command, Output};

fn new(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cclkit"))
        .arg("new")
        .args(args)
        .output()
        .expect("run cclkit new")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `cargo metadata` of a generated crate: its one package's name and target.
fn metadata(dir: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(dir)
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("metadata JSON")
}

#[test]
fn new_plugins_are_standalone_and_renamed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Nested inside another crate's directory: the empty [workspace] keeps it apart.
    let outer = tmp.path().join("outer");
    std::fs::create_dir_all(outer.join("src")).expect("mkdir");
    std::fs::write(
        outer.join("Cargo.toml"),
        "[package]\nname = \"outer\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .expect("outer manifest");
    std::fs::write(outer.join("src/lib.rs"), "").expect("outer lib");
    let sdk = format!(
        "path:{}",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .display()
    );
    for (kind, name, extra) in [
        ("net", "my-net", None),
        ("net", "my-poll", Some("inline")),
        ("tuner", "foo", None),
    ] {
        let dir = outer.join(name);
        let d = dir.display().to_string();
        let mut args = vec![kind, name, "--dir", &d, "--sdk", &sdk];
        if let Some(t) = extra {
            args.extend(["--template", t]);
        }
        let out = new(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = metadata(&dir);
        let pkgs = v["packages"].as_array().expect("packages");
        assert_eq!(pkgs.len(), 1, "{v}");
        let crate_name = format!("nccl-{kind}-{name}");
        assert_eq!(pkgs[0]["name"], crate_name.as_str());
        assert_eq!(pkgs[0]["targets"][0]["kind"][0], "cdylib");
        assert_eq!(
            pkgs[0]["targets"][0]["name"],
            crate_name.replace('-', "_").as_str()
        );
        let lib = read(&dir.join("src/lib.rs"));
        assert!(!lib.to_lowercase().contains("template"), "{lib}");
        for f in ["README.md", ".gitignore", "ci.sh"] {
            assert!(dir.join(f).is_file(), "{f}");
        }
        assert!(read(&dir.join("README.md")).contains(&format!("libnccl-{kind}-{name}.so")));
    }
    let net = read(&outer.join("my-net/src/lib.rs"));
    for want in [
        "pub struct MyNetNet",
        "const NAME: &'static CStr = c\"my-net\";",
        "std::env::var(\"MY_NET_IP\")",
        "export_net!(MyNetNet);",
    ] {
        assert!(net.contains(want), "missing {want:?}");
    }
    let poll = read(&outer.join("my-poll/src/lib.rs"));
    assert!(poll.contains("c\"my-poll\""), "{poll}");
    assert!(poll.contains("export_net!(MyPollNet);"));
    let tuner = read(&outer.join("foo/src/lib.rs"));
    assert!(tuner.contains("env_number(\"FOO_THRESHOLD\", 65536)"));
    assert!(read(&outer.join("foo/Cargo.toml")).contains("cclkit-abi = { path = \""));
}

#[test]
fn bad_names_and_occupied_directories_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for (kind, name) in [
        ("net", "Bad"),
        ("net", "9lives"),
        ("net", "trailing-"),
        ("net", "a--b"),
        ("net", "template"),
        ("tuner", "cclkit-x"),
        ("profiler", "foo"),
    ] {
        let d = tmp.path().join("x").display().to_string();
        let out = new(&[kind, name, "--dir", &d]);
        assert_eq!(out.status.code(), Some(2), "{kind} {name}");
        assert!(!tmp.path().join("x").exists(), "{kind} {name} wrote files");
    }
    let out = new(&["tuner", "ok", "--template", "inline"]);
    assert_eq!(out.status.code(), Some(2));
    let out = new(&["net", "ok", "--sdk", "latest"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sdk latest"));

    let dir = tmp.path().join("taken");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("keep.txt"), "mine").expect("write");
    let d = dir.display().to_string();
    let out = new(&["net", "again", "--dir", &d]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists and is not empty"));
    assert_eq!(read(&dir.join("keep.txt")), "mine");
    // The default SDK is the published crate.
    let fresh = tmp.path().join("fresh").display().to_string();
    assert!(new(&["net", "again", "--dir", &fresh]).status.success());
    assert!(read(&tmp.path().join("fresh/Cargo.toml")).contains("\ncclkit-abi = \"0.1\"\n"));
}
