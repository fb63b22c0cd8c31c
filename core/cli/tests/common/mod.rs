//! Test helpers: C plugins built at test time and packaged Rust plugins, from
//! `cclkit_tests` (shared with the host's and the runtime's tests).
#![allow(dead_code, unused_imports)]

pub use cclkit_tests::cplugin::{Plugins, abi_include, fixture, s};
pub use cclkit_tests::plugin as rust_plugin;
pub mod standin;
pub mod tune;

use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Runs `cmd` with piped output, in a process group of its own; past `limit` it
/// kills the whole group (SIGKILL: a launcher and its ranks too) and fails the
/// test.
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().expect("spawn cclkit");
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("cclkit output"),
        Err(_) => {
            // SAFETY: kill(2) of the process group created for this child.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            panic!("{cmd:?} did not finish within {limit:?}");
        }
    }
}

/// Runs `cclkit ARGS` with only `env` set (a clean environment, as operators run
/// `doctor`: the loader reads `LD_LIBRARY_PATH` only at process start); 60 s at most.
pub fn cclkit_clean(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
    cmd.args(args).env_clear();
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_bounded(cmd, Duration::from_secs(60))
}
