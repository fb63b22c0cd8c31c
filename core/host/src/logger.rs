//! The logger handed to plugins: NCCL's `ncclDebugLogger_t`, backed by `tracing`.
//!
//! The logger is C-variadic, so `logger.c` formats each message with `vsnprintf` and
//! calls a Rust sink with the finished text. The sink emits a `tracing` event with
//! target `nccl::plugin`, NCCL's level and the subsystem bits in the `subsys` field
//! (see [`crate::log`] for how `NCCL_DEBUG`/`NCCL_DEBUG_SUBSYS` filter them), and keeps
//! the last WARN of each thread: host adapters quote it in their errors, so a failing
//! call reports *the plugin's own explanation* next to its return code.

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, c_char, c_int, c_ulong};

use cclkit_abi::raw::common::{LogLevel, ncclDebugLogger_t};
use tracing::level_filters::LevelFilter;

type SinkFn = unsafe extern "C" fn(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    msg: *const c_char,
    len: usize,
);

unsafe extern "C" {
    /// The variadic logger defined in `logger.c`.
    fn cclkit_nccl_logger(
        level: LogLevel,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
    /// Installs the sink and the highest level worth formatting.
    fn cclkit_log_install(sink: SinkFn, max_level: c_int);
}

thread_local! {
    /// The last WARN (or ABORT) message a plugin logged on this thread.
    static LAST_WARN: RefCell<Option<String>> = const { RefCell::new(None) };
    /// Counts WARNs on this thread, so a caller can tell whether one arrived during a call.
    static WARN_SEQ: Cell<u64> = const { Cell::new(0) };
}

/// Messages longer than this are cut when remembered as the last WARN.
const MAX_REMEMBERED: usize = 4096;

/// A function that sees every message a plugin logs, formatted: its NCCL level, its
/// subsystem bits and the text (without a trailing newline). It runs on the plugin's
/// thread inside the plugin's call, so it must be quick and must not call the plugin.
pub type Observer = fn(level: LogLevel, subsys: u64, text: &str);

/// The process's observer, if one was installed.
static OBSERVER: std::sync::OnceLock<Observer> = std::sync::OnceLock::new();

/// Installs `observer` for every plugin message from now on, next to the `tracing`
/// events (test peers print plugin logs in a form their parent parses). Messages of
/// every level are then formatted, whatever `tracing` shows. The first observer
/// installed stays; returns whether `observer` is the installed one.
pub fn set_observer(observer: Observer) -> bool {
    std::ptr::fn_addr_eq(*OBSERVER.get_or_init(|| observer), observer)
}

/// The `ncclDebugLogger_t` to pass to a plugin's `init`.
///
/// Also (re)installs the sink with the current `tracing` level, so messages above
/// what any subscriber shows are not even formatted (WARN always is).
pub fn logger() -> ncclDebugLogger_t {
    let max = match LevelFilter::current() {
        _ if OBSERVER.get().is_some() => LogLevel::TRACE.0,
        LevelFilter::TRACE | LevelFilter::DEBUG => LogLevel::TRACE.0,
        LevelFilter::INFO => LogLevel::INFO.0,
        _ => LogLevel::WARN.0,
    };
    // SAFETY: `log_sink` has exactly the C sink signature and never unwinds; the C side
    // only stores the pointer and the level.
    unsafe { cclkit_log_install(log_sink, max) };
    Some(cclkit_nccl_logger)
}

/// A marker of this thread's WARN count; pass it to [`warn_since`] after a call.
pub fn warn_mark() -> u64 {
    WARN_SEQ.with(Cell::get)
}

/// The last WARN a plugin logged on this thread after `mark` was taken, if any.
pub fn warn_since(mark: u64) -> Option<String> {
    if WARN_SEQ.with(Cell::get) == mark {
        return None;
    }
    LAST_WARN.with(|w| w.borrow().clone())
}

/// The last WARN a plugin logged on this thread (whenever it was).
pub fn last_warn() -> Option<String> {
    LAST_WARN.with(|w| w.borrow().clone())
}

/// Receives every formatted plugin message (called from `logger.c`).
///
/// # Safety
/// `msg` must point to `len` readable bytes and `file` must be NULL or a NUL-terminated
/// string, both valid for the duration of the call (the C shim guarantees this).
unsafe extern "C" fn log_sink(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    msg: *const c_char,
    len: usize,
) {
    let bytes: &[u8] = if msg.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the shim passes a buffer of `len` formatted bytes (see above).
        unsafe { std::slice::from_raw_parts(msg.cast::<u8>(), len) }
    };
    let file = if file.is_null() {
        None
    } else {
        // SAFETY: non-NULL `file` is a NUL-terminated string (`__FILE__`/`__func__`).
        Some(unsafe { CStr::from_ptr(file) })
    };
    // Never unwind into C: a panic in a subscriber is dropped here.
    let _ = std::panic::catch_unwind(|| emit(LogLevel(level), flags, file, line, bytes));
}

