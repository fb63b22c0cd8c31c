//! Environment settings, read once at `init` (never on the data path).
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `CCLKIT_OFI_PROVIDER` | efa, other RDM+TAGGED providers, never `sockets` | comma list of providers in preference order (`shm`, `tcp;ofi_rxm,shm`); `tcp` also matches `tcp;ofi_rxm` |
//! | `CCLKIT_OFI_IFACE` | all domains but loopback | comma list of domains (NICs) to use, e.g. `lo` or `efa_0-rdm` |
//! | `CCLKIT_OFI_ADDR` | the domain's own address | node address IP-based endpoints bind to (`fi_getinfo(node, FI_SOURCE)`) |
//! | `CCLKIT_OFI_MAX_RECVS` | 8 | most buffers in one grouped `irecv` (1–8) |
//! | `CCLKIT_OFI_LIVENESS_MS` | 1000 | idle time before a waiting comm checks its peer; 0 disables |
//! | `CCLKIT_OFI_LIVENESS_PROC` | 1 | 0 skips the same-host `/proc` check (then only pings detect a dead peer) |
//! | `CCLKIT_OFI_MR_CACHE` | 1 | 0 disables the registration cache |
//! | `CCLKIT_OFI_GDR` | 1 | 0 reports host memory only even when the provider has `FI_HMEM` (escape hatch for a libfabric built without CUDA support) |
//! | `CCLKIT_OFI_WRITE_BYTES` | on `ofi_rxm` stacks: sizes between its eager and SAR limits | `MIN-MAX` (bytes): sends in that range go as RMA writes into the receive buffer (README "Writes"); `0` = off |
//! | `CCLKIT_OFI_OFFER_WAIT_US` | 16 µs + the send's time at 2 GB/s | longest a send in the write range waits for its receive's offer (README "Writes"), 0–1000000; `0` = never waits |
//! | `CCLKIT_OFI_BUNDLE_SLOTS` | 1 | 0: bundles stay within one eager message (no bundle slots, README "Bundle slots"); slots need bundles and writes |
//! | `CCLKIT_OFI_REGISTER_HOST` | 0 | 1 registers host memory even when the provider does not need it (as if `FI_MR_LOCAL`; exercises EFA's registration path on tcp/shm) |
//!
//! `FI_PROVIDER`, `FI_TCP_IFACE`, `FI_LOG_LEVEL`, … are read by libfabric itself.

use cclkit_abi::{Error, Result, nccl_warn};

/// Most buffers one grouped receive may carry (NCCL's IB transport uses 8 too).
pub const MAX_RECVS_LIMIT: usize = 8;

/// The effective settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Providers in preference order; `None` = the default order.
    pub providers: Option<Vec<String>>,
    /// Domains to use; `None` = every domain except loopback (unless it is the only one).
    pub ifaces: Option<Vec<String>>,
    /// Node address to bind endpoints to.
    pub addr: Option<String>,
    /// Largest grouped receive.
    pub max_recvs: usize,
    /// Idle time before a liveness check, in ms (0 = never).
    pub liveness_ms: u64,
    /// Same-host peers are checked through `/proc`.
    pub liveness_proc: bool,
    /// Registration cache on/off.
    pub mr_cache: bool,
    /// Register host memory even without `FI_MR_LOCAL`.
    pub register_host: bool,
    /// Offer CUDA/DMABUF when the provider has `FI_HMEM`.
    pub gdr: bool,
    /// Bundle size in bytes (`CCLKIT_OFI_BUNDLE_BYTES`, 0 = off); `None` = by provider
    /// (see [`Config::bundle_bytes_for`]).
    pub bundle_bytes: Option<usize>,
    /// `FI_OFI_RXM_BUFFER_SIZE` when set to a number (`ofi_rxm`'s eager buffer).
    pub rxm_buffer: Option<usize>,
    /// Sizes sent as RMA writes (`CCLKIT_OFI_WRITE_BYTES`; `Some(None)` = off);
    /// `None` = by provider (see [`Config::write_range_for`]).
    pub write: Option<Option<(usize, usize)>>,
    /// `FI_OFI_RXM_EAGER_LIMIT` and `FI_OFI_RXM_SAR_LIMIT` when set to numbers.
    pub rxm_limits: (Option<usize>, Option<usize>),
    /// Bundles may outgrow one eager message into the receiver's slots
    /// (`CCLKIT_OFI_BUNDLE_SLOTS`).
    pub bundle_slots: bool,
    /// Longest wait for an offer (`CCLKIT_OFI_OFFER_WAIT_US`); `None` = by size.
    pub offer_wait_us: Option<u64>,
    /// The kernel's TCP congestion control in this network namespace, read at
    /// start (`None` when unreadable): it decides how far writes reach on
    /// socket providers (see [`Config::write_range_for`]).
    pub tcp_cc: Option<String>,
}

