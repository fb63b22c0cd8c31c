//! The plugin's settings: NCCL's `NCCL_IB_*` variables, read once at `init`.
//!
//! Names, defaults and syntax follow NCCL's IB transport (`NCCL_PARAM` lines of
//! `net_ib/init.cc`, `connect.cc`, `common.cc`, `p2p.cc`) so an existing job script
//! behaves the same with this plugin. Unknown or malformed values are reported once
//! and replaced by the default, as NCCL does. `README.md` lists every variable.

use std::fmt;

use cclkit_abi::nccl_warn;
/// `NCCL_IB_HCA` / `NCCL_SOCKET_IFNAME` lists, read as NCCL's `matchIfList` reads them.
pub use cclkit_abi::sock::IfList;

/// Address family for RoCE GID selection and the side channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4 (GIDs of the form `::ffff:a.b.c.d`).
    V4,
    /// IPv6.
    V6,
}

/// Every setting, with NCCL's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `NCCL_IB_DISABLE=1` turns the plugin off.
    pub disable: bool,
    /// `NCCL_IB_HCA`.
    pub hca: IfList,
    /// `NCCL_IB_GID_INDEX` (-1 = choose automatically). RoCE only, as in NCCL's
    /// `ncclIbGetGidIndex`; IB ports use [`Config::routable_flid_gid_index`] or 0.
    pub gid_index: Option<u32>,
    /// `NCCL_IB_ROUTABLE_FLID_GID_INDEX` (1): the IB GID index tried for a FLID.
    pub routable_flid_gid_index: u32,
    /// `NCCL_IB_ROCE_VERSION_NUM` (2).
    pub roce_version: u32,
    /// `NCCL_IB_ADDR_FAMILY` (AF_INET).
    pub addr_family: Family,
    /// `NCCL_IB_ADDR_RANGE` (`addr/prefixlen`, unset): RoCE GIDs outside are skipped.
    pub addr_range: Option<String>,
    /// `NCCL_IB_TC` (-1 = unset): wins over the communicator's trafficClass.
    pub traffic_class: Option<u8>,
    /// `NCCL_IB_SL` (-1 = unset): wins over the communicator's trafficClass.
    pub sl: Option<u8>,
    /// `NCCL_IB_FIFO_TC` (-1 = unset): traffic class of the receiver's QPs (which carry
    /// the CTS writes) on RoCE.
    pub fifo_tc: Option<u8>,
    /// `NCCL_IB_TIMEOUT` (20: 4.096 µs × 2^20 ≈ 4 s per retry).
    pub timeout: u8,
    /// `NCCL_IB_RETRY_CNT` (7).
    pub retry_cnt: u8,
    /// `NCCL_IB_PKEY` (0): P_Key index.
    pub pkey_index: u16,
    /// `NCCL_IB_QPS_PER_CONNECTION` (1, at most 16).
    pub qps_per_connection: usize,
    /// `NCCL_IB_SPLIT_DATA_ON_QPS` (0): 0 sends each message on one QP, round-robin
    /// over the connection's QPs; 1 splits every message over all of them.
    pub split_data_on_qps: bool,
    /// `NCCL_IB_ADAPTIVE_ROUTING` (-2 = on for InfiniBand ports, off for RoCE).
    pub adaptive_routing: Option<bool>,
    /// `NCCL_IB_AR_THRESHOLD` (8192): with adaptive routing, single messages larger
    /// than this send the immediate in its own work request.
    pub ar_threshold: u64,
    /// `NCCL_IB_ECE_ENABLE` (1): negotiate Enhanced Connection Establishment.
    pub ece_enable: bool,
    /// `NCCL_IB_USE_INLINE` (0): CTS entries posted inline.
    pub use_inline: bool,
    /// `NCCL_IB_OOO_RQ` (0): out-of-order receive queues (mlx5dv only).
    pub ooo_rq: bool,
    /// `NCCL_IB_MERGE_NICS` (1): allow `makeVDevice` to fuse NICs.
    pub merge_nics: bool,
    /// `NCCL_IB_QUERY_PORT_SPEED` (1): use `ibv_query_port_speed` when the library
    /// has it.
    pub query_port_speed: bool,
    /// `NCCL_IB_RETURN_ASYNC_EVENTS` (1): fatal async events fail the comms.
    pub return_async_events: bool,
    /// `NCCL_IB_PCI_RELAXED_ORDERING` (2 = when the library supports it).
    pub relaxed_ordering: u32,
    /// `NCCL_GDR_FLUSH_DISABLE` (0).
    pub gdr_flush_disable: bool,
    /// `NCCL_SOCKET_IFNAME`: interfaces for the TCP side channel.
    pub socket_ifname: IfList,
    /// `NCCL_SOCKET_FAMILY`.
    pub socket_family: Option<Family>,
}