fn emit(level: LogLevel, flags: c_ulong, file: Option<&CStr>, line: c_int, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim_end_matches('\n');
    let file = file.map(CStr::to_string_lossy);
    let file = file.as_deref().unwrap_or("?");
    let subsys: u64 = flags;
    if let Some(observe) = OBSERVER.get() {
        observe(level, subsys, text);
    }
    match level {
        LogLevel::WARN | LogLevel::ABORT => {
            remember_warn(text);
            if level == LogLevel::ABORT {
                tracing::error!(target: "nccl::plugin", subsys, file, line, "{text}");
            } else {
                tracing::warn!(target: "nccl::plugin", subsys, file, line, "{text}");
            }
        }
        LogLevel::INFO | LogLevel::VERSION => {
            tracing::info!(target: "nccl::plugin", subsys, file, line, "{text}")
        }
        LogLevel::TRACE => tracing::trace!(target: "nccl::plugin", subsys, file, line, "{text}"),
        LogLevel::NONE => {}
        _ => tracing::debug!(target: "nccl::plugin", subsys, file, line, level = level.0, "{text}"),
    }
}

fn remember_warn(text: &str) {
    let mut kept = text.to_owned();
    if kept.len() > MAX_REMEMBERED {
        let mut cut = MAX_REMEMBERED;
        while !kept.is_char_boundary(cut) {
            cut -= 1;
        }
        kept.truncate(cut);
    }
    LAST_WARN.with(|w| *w.borrow_mut() = Some(kept));
    WARN_SEQ.with(|s| s.set(s.get().wrapping_add(1)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_printf_arguments_and_remembers_warn() {
        let log = logger().expect("logger");
        let mark = warn_mark();
        // SAFETY: a printf format with matching arguments, as a plugin would call it.
        unsafe {
            log(
                LogLevel::WARN,
                cclkit_abi::raw::common::subsys::NET,
                c"test.c".as_ptr(),
                42,
                c"dev %d: %s (%5.1f%%)".as_ptr(),
                3 as c_int,
                c"mlx5_0".as_ptr(),
                99.5f64,
            )
        };
        assert_eq!(warn_since(mark).as_deref(), Some("dev 3: mlx5_0 ( 99.5%)"));
        assert_eq!(warn_since(warn_mark()), None);
    }

    #[test]
    fn long_messages_are_not_truncated() {
        let log = logger().expect("logger");
        let long = "x".repeat(3000);
        let c = std::ffi::CString::new(long.clone()).expect("no NUL");
        let mark = warn_mark();
        // SAFETY: "%s" with one valid string argument.
        unsafe {
            log(
                LogLevel::WARN,
                0,
                std::ptr::null(),
                0,
                c"<%s>".as_ptr(),
                c.as_ptr(),
            )
        };
        assert_eq!(warn_since(mark), Some(format!("<{long}>")));
    }

    #[test]
    fn info_does_not_replace_the_last_warn() {
        let log = logger().expect("logger");
        // SAFETY: literal formats without conversions.
        unsafe {
            log(
                LogLevel::WARN,
                0,
                std::ptr::null(),
                0,
                c"the warning".as_ptr(),
            );
            let mark = warn_mark();
            log(
                LogLevel::INFO,
                0,
                std::ptr::null(),
                0,
                c"just info".as_ptr(),
            );
            assert_eq!(warn_since(mark), None);
        }
        assert_eq!(last_warn().as_deref(), Some("the warning"));
    }
}
