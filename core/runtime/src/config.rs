//! Runtime configuration, read from the environment once per communicator.

use std::sync::Arc;
use std::time::Duration;

use super::bootstrap;
use super::device::DeviceKind;
use super::error::{Error, Result};
use cclkit_host::select::NetRegistry;
use cclkit_host::select::TunerRegistry;

/// Default for `CCLKIT_OP_TIMEOUT` (seconds).
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(300);
/// NCCL's channel limit.
pub const MAX_CHANNELS: usize = 32;

/// How a communicator is set up and run.
#[derive(Clone)]
pub struct Config {
    /// The plugin registry to select from (`None` = the process-wide one, configured
    /// from `NCCL_NET_PLUGIN`, `NCCL_NET`, …).
    pub registry: Option<Arc<NetRegistry>>,
    /// The tuner registry (`None` = the process-wide one, from `NCCL_TUNER_PLUGIN`).
    pub tuner_registry: Option<Arc<TunerRegistry>>,
    /// `CCLKIT_TUNER_REPORT=1`: rank 0 prints what every collective ran with at destroy.
    pub tuner_report: bool,
    /// Traffic class passed to the plugin (`NCCL_IB_TC`-like; -1 = unset).
    pub traffic_class: Option<i32>,
    /// `CCLKIT_BOOTSTRAP_TIMEOUT`: joining and connection setup.
    pub bootstrap_timeout: Duration,
    /// `CCLKIT_OP_TIMEOUT`: how long one operation may wait (from its first pass
    /// without progress); past it the communicator is aborted.
    pub op_timeout: Duration,
    /// `NCCL_MIN_NCHANNELS`.
    pub min_channels: usize,
    /// `NCCL_MAX_NCHANNELS`.
    pub max_channels: usize,
    /// `NCCL_ALGO` (e.g. `ring`, `tree`, `^tree`).
    pub algo: Option<String>,
    /// `NCCL_PROTO` (e.g. `LL,Simple`, `^LL128`).
    pub proto: Option<String>,
    /// `CCLKIT_GROUPED_RECV` (default on): grouped receives on p2p links when the
    /// plugin's `maxRecvs > 1`.
    pub grouped_recv: bool,
    /// `CCLKIT_DIRECT` (default on): NCCL's direct paths on host memory (receive into
    /// and send from the registered user buffer where no later step writes those
    /// bytes); off stages every byte through the FIFO slots.
    pub direct: bool,
    /// `CCLKIT_RUN_AHEAD`: let a channel's next step send while the current one only
    /// waits for data (`proxy/engine/ahead.rs`). Unset: on when every rank has a core
    /// of its own; `1`/`0`: always/never.
    pub run_ahead: Option<bool>,
    /// `CCLKIT_DEVICE` (`host`, `cuda`, `cuda:N`; `CCLKIT_CUDA_EMULATE=1` for the
    /// emulated GPU): where user buffers live (see [`super::device`]).
    pub device: DeviceKind,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("traffic_class", &self.traffic_class)
            .field("bootstrap_timeout", &self.bootstrap_timeout)
            .field("op_timeout", &self.op_timeout)
            .field("channels", &(self.min_channels, self.max_channels))
            .field("grouped_recv", &self.grouped_recv)
            .field("direct", &self.direct)
            .field("run_ahead", &self.run_ahead)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// Longest value quoted back in a message: a hostile variable must not flood the log.
pub const MAX_ECHO: usize = 80;
/// Largest accepted timeout (`CCLKIT_BOOTSTRAP_TIMEOUT`, `CCLKIT_OP_TIMEOUT`, `-T`):
/// seven days. Larger values are refused rather than overflowing a deadline.
pub const MAX_TIMEOUT_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// `v` cut to [`MAX_ECHO`] characters (with `…` when cut), for messages.
pub fn shown(v: &str) -> String {
    if v.chars().count() <= MAX_ECHO {
        return v.to_string();
    }
    let mut out: String = v.chars().take(MAX_ECHO).collect();
    out.push('…');
    out
}

fn bad(name: &str, v: &str, want: &str) -> Error {
    Error::invalid_argument(format!("{name}={} is not valid: {want}", shown(v)))
}

/// The one parser of boolean variables: `1/0`, `true/false`, `yes/no`, `on/off`
/// (any case). Anything else, the empty string included, is an error naming `name`.
pub fn parse_bool(name: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(bad(name, v, "expected 1 or 0 (true/false, yes/no, on/off)")),
    }
}

