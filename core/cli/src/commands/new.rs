//! `cclkit new net|tuner NAME`: a plugin crate of one's own, outside this repository.
//!
//! The crate is standalone: its own `Cargo.toml` (no workspace inheritance, an empty
//! `[workspace]` so it never joins an enclosing one, no inherited lints), a README,
//! `.gitignore` and `ci.sh`. It depends on `cclkit-abi` only, so plain
//! `cargo build --release` is all it needs besides a Rust toolchain. Its `src/lib.rs`
//! is one of the templates in `examples/` (embedded at build time, so those crates
//! stay the single source), renamed throughout.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod files;

pub use files::{Sdk, Template};

/// Arguments of `cclkit new`.
#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// What to start: `net` or `tuner`.
    #[arg(value_enum)]
    pub kind: NewKind,
    /// The plugin's name: lowercase letters, digits and dashes (`acme`, `my-net`). The
    /// crate is `nccl-<kind>-NAME`, its library `libnccl_<kind>_NAME.so`, installed by
    /// `cclkit package` as `libnccl-<kind>-NAME.so`.
    pub name: String,
    /// Directory to create (default: `./nccl-<kind>-NAME`); must not exist or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Where `cclkit-abi` comes from: a version requirement (default `0.1`, as
    /// published), `path:DIR` (a local checkout: the `abi/` directory or the repository
    /// root), or `git:URL[#REV]`.
    #[arg(long, default_value = "0.1")]
    pub sdk: String,
    /// Net template: `threads` (one helper thread per connection moves the bytes) or
    /// `inline` (all progress inside isend/irecv/test, no helper thread).
    #[arg(long, value_enum, default_value = "threads")]
    pub template: NetStyle,
}

/// The kinds `cclkit new` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NewKind {
    /// A network transport (`export_net!`).
    Net,
    /// A tuner (`export_tuner!`).
    Tuner,
}

/// The two net templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetStyle {
    /// `examples/net-template`: a helper thread per connection.
    Threads,
    /// `examples/net-inline-template`: progress inside isend/irecv/test.
    Inline,
}

/// Checks a plugin name; the error says what is allowed.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= 31
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        return Err(format!(
            "'{name}' is not a plugin name: use lowercase letters, digits and single dashes, \
             starting with a letter, at most 31 characters (e.g. acme, my-net)"
        ));
    }
    if name == "template" || name == "cclkit" || name.starts_with("cclkit-") {
        return Err(format!(
            "'{name}' is taken by cclkit's own plugins; pick another name"
        ));
    }
    Ok(())
}

/// Writes the crate into `dir`; returns the files written, relative to `dir`.
pub fn create(
    dir: &Path,
    template: Template,
    name: &str,
    sdk: &Sdk,
) -> Result<Vec<&'static str>, String> {
    check_name(name)?;
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if entries.next().is_some() {
            return Err(format!("{} exists and is not empty", dir.display()));
        }
    }
    let files = files::render(template, name, sdk);
    std::fs::create_dir_all(dir.join("src")).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    for (rel, text) in &files {
        let path = dir.join(rel);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        if rel.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        written.push(*rel);
    }
    // Renaming changes line lengths: keep the crate `cargo fmt --check` clean (what its
    // ci.sh runs). Best effort: without rustfmt the code is still valid, only unformatted.
    let formatted = std::process::Command::new("rustfmt")
        .args(["--edition", "2024"])
        .arg(dir.join("src/lib.rs"))
        .status();
    if !formatted.is_ok_and(|s| s.success()) {
        eprintln!("cclkit new: note: rustfmt did not run; `cargo fmt` will tidy src/lib.rs");
    }
    Ok(written)
}

/// Runs `cclkit new`.
pub fn run(a: &NewArgs) -> ExitCode {
    let template = match (a.kind, a.template) {
        (NewKind::Net, NetStyle::Threads) => Template::Net,
        (NewKind::Net, NetStyle::Inline) => Template::NetInline,
        (NewKind::Tuner, NetStyle::Threads) => Template::Tuner,
        (NewKind::Tuner, NetStyle::Inline) => {
            eprintln!("cclkit new: --template inline is a net template");
            return ExitCode::from(2);
        }
    };
    let sdk = match Sdk::parse(&a.sdk) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cclkit new: --sdk {}: {e}", a.sdk);
            return ExitCode::from(2);
        }
    };
    let word = template.kind_word();
    let crate_name = format!("nccl-{word}-{}", a.name);
    let dir = a.dir.clone().unwrap_or_else(|| PathBuf::from(&crate_name));
    match create(&dir, template, &a.name, &sdk) {
        Ok(files) => {
            let lib = format!("lib{}.so", crate_name.replace('-', "_"));
            println!(
                "created {} ({crate_name}, {} template): {}",
                dir.display(),
                template.source(),
                files.join(" ")
            );
            println!("next:");
            println!("  cd {} && cargo build --release", dir.display());
            println!("  cclkit package target/release/{lib} --dest target/nccl-plugins");
            println!(
                "  cclkit check target/nccl-plugins/libnccl-{word}-{}.so",
                a.name
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cclkit new: {e}");
            ExitCode::from(2)
        }
    }
}
