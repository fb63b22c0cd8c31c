//! `cclkit perf --np N` without a launcher: the ranks run as child processes of
//! cclkit's local launcher (one rank included), so a plugin that crashes, hangs or
//! ends the process in its constructor is a failed rank, never a silent exit 0.

use std::process::ExitCode;
use std::time::Duration;

use cclkit_runtime::{Config, world};

use super::{LAUNCHER_ENV, place};

/// Runs `np` local ranks of this command and reports the first one that failed.
pub fn run(np: usize) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if np > 1 {
        let set = place::local_env(&|k| std::env::var(k).ok());
        let note: Vec<String> = set
            .iter()
            .map(|(k, v, why)| format!("{k}={v} ({why})"))
            .collect();
        for (k, v, _) in &set {
            // SAFETY: no other thread exists yet (logging starts none; the bootstrap
            // root and the ranks start after this), so nothing reads the environment
            // concurrently.
            unsafe { std::env::set_var(k, v) };
        }
        if !note.is_empty() {
            // SAFETY: as above.
            unsafe { std::env::set_var(LAUNCHER_ENV, note.join(", ")) };
        }
    }
    // Every variable is checked here once, so a bad value is one clear error instead
    // of the same error from every rank.
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cclkit perf: {e}");
            return ExitCode::from(2);
        }
    };
    let o = cclkit_runtime::launch::LocalOptions {
        timeout: config.bootstrap_timeout,
        grace: Duration::from_secs(1),
        require_result: true,
    };
    match world::spawn_self_with(np, &args, &o) {
        Ok(exits) => match world::failures(&exits) {
            None => ExitCode::SUCCESS,
            Some(why) => {
                eprintln!("cclkit perf: {why}");
                // A rank that found wrong data exits 1; keep that meaning.
                let first = exits
                    .iter()
                    .filter(|e| !e.ok() && !e.stopped)
                    .min_by_key(|e| e.order);
                let code = first.and_then(|e| e.code).filter(|&c| c != 0);
                ExitCode::from(code.unwrap_or(1).clamp(1, 255) as u8)
            }
        },
        Err(e) => {
            eprintln!("cclkit perf: {e}");
            ExitCode::FAILURE
        }
    }
}
