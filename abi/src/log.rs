//! Plugin-side logging: through NCCL's logger when a host gave one, else through `tracing`.
//!
//! NCCL's `ncclDebugLogger_t` is C-variadic; stable Rust can call it, so every message
//! is formatted here and passed as `"%s"` (never as a format string: a `%` in a device
//! name must not be interpreted). Use the [`nccl_warn!`](crate::nccl_warn),
//! [`nccl_info!`](crate::nccl_info) and [`nccl_trace!`](crate::nccl_trace) macros.

use std::ffi::{CStr, CString, c_char, c_int, c_ulong};
use std::fmt;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use crate::raw::common::{LogLevel, ncclDebugLogger_t};

/// The host's logger as a `usize` (0 = none); set by the export adapters on `init`.
static LOGGER: AtomicUsize = AtomicUsize::new(0);
/// Highest level worth formatting when a host logger is set (from `NCCL_DEBUG`).
static MAX_LEVEL: AtomicI32 = AtomicI32::new(LogLevel::WARN.0);

/// Installs the host's logger (NULL clears it) and reads `NCCL_DEBUG` once.
///
/// Called by the export adapters from `init`; plugin code never needs to.
pub fn set_logger(logger: ncclDebugLogger_t) {
    let raw = logger.map_or(0, |f| f as usize);
    LOGGER.store(raw, Ordering::Release);
    MAX_LEVEL.store(
        level_from_env(std::env::var("NCCL_DEBUG").ok().as_deref()).0,
        Ordering::Relaxed,
    );
}

/// Parses an `NCCL_DEBUG` value as NCCL does (case-insensitive; unset ⇒ WARN).
pub fn level_from_env(value: Option<&str>) -> LogLevel {
    match value.map(str::to_ascii_uppercase).as_deref() {
        Some("VERSION") => LogLevel::VERSION,
        Some("INFO") => LogLevel::INFO,
        Some("ABORT") => LogLevel::ABORT,
        Some("TRACE") => LogLevel::TRACE,
        Some("NONE") => LogLevel::NONE,
        _ => LogLevel::WARN,
    }
}

fn logger() -> ncclDebugLogger_t {
    let raw = LOGGER.load(Ordering::Acquire);
    if raw == 0 {
        return None;
    }
    // SAFETY: `raw` was stored by `set_logger` from a non-NULL `ncclDebugLogger_t`,
    // i.e. from a function pointer of exactly this type.
    Some(unsafe { std::mem::transmute::<usize, LoggerFn>(raw) })
}

type LoggerFn = unsafe extern "C" fn(LogLevel, c_ulong, *const c_char, c_int, *const c_char, ...);

/// The host's logger as installed by the last `init` (NULL if none), for a plugin
/// that hands it on, e.g. a profiler forwarding `init` to other profilers.
pub fn host_logger() -> ncclDebugLogger_t {
    logger()
}

/// Whether a message at `level` would be shown (used by the macros to skip formatting).
pub fn enabled(level: LogLevel) -> bool {
    if logger().is_some() {
        // WARN always reaches NCCL, which filters it itself.
        level.0 <= LogLevel::WARN.0 || level.0 <= MAX_LEVEL.load(Ordering::Relaxed)
    } else {
        match level {
            LogLevel::WARN => tracing::enabled!(tracing::Level::WARN),
            LogLevel::INFO => tracing::enabled!(tracing::Level::INFO),
            _ => tracing::enabled!(tracing::Level::TRACE),
        }
    }
}

/// Emits one message. `file` must be NUL-terminated (the macros pass `concat!(file!(), "\0")`).
pub fn emit(
    level: LogLevel,
    flags: c_ulong,
    file: &'static str,
    line: u32,
    args: fmt::Arguments<'_>,
) {
    match logger() {
        Some(log) => {
            let text = match args.as_str() {
                Some(s) => s.to_owned(),
                None => args.to_string(),
            };
            // An interior NUL would cut the message; replace it rather than lose it all.
            let text = CString::new(text.replace('\0', "\\0")).unwrap_or_default();
            let file = CStr::from_bytes_with_nul(file.as_bytes()).unwrap_or(c"?");
            let line = c_int::try_from(line).unwrap_or(c_int::MAX);
            // SAFETY: `log` is the host's logger; the format is a literal "%s" whose one
            // argument is a valid NUL-terminated string that outlives the call.
            unsafe {
                log(
                    level,
                    flags,
                    file.as_ptr(),
                    line,
                    c"%s".as_ptr(),
                    text.as_ptr(),
                )
            };
        }
        None => {
            let file = file.trim_end_matches('\0');
            match level {
                LogLevel::WARN | LogLevel::ABORT => {
                    tracing::warn!(target: "cclkit::plugin", flags, file, line, "{args}")
                }
                LogLevel::INFO | LogLevel::VERSION => {
                    tracing::info!(target: "cclkit::plugin", flags, file, line, "{args}")
                }
                _ => tracing::trace!(target: "cclkit::plugin", flags, file, line, "{args}"),
            }
        }
    }
}

/// Logs at WARN: `nccl_warn!("listen on {addr}: {err}")` (subsystem `NCCL_ALL`).
#[macro_export]
macro_rules! nccl_warn {
    ($($arg:tt)+) => {
        $crate::nccl_log!($crate::raw::common::LogLevel::WARN, $crate::raw::common::subsys::ALL, $($arg)+)
    };
}

/// Logs at INFO for a subsystem: `nccl_info!(subsys::NET, "using {n} sockets")`.
#[macro_export]
macro_rules! nccl_info {
    ($flags:expr, $($arg:tt)+) => {
        $crate::nccl_log!($crate::raw::common::LogLevel::INFO, $flags, $($arg)+)
    };
}

/// Logs at TRACE for a subsystem.
#[macro_export]
macro_rules! nccl_trace {
    ($flags:expr, $($arg:tt)+) => {
        $crate::nccl_log!($crate::raw::common::LogLevel::TRACE, $flags, $($arg)+)
    };
}

/// Logs at any level; formats only when the message would be shown.
#[macro_export]
macro_rules! nccl_log {
    ($level:expr, $flags:expr, $($arg:tt)+) => {{
        let level = $level;
        if $crate::log::enabled(level) {
            $crate::log::emit(level, $flags, concat!(file!(), "\0"), line!(), format_args!($($arg)+));
        }
    }};
}
