//! `cclkit package LIB.so`: check a built plugin's exported tables, then install it
//! under every name NCCL and RCCL search. The Makefile packages cclkit's own plugins
//! through this same code (`make package`, `make symbols`).
//!
//! The check reads the file's dynamic symbols (no `dlopen`, so nothing of the plugin
//! runs): every versioned table (`ncclNetPlugin_vN`, `ncclTunerPlugin_vN`,
//! `ncclEnvPlugin_vN`, `ncclProfiler_vN`) must be a data object (NCCL `dlsym`s it and
//! reads it as a struct) of exactly its version's size, and at least one version NCCL
//! accepts must be there. `--exact` also demands every version cclkit's export macros
//! publish and nothing of another kind, which is what cclkit's own plugins promise.
//!
//! Installed names (NCCL `plugin_open.cc` prefixes; RCCL renames only the net one):
//! net → `libnccl-net-NAME.so` and `librccl-net-NAME.so`, tuner →
//! `libnccl-tuner-NAME.so`, env → `libnccl-env-NAME.so`, profiler →
//! `libnccl-profiler-NAME.so`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cclkit_host::symbols::Family;

use crate::elf::{ElfInfo, STT_OBJECT};

/// Arguments of `cclkit package`.
#[derive(Debug, clap::Args)]
pub struct PackageArgs {
    /// The built library (e.g. `target/release/libnccl_net_acme.so`).
    pub library: PathBuf,
    /// The plugin name in the installed file names (default: from the file name,
    /// `libnccl_net_acme.so` → `acme`).
    #[arg(long)]
    pub name: Option<String>,
    /// Where to install (default: the library's own directory).
    #[arg(long)]
    pub dest: Option<PathBuf>,
    /// Package only this kind (default: every kind the library exports).
    #[arg(long, value_enum)]
    pub kind: Option<Kind>,
    /// Demand every version cclkit's export macros publish and no other kind's tables.
    #[arg(long)]
    pub exact: bool,
    /// Check the symbols only; install nothing.
    #[arg(long)]
    pub check_only: bool,
    /// Print nothing on success.
    #[arg(long)]
    pub quiet: bool,
}

/// A plugin kind NCCL loads from its own library name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// `ncclNetPlugin_vN` (NCCL_NET_PLUGIN).
    Net,
    /// `ncclTunerPlugin_vN` (NCCL_TUNER_PLUGIN).
    Tuner,
    /// `ncclEnvPlugin_vN` (NCCL_ENV_PLUGIN).
    Env,
    /// `ncclProfiler_vN` (NCCL_PROFILER_PLUGIN).
    Profiler,
}

/// Every kind, in the order they are reported.
pub const KINDS: [Kind; 4] = [Kind::Net, Kind::Tuner, Kind::Env, Kind::Profiler];

impl Kind {
    /// The versioned symbol prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Net => Family::Net.prefix(),
            Kind::Tuner => Family::Tuner.prefix(),
            Kind::Env => "ncclEnvPlugin_v",
            Kind::Profiler => "ncclProfiler_v",
        }
    }

    /// The word used in library names and reports.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Net => "net",
            Kind::Tuner => "tuner",
            Kind::Env => "env",
            Kind::Profiler => "profiler",
        }
    }

    /// The versions cclkit's export macro for this kind publishes (what `--exact` wants;
    /// net and tuner: every version the loader accepts, from `cclkit_host::symbols`).
    pub fn published(self) -> &'static [u32] {
        match self {
            Kind::Net => Family::Net.accepted(),
            Kind::Tuner => Family::Tuner.accepted(),
            Kind::Env => &[1, 2],
            Kind::Profiler => &[1, 2, 3, 4, 5, 6, 7],
        }
    }

    /// The size of a version's table (`None`: a version cclkit has no layout for).
    pub fn table_size(self, version: u32) -> Option<u64> {
        use cclkit_abi::raw::{env, profiler as p};
        let size = match (self, version) {
            (Kind::Net, v) => Family::Net.table_size(v)?,
            (Kind::Tuner, v) => Family::Tuner.table_size(v)?,
            (Kind::Env, 1) => size_of::<env::v1::ncclEnv_v1_t>(),
            (Kind::Env, 2) => size_of::<env::v2::ncclEnv_v2_t>(),
            (Kind::Profiler, 1) => size_of::<p::v1::ncclProfiler_v1_t>(),
            (Kind::Profiler, 2) => size_of::<p::v2::ncclProfiler_v2_t>(),
            (Kind::Profiler, 3) => size_of::<p::v3::ncclProfiler_v3_t>(),
            (Kind::Profiler, 4) => size_of::<p::v4::ncclProfiler_v4_t>(),
            (Kind::Profiler, 5) => size_of::<p::v5::ncclProfiler_v5_t>(),
            (Kind::Profiler, 6) => size_of::<p::v6::ncclProfiler_v6_t>(),
            (Kind::Profiler, 7) => size_of::<p::v7::ncclProfiler_v7_t>(),
            _ => return None,
        };
        Some(size as u64)
    }

    /// The file names NCCL (and RCCL) look for a plugin called `name` under.
    pub fn installed_names(self, name: &str) -> Vec<String> {
        match self {
            Kind::Net => vec![
                format!("libnccl-net-{name}.so"),
                format!("librccl-net-{name}.so"),
            ],
            k => vec![format!("libnccl-{}-{name}.so", k.word())],
        }
    }
}

