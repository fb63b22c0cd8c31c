//! Every plugin kind NCCL 2.31 loads, recognised by the versioned data symbols a
//! library exports, so that `cclkit info` and `cclkit check` can name what a library
//! is even when cclkit cannot drive it.
//!
//! NCCL finds each kind by `dlsym` of `<prefix><N>`, newest version first
//! (src/plugin/net.cc, tuner.cc, profiler.cc, env.cc, gin.cc, rma.cc; NCCL_ABI.md
//! §3.2–3.4). Several kinds may live in one library (NCCL's `plugins/mixed`).
//! Nothing here calls into the library: symbols are looked up, never run.

use serde::Serialize;

use super::library::Library;

/// A plugin kind NCCL 2.31 loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `ncclNetPlugin_vN` (`NCCL_NET_PLUGIN`).
    Net,
    /// `ncclCollNetPlugin_vN`, searched in the net plugin's library.
    CollNet,
    /// `ncclTunerPlugin_vN` (`NCCL_TUNER_PLUGIN`).
    Tuner,
    /// `ncclProfiler_vN` (`NCCL_PROFILER_PLUGIN`).
    Profiler,
    /// `ncclEnvPlugin_vN` (`NCCL_ENV_PLUGIN`).
    Env,
    /// `ncclGinPlugin_vN` (GPU-initiated networking, `NCCL_GIN_PLUGIN`).
    Gin,
    /// `ncclRmaPlugin_vN` (`NCCL_RMA_PLUGIN`).
    Rma,
}

/// The highest version probed for any kind: newer than any release, so a library
/// built for a later NCCL is still named (and flagged as not loaded by 2.31).
const MAX_PROBED: u32 = 20;

impl Kind {
    /// Every kind, in the order reports list them.
    pub const ALL: [Kind; 7] = [
        Kind::Net,
        Kind::CollNet,
        Kind::Tuner,
        Kind::Profiler,
        Kind::Env,
        Kind::Gin,
        Kind::Rma,
    ];

    /// The name used in reports ("net", "CollNet", "tuner", "profiler", "env",
    /// "GIN", "RMA").
    pub fn label(self) -> &'static str {
        match self {
            Kind::Net => "net",
            Kind::CollNet => "CollNet",
            Kind::Tuner => "tuner",
            Kind::Profiler => "profiler",
            Kind::Env => "env",
            Kind::Gin => "GIN",
            Kind::Rma => "RMA",
        }
    }

    /// The symbol prefix NCCL appends the version to.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Net => "ncclNetPlugin_v",
            Kind::CollNet => "ncclCollNetPlugin_v",
            Kind::Tuner => "ncclTunerPlugin_v",
            Kind::Profiler => "ncclProfiler_v",
            Kind::Env => "ncclEnvPlugin_v",
            Kind::Gin => "ncclGinPlugin_v",
            Kind::Rma => "ncclRmaPlugin_v",
        }
    }

    /// The versions NCCL 2.31.2 tries, in `dlsym` order (NCCL_ABI.md §3.2–3.4).
    pub fn nccl_2_31(self) -> &'static [u32] {
        match self {
            Kind::Net | Kind::CollNet => &[12, 11, 10, 9, 8, 7, 6],
            Kind::Tuner => &[6, 5, 4, 3, 2],
            Kind::Profiler => &[7, 6, 5, 4, 3, 2, 1],
            Kind::Env => &[2, 1],
            Kind::Gin => &[14, 13],
            Kind::Rma => &[15, 14, 13],
        }
    }

    /// True for the kinds `cclkit check` has a conformance suite for. The others are
    /// recognised and named, but their tables are never called.
    pub fn checked_by_cclkit(self) -> bool {
        matches!(self, Kind::Net | Kind::Tuner | Kind::Profiler | Kind::Env)
    }

    /// The symbol of one version (`ncclProfiler_v5`).
    pub fn symbol(self, version: u32) -> String {
        format!("{}{version}", self.prefix())
    }

    /// The kind and version a symbol name denotes (`ncclEnvPlugin_v2` → env v2).
    pub fn parse(symbol: &str) -> Option<(Kind, u32)> {
        Kind::ALL.iter().find_map(|&k| {
            let v = symbol.strip_prefix(k.prefix())?;
            // Digits only: `ncclNetPlugin_v12x` is not a plugin symbol.
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            v.parse().ok().map(|v| (k, v))
        })
    }
}

/// One versioned plugin table a library exports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Found {
    /// Its kind.
    pub kind: Kind,
    /// Its ABI version.
    pub version: u32,
    /// The symbol (`ncclProfiler_v5`).
    pub symbol: String,
    /// True when NCCL 2.31 would consider this version ([`Kind::nccl_2_31`]).
    pub nccl_loads: bool,
}

