//! Versioned plugin symbols: which ones a library exports, and which one each NCCL
//! release would pick (NCCL_ABI.md §3.2, §3.3, §3.5).

use serde::Serialize;

use super::library::{Library, symbol_size};

/// Every versioned symbol family a library may export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `ncclNetPlugin_vN`.
    Net,
    /// `ncclCollNetPlugin_vN`.
    CollNet,
    /// `ncclTunerPlugin_vN`.
    Tuner,
    /// `ncclProfiler_vN`.
    Profiler,
    /// `ncclEnvPlugin_vN`.
    Env,
}

impl Family {
    /// The symbol name prefix (`ncclNetPlugin_v`).
    pub fn prefix(self) -> &'static str {
        match self {
            Family::Net => "ncclNetPlugin_v",
            Family::CollNet => "ncclCollNetPlugin_v",
            Family::Tuner => "ncclTunerPlugin_v",
            Family::Profiler => "ncclProfiler_v",
            Family::Env => "ncclEnvPlugin_v",
        }
    }

    /// Every version ever defined, newest first (what [`exported`] probes).
    pub fn all_versions(self) -> &'static [u32] {
        match self {
            Family::Net => &[12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2],
            Family::CollNet => &[12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2],
            Family::Tuner | Family::Profiler => &[7, 6, 5, 4, 3, 2, 1],
            Family::Env => &[2, 1],
        }
    }

    /// The symbol name of a version (`ncclNetPlugin_v12`).
    pub fn symbol(self, version: u32) -> String {
        format!("{}{version}", self.prefix())
    }

    /// The size in bytes of a version's table, where the ABI defines it.
    pub fn table_size(self, version: u32) -> Option<usize> {
        use cclkit_abi::raw::{collnet, net, profiler, tuner};
        use std::mem::size_of;
        Some(match (self, version) {
            (Family::Net, 12) => size_of::<net::v12::ncclNet_v12_t>(),
            (Family::Net, 11) => size_of::<net::v11::ncclNet_v11_t>(),
            (Family::Net, 10) => size_of::<net::v10::ncclNet_v10_t>(),
            (Family::Net, 9) => size_of::<net::v9::ncclNet_v9_t>(),
            (Family::Net, 8) => size_of::<net::v8::ncclNet_v8_t>(),
            (Family::Net, 7) => size_of::<net::v7::ncclNet_v7_t>(),
            (Family::Net, 6) => size_of::<net::v6::ncclNet_v6_t>(),
            (Family::CollNet, 12) => size_of::<collnet::ncclCollNet_v12_t>(),
            (Family::CollNet, 11) => size_of::<collnet::ncclCollNet_v11_t>(),
            (Family::CollNet, 10) => size_of::<collnet::ncclCollNet_v10_t>(),
            (Family::CollNet, 9) => size_of::<collnet::ncclCollNet_v9_t>(),
            (Family::CollNet, 8) => size_of::<collnet::ncclCollNet_v8_t>(),
            (Family::CollNet, 7) => size_of::<collnet::ncclCollNet_v7_t>(),
            (Family::CollNet, 6) => size_of::<collnet::ncclCollNet_v6_t>(),
            (Family::Tuner, 7) => size_of::<tuner::ncclTuner_v7_t>(),
            (Family::Tuner, 6) => size_of::<tuner::ncclTuner_v6_t>(),
            (Family::Tuner, 5) => size_of::<tuner::ncclTuner_v5_t>(),
            (Family::Tuner, 4) => size_of::<tuner::ncclTuner_v4_t>(),
            (Family::Tuner, 3) => size_of::<tuner::ncclTuner_v3_t>(),
            (Family::Tuner, 2) => size_of::<tuner::ncclTuner_v2_t>(),
            (Family::Tuner, 1) => size_of::<tuner::ncclTuner_v1_t>(),
            (Family::Profiler, 7) => size_of::<profiler::v7::ncclProfiler_v7_t>(),
            (Family::Profiler, 6) => size_of::<profiler::v6::ncclProfiler_v6_t>(),
            (Family::Profiler, 5) => size_of::<profiler::v5::ncclProfiler_v5_t>(),
            (Family::Profiler, 4) => size_of::<profiler::v4::ncclProfiler_v4_t>(),
            (Family::Profiler, 3) => size_of::<profiler::v3::ncclProfiler_v3_t>(),
            (Family::Profiler, 2) => size_of::<profiler::v2::ncclProfiler_v2_t>(),
            (Family::Profiler, 1) => size_of::<profiler::v1::ncclProfiler_v1_t>(),
            (Family::Env, 2) => size_of::<cclkit_abi::raw::env::ncclEnv_v2_t>(),
            (Family::Env, 1) => size_of::<cclkit_abi::raw::env::ncclEnv_v1_t>(),
            _ => return None,
        })
    }

    /// The versions NCCL 2.30 (and cclkit) accepts, in `dlsym` order.
    pub fn accepted(self) -> &'static [u32] {
        match self {
            Family::Net | Family::CollNet => &[12, 11, 10, 9, 8, 7, 6],
            // NCCL 2.30 stops at v2; cclkit also accepts v1 (NCCL 2.19–2.20 tuners)
            // and v7 (in NCCL's source after 2.31, tried first there).
            Family::Tuner => &[7, 6, 5, 4, 3, 2, 1],
            // NCCL 2.31.2 tries _v7 … _v1 (NCCL_ABI.md §3.4).
            Family::Profiler => &[7, 6, 5, 4, 3, 2, 1],
            // NCCL 2.30.7 tries _v2, then _v1 (2.28.7–2.30.4 know only _v1).
            Family::Env => &[2, 1],
        }
    }
}