/// What the symbol check found for one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindReport {
    /// The kind.
    pub kind: Kind,
    /// Versions exported correctly.
    pub versions: Vec<u32>,
    /// Everything wrong, one line each.
    pub problems: Vec<String>,
}

/// Checks the versioned tables of every kind `info` exports (or only `only`).
pub fn check_symbols(info: &ElfInfo, only: Option<Kind>, exact: bool) -> Vec<KindReport> {
    let mut out = Vec::new();
    for kind in KINDS {
        let found: Vec<_> = info
            .symbols
            .iter()
            .filter(|s| s.name.starts_with(kind.prefix()))
            .filter_map(|s| Some((s, s.name[kind.prefix().len()..].parse::<u32>().ok()?)))
            .collect();
        let wanted = only.is_none_or(|k| k == kind);
        if found.is_empty() && !(wanted && only.is_some()) {
            continue;
        }
        let mut r = KindReport {
            kind,
            versions: Vec::new(),
            problems: Vec::new(),
        };
        if !wanted {
            if exact {
                r.problems.push(format!(
                    "also exports {} tables ({}), which a {} plugin must not",
                    kind.word(),
                    found
                        .iter()
                        .map(|(s, _)| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                    only.map_or("", Kind::word)
                ));
                out.push(r);
            }
            continue;
        }
        for (sym, v) in &found {
            if sym.kind != STT_OBJECT {
                r.problems.push(format!(
                    "{} is not a data object (type {}): NCCL reads it as a struct",
                    sym.name, sym.kind
                ));
            } else if let Some(want) = kind.table_size(*v)
                && sym.size != want
            {
                r.problems.push(format!(
                    "{} is {} bytes, the v{v} table is {want}",
                    sym.name, sym.size
                ));
            } else if !kind.published().contains(v) {
                r.problems.push(format!(
                    "{}: no NCCL release cclkit knows accepts {} v{v}",
                    sym.name,
                    kind.word()
                ));
            } else {
                r.versions.push(*v);
            }
        }
        r.versions.sort_unstable();
        if exact {
            for v in kind.published() {
                if !found.iter().any(|(_, f)| f == v) {
                    r.problems.push(format!("missing {}{v}", kind.prefix()));
                }
            }
        } else if r.versions.is_empty() && r.problems.is_empty() {
            r.problems.push(format!(
                "exports no {} table ({}N)",
                kind.word(),
                kind.prefix()
            ));
        }
        out.push(r);
    }
    out
}

/// The plugin name a cargo cdylib file stands for: `libnccl_net_acme.so` → `acme`,
/// `libnccl-tuner-foo.so` → `foo`, `libacme.so` → `acme`.
pub fn default_name(file: &Path) -> Option<String> {
    let stem = file.file_name()?.to_str()?;
    let stem = stem.strip_prefix("lib").unwrap_or(stem);
    let stem = stem.split(".so").next()?;
    let norm = stem.replace('_', "-");
    let bare = [
        "nccl-net-",
        "rccl-net-",
        "nccl-tuner-",
        "nccl-env-",
        "nccl-profiler-",
    ]
    .iter()
    .find_map(|p| norm.strip_prefix(p))
    .unwrap_or(&norm);
    valid_name(bare).then(|| bare.to_owned())
}

/// Plugin names: letters, digits, `-`, `_`, `.`; no path separators; 1–64 bytes.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Copies `src` to `dest/name` through a temporary file and a rename, so a process
/// loading the old file never sees a half-written one.
fn install(src: &Path, dest: &Path, name: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let to = dest.join(name);
    let tmp = dest.join(format!(".{name}.cclkit-package"));
    std::fs::copy(src, &tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &to).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(to)
}

/// Runs `cclkit package`: 0 packaged (or checked), 1 a symbol check failed, 2 usage
/// or I/O error.
pub fn run(a: &PackageArgs) -> ExitCode {
    let fail = |msg: String| {
        eprintln!("cclkit package: {msg}");
        ExitCode::from(2)
    };
    let info = match ElfInfo::read(&a.library) {
        Ok(i) => i,
        Err(e) => return fail(e.to_string()),
    };
    let reports = check_symbols(&info, a.kind, a.exact);
    let lib = a.library.display();
    if reports.is_empty() {
        eprintln!(
            "FAIL {lib}: exports no plugin table (ncclNetPlugin_vN, ncclTunerPlugin_vN, \
             ncclEnvPlugin_vN, ncclProfiler_vN): was it built with export_net!/export_tuner! \
             and crate-type = [\"cdylib\"]?"
        );
        return ExitCode::FAILURE;
    }
    let mut bad = false;
    for r in &reports {
        for p in &r.problems {
            eprintln!("FAIL {lib}: {p}");
            bad = true;
        }
    }
    if bad {
        return ExitCode::FAILURE;
    }
    let summary = |r: &KindReport| {
        let v: Vec<String> = r.versions.iter().map(|v| format!("v{v}")).collect();
        format!("{} {}", r.kind.word(), v.join(" "))
    };
    if a.check_only {
        if !a.quiet {
            let all: Vec<String> = reports.iter().map(summary).collect();
            println!("ok   {lib}: {}", all.join("; "));
        }
        return ExitCode::SUCCESS;
    }
    let name = match a.name.clone().or_else(|| default_name(&a.library)) {
        Some(n) if valid_name(&n) => n,
        Some(n) => return fail(format!("--name {n}: use letters, digits, '-', '_' or '.'")),
        None => {
            return fail(format!(
                "cannot tell the plugin name from {lib}; give --name NAME"
            ));
        }
    };
    let dest = a.dest.clone().unwrap_or_else(|| {
        a.library
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    });
    if let Err(e) = std::fs::create_dir_all(&dest) {
        return fail(format!("{}: {e}", dest.display()));
    }
    for r in &reports {
        for file in r.kind.installed_names(&name) {
            match install(&a.library, &dest, &file) {
                Ok(to) if !a.quiet => println!("installed {} ({})", to.display(), summary(r)),
                Ok(_) => {}
                Err(e) => return fail(format!("installing {file} into {}: {e}", dest.display())),
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::{STT_FUNC, Symbol};

    fn sym(name: &str, kind: u8, size: u64) -> Symbol {
        Symbol {
            name: name.into(),
            kind,
            size,
        }
    }

    fn net_tables() -> Vec<Symbol> {
        (6..=12)
            .map(|v| {
                let size = Kind::Net.table_size(v).expect("net size");
                sym(&format!("ncclNetPlugin_v{v}"), STT_OBJECT, size)
            })
            .collect()
    }

    #[test]
    fn a_complete_net_plugin_passes_exactly() {
        let info = ElfInfo {
            symbols: net_tables(),
            ..ElfInfo::default()
        };
        let r = check_symbols(&info, Some(Kind::Net), true);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].versions, vec![6, 7, 8, 9, 10, 11, 12]);
        assert!(r[0].problems.is_empty(), "{:?}", r[0].problems);
    }

    #[test]
    fn wrong_size_type_missing_and_foreign_tables_are_named() {
        let mut syms = net_tables();
        syms.retain(|s| s.name != "ncclNetPlugin_v9");
        syms[0].size += 8; // v6
        syms[1].kind = STT_FUNC; // v7
        let tuner = Kind::Tuner.table_size(3).expect("tuner size");
        syms.push(sym("ncclTunerPlugin_v3", STT_OBJECT, tuner));
        let info = ElfInfo {
            symbols: syms,
            ..ElfInfo::default()
        };
        let r = check_symbols(&info, Some(Kind::Net), true);
        let all: Vec<&String> = r.iter().flat_map(|k| &k.problems).collect();
        let want = [
            format!(
                "ncclNetPlugin_v6 is {} bytes, the v6 table is {}",
                Kind::Net.table_size(6).unwrap_or(0) + 8,
                Kind::Net.table_size(6).unwrap_or(0)
            ),
            "ncclNetPlugin_v7 is not a data object (type 2): NCCL reads it as a struct".into(),
            "missing ncclNetPlugin_v9".into(),
            "also exports tuner tables (ncclTunerPlugin_v3), which a net plugin must not".into(),
        ];
        for w in &want {
            assert!(all.contains(&w), "missing {w:?} in {all:?}");
        }
        assert_eq!(all.len(), want.len(), "{all:?}");
        // Without --exact, a partial set of correct tables is fine and both kinds count.
        let info = ElfInfo {
            symbols: vec![
                sym(
                    "ncclNetPlugin_v8",
                    STT_OBJECT,
                    Kind::Net.table_size(8).unwrap_or(0),
                ),
                sym("ncclTunerPlugin_v3", STT_OBJECT, tuner),
            ],
            ..ElfInfo::default()
        };
        let r = check_symbols(&info, None, false);
        assert_eq!(
            r.iter()
                .map(|k| (k.kind, k.versions.clone()))
                .collect::<Vec<_>>(),
            vec![(Kind::Net, vec![8]), (Kind::Tuner, vec![3])]
        );
        assert!(r.iter().all(|k| k.problems.is_empty()));
    }

    #[test]
    fn names_come_from_cargo_file_names() {
        for (file, want) in [
            ("target/release/libnccl_net_acme.so", Some("acme")),
            ("libnccl_tuner_my_tune.so", Some("my-tune")),
            ("libnccl-net-x.so", Some("x")),
            ("libacme.so", Some("acme")),
            ("lib.so", None),
        ] {
            assert_eq!(default_name(Path::new(file)).as_deref(), want, "{file}");
        }
        assert!(!valid_name("../x"));
        assert!(!valid_name("a/b"));
        assert!(valid_name("cclkit-socket"));
    }
}
