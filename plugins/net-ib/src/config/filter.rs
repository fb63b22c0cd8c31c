//! `NCCL_IB_HCA` / `NCCL_SOCKET_IFNAME` name filters (NCCL's `parseStringList` /
//! `matchIfList` syntax).

use std::fmt;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
