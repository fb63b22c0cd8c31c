//! The files `cclkit new` writes: the template's `lib.rs` renamed, and a standalone
//! `Cargo.toml`, README, `.gitignore` and `ci.sh` written for that name.

use std::path::Path;

/// The templates, embedded from `examples/` (the crates built and checked in this
/// workspace, so what `cclkit new` writes is what `make test` checks).
const NET_LIB: &str = include_str!("../../../../../examples/net-template/src/lib.rs");
const NET_INLINE_LIB: &str = include_str!("../../../../../examples/net-inline-template/src/lib.rs");
const TUNER_LIB: &str = include_str!("../../../../../examples/tuner-template/src/lib.rs");

/// The rustc the templates and `cclkit-abi` need (edition 2024).
pub const MSRV: &str = "1.85";

/// A template `cclkit new` can start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Template {
    /// `examples/net-template`.
    Net,
    /// `examples/net-inline-template`.
    NetInline,
    /// `examples/tuner-template`.
    Tuner,
}

impl Template {
    /// `net` or `tuner`.
    pub fn kind_word(self) -> &'static str {
        match self {
            Template::Net | Template::NetInline => "net",
            Template::Tuner => "tuner",
        }
    }

    /// The directory under `examples/` it comes from.
    pub fn source(self) -> &'static str {
        match self {
            Template::Net => "examples/net-template",
            Template::NetInline => "examples/net-inline-template",
            Template::Tuner => "examples/tuner-template",
        }
    }

    fn lib_rs(self) -> &'static str {
        match self {
            Template::Net => NET_LIB,
            Template::NetInline => NET_INLINE_LIB,
            Template::Tuner => TUNER_LIB,
        }
    }
}

/// Where the generated crate takes `cclkit-abi` from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sdk {
    /// A version requirement on crates.io (`0.1`).
    Version(String),
    /// A local checkout (the `abi/` directory).
    Path(String),
    /// A git repository and an optional revision.
    Git {
        /// Repository URL.
        url: String,
        /// Commit, tag or branch (`rev = …`).
        rev: Option<String>,
    },
}

impl Sdk {
    /// Parses `0.1`, `path:DIR`, `git:URL[#REV]`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(dir) = s.strip_prefix("path:") {
            let mut p = std::path::absolute(Path::new(dir)).map_err(|e| format!("{dir}: {e}"))?;
            if !p.join("Cargo.toml").is_file() {
                return Err(format!("{}: no Cargo.toml there", p.display()));
            }
            if p.join("abi/Cargo.toml").is_file() {
                p = p.join("abi");
            }
            let text = p.display().to_string();
            if text.contains(['"', '\\', '\n']) {
                return Err("the path must not contain quotes, backslashes or newlines".into());
            }
            return Ok(Sdk::Path(text));
        }
        if let Some(rest) = s.strip_prefix("git:") {
            let (url, rev) = match rest.split_once('#') {
                Some((u, r)) => (u, Some(r.to_owned())),
                None => (rest, None),
            };
            if url.is_empty() || url.contains(['"', '\\', '\n', ' ']) {
                return Err("expected git:URL[#REV]".into());
            }
            return Ok(Sdk::Git {
                url: url.to_owned(),
                rev,
            });
        }
        let version_like = !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'=' | b'^' | b'~' | b'*'));
        if !version_like {
            return Err("expected a version (0.1), path:DIR or git:URL[#REV]".into());
        }
        Ok(Sdk::Version(s.to_owned()))
    }

    /// The dependency line for `Cargo.toml`.
    pub fn dependency(&self) -> String {
        match self {
            Sdk::Version(v) => format!("cclkit-abi = \"{v}\""),
            Sdk::Path(p) => format!("cclkit-abi = {{ path = \"{p}\" }}"),
            Sdk::Git { url, rev: None } => format!("cclkit-abi = {{ git = \"{url}\" }}"),
            Sdk::Git { url, rev: Some(r) } => {
                format!("cclkit-abi = {{ git = \"{url}\", rev = \"{r}\" }}")
            }
        }
    }
}

