//! Report pieces shared by `doctor` and `info`: what a plugin file contains (read from
//! its ELF image, without loading it) and what its devices look like.

use std::path::Path;

use serde::Serialize;

use crate::elf::ElfInfo;
use crate::elf::deps::{DepReport, Resolver};
use cclkit_host::net::Properties;
use cclkit_host::symbols::{self, Family, NET_RELEASES, Release, TUNER_RELEASES};

/// One versioned plugin symbol found in the file.
#[derive(Debug, Clone, Serialize)]
pub struct SymbolReport {
    /// Family (net, collnet, tuner).
    pub family: Family,
    /// Version.
    pub version: u32,
    /// Name.
    pub symbol: String,
    /// `st_size`.
    pub size: u64,
    /// The version's table size, if defined.
    pub expected_size: Option<usize>,
    /// True when it is a data object (NCCL reads it as a struct).
    pub is_object: bool,
}

/// Which version one NCCL release range would use.
#[derive(Debug, Clone, Serialize)]
pub struct Pick {
    /// Release range.
    pub releases: &'static str,
    /// Version it would pick, if any.
    pub version: Option<u32>,
}

/// What a plugin file is, from its ELF image.
#[derive(Debug, Clone, Serialize)]
pub struct FileReport {
    /// The file.
    pub path: String,
    /// `DT_SONAME`.
    pub soname: Option<String>,
    /// `DT_NEEDED`.
    pub needed: Vec<String>,
    /// `DT_RUNPATH`.
    pub runpath: Option<String>,
    /// `DT_RPATH`.
    pub rpath: Option<String>,
    /// Versioned plugin symbols.
    pub symbols: Vec<SymbolReport>,
    /// Net version per NCCL release.
    pub net_picks: Vec<Pick>,
    /// Tuner version per NCCL release.
    pub tuner_picks: Vec<Pick>,
    /// Shared-library dependencies.
    pub dependencies: DepReport,
    /// Problems found in the file itself.
    pub problems: Vec<String>,
}

impl FileReport {
    /// Reads `path` (never loads it).
    pub fn inspect(path: &Path, resolver: &Resolver) -> Result<Self, String> {
        let info = ElfInfo::read(path).map_err(|e| e.to_string())?;
        let mut symbols = Vec::new();
        for family in [Family::Net, Family::CollNet, Family::Tuner] {
            for s in info
                .symbols
                .iter()
                .filter(|s| s.name.starts_with(family.prefix()))
            {
                let Ok(version) = s.name[family.prefix().len()..].parse::<u32>() else {
                    continue;
                };
                symbols.push(SymbolReport {
                    family,
                    version,
                    symbol: s.name.clone(),
                    size: s.size,
                    expected_size: family.table_size(version),
                    is_object: s.kind == crate::elf::STT_OBJECT,
                });
            }
        }
        symbols.sort_by_key(|s| (s.family as u8, std::cmp::Reverse(s.version)));
        let mut problems = Vec::new();
        for s in &symbols {
            if !s.is_object {
                problems.push(format!(
                    "{} is not a data object: NCCL reads the symbol as a struct (export a \
                     static table, not a function)",
                    s.symbol
                ));
            }
            if let Some(e) = s
                .expected_size
                .filter(|e| (s.size as usize) < *e && s.size > 0)
            {
                problems.push(format!(
                    "{} is {} bytes but the v{} table is {e} bytes: built against another header?",
                    s.symbol, s.size, s.version
                ));
            }
        }
        let dependencies = resolver.dependencies(path);
        for m in &dependencies.missing {
            problems.push(format!(
                "missing shared library {} (needed by {})",
                m.name, m.needed_by
            ));
        }
        let versions = |f: Family| -> Vec<u32> {
            symbols
                .iter()
                .filter(|s| s.family == f)
                .map(|s| s.version)
                .collect()
        };
        Ok(Self {
            path: path.display().to_string(),
            soname: info.soname,
            needed: info.needed,
            runpath: info.runpath,
            rpath: info.rpath,
            net_picks: picks(NET_RELEASES, &versions(Family::Net)),
            tuner_picks: picks(TUNER_RELEASES, &versions(Family::Tuner)),
            symbols,
            dependencies,
            problems,
        })
    }

    /// Versions of one family, newest first.
    pub fn versions(&self, family: Family) -> Vec<u32> {
        self.symbols
            .iter()
            .filter(|s| s.family == family)
            .map(|s| s.version)
            .collect()
    }

    /// Indented text lines.
    pub fn lines(&self, indent: &str) -> Vec<String> {
        let mut out = vec![format!("{indent}file: {}", self.path)];
        if let Some(s) = &self.soname {
            out.push(format!("{indent}soname: {s}"));
        }
        if let Some(r) = &self.runpath {
            out.push(format!("{indent}runpath: {r}"));
        }
        if let Some(r) = &self.rpath {
            out.push(format!("{indent}rpath: {r}"));
        }
        if !self.symbols.is_empty() {
            let syms: Vec<String> = self
                .symbols
                .iter()
                .map(|s| format!("{} ({} B)", s.symbol, s.size))
                .collect();
            out.push(format!("{indent}symbols: {}", syms.join(", ")));
        }
        if self.symbols.is_empty() {
            out.push(format!(
                "{indent}exports no net, CollNet or tuner table (ncclNetPlugin_v*, \
                 ncclCollNetPlugin_v*, ncclTunerPlugin_v*)"
            ));
        }
        for (label, picks) in [("net", &self.net_picks), ("tuner", &self.tuner_picks)] {
            if picks.iter().any(|p| p.version.is_some()) {
                let row: Vec<String> = picks
                    .iter()
                    .map(|p| match p.version {
                        Some(v) => format!("{} v{v}", p.releases),
                        None => format!("{} -", p.releases),
                    })
                    .collect();
                out.push(format!("{indent}NCCL picks ({label}): {}", row.join(" | ")));
            }
        }
        let d = &self.dependencies;
        if d.missing.is_empty() {
            out.push(format!(
                "{indent}dependencies: all {} found{}",
                d.resolved.len(),
                if self.needed.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", self.needed.join(", "))
                }
            ));
        }
        for m in &d.missing {
            out.push(format!(
                "{indent}MISSING dependency: {} (needed by {})",
                m.name, m.needed_by
            ));
        }
        out
    }
}

