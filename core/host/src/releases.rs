//! What one NCCL or RCCL release does differently when it loads plugins: the default
//! net library name, the versions it probes per kind, and the kinds it knows
//! (NCCL_ABI.md §3.2–3.6, §4.4b; docs/env-plugin.md). `cclkit doctor --nccl-version`
//! and `--rccl-version` explain a setup under these rules.
//!
//! RCCL releases are named by their ROCm version, because that is what a cluster
//! installs and because RCCL's plugin loader changed between ROCm releases that report
//! the same NCCL-derived RCCL version.

use serde::Serialize;

use super::config::Flavor;
use super::kinds::Kind;
use super::symbols::{NET_RELEASES, Release, TUNER_RELEASES};

/// A release given on the command line: NCCL `2.28` or ROCm `7.2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HostRelease {
    /// NCCL or RCCL.
    pub flavor: Flavor,
    /// Major version (NCCL 2, ROCm 7).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl HostRelease {
    /// Parses `X.Y` (a patch level `X.Y.Z` is accepted and ignored).
    pub fn parse(flavor: Flavor, s: &str) -> Result<Self, String> {
        let mut it = s.trim().split('.');
        let num = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok());
        let (Some(major), Some(minor)) = (num(it.next()), num(it.next())) else {
            return Err(format!("'{s}' is not a release of the form X.Y"));
        };
        if it.next().is_some_and(|p| p.parse::<u32>().is_err()) || it.next().is_some() {
            return Err(format!("'{s}' is not a release of the form X.Y[.Z]"));
        }
        Ok(Self {
            flavor,
            major,
            minor,
        })
    }

    /// "NCCL 2.28" or "RCCL (ROCm 7.2)".
    pub fn label(&self) -> String {
        match self.flavor {
            Flavor::Nccl => format!("NCCL {}.{}", self.major, self.minor),
            Flavor::Rccl => format!("RCCL (ROCm {}.{})", self.major, self.minor),
        }
    }

    fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

/// One plugin kind as a release knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KindRule {
    /// "net", "tuner", "profiler", "env".
    pub kind: &'static str,
    /// Versions probed, newest first; `None` when not recorded for this release.
    pub tries: Option<&'static [u32]>,
    /// A caveat (e.g. only from a patch release on).
    pub note: Option<&'static str>,
}

/// Everything doctor applies for one release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReleaseRules {
    /// The release.
    pub release: HostRelease,
    /// The library opened when `NCCL_NET_PLUGIN` is unset.
    pub net_default: &'static str,
    /// Whether a value of `none` disables the external plugin (NCCL 2.28+); before
    /// that `none` is an ordinary name. `None`: not recorded for this release.
    pub none_disables: Option<bool>,
    /// Whether `NCCL_TUNER_PLUGIN` unset opens `libnccl-tuner.so` (NCCL 2.21+).
    pub tuner_default: Option<bool>,
    /// Kinds the release loads, with the versions it probes.
    pub kinds: Vec<KindRule>,
    /// Facts the rules cannot express (shown by doctor).
    pub notes: Vec<&'static str>,
}

/// The rules of a release, or why there are none.
pub fn rules(r: HostRelease) -> Result<ReleaseRules, String> {
    match r.flavor {
        Flavor::Nccl => nccl(r),
        Flavor::Rccl => rccl(r),
    }
}

/// NCCL rows: net versions from [`NET_RELEASES`] (2.19–2.30), tuner from
/// [`TUNER_RELEASES`] (2.19–2.30), 2.31 from [`Kind::nccl_2_31`], profiler and env
/// from NCCL_ABI.md §3.4 / docs/env-plugin.md.
fn nccl(r: HostRelease) -> Result<ReleaseRules, String> {
    if r.major != 2 || r.minor < 19 || r.minor > 31 {
        return Err(format!(
            "{} is outside what cclkit records (NCCL 2.19 to 2.31)",
            r.label()
        ));
    }
    let v = format!("2.{}", r.minor);
    let row = |table: &'static [Release]| table.iter().find(|x| covers(x.releases, &v));
    let mut kinds = vec![KindRule {
        kind: "net",
        tries: Some(row(NET_RELEASES).map_or(Kind::Net.nccl_2_31(), |x| x.tries)),
        note: None,
    }];
    kinds.push(KindRule {
        kind: "tuner",
        tries: Some(row(TUNER_RELEASES).map_or(Kind::Tuner.nccl_2_31(), |x| x.tries)),
        note: None,
    });
    if r.at_least(2, 23) {
        kinds.push(KindRule {
            kind: "profiler",
            tries: None,
            note: Some(profiler_newest(r.minor)),
        });
    }
    if r.at_least(2, 28) {
        kinds.push(KindRule {
            kind: "env",
            tries: Some(if r.at_least(2, 31) {
                Kind::Env.nccl_2_31()
            } else {
                &[1]
            }),
            note: match r.minor {
                28 => Some("from 2.28.7 only; 2.28.3 and older have no env plugins"),
                30 => Some("2.30.7 tries ncclEnvPlugin_v2 first; 2.30.4 and older v1 only"),
                _ => None,
            },
        });
    }
    let mut notes = Vec::new();
    if r.minor <= 20 {
        notes.push(
            "NCCL 2.19–2.20 open NCCL_TUNER_PLUGIN as given only: no default name, no \
             libnccl-tuner-<value>.so form, no search of the net library",
        );
    }
    if r.minor == 27 {
        notes.push(
            "before 2.27.5 the <prefix>-<value>.so name is also tried for paths and lib….so names",
        );
    }
    if r.minor < 27 {
        notes.push("NCCL_NET_PLUGIN is a single name before 2.27 (no comma-separated list)");
    }
    Ok(ReleaseRules {
        release: r,
        net_default: "libnccl-net.so",
        none_disables: Some(r.minor >= 28),
        tuner_default: Some(r.minor >= 21),
        kinds,
        notes,
    })
}