/// Largest write: its length travels in 28 bits of the remote CQ data
/// (`engine/write.rs`).
pub const WRITE_MAX: usize = (1 << 28) - 1;
/// `ofi_rxm`'s defaults: eager up to 16 KiB, segmented (SAR) up to 128 KiB.
const RXM_EAGER_LIMIT: usize = 16384;
const RXM_SAR_LIMIT: usize = 131072;

/// Bundle size on socket-based providers when `CCLKIT_OFI_BUNDLE_BYTES` is unset:
/// what `ofi_rxm` sends eagerly in one message (its 16 KiB buffer, less its header
/// and a margin), so a bundle costs one `sendmsg`.
const RXM_BUFFER: usize = 16384;
/// Bundle size on `tcp` without `ofi_rxm` (see [`Config::bundle_bytes_for`]).
pub const NATIVE_TCP_BUNDLE: usize = 128 << 10;
const RXM_MARGIN: usize = 256;

const KNOWN: &[&str] = &[
    "CCLKIT_OFI_PROVIDER",
    "CCLKIT_OFI_IFACE",
    "CCLKIT_OFI_ADDR",
    "CCLKIT_OFI_MAX_RECVS",
    "CCLKIT_OFI_LIVENESS_MS",
    "CCLKIT_OFI_LIVENESS_PROC",
    "CCLKIT_OFI_MR_CACHE",
    "CCLKIT_OFI_REGISTER_HOST",
    "CCLKIT_OFI_GDR",
    "CCLKIT_OFI_BUNDLE_BYTES",
    "CCLKIT_OFI_WRITE_BYTES",
    "CCLKIT_OFI_OFFER_WAIT_US",
];

fn list(value: &str) -> Option<Vec<String>> {
    let items: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    (!items.is_empty()).then_some(items)
}

fn number(name: &str, value: &str, range: std::ops::RangeInclusive<u64>) -> Result<u64> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|v| range.contains(v))
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "{name}={value:?} is not a number in {}..={}",
                range.start(),
                range.end()
            ))
        })
}

/// Parses `MIN-MAX` (bytes, 1 <= MIN <= MAX <= [`WRITE_MAX`]).
fn write_range(value: &str) -> Result<(usize, usize)> {
    let bad = || {
        Error::invalid_argument(format!(
            "CCLKIT_OFI_WRITE_BYTES={value:?} is not 0 or MIN-MAX with 1 <= MIN <= MAX <= {WRITE_MAX}"
        ))
    };
    let (lo, hi) = value.trim().split_once('-').ok_or_else(bad)?;
    let lo: usize = lo.trim().parse().map_err(|_| bad())?;
    let hi: usize = hi.trim().parse().map_err(|_| bad())?;
    if lo == 0 || lo > hi || hi > WRITE_MAX {
        return Err(bad());
    }
    Ok((lo, hi))
}