impl Found {
    fn new(kind: Kind, version: u32) -> Self {
        Self {
            kind,
            version,
            symbol: kind.symbol(version),
            nccl_loads: kind.nccl_2_31().contains(&version),
        }
    }

    /// "profiler v5".
    pub fn label(&self) -> String {
        format!("{} v{}", self.kind.label(), self.version)
    }

    /// The line reports print for a kind cclkit does not check:
    /// "kind profiler v5: not checked by cclkit". `None` for a checked kind.
    pub fn not_checked(&self) -> Option<String> {
        if self.kind.checked_by_cclkit() {
            return None;
        }
        let mut line = format!("kind {}: not checked by cclkit", self.label());
        if !self.nccl_loads {
            line.push_str(" (and NCCL 2.31 does not load this version)");
        }
        Some(line)
    }
}

/// Every plugin table `lib` exports, by kind (in [`Kind::ALL`] order), newest
/// version first. Looks symbols up only.
pub fn classify(lib: &Library) -> Vec<Found> {
    Kind::ALL
        .iter()
        .flat_map(|&k| {
            (1..=MAX_PROBED)
                .rev()
                .filter(move |&v| lib.data_symbol(&k.symbol(v)).is_some())
                .map(move |v| Found::new(k, v))
        })
        .collect()
}

/// The same classification from a list of exported symbol names (e.g. read from the
/// ELF dynamic symbol table without loading the library).
pub fn classify_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<Found> {
    let mut found: Vec<Found> = names
        .into_iter()
        .filter_map(Kind::parse)
        .map(|(k, v)| Found::new(k, v))
        .collect();
    found.sort_by_key(|f| {
        let rank = Kind::ALL.iter().position(|&k| k == f.kind).unwrap_or(0);
        (rank, std::cmp::Reverse(f.version))
    });
    found.dedup();
    found
}

/// True when `found` holds no kind cclkit checks, but at least one that NCCL loads
/// on its own: the library is a plugin, of a kind cclkit only names. (A CollNet table
/// alone does not count: NCCL looks for it only next to a net table.)
pub fn nothing_checkable(found: &[Found]) -> bool {
    !found.iter().any(|f| f.kind.checked_by_cclkit())
        && found.iter().any(|f| f.kind != Kind::CollNet)
}

/// The documented exit status of `cclkit check` when nothing could be checked
/// (docs/check-c-plugin.md), also used when a library exports only kinds cclkit
/// does not check.
pub const EXIT_NOTHING_CHECKED: u8 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_parse_to_kind_and_version() {
        assert_eq!(Kind::parse("ncclProfiler_v5"), Some((Kind::Profiler, 5)));
        assert_eq!(Kind::parse("ncclEnvPlugin_v2"), Some((Kind::Env, 2)));
        assert_eq!(Kind::parse("ncclRmaPlugin_v15"), Some((Kind::Rma, 15)));
        assert_eq!(
            Kind::parse("ncclCollNetPlugin_v9"),
            Some((Kind::CollNet, 9))
        );
        assert_eq!(Kind::parse("ncclNetPlugin_v12x"), None);
        assert_eq!(Kind::parse("ncclNetPlugin_v"), None);
        assert_eq!(Kind::parse("ncclGinPlugin"), None);
    }

    #[test]
    fn names_are_ordered_by_kind_then_newest_and_flag_unchecked_kinds() {
        let f = classify_names([
            "ncclProfiler_v5",
            "ncclEnvPlugin_v2",
            "ncclProfiler_v6",
            "ncclNetPlugin_v12",
            "ncclGinPlugin_v16",
            "unrelated",
        ]);
        let labels: Vec<String> = f.iter().map(Found::label).collect();
        assert_eq!(
            labels,
            ["net v12", "profiler v6", "profiler v5", "env v2", "GIN v16"]
        );
        assert_eq!(f[0].not_checked(), None);
        assert_eq!(f[1].not_checked(), None, "profiler tables are checked");
        assert_eq!(f[3].not_checked(), None, "env tables are checked");
        assert_eq!(
            f[4].not_checked()
                .as_deref()
                .map(|l| l.starts_with("kind GIN v16: not checked")),
            Some(true)
        );
        assert!(!f[4].nccl_loads);
        assert!(!nothing_checkable(&f), "a net table can be checked");
        assert!(!nothing_checkable(&f[3..]), "an env table can be checked");
        assert!(nothing_checkable(&f[4..]));
        assert!(!nothing_checkable(&classify_names([
            "ncclCollNetPlugin_v9"
        ])));
        assert!(!nothing_checkable(&[]));
        assert!(
            f[4].not_checked()
                .is_some_and(|l| l.ends_with("(and NCCL 2.31 does not load this version)"))
        );
    }
}
