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
use super::launch::{self, Launch, LocalOptions, ProcessEnv, RankExit};

/// The launch this process belongs to, if any (from the environment).
pub fn detect() -> Result<Option<Launch>> {
    launch::detect(&ProcessEnv)
}

/// Joins the communicator of the launch described by the environment; `Ok(None)` when
/// no launcher started this process.
pub fn init_from_env(config: &Config) -> Result<Option<Comm>> {
    let Some(l) = detect()? else { return Ok(None) };
    let (id, root) = launch::establish(&l, config.bootstrap_timeout)?;
    let comm = Comm::init_with_root(l.nranks, &id, l.rank, config, root)?;
    // cclkit's own launcher counts a rank that exits before this as failed.
    launch::report("ready");
    Ok(Some(comm))
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
    spawn_self_with(
        np,
        args,
        &LocalOptions {
            timeout,
            grace,
            require_result: false,
        },
    )
}

/// [`spawn_self`] with every option of the local launcher (e.g. requiring each rank
/// to report a result with [`report_result`]).
pub fn spawn_self_with(np: usize, args: &[String], o: &LocalOptions) -> Result<Vec<RankExit>> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::system(format!("cannot find this program: {e}")))?;
    launch::run_local_with(np, &exe, args, o)
}

/// Tells cclkit's local launcher (when it started this process) that this rank has
/// its result, with the exit status it is about to return.
pub fn report_result(status: i32) {
    launch::report(&format!("result {status}"));
}

/// A one-line summary of failed ranks (the first failure first, with its last
/// stderr line; ranks the launcher stopped apart), or `None` when every rank did
/// its part.
pub fn failures(exits: &[RankExit]) -> Option<String> {
    launch::failures(exits)
}