impl Default for Config {
    fn default() -> Self {
        Self::from_lookup(|_| None)
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads settings through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let int = |name: &str, default: i64, min: i64, max: i64| -> i64 {
            match get(name) {
                None => default,
                Some(v) if v.trim().is_empty() => default,
                Some(v) => match v.trim().parse::<i64>() {
                    Ok(n) if (min..=max).contains(&n) || n == default => n,
                    _ => {
                        nccl_warn!(
                            "NET/cclkit-ib: {name}={v} is not an integer in {min}..={max}; using {default}"
                        );
                        default
                    }
                },
            }
        };
        // "-1 = unset" variables of NCCL (NCCL_IB_TC, NCCL_IB_SL, NCCL_IB_FIFO_TC).
        let opt_u8 = |name: &str, max: i64| u8::try_from(int(name, -1, 0, max)).ok();
        let family = |name: &str| -> Option<Family> {
            let v = get(name)?;
            match v.trim() {
                "AF_INET" | "4" => Some(Family::V4),
                "AF_INET6" | "6" => Some(Family::V6),
                other => {
                    nccl_warn!("NET/cclkit-ib: {name}={other} is not AF_INET or AF_INET6; ignored");
                    None
                }
            }
        };
        let gid = int("NCCL_IB_GID_INDEX", -1, -1, 65_535);
        let ar = int("NCCL_IB_ADAPTIVE_ROUTING", -2, 0, 1);
        let ar_threshold = int("NCCL_IB_AR_THRESHOLD", -2, 0, i64::MAX);
        Self {
            disable: int("NCCL_IB_DISABLE", 0, 0, 1) == 1,
            hca: IfList::parse(get("NCCL_IB_HCA").as_deref().unwrap_or("")),
            gid_index: u32::try_from(gid).ok(),
            routable_flid_gid_index: int("NCCL_IB_ROUTABLE_FLID_GID_INDEX", 1, 0, 65_535) as u32,
            roce_version: int("NCCL_IB_ROCE_VERSION_NUM", 2, 1, 2) as u32,
            addr_family: family("NCCL_IB_ADDR_FAMILY").unwrap_or(Family::V4),
            addr_range: get("NCCL_IB_ADDR_RANGE").filter(|s| !s.trim().is_empty()),
            traffic_class: opt_u8("NCCL_IB_TC", 255),
            sl: opt_u8("NCCL_IB_SL", 15),
            fifo_tc: opt_u8("NCCL_IB_FIFO_TC", 255),
            timeout: int("NCCL_IB_TIMEOUT", 20, 1, 31) as u8,
            retry_cnt: int("NCCL_IB_RETRY_CNT", 7, 0, 7) as u8,
            pkey_index: int("NCCL_IB_PKEY", 0, 0, 65_535) as u16,
            qps_per_connection: int("NCCL_IB_QPS_PER_CONNECTION", 1, 1, 16) as usize,
            split_data_on_qps: int("NCCL_IB_SPLIT_DATA_ON_QPS", 0, 0, 1) == 1,
            adaptive_routing: (ar >= 0).then_some(ar == 1),
            ar_threshold: if ar_threshold < 0 {
                8192
            } else {
                ar_threshold as u64
            },
            ece_enable: int("NCCL_IB_ECE_ENABLE", 1, 0, 1) == 1,
            use_inline: int("NCCL_IB_USE_INLINE", 0, 0, 1) == 1,
            ooo_rq: int("NCCL_IB_OOO_RQ", 0, 0, 1) == 1,
            merge_nics: int("NCCL_IB_MERGE_NICS", 1, 0, 1) == 1,
            query_port_speed: int("NCCL_IB_QUERY_PORT_SPEED", 1, 0, 1) == 1,
            return_async_events: int("NCCL_IB_RETURN_ASYNC_EVENTS", 1, 0, 1) == 1,
            relaxed_ordering: int("NCCL_IB_PCI_RELAXED_ORDERING", 2, 0, 2) as u32,
            gdr_flush_disable: int("NCCL_GDR_FLUSH_DISABLE", 0, 0, 1) == 1,
            socket_ifname: IfList::parse(get("NCCL_SOCKET_IFNAME").as_deref().unwrap_or("")),
            socket_family: family("NCCL_SOCKET_FAMILY"),
        }
    }
}

