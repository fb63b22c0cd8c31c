//! The dependency direction of ARCHITECTURE.md, read from `cargo metadata`:
//!
//! ```text
//! abi ← kernels, plugins, examples, host ← runtime ← cli
//! ```
//!
//! Plugins and examples depend on `cclkit-abi` only (they may use the host and the
//! runtime as dev-dependencies, to drive their own `.so` in tests); nothing depends on
//! the CLI; the shared test support (`cclkit-tests`) depends on the ABI only, so every
//! crate's tests can use it without a cycle. Its own tests and example peers may use
//! the host (which itself depends on the ABI only), never the runtime or a plugin.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

/// Where a workspace crate sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layer {
    Abi,
    /// kernels and the host: built on the ABI alone.
    Base,
    /// A plugin or an example (a vendor's crate in miniature).
    Plugin,
    Runtime,
    Cli,
    TestSupport,
}

fn layer(name: &str, manifest: &str) -> Layer {
    match name {
        "cclkit-abi" => Layer::Abi,
        "cclkit-kernels" | "cclkit-host" => Layer::Base,
        "cclkit-runtime" => Layer::Runtime,
        "cclkit-cli" => Layer::Cli,
        "cclkit-tests" => Layer::TestSupport,
        _ if manifest.contains("/plugins/") || manifest.contains("/examples/") => Layer::Plugin,
        _ => panic!("{name} ({manifest}) has no layer: add it to ARCHITECTURE.md and here"),
    }
}

/// Why `from` may not depend on `to` (`dev` = a dev-dependency), or `None` if it may.
fn violation(from: Layer, to: Layer, dev: bool) -> Option<&'static str> {
    use Layer::*;
    if to == Cli {
        return Some("nothing depends on the CLI");
    }
    if dev {
        // Tests may drive anything below the CLI; the test support's own tests drive
        // packaged plugins through the host, which depends on the ABI alone.
        return (from == TestSupport && !matches!(to, Abi | Base)).then_some(
            "the test support's tests use the ABI and the host only (every crate's tests use it)",
        );
    }
    let ok = match from {
        Abi => false,
        Base | Plugin | TestSupport => to == Abi,
        Runtime => matches!(to, Abi | Base | Plugin),
        Cli => matches!(to, Abi | Base | Plugin | Runtime),
    };
    (!ok).then_some(match from {
        Abi => "cclkit-abi depends on no workspace crate",
        Base | Plugin => "kernels, the host, plugins and examples depend on cclkit-abi only",
        TestSupport => "the test support depends on the ABI only",
        Runtime => "the runtime depends on abi, kernels, host and plugins only",
        Cli => "the CLI depends on crates below it only",
    })
}

/// A dependency between workspace crates: (from, to, dev?).
type Edge = (String, String, bool);

/// Every edge between workspace crates, and each crate's layer.
fn edges() -> (Vec<Edge>, BTreeMap<String, Layer>) {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let layers: BTreeMap<String, Layer> = packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().expect("name").to_owned();
            let manifest = p["manifest_path"].as_str().expect("manifest");
            (name.clone(), layer(&name, manifest))
        })
        .collect();
    let mut edges = Vec::new();
    for p in packages {
        let from = p["name"].as_str().expect("name");
        for d in p["dependencies"].as_array().expect("dependencies") {
            let to = d["name"].as_str().expect("dependency name");
            if layers.contains_key(to) {
                edges.push((from.to_owned(), to.to_owned(), d["kind"] == "dev"));
            }
        }
    }
    (edges, layers)
}

#[test]
fn workspace_crates_depend_only_downwards() {
    let (edges, layers) = edges();
    assert!(layers.len() >= 10, "too few workspace crates: {layers:?}");
    assert!(
        edges
            .iter()
            .any(|(f, t, dev)| f == "cclkit-runtime" && t == "cclkit-host" && !dev),
        "expected the runtime to depend on the host: {edges:?}"
    );
    let bad: Vec<String> = edges
        .iter()
        .filter_map(|(f, t, dev)| {
            violation(layers[f], layers[t], *dev).map(|why| {
                let kind = if *dev { "dev-dependency" } else { "dependency" };
                format!("{f} → {t} ({kind}): {why}")
            })
        })
        .collect();
    assert!(
        bad.is_empty(),
        "dependencies against ARCHITECTURE.md:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_rule_refuses_upward_edges() {
    use Layer::*;
    for (from, to, dev) in [
        (Abi, Base, false),
        (Plugin, Base, false),
        (Plugin, Runtime, false),
        (Base, Runtime, false),
        (Runtime, Cli, false),
        (Plugin, Cli, true),
        (TestSupport, Runtime, true),
        (TestSupport, Plugin, true),
        (TestSupport, Base, false),
    ] {
        assert!(violation(from, to, dev).is_some(), "{from:?} → {to:?}");
    }
    for (from, to, dev) in [
        (Plugin, Abi, false),
        (Plugin, Runtime, true),
        (Plugin, Base, true),
        (Runtime, Plugin, false),
        (Cli, Runtime, false),
        (Base, TestSupport, true),
        (TestSupport, Base, true),
    ] {
        assert!(violation(from, to, dev).is_none(), "{from:?} → {to:?}");
    }
}