fn picks(releases: &'static [Release], exported: &[u32]) -> Vec<Pick> {
    symbols::picks(releases, exported)
        .into_iter()
        .map(|(r, v)| Pick {
            releases: r.releases,
            version: v,
        })
        .collect()
}

/// One device's properties, for reports.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// Index.
    pub dev: usize,
    /// Name.
    pub name: String,
    /// PCI path.
    pub pci_path: Option<String>,
    /// guid.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: i32,
    /// Decoded pointer support.
    pub ptr_support_names: Vec<&'static str>,
    /// regIsGlobal.
    pub reg_is_global: bool,
    /// forceFlush.
    pub force_flush: bool,
    /// Mbps.
    pub speed_mbps: i32,
    /// Port.
    pub port: i32,
    /// µs.
    pub latency_us: f32,
    /// maxComms.
    pub max_comms: i32,
    /// maxRecvs.
    pub max_recvs: i32,
    /// netDeviceType (raw).
    pub device_type: i32,
    /// netDeviceVersion.
    pub device_version: i32,
    /// Fused physical devices.
    pub vdevs: Vec<i32>,
    /// maxP2pBytes.
    pub max_p2p_bytes: usize,
    /// maxCollBytes.
    pub max_coll_bytes: usize,
    /// maxMultiRequestSize.
    pub max_multi_request_size: i32,
    /// railId.
    pub rail_id: i16,
    /// planeId.
    pub plane_id: i16,
}

impl DeviceReport {
    /// Copies the properties of device `dev`.
    pub fn new(dev: usize, p: &Properties) -> Self {
        use cclkit_abi::raw::common::ptr;
        let names = [
            (ptr::HOST, "HOST"),
            (ptr::CUDA, "CUDA"),
            (ptr::DMABUF, "DMABUF"),
        ]
        .into_iter()
        .filter(|(b, _)| p.ptr_support & b != 0)
        .map(|(_, n)| n)
        .collect();
        Self {
            dev,
            name: p.name.clone(),
            pci_path: p.pci_path.clone(),
            guid: p.guid,
            ptr_support: p.ptr_support,
            ptr_support_names: names,
            reg_is_global: p.reg_is_global,
            force_flush: p.force_flush,
            speed_mbps: p.speed_mbps,
            port: p.port,
            latency_us: p.latency_us,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            device_type: p.device_type.0,
            device_version: p.device_version,
            vdevs: p.vdevs.clone(),
            max_p2p_bytes: p.max_p2p_bytes,
            max_coll_bytes: p.max_coll_bytes,
            max_multi_request_size: p.max_multi_request_size,
            rail_id: p.rail_id,
            plane_id: p.plane_id,
        }
    }

    /// One line of text.
    pub fn line(&self) -> String {
        let ty = cclkit_abi::raw::net::NetDeviceType(self.device_type);
        format!(
            "dev {}: {} speed={} ptr={} type={}{} maxRecvs={} maxComms={} latency={}us \
             regIsGlobal={} forceFlush={} maxP2pBytes={} maxCollBytes={} vdevs={:?} guid={:#x}{}{}",
            self.dev,
            self.name,
            speed(self.speed_mbps),
            if self.ptr_support_names.is_empty() {
                "none".to_owned()
            } else {
                self.ptr_support_names.join("|")
            },
            ty,
            if self.device_version != 0 {
                format!(" v{}", self.device_version)
            } else {
                String::new()
            },
            self.max_recvs,
            self.max_comms,
            self.latency_us,
            self.reg_is_global as u8,
            self.force_flush as u8,
            bytes(self.max_p2p_bytes),
            bytes(self.max_coll_bytes),
            self.vdevs,
            self.guid,
            self.pci_path
                .as_deref()
                .map(|p| format!(" pci={p}"))
                .unwrap_or_default(),
            if self.rail_id >= 0 || self.plane_id >= 0 {
                format!(" rail={} plane={}", self.rail_id, self.plane_id)
            } else {
                String::new()
            }
        )
    }
}

fn speed(mbps: i32) -> String {
    if mbps >= 1000 && mbps % 1000 == 0 {
        format!("{}Gb/s", mbps / 1000)
    } else {
        format!("{mbps}Mb/s")
    }
}

fn bytes(b: usize) -> String {
    const UNITS: [(usize, &str); 3] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB")];
    for (u, n) in UNITS {
        if b >= u && b % u == 0 {
            return format!("{}{n}", b / u);
        }
    }
    b.to_string()
}
