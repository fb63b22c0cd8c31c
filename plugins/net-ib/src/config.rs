//! The plugin's settings: NCCL's `NCCL_IB_*` variables, read once at `init`.
//!
//! Names, defaults and syntax follow NCCL's IB transport so an existing job script
//! behaves the same with this plugin. Unknown or malformed values are reported once
//! and replaced by the default, as NCCL does.

use std::fmt;

use cclkit_abi::nccl_warn;

/// A `NCCL_IB_HCA` / `NCCL_SOCKET_IFNAME` style filter:
/// `[^][=]name[:port][,name[:port]…]` — `^` excludes the listed names, `=` asks for
/// exact names instead of prefixes, `:port` restricts to one port.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NameFilter {
    exclude: bool,
    exact: bool,
    items: Vec<(String, Option<u32>)>,
}

impl NameFilter {
    /// Parses the variable's value (`None` or empty: everything matches).
    pub fn parse(value: Option<&str>) -> Self {
        let mut s = value.unwrap_or("").trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let items = s
            .split(',')
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .map(|i| match i.split_once(':') {
                Some((name, port)) => (name.to_owned(), port.trim().parse().ok()),
                None => (i.to_owned(), None),
            })
            .collect();
        Self {
            exclude,
            exact,
            items,
        }
    }

    /// Whether device `name` port `port` passes. `port = None` asks whether *some*
    /// port of the device may pass (the device-level pre-check): `^mlx5_0:1` still
    /// lets mlx5_0 through to its other ports.
    pub fn matches(&self, name: &str, port: Option<u32>) -> bool {
        if self.items.is_empty() {
            return true;
        }
        let hit = |port_items_count: bool| {
            self.items.iter().any(|(n, p)| {
                let name_ok = if self.exact {
                    name == n
                } else {
                    name.starts_with(n.as_str())
                };
                name_ok
                    && match (p, port) {
                        (None, _) => true,
                        (Some(_), None) => port_items_count,
                        (Some(a), Some(b)) => *a == b,
                    }
            })
        };
        if self.exclude { !hit(false) } else { hit(true) }
    }

