//! Multi-process helpers for the runtime suites (`runtime_*.rs`).
//!
//! A test function is both the launcher and the rank program. The parent re-runs the
//! test binary as `np` processes with `--exact <this test>` and `CKT_ROLE=rank`; the
//! same function, seeing that variable, runs its rank body instead (see [`rank!`]).
//! The parent hosts the bootstrap root as `cclkit --np` does and hands every rank
//! `CCLKIT_UNIQUE_ID/RANK/NRANKS`, so ranks join through `world::init_from_env`.
//!
//! Every launch has a deadline after which its processes are killed and the test
//! fails with their output; launches of one binary run one at a time (the build
//! machine has two cores, and eight ranks each with a spinning proxy thread is load
//! enough). Ranks report facts to the parent as `@@ {json}` lines on stdout.
#![allow(dead_code)]

pub mod colls;
pub mod data;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cclkit_runtime::{BootstrapRoot, random_u64};
use cclkit_runtime::{Comm, Config, world};

/// Environment variable marking a rank process.
pub const ROLE: &str = "CKT_ROLE";

/// The name libtest knows the calling test by (`module::fn`, crate name dropped).
#[macro_export]
macro_rules! test_name {
    () => {{
        fn here() {}
        let full = std::any::type_name_of_val(&here);
        let full = full.strip_suffix("::here").unwrap_or(full);
        full.split_once("::").map_or(full, |(_, rest)| rest)
    }};
}

/// In a rank process: runs `$body` (the rank program) and returns from the test.
#[macro_export]
macro_rules! rank {
    ($body:expr) => {
        if $crate::common_rt::is_rank() {
            $crate::common_rt::emit("started", $crate::test_name!());
            let f: &dyn Fn() = &$body;
            f();
            $crate::common_rt::emit("finished", $crate::test_name!());
            return;
        }
    };
}

/// Whether this process is a rank of a launch.
pub fn is_rank() -> bool {
    std::env::var_os(ROLE).is_some()
}

/// A launch parameter (`CKT_<name>`), in a rank process.
pub fn param(name: &str) -> Option<String> {
    std::env::var(format!("CKT_{name}")).ok()
}

/// A numeric launch parameter with a default.
pub fn param_u64(name: &str, default: u64) -> u64 {
    param(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("CKT_{name}={v} is not a number"))
    })
}

/// Reports `value` under `key` to the parent.
pub fn emit(key: &str, value: impl serde::Serialize) {
    let line = serde_json::json!({ key: value });
    println!("@@ {line}");
}

/// Joins the communicator of this launch (configuration from the environment).
pub fn join() -> Comm {
    let config = Config::from_env().unwrap_or_else(|e| panic!("config: {e}"));
    world::init_from_env(&config)
        .unwrap_or_else(|e| panic!("init: {e}"))
        .expect("a rank process is started by a launcher")
}

/// Where the packaged plugins are: `CCLKIT_LIB_DIR`, else `<workspace>/build/lib`.
pub fn lib_dir() -> PathBuf {
    std::env::var_os("CCLKIT_LIB_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/lib"),
        PathBuf::from,
    )
}

/// A packaged plugin file; fails (never skips) when it is missing.
pub fn packaged(file: &str) -> PathBuf {
    let p = lib_dir().join(file);
    assert!(
        p.is_file(),
        "{} is missing: run `make package` first (or point CCLKIT_LIB_DIR at a directory \
         holding the packaged plugins)",
        p.display()
    );
    p
}

/// Environment selecting the built-in socket transport.
pub fn builtin_net() -> Vec<(String, String)> {
    vec![("NCCL_NET_PLUGIN".into(), "none".into())]
}

/// Environment loading the packaged socket plugin by name, with no silent fallback.
pub fn plugin_net() -> Vec<(String, String)> {
    packaged("libnccl-net-cclkit-socket.so");
    vec![
        ("NCCL_NET_PLUGIN".into(), "cclkit-socket".into()),
        ("LD_LIBRARY_PATH".into(), lib_dir().display().to_string()),
        ("CCLKIT_STRICT".into(), "1".into()),
    ]
}

