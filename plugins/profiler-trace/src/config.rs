//! Settings from the environment, read once per communicator at `init`.
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `CCLKIT_PROFILE_DIR` | `NCCL_PROFILE_DIR`, else `.` | directory of the trace files |
//! | `CCLKIT_PROFILE_MAX_EVENTS` | 250000 | events kept per communicator for the trace |
//! | `CCLKIT_PROFILE_MASK` | `NCCL_PROFILE_EVENT_MASK`, else [`DEFAULT_MASK`] | `ncclProfile*` bits to activate (decimal or 0x hex) |
//! | `CCLKIT_PROFILE_SUMMARY` | `1` | `0` silences the summary on stderr (the `.txt` file is still written) |
//! | `CCLKIT_PROFILERS` | unset | comma-separated profiler libraries to forward every event to |

use std::path::PathBuf;

use cclkit_abi::raw::profiler::event as bit;
use cclkit_abi::{Error, Result};

/// Events kept per communicator unless `CCLKIT_PROFILE_MAX_EVENTS` says otherwise.
pub const DEFAULT_MAX_EVENTS: usize = 250_000;
/// Upper bound on `CCLKIT_PROFILE_MAX_EVENTS` (about 1 GiB of trace records).
pub const LIMIT_MAX_EVENTS: usize = 10_000_000;

/// The events activated by default: everything a trace reader needs to follow a
/// collective down to the network, without the proxy thread's idle/active chatter
/// (ProxyCtrl) or GPU-timer channels (KernelCh).
pub const DEFAULT_MASK: u64 = bit::GROUP
    | bit::COLL
    | bit::P2P
    | bit::PROXY_OP
    | bit::PROXY_STEP
    | bit::NET_PLUGIN
    | bit::GROUP_API
    | bit::COLL_API
    | bit::P2P_API
    | bit::KERNEL_LAUNCH
    | bit::CE_COLL
    | bit::CE_SYNC
    | bit::CE_BATCH;

/// Parsed settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where trace files go.
    pub dir: PathBuf,
    /// Trace records kept per communicator.
    pub max_events: usize,
    /// Activation mask.
    pub mask: u64,
    /// Print the summary to stderr.
    pub print_summary: bool,
    /// Profiler libraries to forward to.
    pub forward: Vec<String>,
}

impl Config {
    /// Reads the environment through `get` (a closure so tests need not touch it).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let dir = get("CCLKIT_PROFILE_DIR")
            .or_else(|| get("NCCL_PROFILE_DIR"))
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| ".".into());
        let max_events = match get("CCLKIT_PROFILE_MAX_EVENTS") {
            None => DEFAULT_MAX_EVENTS,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n <= LIMIT_MAX_EVENTS => n,
                _ => {
                    return Err(Error::invalid_argument(format!(
                        "CCLKIT_PROFILE_MAX_EVENTS={v}: expected 0…{LIMIT_MAX_EVENTS}"
                    )));
                }
            },
        };
        // NCCL's example profiler reads NCCL_PROFILE_EVENT_MASK: honour it too.
        let mask_var = ["CCLKIT_PROFILE_MASK", "NCCL_PROFILE_EVENT_MASK"]
            .into_iter()
            .find_map(|k| get(k).map(|v| (k, v)));
        let mask = match mask_var {
            None => DEFAULT_MASK,
            Some((k, v)) => parse_mask(&v).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{k}={v}: expected a number (decimal or 0x hex) below 2^16"
                ))
            })?,
        };
        let print_summary = get("CCLKIT_PROFILE_SUMMARY").is_none_or(|v| v.trim() != "0");
        let forward = get("CCLKIT_PROFILERS")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            dir: PathBuf::from(dir),
            max_events,
            mask,
            print_summary,
            forward,
        })
    }
}

fn parse_mask(v: &str) -> Option<u64> {
    let v = v.trim();
    let n = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None => v.parse().ok()?,
    };
    (n < 1 << 16).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn defaults_and_overrides() {
        let c = Config::from_env(env(&[])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (c.dir, c.max_events, c.mask),
            (PathBuf::from("."), DEFAULT_MAX_EVENTS, DEFAULT_MASK)
        );
        let c = Config::from_env(env(&[
            ("NCCL_PROFILE_DIR", "/n"),
            ("CCLKIT_PROFILE_MASK", "0x1a"),
            ("CCLKIT_PROFILERS", " a, ,libb.so "),
            ("CCLKIT_PROFILE_SUMMARY", "0"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (c.dir.to_str(), c.mask, c.print_summary),
            (Some("/n"), 0x1a, false)
        );
        assert_eq!(c.forward, vec!["a".to_owned(), "libb.so".to_owned()]);
        let c = Config::from_env(env(&[
            ("CCLKIT_PROFILE_DIR", "/c"),
            ("NCCL_PROFILE_DIR", "/n"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.dir.to_str(), Some("/c"));
    }

    #[test]
    fn bad_values_are_named() {
        for (k, v) in [
            ("CCLKIT_PROFILE_MASK", "0x10000"),
            ("CCLKIT_PROFILE_MASK", "lots"),
            ("CCLKIT_PROFILE_MAX_EVENTS", "-1"),
            ("CCLKIT_PROFILE_MAX_EVENTS", "10000001"),
            ("NCCL_PROFILE_EVENT_MASK", "-3"),
        ] {
            let pairs = [(k, v)];
            let err = Config::from_env(env(&pairs)).unwrap_err();
            assert!(err.message().contains(k), "{err}");
        }
    }
}