    /// True when no name was given.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl fmt::Display for NameFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.items.is_empty() {
            return f.write_str("(all)");
        }
        let list: Vec<String> = self
            .items
            .iter()
            .map(|(n, p)| match p {
                Some(p) => format!("{n}:{p}"),
                None => n.clone(),
            })
            .collect();
        write!(
            f,
            "{}{}{}",
            if self.exclude { "^" } else { "" },
            if self.exact { "=" } else { "" },
            list.join(",")
        )
    }
}

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
    pub hca: NameFilter,
    /// `NCCL_IB_GID_INDEX` (None = choose automatically, RoCE only).
    pub gid_index: Option<u32>,
    /// `NCCL_IB_ROCE_VERSION_NUM` (2).
    pub roce_version: u32,
    /// `NCCL_IB_ADDR_FAMILY` (AF_INET).
    pub addr_family: Family,
    /// `NCCL_IB_TC` (0); a communicator's trafficClass overrides it.
    pub traffic_class: u8,
    /// `NCCL_IB_SL` (0).
    pub sl: u8,
    /// `NCCL_IB_TIMEOUT` (20: 4.096 µs × 2^20 ≈ 4 s per retry).
    pub timeout: u8,
    /// `NCCL_IB_RETRY_CNT` (7).
    pub retry_cnt: u8,
    /// `NCCL_IB_PKEY` (0): P_Key index.
    pub pkey_index: u16,
    /// `NCCL_IB_QPS_PER_CONNECTION` (1, at most 16).
    pub qps_per_connection: usize,
    /// `NCCL_IB_PCI_RELAXED_ORDERING` (2 = when the library supports it).
    pub relaxed_ordering: u32,
    /// `NCCL_GDR_FLUSH_DISABLE` (0).
    pub gdr_flush_disable: bool,
    /// `NCCL_SOCKET_IFNAME`: interfaces for the TCP side channel.
    pub socket_ifname: NameFilter,
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
                Some(v) => match v.trim().parse::<i64>() {
                    Ok(n) if (min..=max).contains(&n) => n,
                    _ => {
                        nccl_warn!(
                            "NET/cclkit-ib: {name}={v} is not an integer in {min}..={max}; using {default}"
                        );
                        default
                    }
                },
            }
        };
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
        Self {
            disable: int("NCCL_IB_DISABLE", 0, 0, 1) == 1,
            hca: NameFilter::parse(get("NCCL_IB_HCA").as_deref()),
            gid_index: u32::try_from(gid).ok(),
            roce_version: int("NCCL_IB_ROCE_VERSION_NUM", 2, 1, 2) as u32,
            addr_family: family("NCCL_IB_ADDR_FAMILY").unwrap_or(Family::V4),
            traffic_class: int("NCCL_IB_TC", 0, 0, 255) as u8,
            sl: int("NCCL_IB_SL", 0, 0, 15) as u8,
            timeout: int("NCCL_IB_TIMEOUT", 20, 1, 31) as u8,
            retry_cnt: int("NCCL_IB_RETRY_CNT", 7, 0, 7) as u8,
            pkey_index: int("NCCL_IB_PKEY", 0, 0, 65_535) as u16,
            qps_per_connection: int("NCCL_IB_QPS_PER_CONNECTION", 1, 1, 16) as usize,
            relaxed_ordering: int("NCCL_IB_PCI_RELAXED_ORDERING", 2, 0, 2) as u32,
            gdr_flush_disable: int("NCCL_GDR_FLUSH_DISABLE", 0, 0, 1) == 1,
            socket_ifname: NameFilter::parse(get("NCCL_SOCKET_IFNAME").as_deref()),
            socket_family: family("NCCL_SOCKET_FAMILY"),
        }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NCCL_IB_HCA={} GID_INDEX={} ROCE_VERSION={} TC={} SL={} TIMEOUT={} RETRY_CNT={} \
             PKEY={} QPS_PER_CONNECTION={} PCI_RELAXED_ORDERING={} GDR_FLUSH_DISABLE={}",
            self.hca,
            self.gid_index
                .map_or_else(|| "auto".to_owned(), |g| g.to_string()),
            self.roce_version,
            self.traffic_class,
            self.sl,
            self.timeout,
            self.retry_cnt,
            self.pkey_index,
            self.qps_per_connection,
            self.relaxed_ordering,
            u8::from(self.gdr_flush_disable),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn hca_filter_follows_nccl_syntax() {
        let all = NameFilter::parse(None);
        assert!(all.matches("mlx5_0", Some(1)));
        let f = NameFilter::parse(Some("mlx5_0:1,mlx5_1"));
        assert!(f.matches("mlx5_0", Some(1)));
        assert!(!f.matches("mlx5_0", Some(2)));
        assert!(f.matches("mlx5_1", Some(2)));
        assert!(f.matches("mlx5_10", Some(1)), "prefix match without '='");
        assert!(!f.matches("mlx4_0", Some(1)));
        assert!(
            f.matches("mlx5_0", None),
            "device-level check ignores ports"
        );
        let exact = NameFilter::parse(Some("=mlx5_1"));
        assert!(exact.matches("mlx5_1", Some(1)));
        assert!(!exact.matches("mlx5_10", Some(1)));
        let not = NameFilter::parse(Some("^mlx5_3"));
        assert!(!not.matches("mlx5_3", Some(1)));
        assert!(not.matches("mlx5_2", Some(1)));
        let not_exact = NameFilter::parse(Some("^=mlx5_1:2"));
        assert!(!not_exact.matches("mlx5_1", Some(2)));
        assert!(not_exact.matches("mlx5_1", Some(1)));
        assert!(not_exact.matches("mlx5_10", Some(2)));
        assert!(
            not_exact.matches("mlx5_1", None),
            "excluding one port keeps the device's other ports"
        );
        let not_dev = NameFilter::parse(Some("^mlx5_1"));
        assert!(!not_dev.matches("mlx5_1", None));
        assert_eq!(not_exact.to_string(), "^=mlx5_1:2");
        let ifname = NameFilter::parse(Some("^docker,lo"));
        assert!(!ifname.matches("docker0", None));
        assert!(ifname.matches("eth0", None));
    }

    #[test]
    fn defaults_and_bad_values_follow_nccl() {
        let c = Config::default();
        assert!(!c.disable);
        assert_eq!(c.gid_index, None);
        assert_eq!((c.roce_version, c.timeout, c.retry_cnt), (2, 20, 7));
        assert_eq!(c.qps_per_connection, 1);
        assert_eq!(c.addr_family, Family::V4);
        let env: HashMap<&str, &str> = [
            ("NCCL_IB_DISABLE", "1"),
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_TC", "106"),
            ("NCCL_IB_SL", "99"),
            ("NCCL_IB_QPS_PER_CONNECTION", "4"),
            ("NCCL_IB_TIMEOUT", "x"),
            ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
            ("NCCL_IB_HCA", "=mlx5_0"),
        ]
        .into_iter()
        .collect();
        let c = Config::from_lookup(|k| env.get(k).map(|v| v.to_string()));
        assert!(c.disable);
        assert_eq!(c.gid_index, Some(3));
        assert_eq!(c.traffic_class, 106);
        assert_eq!(c.sl, 0, "out of range → default");
        assert_eq!(c.timeout, 20, "not a number → default");
        assert_eq!(c.qps_per_connection, 4);
        assert_eq!(c.addr_family, Family::V6);
        assert!(!c.hca.matches("mlx5_01", None));
        assert!(c.to_string().contains("NCCL_IB_HCA==mlx5_0"));
    }
}