/// The one parser of count variables: a whole decimal number in `min..=max`.
pub fn parse_count(name: &str, v: &str, min: u64, max: u64) -> Result<u64> {
    let n: u64 = v.trim().parse().map_err(|_| {
        bad(
            name,
            v,
            &format!("expected a whole number in {min}..={max}"),
        )
    })?;
    if n < min || n > max {
        return Err(bad(
            name,
            v,
            &format!("expected a whole number in {min}..={max}"),
        ));
    }
    Ok(n)
}

/// The one parser of signed integer variables (`NCCL_IB_TC`-like): in `min..=max`.
pub fn parse_int(name: &str, v: &str, min: i64, max: i64) -> Result<i64> {
    let n: i64 = v
        .trim()
        .parse()
        .map_err(|_| bad(name, v, &format!("expected an integer in {min}..={max}")))?;
    if n < min || n > max {
        return Err(bad(
            name,
            v,
            &format!("expected an integer in {min}..={max}"),
        ));
    }
    Ok(n)
}

/// The one parser of durations in seconds (fractions allowed): positive, finite and at
/// most [`MAX_TIMEOUT_SECS`]; never panics on huge or odd input.
pub fn parse_secs(name: &str, v: &str) -> Result<Duration> {
    let want = format!("expected seconds, above 0 and at most {MAX_TIMEOUT_SECS}");
    let s: f64 = v.trim().parse().map_err(|_| bad(name, v, &want))?;
    if !s.is_finite() || s <= 0.0 || s > MAX_TIMEOUT_SECS {
        return Err(bad(name, v, &want));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Algorithm names `NCCL_ALGO` may list (NCCL's spellings and the `NCCL_ALGO_*` ones).
pub const ALGO_NAMES: [&str; 10] = [
    "ring",
    "tree",
    "collnetdirect",
    "collnet_direct",
    "collnetchain",
    "collnet_chain",
    "nvls",
    "nvlstree",
    "nvls_tree",
    "pat",
];
/// Protocol names `NCCL_PROTO` may list.
pub const PROTO_NAMES: [&str; 3] = ["ll", "ll128", "simple"];
/// Collective names usable in the per-collective form (`allreduce:tree;…`).
const FUNC_NAMES: [&str; 5] = [
    "allreduce",
    "broadcast",
    "reduce",
    "allgather",
    "reducescatter",
];

/// Checks an `NCCL_ALGO` / `NCCL_PROTO` value (`a,b`, `^a,b`, or
/// `allreduce:a,b;broadcast:c`): every name must be one of `known`.
pub fn check_name_list(name: &str, v: &str, known: &[&str]) -> Result<()> {
    let unknown = |what: &str, x: &str, list: &[&str]| {
        Error::invalid_argument(format!(
            "{name}={}: unknown {what} '{}' (known: {})",
            shown(v),
            shown(x.trim()),
            list.join(", ")
        ))
    };
    let check_list = |list: &str| -> Result<()> {
        let list = list.trim();
        let list = list.strip_prefix('^').unwrap_or(list);
        for x in list.split(',') {
            let k = x.trim().to_ascii_lowercase();
            if k.is_empty() {
                continue;
            }
            if !known.contains(&k.as_str()) {
                return Err(unknown("name", x, known));
            }
        }
        Ok(())
    };
    if v.trim().is_empty() {
        return Err(bad(name, v, "empty"));
    }
    if !v.contains(':') {
        return check_list(v);
    }
    for part in v.split(';').filter(|p| !p.trim().is_empty()) {
        let (f, list) = part
            .split_once(':')
            .ok_or_else(|| bad(name, v, "expected COLL:NAMES;COLL:NAMES"))?;
        let f = f.trim().to_ascii_lowercase();
        if !FUNC_NAMES.contains(&f.as_str()) {
            return Err(unknown("collective", &f, &FUNC_NAMES));
        }
        check_list(list)?;
    }
    Ok(())
}

/// Runs `read` with a lookup that reads the environment as NCCL does
/// ([`cclkit_host::env::process_env`]). An error about a value the env plugin
/// supplied names the plugin as its source; a plugin whose `init` failed fails the
/// read, as NCCL fails communicator creation.
pub fn with_nccl_env<T>(
    read: impl FnOnce(&dyn Fn(&str) -> Option<String>) -> Result<T>,
) -> Result<T> {
    let env = cclkit_host::env::process_env();
    if let Some(e) = env.init_error() {
        return Err(Error::invalid_usage(e.to_string()));
    }
    let from_plugin = std::cell::RefCell::new(Vec::<String>::new());
    let get = |k: &str| {
        let (v, src) = env.lookup(k);
        if v.is_some() && src == cclkit_host::env::ValueSource::EnvPlugin {
            from_plugin.borrow_mut().push(k.to_owned());
        }
        v
    };
    read(&get).map_err(|e| {
        let names = from_plugin.borrow();
        // Parse errors start "NAME=value"; name the plugin when it supplied NAME.
        match (
            names
                .iter()
                .find(|n| e.message().starts_with(&format!("{n}="))),
            env.plugin_label(),
        ) {
            (Some(n), Some(label)) => e.context(format!("{n} set by the ENV plugin {label}")),
            _ => e,
        }
    })
}

impl Config {
    /// Reads the environment as NCCL does: `NCCL_*` through the process's env plugin
    /// (`NCCL_ENV_PLUGIN`, loaded once by cclkit-host), `CCLKIT_*` from the process.
    pub fn from_env() -> Result<Self> {
        with_nccl_env(|get| Self::from_lookup(get))
    }

    /// Reads configuration through `get` (`None` = unset).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        // Registries built for this configuration fall back to the built-in transport.
        crate::install_builtin_net();
        let secs = |name: &str, default: Duration| -> Result<Duration> {
            get(name).map_or(Ok(default), |v| parse_secs(name, &v))
        };
        let count = |name: &str, default: usize| -> Result<usize> {
            get(name).map_or(Ok(default), |v| {
                parse_count(name, &v, 1, MAX_CHANNELS as u64).map(|n| n as usize)
            })
        };
        let flag = |name: &str, default: bool| -> Result<bool> {
            get(name).map_or(Ok(default), |v| parse_bool(name, &v))
        };
        let tc = |name: &str| -> Result<Option<i32>> {
            get(name)
                .map(|v| parse_int(name, &v, -1, 255).map(|n| n as i32))
                .transpose()
        };
        let min_channels = count("NCCL_MIN_NCHANNELS", 1)?;
        let max_channels = count("NCCL_MAX_NCHANNELS", MAX_CHANNELS)?;
        // Read here only to be validated like every other flag (the plugin registry
        // reads it too): `CCLKIT_STRICT=abc` is an error, not a silent "off".
        flag("CCLKIT_STRICT", false)?;
        let algo = get("NCCL_ALGO");
        if let Some(v) = &algo {
            check_name_list("NCCL_ALGO", v, &ALGO_NAMES)?;
        }
        let proto = get("NCCL_PROTO");
        if let Some(v) = &proto {
            check_name_list("NCCL_PROTO", v, &PROTO_NAMES)?;
        }
        Ok(Self {
            registry: None,
            tuner_registry: None,
            tuner_report: flag("CCLKIT_TUNER_REPORT", false)?,
            traffic_class: match tc("NCCL_IB_TC")? {
                Some(t) => Some(t),
                None => tc("CCLKIT_TRAFFIC_CLASS")?,
            },
            bootstrap_timeout: secs("CCLKIT_BOOTSTRAP_TIMEOUT", bootstrap::DEFAULT_TIMEOUT)?,
            op_timeout: secs("CCLKIT_OP_TIMEOUT", DEFAULT_OP_TIMEOUT)?,
            min_channels,
            max_channels: max_channels.max(min_channels),
            algo,
            proto,
            grouped_recv: flag("CCLKIT_GROUPED_RECV", true)?,
            direct: flag("CCLKIT_DIRECT", true)?,
            run_ahead: get("CCLKIT_RUN_AHEAD")
                .map(|v| parse_bool("CCLKIT_RUN_AHEAD", &v))
                .transpose()?,
            device: DeviceKind::from_lookup(get).map_err(|e| e.context("CCLKIT_DEVICE"))?,
        })
    }

    /// Channels to connect: two by default (one per tree), at least one per device when
    /// there are several, within `NCCL_MIN_NCHANNELS..=NCCL_MAX_NCHANNELS`.
    pub fn channels(&self, devices: usize) -> usize {
        devices.max(2).clamp(self.min_channels, self.max_channels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
        let m: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(&move |k| m.get(k).cloned())
    }

    #[test]
    fn every_bad_value_is_an_error_naming_its_variable() {
        let long = "9".repeat(5000);
        for (name, v) in [
            ("NCCL_MIN_NCHANNELS", "abc"),
            ("NCCL_MAX_NCHANNELS", "-1"),
            ("NCCL_MAX_NCHANNELS", "0"),
            ("NCCL_IB_TC", "abc"),
            ("NCCL_IB_TC", "256"),
            ("CCLKIT_TRAFFIC_CLASS", "x"),
            ("CCLKIT_GROUPED_RECV", "-1"),
            ("CCLKIT_DIRECT", "2"),
            ("CCLKIT_TUNER_REPORT", "abc"),
            ("CCLKIT_STRICT", "abc"),
            ("CCLKIT_STRICT", ""),
            ("CCLKIT_OP_TIMEOUT", ""),
            ("CCLKIT_OP_TIMEOUT", "0"),
            ("CCLKIT_OP_TIMEOUT", "-3"),
            ("CCLKIT_OP_TIMEOUT", "nan"),
            ("CCLKIT_OP_TIMEOUT", "inf"),
            ("CCLKIT_OP_TIMEOUT", "1e20"),
            ("CCLKIT_OP_TIMEOUT", "18446744073709551616"),
            ("CCLKIT_BOOTSTRAP_TIMEOUT", "18446744073709551616"),
            ("CCLKIT_BOOTSTRAP_TIMEOUT", long.as_str()),
            ("NCCL_ALGO", "abc"),
            ("NCCL_ALGO", "allreduce:ring;bogus:tree"),
            ("NCCL_PROTO", "^LL,fast"),
            ("NCCL_PROTO", ""),
        ] {
            let e = cfg(&[(name, v)]).unwrap_err();
            let m = e.message();
            assert!(m.contains(name), "{name}={v}: {m}");
            // Echoed values are cut: never the whole hostile value.
            assert!(m.chars().count() < 300, "{name}: {} chars", m.len());
        }
        let e = cfg(&[("NCCL_ALGO", "abc")]).unwrap_err();
        assert!(e.message().contains("unknown name 'abc'"), "{e}");
    }

    #[test]
    fn good_values_are_read() {
        let c = cfg(&[
            ("NCCL_MIN_NCHANNELS", "3"),
            ("NCCL_MAX_NCHANNELS", " 5 "),
            ("NCCL_IB_TC", "-1"),
            ("CCLKIT_GROUPED_RECV", "off"),
            ("CCLKIT_DIRECT", "false"),
            ("CCLKIT_RUN_AHEAD", "on"),
            ("CCLKIT_TUNER_REPORT", "Yes"),
            ("CCLKIT_STRICT", "0"),
            ("CCLKIT_OP_TIMEOUT", "0.25"),
            ("CCLKIT_BOOTSTRAP_TIMEOUT", "604800"),
            ("NCCL_ALGO", "allreduce:Ring,tree;broadcast:ring"),
            ("NCCL_PROTO", "^LL128"),
        ])
        .unwrap();
        assert_eq!((c.min_channels, c.max_channels), (3, 5));
        assert_eq!(c.traffic_class, Some(-1));
        assert!(!c.grouped_recv && c.tuner_report && !c.direct);
        assert_eq!(c.run_ahead, Some(true));
        assert_eq!(c.op_timeout, Duration::from_millis(250));
        assert_eq!(c.bootstrap_timeout, Duration::from_secs(604_800));
        let d = cfg(&[]).unwrap();
        assert_eq!(d.op_timeout, DEFAULT_OP_TIMEOUT);
        assert!(d.grouped_recv && !d.tuner_report && d.direct);
        assert_eq!(d.run_ahead, None);
        assert!(cfg(&[("CCLKIT_RUN_AHEAD", "sometimes")]).is_err());
    }

    #[test]
    fn random_values_never_panic_the_parsers() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet = b"0123456789.-+eE^,:;_ abcxyzLlINFnaf\xc3\xa9";
        for _ in 0..20_000 {
            let len = (next() % 24) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let v = String::from_utf8_lossy(&bytes);
            if let Ok(d) = parse_secs("T", &v) {
                assert!(d > Duration::ZERO && d.as_secs_f64() <= MAX_TIMEOUT_SECS);
            }
            if let Ok(n) = parse_count("N", &v, 1, 32) {
                assert!((1..=32).contains(&n));
            }
            let _ = parse_bool("B", &v);
            let _ = check_name_list("NCCL_ALGO", &v, &ALGO_NAMES);
            assert!(shown(&v.repeat(20)).chars().count() <= MAX_ECHO + 1);
        }
    }
}