impl Config {
    /// Reads the settings from `get` (the process environment in production).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let max_recvs = match get("CCLKIT_OFI_MAX_RECVS") {
            Some(v) => number("CCLKIT_OFI_MAX_RECVS", &v, 1..=MAX_RECVS_LIMIT as u64)? as usize,
            None => MAX_RECVS_LIMIT,
        };
        let liveness_ms = match get("CCLKIT_OFI_LIVENESS_MS") {
            Some(v) => number("CCLKIT_OFI_LIVENESS_MS", &v, 0..=3_600_000)?,
            None => 1000,
        };
        let flag = |name: &str, default: bool| -> Result<bool> {
            match get(name) {
                Some(v) => Ok(number(name, &v, 0..=1)? == 1),
                None => Ok(default),
            }
        };
        let mr_cache = flag("CCLKIT_OFI_MR_CACHE", true)?;
        let liveness_proc = flag("CCLKIT_OFI_LIVENESS_PROC", true)?;
        let register_host = flag("CCLKIT_OFI_REGISTER_HOST", false)?;
        let gdr = flag("CCLKIT_OFI_GDR", true)?;
        let bundle_slots = flag("CCLKIT_OFI_BUNDLE_SLOTS", true)?;
        let bundle_bytes = match get("CCLKIT_OFI_BUNDLE_BYTES") {
            Some(v) if v.trim() == "0" => Some(0),
            Some(v) => Some(number("CCLKIT_OFI_BUNDLE_BYTES", &v, 1024..=(4 << 20))? as usize),
            None => None,
        };
        let write = match get("CCLKIT_OFI_WRITE_BYTES") {
            Some(v) if v.trim() == "0" => Some(None),
            Some(v) => Some(Some(write_range(&v)?)),
            None => None,
        };
        let offer_wait_us = get("CCLKIT_OFI_OFFER_WAIT_US")
            .map(|v| number("CCLKIT_OFI_OFFER_WAIT_US", &v, 0..=1_000_000))
            .transpose()?;
        let limit = |name: &str| get(name).and_then(|v| v.trim().parse::<usize>().ok());
        Ok(Self {
            providers: get("CCLKIT_OFI_PROVIDER").as_deref().and_then(list),
            ifaces: get("CCLKIT_OFI_IFACE").as_deref().and_then(list),
            addr: get("CCLKIT_OFI_ADDR")
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty()),
            max_recvs,
            liveness_ms,
            liveness_proc,
            mr_cache,
            register_host,
            gdr,
            bundle_bytes,
            // libfabric's own setting: a value it would reject is not ours to judge.
            rxm_buffer: get("FI_OFI_RXM_BUFFER_SIZE").and_then(|v| v.trim().parse().ok()),
            write,
            rxm_limits: (
                limit("FI_OFI_RXM_EAGER_LIMIT"),
                limit("FI_OFI_RXM_SAR_LIMIT"),
            ),
            bundle_slots,
            offer_wait_us,
            tcp_cc: None,
        })
    }

    /// The sizes `provider` sends as RMA writes, `None` = none: the setting, else
    /// on `ofi_rxm` stacks everything above its eager limit that it segments
    /// through bounce buffers (below its SAR limit), where a write into the
    /// receive buffer ran 1.1-1.6x a tagged send on `tcp;ofi_rxm` (README
    /// "Writes"). Over kernel sockets it reaches on to [`WRITE_MAX`], past
    /// rendezvous (1.03-1.17x from 128 KiB to 4 MiB), unless the congestion
    /// control is BBR or unknown: BBR throttles one-way streams on low-latency
    /// links now and then (a plain TCP stream on loopback ran at a third of its
    /// rate), and a write is one. Eager messages are as fast as a write, and
    /// other providers move large messages without bounce buffers.
    pub fn write_range_for(&self, provider: &str) -> Option<(usize, usize)> {
        if let Some(w) = self.write {
            return w;
        }
        if !provider.split(';').any(|p| p == "ofi_rxm") {
            return None;
        }
        let sockets = provider
            .split(';')
            .any(|p| matches!(p, "tcp" | "sockets" | "net"));
        let steady = self
            .tcp_cc
            .as_deref()
            .is_some_and(|cc| !cc.starts_with("bbr"));
        let eager = self.rxm_limits.0.unwrap_or(RXM_EAGER_LIMIT);
        let top = if sockets && steady {
            WRITE_MAX
        } else {
            let sar = self.rxm_limits.1.unwrap_or(RXM_SAR_LIMIT);
            sar.min(WRITE_MAX + 1).saturating_sub(1)
        };
        (eager < top).then(|| (eager + 1, top))
    }

    /// The bundle size for `provider`: the setting, else on for providers that
    /// put every message on a kernel socket (`tcp`, `sockets`), where a message's
    /// system call costs more than copying it; off for the others (`shm` copies
    /// anyway, NICs post from user space). Under `ofi_rxm`, sized to its eager
    /// buffer (`FI_OFI_RXM_BUFFER_SIZE` when set), beyond which it segments
    /// messages; `tcp` alone (libfabric 2.x's own reliable endpoints, which
    /// libfabric 2.x lists before `tcp;ofi_rxm`) has no such limit, and bundles
    /// of [`NATIVE_TCP_BUNDLE`] streamed 8-32 KiB sends 1.1-1.9x raw libfabric
    /// there, where 16 KiB bundles left them at 0.90-0.94x and 64 KiB ones left
    /// 32 KiB at 0.93-1.04x (docs/PERFORMANCE.md). A receive comm that has
    /// received a bundle keeps eight bundle receives posted: 1 MiB.
    pub fn bundle_bytes_for(&self, provider: &str) -> usize {
        if let Some(n) = self.bundle_bytes {
            return n;
        }
        let sockets = provider.split(';').any(|p| p == "tcp" || p == "sockets");
        if !sockets {
            return 0;
        }
        if provider == "tcp" {
            return NATIVE_TCP_BUNDLE;
        }
        self.rxm_buffer
            .unwrap_or(RXM_BUFFER)
            .saturating_sub(RXM_MARGIN)
            .max(1024)
    }

    /// Reads the process environment and warns about unknown `CCLKIT_OFI_*` names.
    pub fn from_env() -> Result<Self> {
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("CCLKIT_OFI_") && !KNOWN.contains(&name.as_ref()) {
                nccl_warn!("NET/OFI: ignoring unknown setting {name} (known: {KNOWN:?})");
            }
        }
        let mut c = Self::from_lookup(|k| std::env::var(k).ok())?;
        c.tcp_cc = tcp_congestion_control();
        Ok(c)
    }
}