/// A name list for logs: "(all)" when it selects everything.
fn list(l: &IfList) -> String {
    if l.is_empty() && !l.is_exclude() {
        "(all)".to_owned()
    } else {
        l.to_string()
    }
}

fn opt(v: Option<u8>) -> String {
    v.map_or_else(|| "unset".to_owned(), |v| v.to_string())
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NCCL_IB_HCA={} GID_INDEX={} ROCE_VERSION={} TC={} SL={} FIFO_TC={} TIMEOUT={} \
             RETRY_CNT={} PKEY={} QPS_PER_CONNECTION={} SPLIT_DATA_ON_QPS={} \
             ADAPTIVE_ROUTING={} AR_THRESHOLD={} ECE_ENABLE={} USE_INLINE={} \
             PCI_RELAXED_ORDERING={} GDR_FLUSH_DISABLE={}",
            list(&self.hca),
            self.gid_index
                .map_or_else(|| "auto".to_owned(), |g| g.to_string()),
            self.roce_version,
            opt(self.traffic_class),
            opt(self.sl),
            opt(self.fifo_tc),
            self.timeout,
            self.retry_cnt,
            self.pkey_index,
            self.qps_per_connection,
            u8::from(self.split_data_on_qps),
            self.adaptive_routing
                .map_or_else(|| "auto".to_owned(), |a| u8::from(a).to_string()),
            self.ar_threshold,
            u8::from(self.ece_enable),
            u8::from(self.use_inline),
            self.relaxed_ordering,
            u8::from(self.gdr_flush_disable),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Config {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| env.get(k).cloned())
    }

    #[test]
    fn defaults_follow_nccl() {
        let c = Config::default();
        assert!(!c.disable);
        assert_eq!(c.gid_index, None);
        assert_eq!((c.roce_version, c.timeout, c.retry_cnt), (2, 20, 7));
        assert_eq!(c.qps_per_connection, 1);
        assert_eq!(c.addr_family, Family::V4);
        assert_eq!((c.traffic_class, c.sl, c.fifo_tc), (None, None, None));
        assert!(
            !c.split_data_on_qps,
            "NCCL_IB_SPLIT_DATA_ON_QPS defaults to 0"
        );
        assert_eq!(c.adaptive_routing, None, "-2: decided per link layer");
        assert_eq!(c.ar_threshold, 8192);
        assert!(c.ece_enable && c.merge_nics && c.return_async_events);
        assert!(!c.use_inline && !c.ooo_rq);
        assert_eq!(c.routable_flid_gid_index, 1);
        assert_eq!(c.addr_range, None);
    }

    #[test]
    fn set_and_bad_values_follow_nccl() {
        let c = cfg(&[
            ("NCCL_IB_DISABLE", "1"),
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_TC", "106"),
            ("NCCL_IB_SL", "99"),
            ("NCCL_IB_FIFO_TC", "-1"),
            ("NCCL_IB_QPS_PER_CONNECTION", "4"),
            ("NCCL_IB_TIMEOUT", "x"),
            ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
            ("NCCL_IB_ADDR_RANGE", "fd00::/8"),
            ("NCCL_IB_HCA", "=mlx5_0"),
            ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
            ("NCCL_IB_ADAPTIVE_ROUTING", "0"),
            ("NCCL_IB_AR_THRESHOLD", "0"),
            ("NCCL_IB_ECE_ENABLE", "0"),
            ("NCCL_IB_USE_INLINE", "1"),
        ]);
        assert!(c.disable);
        assert_eq!(c.gid_index, Some(3));
        assert_eq!(c.traffic_class, Some(106));
        assert_eq!(c.sl, None, "out of range → default (unset)");
        assert_eq!(c.fifo_tc, None);
        assert_eq!(c.timeout, 20, "not a number → default");
        assert_eq!(c.qps_per_connection, 4);
        assert_eq!(c.addr_family, Family::V6);
        assert_eq!(c.addr_range.as_deref(), Some("fd00::/8"));
        assert!(!c.hca.selects("mlx5_01"));
        assert!(c.split_data_on_qps);
        assert_eq!(c.adaptive_routing, Some(false));
        assert_eq!(c.ar_threshold, 0);
        assert!(!c.ece_enable && c.use_inline);
        let s = c.to_string();
        assert!(
            s.contains("NCCL_IB_HCA==mlx5_0") && s.contains("TC=106"),
            "{s}"
        );
        assert_eq!(
            cfg(&[("NCCL_IB_ADAPTIVE_ROUTING", "1")]).adaptive_routing,
            Some(true)
        );
    }
}
