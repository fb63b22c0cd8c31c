//! `NCCL_SOCKET_IFNAME` / `NCCL_IB_HCA` name lists, as NCCL's `parseStringList` and
//! `matchIfList` read them (NCCL 2.30 `src/misc/utils.cc`).

use std::fmt;

/// One list entry: a name (prefix or exact) and an optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    port: Option<u32>,
}

/// A parsed list `[^][=]name[:port][,name[:port]…]`.
///
/// Names are prefixes (`eth` selects `eth0` and `eth12`) unless the list starts with
/// `=` (whole names); a leading `^` turns the list into an exclusion list. As in
/// NCCL, an empty list selects everything and `^` followed by nothing selects
/// nothing. Fields after the port (NCCL's rail and plane) are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IfList {
    exclude: bool,
    exact: bool,
    entries: Vec<Entry>,
}

impl IfList {
    /// Parses a value; blanks around entries are ignored, empty entries skipped.
    pub fn parse(spec: &str) -> Self {
        let mut s = spec.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let entries = s
            .split(',')
            .map(str::trim)
            .filter_map(|e| {
                let mut parts = e.split(':');
                let name = parts.next().filter(|n| !n.is_empty())?;
                // NCCL reads the port with atoi; an unreadable one means "any".
                let port = parts.next().and_then(|p| p.trim().parse().ok());
                Some(Entry {
                    name: name.to_owned(),
                    port,
                })
            })
            .collect();
        Self {
            exclude,
            exact,
            entries,
        }
    }

    /// Whether `name` (and `port`, `None` = any port) is selected: NCCL's
    /// `matchIfList(name, port) ^ searchNot`.
    pub fn matches(&self, name: &str, port: Option<u32>) -> bool {
        let listed = self.entries.is_empty()
            || self.entries.iter().any(|e| {
                let name_ok = if self.exact {
                    e.name == name
                } else {
                    name.starts_with(e.name.as_str())
                };
                let port_ok = match (e.port, port) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                };
                name_ok && port_ok
            });
        listed != self.exclude
    }

    /// Whether interface `name` is selected (ports play no part for interfaces).
    pub fn selects(&self, name: &str) -> bool {
        self.matches(name, None)
    }

    /// True when the list names nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True for a `^` list.
    pub fn is_exclude(&self) -> bool {
        self.exclude
    }
}

impl fmt::Display for IfList {
    /// The list in NCCL's syntax (what `parse` reads back to the same list).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&e.name)?;
            if let Some(p) = e.port {
                write!(f, ":{p}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_exclusion_and_exact_names() {
        let l = IfList::parse("eth,ib0");
        assert!(l.selects("eth0") && l.selects("eth12") && l.selects("ib0"));
        assert!(!l.selects("ib1") && !l.selects("lo") && !l.selects("et"));
        let l = IfList::parse("^docker,lo");
        assert!(l.selects("eth0") && !l.selects("docker0") && !l.selects("lo"));
        assert!(!l.selects("lo2"), "prefix exclusion");
        let l = IfList::parse("=eth0");
        assert!(l.selects("eth0") && !l.selects("eth01") && !l.selects("eth"));
        let l = IfList::parse("^=eth0:5000");
        assert!(!l.selects("eth0") && l.selects("eth01"));
    }

    #[test]
    fn empty_lists_follow_nccl() {
        assert!(IfList::parse("").selects("anything"));
        assert!(IfList::parse(" , ,").selects("anything"));
        // matchIfList answers true for an empty list, and `^` inverts it.
        assert!(!IfList::parse("^").selects("eth0"));
        assert!(IfList::parse("").is_empty());
    }

    #[test]
    fn ports_restrict_only_when_both_sides_have_one() {
        let l = IfList::parse("mlx5_0:1,mlx5_1");
        assert!(l.matches("mlx5_0", Some(1)) && !l.matches("mlx5_0", Some(2)));
        assert!(l.matches("mlx5_0", None));
        assert!(l.matches("mlx5_1", Some(7)));
        let l = IfList::parse("^mlx5_0:1");
        assert!(!l.matches("mlx5_0", Some(1)) && l.matches("mlx5_0", Some(2)));
        // Rail and plane fields are read past; a bad port means any port.
        let l = IfList::parse("mlx5_2:1:0:3,mlx5_3:x");
        assert!(l.matches("mlx5_2", Some(1)) && !l.matches("mlx5_2", Some(2)));
        assert!(l.matches("mlx5_3", Some(9)));
    }

    #[test]
    fn display_round_trips() {
        for spec in ["^=eth0:5000,ib", "eth,lo", "", "=mlx5_0:1"] {
            let l = IfList::parse(spec);
            assert_eq!(l.to_string(), spec);
            assert_eq!(IfList::parse(&l.to_string()), l);
        }
    }
}
