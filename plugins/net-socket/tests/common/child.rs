//! Child processes: the test binary re-executes itself (`--exact <test> --nocapture`)
//! with `CCLKIT_TEST_ROLE` set; parent and child talk in lines prefixed `@@ `.
//! Every wait is bounded, and a child is killed when its handle is dropped.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// Environment variable carrying a child's role.
pub const ROLE_ENV: &str = "CCLKIT_TEST_ROLE";

/// The role of this process, if it is a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// A running child.
pub struct Child {
    pid: i32,
    exited: Receiver<ExitStatus>,
    status: Option<ExitStatus>,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    name: String,
}

impl Child {
    /// Starts `<this test binary> --exact <test> --nocapture` with `envs`, optionally
    /// behind a wrapper command (e.g. `ip netns exec <ns>`).
    pub fn spawn(
        name: &str,
        test: &str,
        role: &str,
        envs: &[(&str, String)],
        wrapper: &[&str],
    ) -> Child {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut proc = cmd.spawn().expect("spawn child");
        let stdout = proc.stdout.take().expect("child stdout");
        let stdin = proc.stdin.take();
        let pid = proc.id() as i32;
        let (done_tx, done_rx) = channel();
        std::thread::spawn(move || {
            if let Ok(status) = proc.wait() {
                let _ = done_tx.send(status);
            }
        });
        let (tx, rx) = channel();
        let label = name.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // libtest prints "test <name> ... " without a newline before the
                // test runs, so a marker may start mid-line.
                if let Some(pos) = line.find("@@ ") {
                    if tx.send(line[pos + 3..].to_owned()).is_err() {
                        break;
                    }
                } else {
                    eprintln!("[{label}] {line}");
                }
            }
        });
        Child {
            pid,
            exited: done_rx,
            status: None,
            stdin,
            lines: rx,
            name: name.to_owned(),
        }
    }

    /// Waits for the next `@@` line starting with `prefix`; returns the rest.
    pub fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                    if line.starts_with("FAIL") {
                        panic!("{}: {line}", self.name);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{}: no '{prefix}' line within {timeout:?}", self.name)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("{}: exited before printing '{prefix}'", self.name)
                }
            }
        }
    }

    /// Sends one line to the child's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("child stdin");
        writeln!(stdin, "{line}").expect("write to child");
        stdin.flush().expect("flush child stdin");
    }

    /// Waits for the child to exit; `None` on timeout.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.exited.recv_timeout(timeout).ok();
        }
        self.status
    }

    /// Waits for a successful exit.
    pub fn wait_ok(&mut self, timeout: Duration) {
        match self.wait(timeout) {
            Some(status) => assert!(status.success(), "{} exited with {status}", self.name),
            None => panic!("{} did not exit within {timeout:?}", self.name),
        }
    }

    /// Kills the child now (SIGKILL) and waits until it is reaped.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            if let Ok(status) = self.exited.try_recv() {
                self.status = Some(status);
                return;
            }
            // SAFETY: plain kill(2) of our own child, not yet reaped (checked above).
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = self.wait(Duration::from_secs(10));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Prints a protocol line for the parent.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "@@ {line}");
    let _ = out.flush();
}

/// Reads the next line the parent sent (panics on EOF: the parent is gone).
pub fn hear() -> String {
    let mut line = String::new();
    let n = std::io::stdin().read_line(&mut line).expect("read stdin");
    assert!(n > 0, "parent closed stdin");
    line.trim().to_owned()
}

/// Hex encoding of a handle.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes [`hex`].
pub fn unhex(s: &str) -> [u8; 128] {
    let mut out = [0u8; 128];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex");
    }
    out
}
