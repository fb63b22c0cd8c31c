//! The environment, read once at `init` into a typed [`Config`].
//!
//! NCCL's names where NCCL has the knob (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`,
//! `NCCL_SOCKET_NTHREADS`, `NCCL_NSOCKS_PERTHREAD`, `NCCL_SOCKET_INLINE`,
//! `NCCL_SOCKET_MIN_TASKSIZE`); `CCLKIT_SOCKET_*` for what is ours.

use std::fmt;
use std::time::Duration;

use cclkit_abi::{Error, Result};

use crate::wire::{MAX_RECVS, MAX_STREAMS};

/// Address family restriction (`NCCL_SOCKET_FAMILY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
}

/// Effective settings of the plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `NCCL_SOCKET_IFNAME`: interface selection list (NCCL syntax).
    pub ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY`.
    pub family: Option<Family>,
    /// `NCCL_SOCKET_NTHREADS` (0…16); `None` = auto from the interface.
    pub nthreads: Option<usize>,
    /// `NCCL_NSOCKS_PERTHREAD` (≥ 1); `None` = auto from the interface.
    pub socks_per_thread: Option<usize>,
    /// `NCCL_SOCKET_INLINE`: payloads up to this many bytes ride on the control
    /// stream with their header instead of being handed to helper threads.
    pub inline_bytes: usize,
    /// `NCCL_SOCKET_MIN_TASKSIZE`: smallest chunk a message is cut into.
    pub min_chunk: usize,
    /// `CCLKIT_SOCKET_MAX_RECVS`: buffers per grouped receive (1 = no grouping).
    pub max_recvs: usize,
    /// `CCLKIT_SOCKET_CONNECT_TIMEOUT_MS`: how long a connect may stay incomplete.
    pub connect_timeout: Duration,
}

/// Names of our own variables (anything else starting with the prefix is a typo).
const OWN_VARS: &[&str] = &[
    "CCLKIT_SOCKET_MAX_RECVS",
    "CCLKIT_SOCKET_CONNECT_TIMEOUT_MS",
];
const OWN_PREFIX: &str = "CCLKIT_SOCKET_";

impl Default for Config {
    fn default() -> Self {
        Self {
            ifname: None,
            family: None,
            nthreads: None,
            socks_per_thread: None,
            inline_bytes: 64 * 1024,
            min_chunk: 64 * 1024,
            // Grouped receives cost a clear-to-send record per receive (about one
            // syscall on each side of every message); opt in where NCCL groups.
            max_recvs: 1,
            connect_timeout: Duration::from_secs(120),
        }
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<(Self, Vec<String>)> {
        let names: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .collect();
        Self::parse(|name| std::env::var(name).ok(), &names)
    }

    /// Builds a config from `lookup`; `names` are every variable set (to find unknown
    /// `CCLKIT_SOCKET_*` ones). Returns the config and one warning per unknown name.
    pub fn parse(
        lookup: impl Fn(&str) -> Option<String>,
        names: &[String],
    ) -> Result<(Self, Vec<String>)> {
        let mut cfg = Self::default();
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        cfg.ifname = get("NCCL_SOCKET_IFNAME").map(|s| s.trim().to_owned());
        if let Some(v) = get("NCCL_SOCKET_FAMILY") {
            cfg.family = Some(match v.trim().to_ascii_uppercase().as_str() {
                "AF_INET" | "4" | "IPV4" => Family::V4,
                "AF_INET6" | "6" | "IPV6" => Family::V6,
                other => {
                    return Err(Error::invalid_argument(format!(
                        "NCCL_SOCKET_FAMILY={other}: expected AF_INET or AF_INET6"
                    )));
                }
            });
        }
        cfg.nthreads = auto_or(get("NCCL_SOCKET_NTHREADS"), "NCCL_SOCKET_NTHREADS", 0, 16)?;
        cfg.socks_per_thread = auto_or(
            get("NCCL_NSOCKS_PERTHREAD"),
            "NCCL_NSOCKS_PERTHREAD",
            1,
            MAX_STREAMS,
        )?;
        if let (Some(t), Some(s)) = (cfg.nthreads, cfg.socks_per_thread) {
            if t * s > MAX_STREAMS {
                return Err(Error::invalid_argument(format!(
                    "NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD = {} exceeds {MAX_STREAMS}",
                    t * s
                )));
            }
        }
        if let Some(v) = get("NCCL_SOCKET_INLINE") {
            cfg.inline_bytes = number(&v, "NCCL_SOCKET_INLINE", 0, 1 << 30)?;
        }
        if let Some(v) = get("NCCL_SOCKET_MIN_TASKSIZE") {
            cfg.min_chunk = number(&v, "NCCL_SOCKET_MIN_TASKSIZE", 4096, 1 << 30)?;
        }
        if let Some(v) = get("CCLKIT_SOCKET_MAX_RECVS") {
            cfg.max_recvs = number(&v, "CCLKIT_SOCKET_MAX_RECVS", 1, MAX_RECVS)?;
        }
        if let Some(v) = get("CCLKIT_SOCKET_CONNECT_TIMEOUT_MS") {
            let ms = number(&v, "CCLKIT_SOCKET_CONNECT_TIMEOUT_MS", 1, 86_400_000)?;
            cfg.connect_timeout = Duration::from_millis(ms as u64);
        }
        let warnings = names
            .iter()
            .filter(|n| n.starts_with(OWN_PREFIX) && !OWN_VARS.contains(&n.as_str()))
            .map(|n| {
                format!(
                    "cclkit-socket: ignoring unknown variable {n} (known: {})",
                    OWN_VARS.join(", ")
                )
            })
            .collect();
        Ok((cfg, warnings))
    }

    /// Whether comms run in grouped (clear-to-send) mode.
    pub fn grouped(&self) -> bool {
        self.max_recvs > 1
    }
}

/// `-1`/`-2`/unset mean auto (NCCL uses -2); otherwise a number in `lo..=hi`.
fn auto_or(value: Option<String>, name: &str, lo: usize, hi: usize) -> Result<Option<usize>> {
    match value {
        None => Ok(None),
        Some(v) if matches!(v.trim(), "-1" | "-2") => Ok(None),
        Some(v) => number(&v, name, lo, hi).map(Some),
    }
}

fn number(value: &str, name: &str, lo: usize, hi: usize) -> Result<usize> {
    value
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "{name}={value}: expected a whole number in {lo}..={hi}"
            ))
        })
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auto = |v: Option<usize>| v.map_or_else(|| "auto".to_owned(), |n| n.to_string());
        write!(
            f,
            "NCCL_SOCKET_IFNAME={} NCCL_SOCKET_FAMILY={} NCCL_SOCKET_NTHREADS={} \
             NCCL_NSOCKS_PERTHREAD={} NCCL_SOCKET_INLINE={} NCCL_SOCKET_MIN_TASKSIZE={} \
             CCLKIT_SOCKET_MAX_RECVS={} CCLKIT_SOCKET_CONNECT_TIMEOUT_MS={}",
            self.ifname.as_deref().unwrap_or("(auto)"),
            match self.family {
                None => "any",
                Some(Family::V4) => "AF_INET",
                Some(Family::V6) => "AF_INET6",
            },
            auto(self.nthreads),
            auto(self.socks_per_thread),
            self.inline_bytes,
            self.min_chunk,
            self.max_recvs,
            self.connect_timeout.as_millis(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<(Config, Vec<String>)> {
        let names: Vec<String> = vars.iter().map(|(k, _)| k.to_string()).collect();
        Config::parse(
            |n| {
                vars.iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            },
            &names,
        )
    }

    #[test]
    fn defaults_and_overrides() {
        let (cfg, warn) = parse(&[]).unwrap();
        assert_eq!(cfg, Config::default());
        assert!(warn.is_empty());
        let (cfg, warn) = parse(&[
            ("NCCL_SOCKET_IFNAME", "^docker,lo"),
            ("NCCL_SOCKET_FAMILY", "AF_INET6"),
            ("NCCL_SOCKET_NTHREADS", "4"),
            ("NCCL_NSOCKS_PERTHREAD", "-2"),
            ("NCCL_SOCKET_INLINE", "128"),
            ("CCLKIT_SOCKET_MAX_RECVS", "6"),
            ("CCLKIT_SOCKET_MAXRECVS", "4"),
        ])
        .unwrap();
        assert_eq!(cfg.ifname.as_deref(), Some("^docker,lo"));
        assert_eq!(cfg.family, Some(Family::V6));
        assert_eq!(cfg.nthreads, Some(4));
        assert_eq!(cfg.socks_per_thread, None);
        assert_eq!(cfg.inline_bytes, 128);
        assert_eq!(cfg.max_recvs, 6);
        assert!(cfg.grouped());
        assert_eq!(warn.len(), 1);
        assert!(warn[0].contains("CCLKIT_SOCKET_MAXRECVS"));
    }

    #[test]
    fn rejects_bad_values() {
        for bad in [
            ("NCCL_SOCKET_FAMILY", "AF_UNIX"),
            ("NCCL_SOCKET_NTHREADS", "17"),
            ("NCCL_SOCKET_NTHREADS", "two"),
            ("CCLKIT_SOCKET_MAX_RECVS", "0"),
            ("NCCL_SOCKET_MIN_TASKSIZE", "1"),
        ] {
            let err = parse(&[bad]).unwrap_err();
            assert!(err.message().contains(bad.0), "{err}");
        }
        assert!(
            parse(&[
                ("NCCL_SOCKET_NTHREADS", "16"),
                ("NCCL_NSOCKS_PERTHREAD", "5")
            ])
            .is_err()
        );
    }
}
