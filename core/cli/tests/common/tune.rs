//! Running the `cclkit tune` binary in tests: a bounded run (the whole process group
//! is killed past its limit) with the variables that would change it scrubbed, and
//! readers for its JSON.
#![allow(dead_code)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Run {
    /// Exit status (`None`: killed).
    pub code: Option<i32>,
    /// Everything printed on stdout.
    pub stdout: String,
    /// Everything printed on stderr.
    pub stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Variables that would change what the binary does, removed from every run.
pub const SCRUB: [&str; 9] = [
    "CCLKIT_UNIQUE_ID",
    "CCLKIT_RANK",
    "CCLKIT_NRANKS",
    "NCCL_TUNER_PLUGIN",
    "NCCL_TUNER_CONFIG_FILE",
    "CCLKIT_TUNER_MODE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "CCLKIT_STRICT",
];

/// Runs `cclkit args` with `env`, killing its process group after `limit`.
pub fn cclkit(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    for v in SCRUB {
        cmd.env_remove(v);
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .env("CCLKIT_OP_TIMEOUT", "60")
        .env("CCLKIT_BOOTSTRAP_TIMEOUT", "60")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().expect("start cclkit");
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = pipe(Box::new(child.stdout.take().expect("stdout")));
    let err = pipe(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let pgid = i32::try_from(child.id()).expect("pid");
            // SAFETY: signals the process group this test created for the child.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let _ = child.wait();
            panic!(
                "cclkit {args:?} ran past {limit:?}\n--- stdout\n{}--- stderr\n{}",
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The launcher's ranks are gone when it exits; a stray one would keep the pipes
    // open, so make sure nothing of the group is left.
    let pgid = i32::try_from(child.id()).expect("pid");
    // SAFETY: as above; the group may already be empty (ESRCH).
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    Run {
        code: status.code(),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

pub const SHORT: Duration = Duration::from_secs(60);
pub const RANKS: Duration = Duration::from_secs(120);

pub fn json(r: &Run) -> Value {
    assert_eq!(r.code, Some(0), "{r}");
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("JSON: {e}\n{r}"))
}

/// `(algo/proto/channels, source, changed)` of the cell for `coll` and `bytes`.
pub fn cell(t: &Value, coll: &str, bytes: u64) -> (String, String, bool) {
    let c = t["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .find(|c| c["collective"] == coll && c["bytes"] == bytes)
        .unwrap_or_else(|| panic!("no cell {coll} {bytes} in {t}"));
    let d = &c["decision"];
    (
        format!(
            "{}/{}/{}",
            d["algo"].as_str().expect("algo"),
            d["proto"].as_str().expect("proto"),
            d["channels"]
        ),
        d["source"].as_str().expect("source").to_owned(),
        c["changed"].as_bool().expect("changed"),
    )
}

pub fn builtin(t: &Value, coll: &str, bytes: u64) -> String {
    let c = t["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .find(|c| c["collective"] == coll && c["bytes"] == bytes)
        .expect("cell");
    let b = &c["builtin"];
    format!(
        "{}/{}/{}",
        b["algo"].as_str().unwrap_or("?"),
        b["proto"].as_str().unwrap_or("?"),
        b["channels"]
    )
}

pub const RULES: &str = "\
# steering by size
allreduce,0,8191,ring,ll,1,-1,-1
allreduce,8192,-1,tree,simple,2,-1,-1
allgather,0,-1,ring,ll128,2,-1,8
";