/// One exported versioned symbol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exported {
    /// Symbol family.
    pub family: Family,
    /// ABI version.
    pub version: u32,
    /// Symbol name.
    pub symbol: String,
    /// `st_size` of the object, when the dynamic linker knows it.
    pub size: Option<usize>,
    /// The table size this version must have, when defined.
    pub expected_size: Option<usize>,
}

impl Exported {
    /// True when the object is known to be smaller than its version's table.
    pub fn too_small(&self) -> bool {
        matches!((self.size, self.expected_size), (Some(s), Some(e)) if s < e)
    }
}

/// Every versioned plugin symbol `lib` exports, newest first per family.
pub fn exported(lib: &Library, family: Family) -> Vec<Exported> {
    family
        .all_versions()
        .iter()
        .filter_map(|&v| {
            let symbol = family.symbol(v);
            let addr = lib.data_symbol(&symbol)?;
            Some(Exported {
                family,
                version: v,
                size: symbol_size(addr),
                expected_size: family.table_size(v),
                symbol,
            })
        })
        .collect()
}

/// The `name` field (offset 0 of every plugin table) of an exported table.
pub fn table_name(lib: &Library, symbol: &str) -> Option<String> {
    let addr = lib.data_symbol(symbol)?;
    // SAFETY: every versioned NCCL plugin table starts with `const char* name`; the
    // symbol is at least pointer-sized (a table), mapped while `lib` is alive.
    let name = unsafe { addr.cast::<*const std::ffi::c_char>().read() };
    if name.is_null() {
        return None;
    }
    // SAFETY: a non-NULL name is a NUL-terminated string owned by the loaded plugin.
    Some(
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// One NCCL release range and the versions it tries, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Release {
    /// Releases this row covers ("2.20–2.23").
    pub releases: &'static str,
    /// Versions tried, in order.
    pub tries: &'static [u32],
}

/// Net symbol search per NCCL release (NCCL_ABI.md §3.5), 2.19 to 2.30.
pub const NET_RELEASES: &[Release] = &[
    Release {
        releases: "2.19",
        tries: &[7, 6, 5],
    },
    Release {
        releases: "2.20–2.23",
        tries: &[8, 7, 6, 5],
    },
    Release {
        releases: "2.24–2.25",
        tries: &[9, 8, 7, 6, 5],
    },
    Release {
        releases: "2.26–2.27",
        tries: &[10, 9, 8, 7, 6],
    },
    Release {
        releases: "2.28–2.29",
        tries: &[11, 10, 9, 8, 7, 6],
    },
    Release {
        releases: "2.30",
        tries: &[12, 11, 10, 9, 8, 7, 6],
    },
];

/// Tuner symbol search per NCCL release (NCCL_ABI.md §3.3, §4.4b), 2.19 to the v7
/// tuner in NCCL's source after 2.31.
pub const TUNER_RELEASES: &[Release] = &[
    Release {
        releases: "2.19–2.20",
        tries: &[1],
    },
    Release {
        releases: "2.21",
        tries: &[2],
    },
    Release {
        releases: "2.22–2.23",
        tries: &[3, 2],
    },
    Release {
        releases: "2.24–2.27",
        tries: &[4, 3, 2],
    },
    Release {
        releases: "2.28–2.29",
        tries: &[5, 4, 3, 2],
    },
    Release {
        releases: "2.30",
        tries: &[6, 5, 4, 3, 2],
    },
    Release {
        releases: "after 2.31 (source)",
        tries: &[7, 6, 5, 4, 3, 2],
    },
];

/// What one release range would pick from the exported versions (`None`: nothing,
/// so that release would not use the library).
pub fn picks(releases: &'static [Release], exported: &[u32]) -> Vec<(Release, Option<u32>)> {
    releases
        .iter()
        .map(|r| (*r, r.tries.iter().copied().find(|v| exported.contains(v))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_picks() {
        let p = picks(NET_RELEASES, &[12, 9, 6]);
        let got: Vec<_> = p.iter().map(|(r, v)| (r.releases, *v)).collect();
        assert_eq!(
            got,
            [
                ("2.19", Some(6)),
                ("2.20–2.23", Some(6)),
                ("2.24–2.25", Some(9)),
                ("2.26–2.27", Some(9)),
                ("2.28–2.29", Some(9)),
                ("2.30", Some(12)),
            ]
        );
        let only_v5 = picks(NET_RELEASES, &[5]);
        assert_eq!(only_v5[2].1, Some(5));
        assert_eq!(only_v5[3].1, None);
        // v4 alone: 2.24–2.27, 2.28–2.29, 2.30 and the v7-era release take it.
        let tuner = picks(TUNER_RELEASES, &[4]);
        assert_eq!(tuner.iter().filter(|(_, v)| v.is_some()).count(), 4);
        // v7 alone: only the release whose source has v7.
        let v7 = picks(TUNER_RELEASES, &[7]);
        assert_eq!(
            v7.iter()
                .filter_map(|(r, v)| v.map(|v| (r.releases, v)))
                .collect::<Vec<_>>(),
            vec![("after 2.31 (source)", 7)]
        );
    }

    #[test]
    fn table_sizes_match_the_abi() {
        assert_eq!(Family::Net.table_size(12), Some(176));
        assert_eq!(Family::Net.table_size(6), Some(136));
        assert_eq!(Family::Net.table_size(5), None);
        assert_eq!(Family::Tuner.table_size(6), Some(40));
        assert_eq!(Family::Tuner.table_size(7), Some(40));
        assert_eq!(Family::CollNet.table_size(12), Some(152));
    }
}
