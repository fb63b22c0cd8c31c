//! Child processes of `cclkit check`: each runs in its own process group, is killed
//! (with its peers) at its time limit, and its exit, signal or timeout becomes a result.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

use super::child::{RESULT_PREFIX, STEP_PREFIX, WireResult, after};
use super::netns;
use super::report::{CheckResult, Status};

/// How a child ended.
pub(crate) enum Ended {
    /// It exited (normally or by a signal) with this output.
    Exited(Output),
    /// It was still running at the limit: killed; its partial output.
    TimedOut { pid: u32, output: Option<Output> },
    /// It could not be started.
    NotStarted(String),
}

/// Spawns `cmd` in its own process group, waits up to `limit`, then kills the group.
pub(crate) fn spawn_and_wait(mut cmd: Command, limit: Duration) -> Ended {
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ended::NotStarted(e.to_string()),
    };
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let ended = match rx.recv_timeout(limit) {
        Ok(Ok(out)) => Ended::Exited(out),
        Ok(Err(e)) => Ended::NotStarted(e.to_string()),
        Err(_) => {
            kill_group(pid);
            let output = rx
                .recv_timeout(Duration::from_secs(10))
                .ok()
                .and_then(Result::ok);
            Ended::TimedOut { pid, output }
        }
    };
    // Peers a child left behind (it should not) go with their group.
    kill_group(pid);
    if let Ended::TimedOut { pid, .. } = &ended {
        netns::cleanup_for(*pid);
    }
    ended
}

fn kill_group(pid: u32) {
    if let Ok(pgid) = i32::try_from(pid) {
        // SAFETY: kill(2) on the process group we created for this child (its pgid is
        // its pid); ESRCH when it is already gone is harmless.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
}

/// Turns a child's end into a result (`r` names the check; its status and message
/// are overwritten).
pub(crate) fn classify(mut r: CheckResult, ended: Ended, limit: Duration) -> CheckResult {
    let (output, what) = match ended {
        Ended::NotStarted(e) => {
            r.message = format!("could not start the check process: {e}");
            return r;
        }
        Ended::TimedOut { output, .. } => {
            let secs = limit.as_secs();
            (output, format!("timed out after {secs} s (killed)"))
        }
        Ended::Exited(out) => {
            let what = exit_text(&out);
            (Some(out), what)
        }
    };
    let stdout = output
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let stderr = output
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .unwrap_or_default();
    let step = stdout
        .lines()
        .rev()
        .find_map(|l| after(l, STEP_PREFIX))
        .map(str::to_owned);
    let result = stdout
        .lines()
        .rev()
        .find_map(|l| after(l, RESULT_PREFIX))
        .and_then(|j| serde_json::from_str::<WireResult>(j).ok());
    let clean_exit = output.as_ref().is_some_and(|o| o.status.success());
    match result {
        Some(w) if clean_exit => {
            r.status = w.status;
            r.message = w.message;
        }
        Some(w) => {
            r.status = Status::Fail;
            r.message = format!(
                "{}; then the process {what} while exiting (a library destructor, atexit \
                 handler or leftover thread of the plugin){}",
                w.message,
                tail(&stderr)
            );
        }
        None => {
            let at = step.map_or_else(String::new, |s| format!(" during: {s}"));
            r.message = format!("the check process {what}{at}{}", tail(&stderr));
        }
    }
    r
}

/// "was killed by SIGSEGV (signal 11)" / "exited with code 3".
fn exit_text(out: &Output) -> String {
    if let Some(sig) = out.status.signal() {
        format!("was killed by {} (signal {sig})", signal_name(sig))
    } else {
        match out.status.code() {
            Some(0) => "exited without a result".to_owned(),
            Some(c) => format!("exited with code {c}"),
            None => "ended".to_owned(),
        }
    }
}

/// The usual name of a signal number.
pub(crate) fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}

/// The last lines the child wrote to stderr (plugin WARNs, panics), for crash reports.
fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let last: Vec<String> = lines[lines.len().saturating_sub(4)..]
        .iter()
        .map(|l| {
            let l = l.trim();
            match l.char_indices().nth(240) {
                Some((cut, _)) => format!("{}…", &l[..cut]),
                None => l.to_owned(),
            }
        })
        .collect();
    format!("; stderr: {}", last.join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_have_names_and_stderr_is_cut() {
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        let t = tail("a\n\nb\nc\nd\ne\n");
        assert_eq!(t, "; stderr: b | c | d | e");
        assert_eq!(tail(""), "");
    }
}