/// The TCP congestion control of this process's network namespace.
fn tcp_congestion_control() -> Option<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
        Config::from_lookup(|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.providers, None);
        assert_eq!(c.ifaces, None);
        assert_eq!(c.max_recvs, 8);
        assert_eq!(c.liveness_ms, 1000);
        assert!(c.mr_cache);
        assert!(c.liveness_proc);
        assert!(!c.register_host);
        assert!(c.gdr);
        assert!(c.bundle_slots);
        assert_eq!(c.bundle_bytes, None);
        assert!(c.bundle_bytes_for("tcp;ofi_rxm") >= 1024);
        assert_eq!(c.bundle_bytes_for("tcp;ofi_rxm"), 16384 - 256);
        assert_eq!(c.bundle_bytes_for("tcp"), NATIVE_TCP_BUNDLE);
        assert_eq!(c.bundle_bytes_for("shm"), 0);
        assert_eq!(c.bundle_bytes_for("efa"), 0);
    }

    #[test]
    fn bundle_setting() {
        assert_eq!(
            cfg(&[("CCLKIT_OFI_BUNDLE_BYTES", "0")])
                .unwrap()
                .bundle_bytes_for("tcp;ofi_rxm"),
            0
        );
        assert_eq!(
            cfg(&[("CCLKIT_OFI_BUNDLE_BYTES", "8192")])
                .unwrap()
                .bundle_bytes_for("shm"),
            8192
        );
        assert_eq!(
            cfg(&[("FI_OFI_RXM_BUFFER_SIZE", "65536")])
                .unwrap()
                .bundle_bytes_for("tcp;ofi_rxm"),
            65536 - 256
        );
        assert!(cfg(&[("CCLKIT_OFI_BUNDLE_BYTES", "100")]).is_err());
        assert!(cfg(&[("CCLKIT_OFI_BUNDLE_BYTES", "lots")]).is_err());
    }

    #[test]
    fn write_setting() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.write_range_for("tcp;ofi_rxm"), Some((16385, 131071)));
        assert_eq!(c.write_range_for("shm"), None);
        assert_eq!(c.write_range_for("efa"), None);
        let c = cfg(&[
            ("FI_OFI_RXM_EAGER_LIMIT", "65536"),
            ("FI_OFI_RXM_SAR_LIMIT", "262144"),
        ])
        .unwrap();
        assert_eq!(c.write_range_for("verbs;ofi_rxm"), Some((65537, 262143)));
        // rxm segmenting nothing (SAR limit at or under the eager limit): no writes.
        let c = cfg(&[("FI_OFI_RXM_SAR_LIMIT", "16384")]).unwrap();
        assert_eq!(c.write_range_for("tcp;ofi_rxm"), None);
        let off = cfg(&[("CCLKIT_OFI_WRITE_BYTES", "0")]).unwrap();
        assert_eq!(off.write_range_for("tcp;ofi_rxm"), None);
        let set = cfg(&[("CCLKIT_OFI_WRITE_BYTES", " 1-4096 ")]).unwrap();
        assert_eq!(set.write_range_for("shm"), Some((1, 4096)));
        for bad in ["4096", "0-10", "10-5", "1-268435456", "a-b", "-5", "5-"] {
            let e = cfg(&[("CCLKIT_OFI_WRITE_BYTES", bad)]).unwrap_err();
            assert!(e.message().contains("CCLKIT_OFI_WRITE_BYTES"), "{bad}: {e}");
        }
    }

    #[test]
    fn writes_reach_past_rendezvous_on_steady_socket_stacks() {
        let with_cc = |pairs: &[(&str, &str)], cc: Option<&str>| {
            let mut c = cfg(pairs).unwrap();
            c.tcp_cc = cc.map(str::to_owned);
            c
        };
        for cc in ["cubic", "reno", "dctcp"] {
            let c = with_cc(&[], Some(cc));
            assert_eq!(
                c.write_range_for("tcp;ofi_rxm"),
                Some((16385, WRITE_MAX)),
                "{cc}"
            );
            assert_eq!(
                c.write_range_for("sockets;ofi_rxm"),
                Some((16385, WRITE_MAX))
            );
            // Not over kernel sockets: rendezvous stays, whatever TCP does.
            assert_eq!(c.write_range_for("verbs;ofi_rxm"), Some((16385, 131071)));
            assert_eq!(c.write_range_for("tcp"), None, "no rxm, no writes");
            // The SAR limit no longer bounds them; the eager limit still does.
            let c = with_cc(&[("FI_OFI_RXM_EAGER_LIMIT", "65536")], Some(cc));
            assert_eq!(c.write_range_for("tcp;ofi_rxm"), Some((65537, WRITE_MAX)));
            let c = with_cc(&[("CCLKIT_OFI_WRITE_BYTES", "0")], Some(cc));
            assert_eq!(c.write_range_for("tcp;ofi_rxm"), None, "the setting wins");
        }
        for cc in [Some("bbr"), Some("bbr2"), None] {
            let c = with_cc(&[], cc);
            assert_eq!(
                c.write_range_for("tcp;ofi_rxm"),
                Some((16385, 131071)),
                "{cc:?}"
            );
        }
    }

    #[test]
    fn reads_this_namespace_congestion_control() {
        let c = Config::from_env().unwrap();
        let kernel = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
            .expect("Linux with IPv4: /proc/sys/net/ipv4/tcp_congestion_control");
        assert_eq!(c.tcp_cc.as_deref(), Some(kernel.trim()));
    }

    #[test]
    fn lists_keep_layered_names() {
        let c = cfg(&[
            ("CCLKIT_OFI_PROVIDER", " tcp;ofi_rxm , shm,"),
            ("CCLKIT_OFI_IFACE", "lo"),
        ])
        .unwrap();
        assert_eq!(
            c.providers,
            Some(vec!["tcp;ofi_rxm".to_owned(), "shm".to_owned()])
        );
        assert_eq!(c.ifaces, Some(vec!["lo".to_owned()]));
    }

    #[test]
    fn bad_numbers_are_errors() {
        assert!(cfg(&[("CCLKIT_OFI_OFFER_WAIT_US", "1000001")]).is_err());
        assert!(cfg(&[("CCLKIT_OFI_OFFER_WAIT_US", "-1")]).is_err());
        assert_eq!(
            cfg(&[("CCLKIT_OFI_OFFER_WAIT_US", " 0")])
                .unwrap()
                .offer_wait_us,
            Some(0)
        );
        assert_eq!(cfg(&[]).unwrap().offer_wait_us, None);
        assert!(cfg(&[("CCLKIT_OFI_MAX_RECVS", "9")]).is_err());
        assert!(cfg(&[("CCLKIT_OFI_MAX_RECVS", "0")]).is_err());
        assert!(cfg(&[("CCLKIT_OFI_MR_CACHE", "yes")]).is_err());
        let e = cfg(&[("CCLKIT_OFI_BUNDLE_SLOTS", "2")]).unwrap_err();
        assert!(e.message().contains("CCLKIT_OFI_BUNDLE_SLOTS"), "{e}");
        assert!(
            !cfg(&[("CCLKIT_OFI_BUNDLE_SLOTS", "0")])
                .unwrap()
                .bundle_slots
        );
        assert!(
            !cfg(&[("CCLKIT_OFI_LIVENESS_PROC", "0")])
                .unwrap()
                .liveness_proc
        );
        assert_eq!(
            cfg(&[("CCLKIT_OFI_LIVENESS_MS", "0")]).unwrap().liveness_ms,
            0
        );
    }
}
