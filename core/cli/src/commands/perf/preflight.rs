//! Each rank loads its plugins once in a short-lived child process before it loads
//! them for real (issue 16).
//!
//! A plugin whose constructor or `init` calls `_exit(0)`, crashes or never returns
//! would otherwise end or stall the rank itself: under an external launcher
//! (mpirun, srun, torchrun) a rank that vanished with status 0 looks like success.
//! The child re-runs this command line with [`CHILD_ENV`] set, selects the net
//! plugin and the tuner as a communicator would (init included), opens the
//! profiler, names each step on stderr the way `doctor` does, and says it is done.
//! A child killed by a signal, stopped after `CCLKIT_DIAG_TIMEOUT` seconds or
//! ending without `done` becomes this rank's error naming the plugin, the step and
//! how it ended. `CCLKIT_PERF_PREFLIGHT=0` skips it (the cost is one process start
//! and one plugin load per rank).

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use cclkit_host::config::LoaderConfig;
use cclkit_host::net::CommConfig;
use cclkit_host::select::{NetRegistry, TunerArgs, TunerRegistry};
use cclkit_host::tuner::NvlDomainInfo;
use cclkit_runtime::config::{parse_bool, parse_secs, shown};

use crate::commands::doctor::contain;

/// `0` skips the preflight; `1` (default) runs it.
pub const ENABLE_ENV: &str = "CCLKIT_PERF_PREFLIGHT";
/// A rank's exit status when the preflight failed (as `doctor`'s for a crash).
pub const FAILED: u8 = contain::CRASH_STATUS;
/// Set in the child: load the plugins, report, exit.
const CHILD_ENV: &str = "CCLKIT_PERF_PREFLIGHT_CHILD";
const STEP: &str = "@cclkit-diag step ";
const DONE: &str = "@cclkit-diag done";
/// Output kept from the child (a plugin printing without end cannot exhaust memory).
const MAX_OUTPUT: u64 = 1 << 20;

/// In the child: does the preflight and returns its exit status; `None` otherwise.
pub fn child(nranks: usize) -> Option<ExitCode> {
    std::env::var_os(CHILD_ENV)?;
    let value = |k: &str| std::env::var(k).map_or_else(|_| "(unset)".to_owned(), |v| shown(&v));
    cclkit_runtime::install_builtin_net();
    let config = LoaderConfig {
        strict: false,
        ..LoaderConfig::from_env()
    };
    contain::step(&format!(
        "net plugin NCCL_NET_PLUGIN={}: loading and init",
        value("NCCL_NET_PLUGIN")
    ));
    let nets = NetRegistry::new(config.clone());
    // Failures to load are the rank's to report, with its own fallbacks; only a
    // plugin that takes the process down matters here.
    let net = nets
        .select(0x0cc1_c17d_9f1e_0001, CommConfig::default())
        .ok();
    contain::step(&format!(
        "tuner NCCL_TUNER_PLUGIN={}: loading and init",
        value("NCCL_TUNER_PLUGIN")
    ));
    let ranks = nranks.max(1);
    let args = TunerArgs {
        n_ranks: ranks,
        n_nodes: 1,
        comm_id: 0x0cc1_c17d_9f1e_0001,
        nvl: NvlDomainInfo {
            nNvlDomains: 1,
            minRanksPerNvlDomain: i32::try_from(ranks).unwrap_or(i32::MAX),
            maxRanksPerNvlDomain: i32::try_from(ranks).unwrap_or(i32::MAX),
        },
    };
    let mut constants = cclkit_runtime::tune::default_constants();
    let tuner =
        TunerRegistry::new(config).select(nets.tuner_library().as_ref(), args, &mut constants);
    contain::step(&format!(
        "profiler NCCL_PROFILER_PLUGIN={}: loading",
        value("NCCL_PROFILER_PLUGIN")
    ));
    let profiler = cclkit_host::profiler::ProfilerPlugin::from_env();
    contain::step("exiting (the plugins' finalize and destructors run)");
    drop((profiler, tuner, net));
    contain::done();
    Some(ExitCode::SUCCESS)
}

/// Whether the preflight is on (`CCLKIT_PERF_PREFLIGHT`, default on).
pub fn enabled() -> Result<bool, String> {
    match std::env::var(ENABLE_ENV) {
        Ok(v) => parse_bool(ENABLE_ENV, &v).map_err(|e| e.message().to_owned()),
        Err(_) => Ok(true),
    }
}

/// In a rank: runs the preflight child; `Err` is the line to report.
pub fn run() -> Result<(), String> {
    let limit = match std::env::var(contain::LIMIT_ENV) {
        Ok(v) => parse_secs(contain::LIMIT_ENV, &v).map_err(|e| e.message().to_owned())?,
        Err(_) => contain::DEFAULT_LIMIT,
    };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .env(CHILD_ENV, "1")
        .env(contain::CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // A rank killed by its launcher takes the child with it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the plugin preflight process: {e}"))?;
    let err = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(r) = err {
            let _ = r.take(MAX_OUTPUT).read_to_end(&mut out);
        }
        out
    });
    let deadline = Instant::now() + limit;
    let (status, timed_out) = loop {
        match child.try_wait() {
            Ok(Some(s)) => break (Some(s), false),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                break (child.wait().ok(), true);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break (None, false),
        }
    };
    // A process the plugin forked may hold the pipe open: wait for it briefly only.
    let until = Instant::now() + Duration::from_secs(2);
    while !reader.is_finished() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stderr = if reader.is_finished() {
        reader.join().unwrap_or_default()
    } else {
        Vec::new()
    };
    let text = String::from_utf8_lossy(&stderr);
    let mut step = None;
    let mut finished = false;
    for line in text.lines() {
        if let Some(i) = line.find(STEP) {
            step = Some(line[i + STEP.len()..].to_owned());
        } else if line.contains(DONE) {
            finished = true;
        }
    }
    let how = match status {
        _ if timed_out => format!(
            "did not finish within {limit:?} ({}; killed)",
            contain::LIMIT_ENV
        ),
        Some(s) => match (s.signal(), s.code()) {
            (Some(sig), _) => format!("was killed by signal {sig}"),
            (None, Some(0)) if finished => return Ok(()),
            (None, Some(c)) => format!("exited with status {c} before it was done"),
            (None, None) => "ended abnormally".to_owned(),
        },
        None => "could not be waited for".to_owned(),
    };
    let step = step.unwrap_or_else(|| "starting".to_owned());
    Err(format!(
        "plugin preflight: the process that loaded the plugins {how} during: {step} \
         (a plugin that ends, crashes or hangs its process; {ENABLE_ENV}=0 skips this check)"
    ))
}
