//! Joining a multi-process run: the one place tools turn "how was I started" into a
//! communicator.
//!
//! * started by a launcher (cclkit's `--np`, `mpirun`, Slurm, torchrun, PMI):
//!   [`init_from_env`] detects it, hosts the bootstrap root on rank 0 when needed,
//!   and joins;
//! * not started by one: [`spawn_self`] re-runs this program as `np` local ranks (the
//!   children then take the first path), or [`single`] makes a one-rank communicator.

use std::time::Duration;

use super::bootstrap::{BootstrapRoot, random_u64};
use super::comm::Comm;
use super::config::Config;
use super::error::{Error, Result};
use super::launch::{self, Launch, ProcessEnv, RankExit};

/// The launch this process belongs to, if any (from the environment).
pub fn detect() -> Result<Option<Launch>> {
    launch::detect(&ProcessEnv)
}

/// Joins the communicator of the launch described by the environment; `Ok(None)` when
/// no launcher started this process.
pub fn init_from_env(config: &Config) -> Result<Option<Comm>> {
    let Some(l) = detect()? else { return Ok(None) };
    let (id, root) = launch::establish(&l, config.bootstrap_timeout)?;
    Comm::init_with_root(l.nranks, &id, l.rank, config, root).map(Some)
}

/// A communicator of this process alone.
pub fn single(config: &Config) -> Result<Comm> {
    let (id, root) = BootstrapRoot::start(
        "127.0.0.1:0"
            .parse()
            .map_err(|_| Error::internal("loopback"))?,
        random_u64(),
        config.bootstrap_timeout,
    )?;
    Comm::init_with_root(1, &id, 0, config, Some(root))
}

/// Re-runs this program with `args` as `np` local ranks and waits for them (see
/// [`launch::run_local`]); a rank that fails makes the others stop after `grace`.
pub fn spawn_self(
    np: usize,
    args: &[String],
    timeout: Duration,
    grace: Duration,
) -> Result<Vec<RankExit>> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::system(format!("cannot find this program: {e}")))?;
    launch::run_local(np, &exe, args, timeout, grace)
}

/// A one-line summary of failed ranks, or `None` when every rank exited 0.
pub fn failures(exits: &[RankExit]) -> Option<String> {
    let bad: Vec<String> = exits
        .iter()
        .filter(|e| e.code != Some(0))
        .map(|e| match (e.code, e.signal) {
            (Some(c), _) => format!("rank {} exited with {c}", e.rank),
            (None, Some(s)) => format!("rank {} was killed by signal {s}", e.rank),
            _ => format!("rank {} ended abnormally", e.rank),
        })
        .collect();
    (!bad.is_empty()).then(|| bad.join(", "))
}