/// RCCL rows: only the facts recorded in NCCL_ABI.md §4.4b (the default net library
/// name by ROCm release). RCCL's probed versions follow its NCCL sync, which is not
/// recorded per ROCm release, so they are left `None`.
fn rccl(r: HostRelease) -> Result<ReleaseRules, String> {
    if !(r.major == 6 || r.major == 7) {
        return Err(format!(
            "{} is outside what cclkit records (ROCm 6.0 to 7.x)",
            r.label()
        ));
    }
    let (net_default, note) = if (r.major, r.minor) == (7, 2) {
        (
            "libnccl-net.so",
            "ROCm 7.2's RCCL opens libnccl-net.so when NCCL_NET_PLUGIN is unset (its NCCL \
             sync replaced RCCL's name); rocm-systems PR #4201 (2026-03) restores \
             librccl-net.so, so a later 7.2.x point release may differ",
        )
    } else if r.at_least(7, 3) {
        (
            "librccl-net.so",
            "RCCL after rocm-systems PR #4201 (2026-03) opens librccl-net.so when \
             NCCL_NET_PLUGIN is unset",
        )
    } else {
        (
            "librccl-net.so",
            "RCCL up to ROCm 7.1 opens librccl-net.so when NCCL_NET_PLUGIN is unset",
        )
    };
    let unknown = |kind| KindRule {
        kind,
        tries: None,
        note: Some("follows RCCL's NCCL sync; not recorded per ROCm release"),
    };
    Ok(ReleaseRules {
        release: r,
        net_default,
        none_disables: None,
        tuner_default: None,
        kinds: vec![unknown("net"), unknown("tuner"), unknown("profiler")],
        notes: vec![note],
    })
}

/// True when a release-range label ("2.20–2.23", "2.30") covers `v` ("2.21").
fn covers(range: &str, v: &str) -> bool {
    let minor = |s: &str| s.strip_prefix("2.").and_then(|m| m.parse::<u32>().ok());
    let Some(want) = minor(v) else { return false };
    match range.split_once('–') {
        Some((a, b)) => {
            matches!((minor(a), minor(b)), (Some(a), Some(b)) if (a..=b).contains(&want))
        }
        None => minor(range) == Some(want),
    }
}

fn profiler_newest(minor: u32) -> &'static str {
    match minor {
        23 => "ncclProfiler_v1 (introduced in 2.23)",
        24 | 25 => "up to ncclProfiler_v2",
        26 => "up to ncclProfiler_v3",
        27 => "up to ncclProfiler_v4",
        28 => "up to ncclProfiler_v5",
        29 | 30 => "up to ncclProfiler_v6",
        _ => "up to ncclProfiler_v7",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_labels_cover_ranges() {
        assert!(covers("2.20–2.23", "2.21") && covers("2.20–2.23", "2.23"));
        assert!(!covers("2.20–2.23", "2.24") && !covers("2.30", "2.3"));
        assert!(covers("2.30", "2.30") && !covers("after 2.31 (source)", "2.31"));
    }

    #[test]
    fn parse_accepts_x_y_and_patch_only() {
        let r = HostRelease::parse(Flavor::Nccl, "2.28.7").expect("patch");
        assert_eq!((r.major, r.minor), (2, 28));
        for bad in ["2", "2.x", "2.28.7.1", "", "2.28.a"] {
            assert!(HostRelease::parse(Flavor::Nccl, bad).is_err(), "{bad}");
        }
    }
}
