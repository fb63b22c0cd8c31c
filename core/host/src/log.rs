//! NCCL-style logging for the `cclkit` binary (and anyone who wants it): a `tracing`
//! subscriber configured from `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS`.
//!
//! * `NCCL_DEBUG`: `NONE`, `VERSION`, `WARN` (default), `INFO`, `ABORT`, `TRACE`
//!   (case-insensitive). WARN and above are always shown, whatever the subsystem.
//! * `NCCL_DEBUG_SUBSYS`: comma list of subsystem names (`INIT,NET,TUNING`, `ALL`);
//!   a leading `^` selects every subsystem *except* those listed. Default
//!   `INIT,BOOTSTRAP,ENV`, as NCCL. INFO/TRACE events carry their subsystem bits in a
//!   `subsys` field (plugin messages carry the flags the plugin passed); events
//!   without one belong to every subsystem.
//!
//! Lines go to stderr as `host:pid:tid NCCL LEVEL message`, so stdout stays clean for
//! reports and `--json`.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::{Arc, Mutex};

use cclkit_abi::raw::common::subsys;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// What to show, from `NCCL_DEBUG` / `NCCL_DEBUG_SUBSYS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// Most verbose level shown.
    pub level: LevelFilter,
    /// Subsystem bits shown at INFO and below.
    pub mask: u64,
}

/// NCCL's default `NCCL_DEBUG_SUBSYS`.
pub const DEFAULT_MASK: u64 = subsys::INIT | subsys::BOOTSTRAP | subsys::ENV;

impl LogConfig {
    /// Reads `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS`.
    pub fn from_env() -> Self {
        Self::parse(
            std::env::var("NCCL_DEBUG").ok().as_deref(),
            std::env::var("NCCL_DEBUG_SUBSYS").ok().as_deref(),
        )
    }

    /// Parses the two values (`None` = unset).
    pub fn parse(debug: Option<&str>, subsystems: Option<&str>) -> Self {
        let level = match debug.map(|s| s.trim().to_ascii_uppercase()).as_deref() {
            Some("NONE") => LevelFilter::OFF,
            Some("INFO") => LevelFilter::INFO,
            Some("TRACE") => LevelFilter::TRACE,
            _ => LevelFilter::WARN,
        };
        Self {
            level,
            mask: subsystems.map_or(DEFAULT_MASK, parse_mask),
        }
    }
}

/// Parses a `NCCL_DEBUG_SUBSYS` value; unknown names are ignored, as NCCL does.
pub fn parse_mask(value: &str) -> u64 {
    let (invert, list) = match value.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, value),
    };
    let bits = list
        .split(',')
        .map(str::trim)
        .filter_map(|name| {
            subsys::NAMES
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, b)| *b)
        })
        .fold(0u64, |acc, b| acc | b);
    if invert { !bits } else { bits }
}

/// Installs the NCCL-style subscriber for this process (no-op if one is set).
pub fn init_from_env() {
    let config = LogConfig::from_env();
    let _ = tracing_subscriber::registry()
        .with(NcclLayer::stderr(config.mask).with_filter(config.level))
        .try_init();
}

/// A layer printing events like NCCL, filtered by subsystem.
pub struct NcclLayer {
    mask: u64,
    host: String,
    out: Arc<Mutex<dyn Write + Send>>,
}

impl NcclLayer {
    /// Prints to stderr.
    pub fn stderr(mask: u64) -> Self {
        Self::to_writer(mask, Arc::new(Mutex::new(std::io::stderr())))
    }

    /// Prints to any writer (tests capture into a buffer).
    pub fn to_writer(mask: u64, out: Arc<Mutex<dyn Write + Send>>) -> Self {
        Self {
            mask,
            host: hostname(),
            out,
        }
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    subsys: Option<u64>,
    rest: String,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "subsys" {
            self.subsys = Some(value);
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "subsys" {
            self.subsys = Some(value as u64);
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            // Plugin call sites (file/line) are noise at INFO; keep them out of the line.
            "file" | "line" => {}
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }
}

impl<S: Subscriber> Layer<S> for NcclLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let level = *event.metadata().level();
        let mut f = Fields::default();
        event.record(&mut f);
        let always = level <= Level::WARN;
        if !always && f.subsys.is_some_and(|bits| bits & self.mask == 0) {
            return;
        }
        let name = match level {
            Level::ERROR => "ABORT",
            Level::WARN => "WARN",
            Level::INFO => "INFO",
            _ => "TRACE",
        };
        let origin = if event.metadata().target().starts_with("nccl::plugin") {
            " [plugin]"
        } else {
            ""
        };
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let line = format!(
            "{}:{}:{tid} NCCL {name}{origin} {}{}\n",
            self.host,
            std::process::id(),
            f.message,
            f.rest
        );
        if let Ok(mut out) = self.out.lock() {
            let _ = out.write_all(line.as_bytes());
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_nccl_debug() {
        assert_eq!(LogConfig::parse(None, None).level, LevelFilter::WARN);
        assert_eq!(
            LogConfig::parse(Some("info"), None).level,
            LevelFilter::INFO
        );
        assert_eq!(
            LogConfig::parse(Some("TRACE"), None).level,
            LevelFilter::TRACE
        );
        assert_eq!(LogConfig::parse(Some("NONE"), None).level, LevelFilter::OFF);
        assert_eq!(LogConfig::parse(None, None).mask, DEFAULT_MASK);
    }

    #[test]
    fn subsystem_lists_and_inversion() {
        assert_eq!(parse_mask("NET,tuning"), subsys::NET | subsys::TUNING);
        assert_eq!(parse_mask("^NET"), !subsys::NET);
        assert_eq!(parse_mask("ALL"), subsys::ALL);
        assert_eq!(parse_mask("BOGUS"), 0);
    }

    #[test]
    fn info_is_filtered_by_subsystem_but_warn_never() {
        let buf: Arc<Mutex<Vec<u8>>> = Arc::new(Mutex::new(Vec::new()));
        let layer = NcclLayer::to_writer(subsys::NET, buf.clone());
        let sub = tracing_subscriber::registry().with(layer.with_filter(LevelFilter::INFO));
        tracing::subscriber::with_default(sub, || {
            tracing::info!(subsys = subsys::NET, "net info");
            tracing::info!(subsys = subsys::TUNING, "tuning info");
            tracing::warn!(subsys = subsys::TUNING, "tuning warn");
            tracing::info!("no subsystem");
            tracing::debug!("too verbose");
        });
        let text = String::from_utf8(buf.lock().expect("lock").clone()).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].ends_with("NCCL INFO net info"), "{}", lines[0]);
        assert!(lines[1].ends_with("NCCL WARN tuning warn"), "{}", lines[1]);
        assert!(lines[2].ends_with("NCCL INFO no subsystem"), "{}", lines[2]);
        assert!(lines[0].contains(&format!(":{}:", std::process::id())));
    }
}
