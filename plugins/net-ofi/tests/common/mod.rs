//! Runs `cclkit-ofi-peer` processes for the integration tests: relays listen
//! handles between two peers, bounds every wait, and kills children on drop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The peer, the package's `cclkit-ofi-peer` example: cargo puts test binaries in
/// `target/<profile>/deps/` and examples in `target/<profile>/examples/`.
/// `cargo test -p cclkit-net-ofi` builds it; a run narrowed with `--test` does not.
pub fn peer_path() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the running test");
    let path = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("test binary inside target/<profile>/deps")
        .join("examples/cclkit-ofi-peer");
    assert!(
        path.exists(),
        "{} is missing: run `cargo test -p cclkit-net-ofi` (or `cargo build -p \
         cclkit-net-ofi --examples` with the same profile) first",
        path.display()
    );
    path
}

/// Provider settings for one test flavour.
pub fn provider_env(provider: &str) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("CCLKIT_OFI_PROVIDER", provider.to_owned()),
        ("FI_LOG_LEVEL", "warn".to_owned()),
    ];
    if provider.starts_with("tcp") {
        // Bind to loopback (node address + FI_SOURCE), see DEPENDENCIES.md §4.
        env.push(("CCLKIT_OFI_IFACE", "lo".to_owned()));
    }
    env
}

/// A running peer.
pub struct Peer {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Peer {
    /// Starts the peer with `args` and extra environment.
    pub fn spawn(name: &str, args: &[&str], env: &[(&str, String)]) -> Peer {
        let mut cmd = Command::new(peer_path());
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn cclkit-ofi-peer");
        let (tx, lines) = channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().expect("stderr");
        let sink = Arc::clone(&stderr);
        let stderr_reader = Some(std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        }));
        let stdin = child.stdin.take();
        Peer {
            name: name.to_owned(),
            child,
            stdin,
            lines,
            seen: Vec::new(),
            stderr,
            stderr_reader,
        }
    }

    /// Everything the peer printed so far (for failure messages).
    pub fn transcript(&self) -> String {
        format!(
            "--- {} stdout:\n{}\n--- {} stderr:\n{}",
            self.name,
            self.seen.join("\n"),
            self.name,
            self.stderr.lock().unwrap()
        )
    }

    /// Waits for a line starting with `prefix`; panics with the transcript on
    /// timeout, on a `FAIL` line, or if the peer exits first.
    pub fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                    if line.starts_with("FAIL") {
                        panic!("{} failed:\n{}", self.name, self.transcript());
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "{}: no {prefix:?} within {timeout:?}\n{}",
                        self.name,
                        self.transcript()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(50)); // let stderr drain
                    panic!(
                        "{}: exited before {prefix:?}\n{}",
                        self.name,
                        self.transcript()
                    )
                }
            }
        }
    }

    /// Sends `line` to a peer that may have finished already (a hint it need not
    /// read): a closed pipe is not an error.
    pub fn hint(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
        }
    }

    /// Sends one line to the peer's stdin.
    pub fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to peer");
        stdin.flush().expect("flush peer stdin");
    }

    /// Waits for its `OK` and exit (killing the peer after `timeout`); returns
    /// its stderr (the plugin's `LOG <level> <text>` lines).
    pub fn finish(mut self, timeout: Duration) -> String {
        self.expect("OK", timeout);
        let status = self.wait(timeout);
        assert!(
            status.success(),
            "{} exited with {status}\n{}",
            self.name,
            self.transcript()
        );
        if let Some(r) = self.stderr_reader.take() {
            let _ = r.join();
        }
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for exit, killing the peer after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "{} did not exit within {timeout:?}\n{}",
                    self.name,
                    self.transcript()
                );
            }
            // Polling a child's exit has no condition to block on with a timeout.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the peer (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        remove_shm_regions(self.child.id());
    }
}

/// Removes the `shm` regions (`/dev/shm/<pid>:…`) a killed or exited peer left:
/// a later process given the same PID would find them in its way (see
/// `tests/stale_shm.rs`). Called only once the peer is reaped.
fn remove_shm_regions(pid: u32) {
    let prefix = format!("{pid}:");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Starts two peers and relays their listen handles so they connect both ways.
pub fn pair(a: (&str, &[&str]), b: (&str, &[&str]), env: &[(&str, String)]) -> (Peer, Peer) {
    let mut pa = Peer::spawn(a.0, a.1, env);
    let mut pb = Peer::spawn(b.0, b.1, env);
    let t = Duration::from_secs(30);
    let ha = pa.expect("HANDLE ", t);
    let hb = pb.expect("HANDLE ", t);
    pa.tell(&format!("PEER {hb}"));
    pb.tell(&format!("PEER {ha}"));
    (pa, pb)
}
