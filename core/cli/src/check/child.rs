//! The child side of `cclkit check`: run one check, report progress and the result
//! on stdout, and never outlive a hung plugin call.
//!
//! Protocol (stdout, one line each, flushed at once):
//! * `@cclkit-check step <text>`: what the check is about to do (the parent quotes
//!   the last one when the process crashes or is killed);
//! * `@cclkit-check result {"status":"PASS","message":"…"}`: the outcome.
//!
//! A watchdog thread turns a plugin call that does not return (a blocking `connect`,
//! a `close` that waits forever) into a failure naming the call, then ends the
//! process with `_exit`: the plugin's state cannot be trusted any more.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::report::Status;
use super::{Checked, Family, Stop, find_check};

/// Prefix of progress lines.
pub(crate) const STEP_PREFIX: &str = "@cclkit-check step ";
/// Prefix of the result line.
pub(crate) const RESULT_PREFIX: &str = "@cclkit-check result ";

/// The text after `prefix` in a protocol line. Searched anywhere in the line, since a
/// plugin may have printed to stdout without a newline just before it.
pub(crate) fn after<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    line.find(prefix).map(|i| &line[i + prefix.len()..])
}

/// The result line's payload.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireResult {
    pub status: Status,
    pub message: String,
}

/// What a child (or peer) process is asked to do.
#[derive(Debug, Clone)]
pub struct ChildArgs {
    /// The library file.
    pub library: PathBuf,
    /// `family.name` of the check (ignored by peers).
    pub check: String,
    /// ABI version.
    pub version: u32,
    /// Seed of the random data.
    pub seed: u64,
    /// The parent's limit for this check.
    pub timeout: Duration,
    /// Fail instead of skipping when init fails or there is no device.
    pub require_devices: bool,
    /// `KEY=VALUE` for the namespace check's peers.
    pub peer_env: Vec<String>,
}

/// Everything a check function gets.
#[derive(Debug, Clone)]
pub(crate) struct Env {
    pub library: PathBuf,
    pub family: Family,
    pub version: u32,
    pub seed: u64,
    pub timeout: Duration,
    pub require_devices: bool,
    pub peer_env: Vec<String>,
    /// This program, to start peer processes.
    pub exe: PathBuf,
}

impl Env {
    pub(crate) fn new(args: &ChildArgs, family: Family) -> Result<Self, String> {
        Ok(Self {
            library: args.library.clone(),
            family,
            version: args.version,
            seed: args.seed,
            timeout: args.timeout,
            require_devices: args.require_devices,
            peer_env: args.peer_env.clone(),
            exe: std::env::current_exe().map_err(|e| format!("cannot find cclkit itself: {e}"))?,
        })
    }
}

/// Runs the check named in `args` and prints its result line.
pub fn run_child(args: &ChildArgs) -> ExitCode {
    let outcome = match args.check.split_once('.') {
        Some((f, name)) => match (
            Family::parse(f),
            Family::parse(f).and_then(|f| find_check(f, name)),
        ) {
            (Some(family), Some(def)) => match Env::new(args, family) {
                Ok(env) => {
                    start_watchdog(args.timeout, &args.check);
                    (def.run)(&env)
                }
                Err(e) => Err(Stop::Fail(e)),
            },
            _ => Err(Stop::Fail(format!("no check named '{}'", args.check))),
        },
        None => Err(Stop::Fail(format!("no check named '{}'", args.check))),
    };
    emit_result(outcome);
    ExitCode::SUCCESS
}

/// Prints the result line.
pub(crate) fn emit_result(outcome: Checked) {
    let (status, message) = match outcome {
        Ok(m) => (Status::Pass, m),
        Err(Stop::Fail(m)) => (Status::Fail, m),
        Err(Stop::Skip(m)) => (Status::Skip, m),
    };
    let wire = WireResult { status, message };
    let json = serde_json::to_string(&wire)
        .unwrap_or_else(|_| r#"{"status":"FAIL","message":"cannot encode the result"}"#.to_owned());
    line(&format!("{RESULT_PREFIX}{json}"));
}

/// Writes one protocol line to stdout and flushes it.
pub(crate) fn line(text: &str) {
    static OUT: Mutex<()> = Mutex::new(());
    let _g = OUT.lock();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// Announces the next step (quoted by the parent if the process dies in it).
pub(crate) fn step(text: impl Into<String>) {
    let text = text.into();
    line(&format!("{STEP_PREFIX}{text}"));
    if let Ok(mut w) = WATCH.lock() {
        w.step = text;
    }
}

struct Watch {
    step: String,
    call: Option<(Instant, String)>,
}

static WATCH: Mutex<Watch> = Mutex::new(Watch {
    step: String::new(),
    call: None,
});

/// Runs `f`, a single plugin call that must return within `limit`; if it does not,
/// the check fails with `message` and the process ends.
pub(crate) fn within<T>(
    limit: Duration,
    message: impl FnOnce() -> String,
    f: impl FnOnce() -> T,
) -> T {
    if let Ok(mut w) = WATCH.lock() {
        w.call = Some((Instant::now() + limit, message()));
    }
    let r = f();
    if let Ok(mut w) = WATCH.lock() {
        w.call = None;
    }
    r
}

/// Starts the watchdog: single calls past their limit, or the whole check past the
/// parent's limit (less a margin so the message, not the kill, reaches the parent).
pub(crate) fn start_watchdog(timeout: Duration, what: &str) {
    let overall = Instant::now()
        + timeout
            .saturating_sub(Duration::from_millis(1500))
            .max(Duration::from_secs(1));
    let secs = timeout.as_secs();
    let what = what.to_owned();
    let _ = std::thread::Builder::new()
        .name("cclkit-check-watchdog".into())
        .spawn(move || {
            loop {
                std::thread::park_timeout(Duration::from_millis(20));
                let now = Instant::now();
                let fired = WATCH.lock().ok().and_then(|w| match &w.call {
                    Some((at, msg)) if now >= *at => Some(msg.clone()),
                    _ if now >= overall => Some(format!(
                        "{what} did not finish within {secs} s; stuck in: {}",
                        if w.step.is_empty() { "setup" } else { &w.step }
                    )),
                    _ => None,
                });
                if let Some(msg) = fired {
                    emit_result(Err(Stop::Fail(msg)));
                    // SAFETY: ends the process without running destructors or atexit
                    // handlers: the plugin is stuck inside a call, so nothing else
                    // in this process can be trusted to finish.
                    unsafe { libc::_exit(0) };
                }
            }
        });
}