/// `my-net` → `MyNet`.
fn camel(name: &str) -> String {
    name.split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The template's `lib.rs` with every mention of the template renamed: environment
/// variables (`CCLKIT_TEMPLATE_X` → `ACME_X`), the table name, the type
/// (`TemplateNet` → `AcmeNet`), thread names and log prefixes.
pub fn rename(template: Template, name: &str) -> String {
    let upper = name.to_ascii_uppercase().replace('-', "_");
    let ty = camel(name);
    template
        .lib_rs()
        .replace("CCLKIT_TEMPLATE_", &format!("{upper}_"))
        .replace("c\"TemplateTuner\"", &format!("c\"{name}\""))
        .replace("c\"TemplateInline\"", &format!("c\"{name}\""))
        .replace("c\"Template\"", &format!("c\"{name}\""))
        .replace("TemplateNet", &format!("{ty}Net"))
        .replace("TemplateTuner", &format!("{ty}Tuner"))
        .replace("Template", &ty)
        .replace("template", name)
}

/// Every file of the new crate: `(path relative to the crate, contents)`.
pub fn render(template: Template, name: &str, sdk: &Sdk) -> Vec<(&'static str, String)> {
    let kind = template.kind_word();
    let crate_name = format!("nccl-{kind}-{name}");
    let lib = format!("lib{}.so", crate_name.replace('-', "_"));
    let installed = format!("libnccl-{kind}-{name}.so");
    let upper = name.to_ascii_uppercase().replace('-', "_");
    let cargo = format!(
        r#"[package]
name = "{crate_name}"
version = "0.1.0"
edition = "2024"
rust-version = "{MSRV}"
description = "{name} {kind} plugin for NCCL and RCCL, built on cclkit-abi"
publish = false

# Standalone: never part of an enclosing workspace.
[workspace]

[lib]
# NCCL dlopens the plugin: a C shared library.
crate-type = ["cdylib"]

[dependencies]
{dependency}

[profile.release]
# Keep unwinding: cclkit-abi turns a panic in a plugin call into an error NCCL logs
# (with the panic's message and location). With panic = "abort" a panic would kill
# the whole job, so export_{kind}! refuses to build (see cclkit-abi's docs).
panic = "unwind"
"#,
        dependency = sdk.dependency()
    );
    let knobs = match template {
        Template::Net | Template::NetInline => format!(
            "- `{upper}_IP`: the address of the one device (default 127.0.0.1; `cclkit check`'s\n  \
             namespace check sets it for its peers)."
        ),
        Template::Tuner => format!(
            "- `{upper}_THRESHOLD`: bytes below which tree/LL is preferred (default 65536).\n\
             - `{upper}_CHANNELS`: channel count to ask for (0 = NCCL's own)."
        ),
    };
    let (names, use_it, try_it) = match template {
        Template::Tuner => (
            format!("`{installed}`"),
            format!("`NCCL_TUNER_PLUGIN={name}` (NCCL finds `{installed}`)"),
            format!(
                "cclkit tune show --tuner target/nccl-plugins/{installed}\n\
                 cclkit perf --np 2 -b 8 -e 1M -f 4 --tuner target/nccl-plugins/{installed}"
            ),
        ),
        _ => (
            format!("`{installed}` (NCCL) and `librccl-net-{name}.so` (RCCL)"),
            format!(
                "`NCCL_NET_PLUGIN={name}` (NCCL finds `{installed}`), `NCCL_NET={name}` to insist on it"
            ),
            format!("cclkit perf --np 2 -b 8 -e 1M -f 4 --net target/nccl-plugins/{installed}"),
        ),
    };
    let readme = format!(
        "# {crate_name}\n\n\
         A {kind} plugin for NCCL and RCCL, started with `cclkit new` from cclkit's\n\
         `{source}`. One Rust implementation is exported as every ABI version\n\
         NCCL 2.19–2.30 loads; replace the logic in `src/lib.rs` and keep the\n\
         `export_{kind}!` line.\n\n\
         ## Build, package, check\n\n\
         Needs a Rust toolchain ({MSRV} or newer) and the `cclkit` command\n\
         (`cargo install --path core/cli` in a cclkit checkout puts it in `~/.cargo/bin`).\n\n\
         ```sh\n\
         cargo build --release\n\
         cclkit package target/release/{lib} --dest target/nccl-plugins\n\
         cclkit check target/nccl-plugins/{installed}\n\
         {try_it}\n\
         ```\n\n\
         `cclkit package` checks the exported tables and installs {names}.\n\
         `./ci.sh` runs the same steps plus `cargo fmt --check` and clippy.\n\n\
         ## Use it\n\n\
         Put the installed file on the library path (`LD_LIBRARY_PATH`) and set\n\
         {use_it}. `--net`/`--tuner NAME|PATH` mean the same in every `cclkit` command.\n\n\
         ## Environment\n\n\
         {knobs}\n\n\
         ## Panics\n\n\
         A panic in a plugin call becomes an error code with the panic's message and\n\
         location in NCCL's log. That needs `panic = \"unwind\"` (set in `Cargo.toml`);\n\
         a build with `panic = \"abort\"` fails on purpose.\n",
        source = template.source(),
    );
    let gitignore = "/target\n/Cargo.lock.bak\n".to_owned();
    let ci = format!(
        "#!/usr/bin/env sh\n\
         # Minimal CI: format, lint, build, package and run cclkit's conformance suite.\n\
         # Needs a Rust toolchain and `cclkit` on PATH (or CCLKIT=/path/to/cclkit).\n\
         set -eu\n\
         cd \"$(dirname \"$0\")\"\n\
         cclkit=${{CCLKIT:-cclkit}}\n\
         cargo fmt --check\n\
         cargo clippy --release --all-targets -- -D warnings\n\
         cargo build --release\n\
         \"$cclkit\" package target/release/{lib} --dest target/nccl-plugins\n\
         \"$cclkit\" check target/nccl-plugins/{installed}\n"
    );
    vec![
        ("Cargo.toml", cargo),
        ("src/lib.rs", rename(template, name)),
        ("README.md", readme),
        (".gitignore", gitignore),
        ("ci.sh", ci),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_forms() {
        assert_eq!(Sdk::parse("0.1"), Ok(Sdk::Version("0.1".into())));
        assert_eq!(Sdk::parse("=0.1.0"), Ok(Sdk::Version("=0.1.0".into())));
        assert_eq!(
            Sdk::parse("git:https://example.invalid/cclkit#v0.1.0"),
            Ok(Sdk::Git {
                url: "https://example.invalid/cclkit".into(),
                rev: Some("v0.1.0".into())
            })
        );
        assert!(Sdk::parse("latest").is_err());
        assert!(Sdk::parse("path:/nonexistent/cclkit").is_err());
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let Ok(Sdk::Path(p)) = Sdk::parse(&format!("path:{}", root.display())) else {
            panic!("the repository root is a valid path: sdk");
        };
        assert!(p.ends_with("/abi"), "{p}");
        assert_eq!(
            Sdk::Path("/x/abi".into()).dependency(),
            "cclkit-abi = { path = \"/x/abi\" }"
        );
    }

    #[test]
    fn templates_are_renamed_throughout() {
        for t in [Template::Net, Template::NetInline, Template::Tuner] {
            let text = rename(t, "my-net");
            assert!(!text.to_lowercase().contains("template"), "{t:?}:\n{text}");
            assert!(text.contains("MyNet"), "{t:?}");
        }
        let net = rename(Template::Net, "my-net");
        for want in [
            "pub struct MyNetNet",
            "const NAME: &'static CStr = c\"my-net\";",
            "std::env::var(\"MY_NET_IP\")",
            "export_net!(MyNetNet);",
        ] {
            assert!(net.contains(want), "missing {want:?}");
        }
        let tuner = rename(Template::Tuner, "foo");
        for want in [
            "const NAME: &'static CStr = c\"foo\";",
            "env_number(\"FOO_THRESHOLD\", 65536)",
            "export_tuner!(FooTuner);",
        ] {
            assert!(tuner.contains(want), "missing {want:?}");
        }
    }

    #[test]
    fn the_manifest_stands_alone() {
        let files = render(Template::Net, "acme", &Sdk::Version("0.1".into()));
        let cargo = &files[0].1;
        assert!(cargo.contains("name = \"nccl-net-acme\""));
        assert!(cargo.contains("\n[workspace]\n"));
        assert!(cargo.contains("cclkit-abi = \"0.1\""));
        assert!(!cargo.contains(".workspace"), "{cargo}");
        assert!(!cargo.contains("[lints]"), "{cargo}");
        let names: Vec<&str> = files.iter().map(|f| f.0).collect();
        assert_eq!(
            names,
            [
                "Cargo.toml",
                "src/lib.rs",
                "README.md",
                ".gitignore",
                "ci.sh"
            ]
        );
        assert!(files[2].1.contains("libnccl-net-acme.so"));
        assert!(
            files[4]
                .1
                .contains("package target/release/libnccl_net_acme.so")
        );
    }
}