/// Compiles the C net plugin fixture `source` (in `tests/fixtures/`) against the
/// committed ABI header into `dir/lib<name>.so`, warnings as errors.
pub fn compile_plugin(dir: &tempfile::TempDir, name: &str, source: &str) -> PathBuf {
    use cclkit_tests::cplugin::{abi_include, fixture};
    let out = dir.path().join(format!("lib{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = std::process::Command::new(&cc)
        .args([
            "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-I",
        ])
        .arg(abi_include())
        .arg("-o")
        .arg(&out)
        .arg(fixture(source))
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler '{cc}': {e}"));
    assert!(status.success(), "compiling {source} failed: {status}");
    out
}

/// Whether a library whose file name contains `name` is mapped into this process.
pub fn mapped(name: &str) -> bool {
    std::fs::read_to_string("/proc/self/maps").is_ok_and(|m| m.contains(name))
}

/// Launches of one test binary run one at a time.
static LAUNCH: Mutex<()> = Mutex::new(());

/// One multi-process launch.
pub struct Job {
    test: String,
    np: usize,
    env: Vec<(String, String)>,
    rank_env: Vec<Vec<(String, String)>>,
    wrap: Vec<Vec<String>>,
    timeout: Duration,
    host_root: bool,
    kill_on: Option<(usize, String, i32)>,
    grace: Duration,
    root_timeout: Option<Duration>,
}

/// How one rank process ended.
#[derive(Debug)]
pub struct RankRun {
    /// The rank.
    pub rank: usize,
    /// Exit code (`None` when a signal ended it).
    pub code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// When it ended, from the launch.
    pub ended: Duration,
}

/// A finished launch.
#[derive(Debug)]
pub struct Run {
    /// The test that ran.
    pub test: String,
    /// Every rank, by rank.
    pub ranks: Vec<RankRun>,
    /// The deadline passed and the rest were killed.
    pub timed_out: bool,
    /// When the `kill_on` victim was killed, from the launch.
    pub killed_at: Option<Duration>,
    /// Wall time of the launch.
    pub wall: Duration,
}

impl Job {
    /// `np` ranks running the rank body of `test` (use [`test_name!`]).
    pub fn new(test: &str, np: usize) -> Self {
        Self {
            test: test.to_owned(),
            np,
            env: vec![
                ("CCLKIT_BOOTSTRAP_TIMEOUT".into(), "30".into()),
                ("CCLKIT_OP_TIMEOUT".into(), "60".into()),
            ],
            rank_env: vec![Vec::new(); np],
            wrap: vec![Vec::new(); np],
            timeout: Duration::from_secs(120),
            host_root: true,
            kill_on: None,
            grace: Duration::from_secs(20),
            root_timeout: None,
        }
    }

    /// Sets a variable for every rank.
    pub fn env(mut self, k: &str, v: impl ToString) -> Self {
        self.env.push((k.to_owned(), v.to_string()));
        self
    }

    /// Sets several variables for every rank.
    pub fn envs(mut self, list: Vec<(String, String)>) -> Self {
        self.env.extend(list);
        self
    }

    /// Sets a variable for one rank (after the common ones, so it overrides them).
    pub fn rank_env(mut self, rank: usize, k: &str, v: impl ToString) -> Self {
        self.rank_env[rank].push((k.to_owned(), v.to_string()));
        self
    }

    /// Runs `rank` under a command prefix (`ip netns exec NS`).
    pub fn wrap(mut self, rank: usize, prefix: &[&str]) -> Self {
        self.wrap[rank] = prefix.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// The launch's deadline.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// How long the others may run on after a rank failed.
    pub fn grace(mut self, d: Duration) -> Self {
        self.grace = d;
        self
    }

    /// How long the bootstrap root waits for ranks (default: the launch deadline).
    pub fn root_timeout(mut self, d: Duration) -> Self {
        self.root_timeout = Some(d);
        self
    }

    /// The ranks find the root themselves (no `CCLKIT_UNIQUE_ID`).
    pub fn no_root(mut self) -> Self {
        self.host_root = false;
        self
    }

    /// SIGKILLs `rank` as soon as it prints the line `marker`.
    pub fn kill_on(self, rank: usize, marker: &str) -> Self {
        self.signal_on(rank, marker, libc::SIGKILL)
    }

    /// Sends `signal` to `rank` as soon as it prints the line `marker` (SIGSTOP: a
    /// hung rank; it is killed once every other rank has ended).
    pub fn signal_on(mut self, rank: usize, marker: &str, signal: i32) -> Self {
        self.kill_on = Some((rank, marker.to_owned(), signal));
        self
    }

    fn command(&self, rank: usize, id: Option<String>) -> Command {
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = match self.wrap[rank].split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args([&self.test, "--exact", "--nocapture", "--test-threads=1"]);
        // Hermetic: nothing from the caller's NCCL/cclkit settings leaks in.
        for (k, _) in std::env::vars() {
            if (k.starts_with("NCCL_") || k.starts_with("CCLKIT_") || k.starts_with("CKT_"))
                && k != "CCLKIT_LIB_DIR"
            {
                cmd.env_remove(k);
            }
        }
        cmd.env(ROLE, "rank").env("RUST_BACKTRACE", "0");
        if let Some(id) = id {
            cmd.env("CCLKIT_UNIQUE_ID", id)
                .env("CCLKIT_RANK", rank.to_string())
                .env("CCLKIT_NRANKS", self.np.to_string())
                .env("CCLKIT_LOCAL_RANK", rank.to_string())
                .env("CCLKIT_LOCAL_SIZE", self.np.to_string());
        }
        cmd.envs(self.env.iter().cloned())
            .envs(self.rank_env[rank].iter().cloned());
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs the launch to its end (or deadline); never hangs.
    pub fn run(self) -> Run {
        let _serial = LAUNCH.lock().unwrap_or_else(|p| p.into_inner());
        let start = Instant::now();
        let (id, root) = if self.host_root {
            let (id, root) = BootstrapRoot::start(
                "127.0.0.1:0".parse().expect("loopback"),
                random_u64(),
                self.root_timeout.unwrap_or(self.timeout),
            )
            .expect("bootstrap root");
            (Some(id.to_string()), Some(root))
        } else {
            (None, None)
        };
        let killed_at: Arc<Mutex<Option<Duration>>> = Arc::new(Mutex::new(None));
        let mut children: Vec<Child> = Vec::with_capacity(self.np);
        let mut readers = Vec::new();
        for rank in 0..self.np {
            let mut child = match self.command(rank, id.clone()).spawn() {
                Ok(c) => c,
                Err(e) => {
                    for c in &mut children {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    panic!("cannot start rank {rank} of {}: {e}", self.test);
                }
            };
            let marker = self
                .kill_on
                .as_ref()
                .filter(|(r, _, _)| *r == rank)
                .map(|(_, m, sig)| (m.clone(), *sig));
            let pid = child.id() as i32;
            let out = child.stdout.take().expect("piped stdout");
            let err = child.stderr.take().expect("piped stderr");
            let killed = Arc::clone(&killed_at);
            readers.push((
                std::thread::spawn(move || read_lines(out, marker, pid, start, &killed)),
                std::thread::spawn(move || {
                    let mut s = String::new();
                    let _ = BufReader::new(err).read_to_string(&mut s);
                    s
                }),
            ));
            children.push(child);
        }
        let victim = self.kill_on.as_ref().map(|(r, _, _)| *r);
        let (exits, timed_out) = supervise(&mut children, start, self.timeout, self.grace, victim);
        drop(root);
        let ranks = exits
            .into_iter()
            .zip(readers)
            .enumerate()
            .map(|(rank, ((status, ended), (out, err)))| {
                use std::os::unix::process::ExitStatusExt;
                RankRun {
                    rank,
                    code: status.and_then(|s| s.code()),
                    signal: status.and_then(|s| s.signal()),
                    stdout: out.join().unwrap_or_default(),
                    stderr: err.join().unwrap_or_default(),
                    ended,
                }
            })
            .collect();
        let killed_at = *killed_at.lock().unwrap_or_else(|p| p.into_inner());
        let run = Run {
            test: self.test,
            ranks,
            timed_out,
            killed_at,
            wall: start.elapsed(),
        };
        for r in &run.ranks {
            // A misspelt test name would run nothing and "pass".
            if r.signal.is_none() && !r.stdout.contains("@@ {\"started\"") {
                panic!(
                    "rank {} never started the rank body of '{}'\n{}",
                    r.rank,
                    run.test,
                    run.describe()
                );
            }
        }
        run
    }
}

/// Collects a rank's stdout; signals it (`pid`) when it prints `marker`.
fn read_lines(
    out: std::process::ChildStdout,
    marker: Option<(String, i32)>,
    pid: i32,
    start: Instant,
    killed: &Mutex<Option<Duration>>,
) -> String {
    let mut all = String::new();
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        if let Some((m, sig)) = &marker
            && m == line.trim()
        {
            // SAFETY: plain kill(2) of our own child, not yet reaped (its pid is ours).
            unsafe { libc::kill(pid, *sig) };
            killed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(start.elapsed());
        }
        all.push_str(&line);
        all.push('\n');
    }
    all
}

type Exit = (Option<std::process::ExitStatus>, Duration);

/// Waits for every child until `timeout`; after a failure the rest get `grace`. The
/// signalled `victim` (maybe only stopped) is killed once all the others ended.
fn supervise(
    children: &mut [Child],
    start: Instant,
    timeout: Duration,
    grace: Duration,
    victim: Option<usize>,
) -> (Vec<Exit>, bool) {
    let mut exits: Vec<Option<Exit>> = children.iter().map(|_| None).collect();
    let mut kill_at = start + timeout;
    let mut timed_out = false;
    while exits.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if exits[i].is_none()
                && let Ok(Some(st)) = c.try_wait()
            {
                if !st.success() {
                    kill_at = kill_at.min(Instant::now() + grace);
                }
                exits[i] = Some((Some(st), start.elapsed()));
            }
        }
        if let Some(v) = victim
            && exits[v].is_none()
            && exits.iter().enumerate().all(|(i, e)| i == v || e.is_some())
        {
            let _ = children[v].kill();
            exits[v] = Some((children[v].wait().ok(), start.elapsed()));
        }
        if Instant::now() >= kill_at && exits.iter().any(Option::is_none) {
            timed_out |= kill_at == start + timeout;
            for (i, c) in children.iter_mut().enumerate() {
                if exits[i].is_none() {
                    let _ = c.kill();
                    let st = c.wait().ok();
                    exits[i] = Some((st, start.elapsed()));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (exits.into_iter().flatten().collect(), timed_out)
}

fn tail(s: &str, n: usize) -> &str {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

impl Run {
    /// Every rank's exit and the ends of its output, for failure messages.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "launch of '{}' ({:.1} s{})\n",
            self.test,
            self.wall.as_secs_f64(),
            if self.timed_out { ", TIMED OUT" } else { "" }
        );
        for r in &self.ranks {
            s.push_str(&format!(
                "--- rank {} exit {:?} signal {:?} after {:.2} s\n[stdout]\n{}\n[stderr]\n{}\n",
                r.rank,
                r.code,
                r.signal,
                r.ended.as_secs_f64(),
                tail(&r.stdout, 3000),
                tail(&r.stderr, 3000)
            ));
        }
        s
    }

    /// Asserts every rank finished its body and exited 0.
    pub fn assert_ok(&self) -> &Self {
        let bad = self.timed_out
            || self
                .ranks
                .iter()
                .any(|r| r.code != Some(0) || !r.stdout.contains("@@ {\"finished\""));
        assert!(!bad, "a rank failed\n{}", self.describe());
        self
    }

    /// The records `rank` reported.
    pub fn records(&self, rank: usize) -> Vec<serde_json::Value> {
        self.ranks[rank]
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix("@@ "))
            .filter_map(|j| serde_json::from_str(j).ok())
            .collect()
    }

    /// Every value `rank` reported under `key`, in order.
    pub fn values(&self, rank: usize, key: &str) -> Vec<serde_json::Value> {
        self.records(rank)
            .into_iter()
            .filter_map(|mut r| r.get_mut(key).map(serde_json::Value::take))
            .collect()
    }

    /// The first value `rank` reported under `key`.
    pub fn value(&self, rank: usize, key: &str) -> serde_json::Value {
        self.values(rank, key)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("rank {rank} reported no '{key}'\n{}", self.describe()))
    }
}
