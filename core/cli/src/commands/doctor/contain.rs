//! Running `doctor` and `info` in a child process, as `check` does: the tools exist
//! to look at plugins that may crash, hang or end the process in a constructor, so
//! the process that loads them is never the one that reports.
//!
//! The parent re-runs the same command line with [`CHILD_ENV`] set, waits at most
//! `CCLKIT_DIAG_TIMEOUT` seconds, passes on the child's stdout and stderr, and
//! exits with the child's status. The child names each plugin step on stderr
//! (`@cclkit-diag step …`) and says `@cclkit-diag done` once its report is out; a
//! child killed by a signal, stopped at the time limit, or ending without `done`
//! becomes one report line naming the plugin, the step and how it ended, and a
//! non-zero exit.

use std::io::{Read, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Set in the child: it does the work itself.
pub const CHILD_ENV: &str = "CCLKIT_DIAG_CHILD";
/// Seconds the child may take (default [`DEFAULT_LIMIT`]).
pub const LIMIT_ENV: &str = "CCLKIT_DIAG_TIMEOUT";
/// Default time limit of the child.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(60);
/// Exit status when the child crashed, hung or ended without its report.
pub const CRASH_STATUS: u8 = 3;
const STEP: &str = "@cclkit-diag step ";
const DONE: &str = "@cclkit-diag done";

/// Whether this process is the child (it runs the plugin).
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// In the child: names the step about to run (quoted if the process dies in it).
pub fn step(text: &str) {
    if is_child() {
        let _ = writeln!(std::io::stderr().lock(), "{STEP}{text}");
    }
}

/// In the child: the report is complete.
pub fn done() {
    if is_child() {
        let _ = writeln!(std::io::stderr().lock(), "{DONE}");
    }
}

/// In the parent: runs this command in a child and returns its exit status; `None`
/// in the child (go on and do the work). `tool` is `doctor` or `info`; `plugin`
/// names what is being looked at.
pub fn run_contained(tool: &str, plugin: &str, json: bool) -> Option<ExitCode> {
    if is_child() {
        return None;
    }
    let limit = match std::env::var(LIMIT_ENV) {
        Ok(v) => match cclkit_runtime::config::parse_secs(LIMIT_ENV, &v) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("cclkit {tool}: {}", e.message());
                return Some(ExitCode::from(2));
            }
        },
        Err(_) => DEFAULT_LIMIT,
    };
    let ended = match run_child(limit) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("cclkit {tool}: cannot start its worker process: {e}");
            return Some(ExitCode::from(2));
        }
    };
    let _ = std::io::stdout().lock().write_all(&ended.stdout);
    let stderr = String::from_utf8_lossy(&ended.stderr);
    let mut last_step = None;
    let mut finished = false;
    let mut err = std::io::stderr().lock();
    for line in stderr.lines() {
        if let Some(s) = line.find(STEP).map(|i| &line[i + STEP.len()..]) {
            last_step = Some(s.to_owned());
        } else if line.contains(DONE) {
            finished = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
    }
    let how = match (ended.status, ended.timed_out) {
        (_, true) => format!("did not finish within {limit:?} ({LIMIT_ENV}; killed)"),
        (Some(s), false) => {
            use std::os::unix::process::ExitStatusExt;
            match (s.signal(), s.code()) {
                (Some(sig), _) => format!("was killed by {} (signal {sig})", signal_name(sig)),
                (None, Some(c)) if finished => return Some(ExitCode::from(c.clamp(0, 255) as u8)),
                (None, Some(c)) => format!("exited with status {c} before its report was complete"),
                (None, None) => "ended abnormally".to_owned(),
            }
        }
        (None, false) => "could not be waited for".to_owned(),
    };
    let step = last_step.unwrap_or_else(|| "starting".to_owned());
    let line = format!(
        "cclkit {tool}: plugin {}: the process that loaded it {how} during: {step}",
        cclkit_runtime::config::shown(plugin)
    );
    if json {
        let v = serde_json::json!({
            "plugin": plugin,
            "step": step,
            "ended": how,
            "problems": [line],
        });
        println!("{v}");
    } else {
        println!("{line}");
    }
    let _ = writeln!(err, "{line}");
    Some(ExitCode::from(CRASH_STATUS))
}

struct Ended {
    status: Option<std::process::ExitStatus>,
    timed_out: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

fn run_child(limit: Duration) -> std::io::Result<Ended> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Bounded reads: a plugin printing without end cannot exhaust memory.
    let cap = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(r) = r {
                let _ = r.take(16 << 20).read_to_end(&mut out);
            }
            out
        })
    };
    let out = cap(child
        .stdout
        .take()
        .map(|s| Box::new(s) as Box<dyn Read + Send>));
    let err = cap(child
        .stderr
        .take()
        .map(|s| Box::new(s) as Box<dyn Read + Send>));
    let deadline = Instant::now() + limit;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() >= deadline => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break None,
        }
    };
    // A process the plugin left behind may keep the pipes open: do not wait for it.
    let join = |h: std::thread::JoinHandle<Vec<u8>>| {
        let until = Instant::now() + Duration::from_secs(2);
        while !h.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        if h.is_finished() {
            h.join().unwrap_or_default()
        } else {
            Vec::new()
        }
    };
    Ok(Ended {
        status,
        timed_out,
        stdout: join(out),
        stderr: join(err),
    })
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}
