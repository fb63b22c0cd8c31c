//! cclkit's own local launcher (`--np N`): starts the ranks, forwards their stderr
//! line by line, and returns as soon as the job can no longer complete.
//!
//! Each rank gets a report pipe (its number in `CCLKIT_REPORT_FD`) on which it
//! writes `ready` once it joined its communicator ([`report`]) and, when the caller
//! asks for one, `result <status>` once it has its result. A rank that exits 0
//! without them did not do its job (a plugin constructor that calls `_exit(0)` looks
//! exactly like that), so it counts as failed, not as a success.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bootstrap::{BootstrapRoot, random_u64};
use crate::config::shown;
use crate::error::{Error, Result};

/// The variable that tells a rank which file descriptor reaches its launcher.
pub const REPORT_FD_ENV: &str = "CCLKIT_REPORT_FD";

/// How one local rank ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankExit {
    /// The rank.
    pub rank: usize,
    /// Exit code, `None` if killed by a signal.
    pub code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// It reported that it joined its communicator.
    pub ready: bool,
    /// The status it reported as its result, if it reported one.
    pub result: Option<i32>,
    /// The launcher killed it (another rank failed first, or a deadline passed).
    pub stopped: bool,
    /// Why the launcher counts it as failed when its exit alone does not say so.
    pub note: Option<String>,
    /// Its last non-empty stderr line (cut to about 80 characters).
    pub last_line: Option<String>,
    /// In which order the launcher saw the ranks end (0 = first).
    pub order: usize,
}

impl RankExit {
    /// Whether this rank did its part: exit 0, joined, and reported a result when one
    /// was required.
    pub fn ok(&self) -> bool {
        self.code == Some(0) && self.note.is_none()
    }
}

/// Options of [`run_local_with`].
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// The bootstrap root's timeout; also bounds how long a rank may take to join
    /// (twice this plus 2 s): a rank stuck in a plugin constructor is killed then.
    pub timeout: Duration,
    /// After the first failure, how long the others get before they are killed.
    pub grace: Duration,
    /// Every rank must report a result (`result <status>`) before exiting.
    pub require_result: bool,
}

/// Tells this rank's launcher `line` (`ready`, `result 0`); silent when this process
/// was not started by cclkit's local launcher.
pub fn report(line: &str) {
    let Some(fd) = std::env::var(REPORT_FD_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
    else {
        return;
    };
    // SAFETY: the launcher made `fd` a pipe's write end for this process; the
    // descriptor is borrowed for one write and not closed (ManuallyDrop).
    let mut f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let _ = f.write_all(format!("{line}\n").as_bytes());
}

/// Runs `np` copies of `program args` as ranks 0…np-1 (see [`run_local_with`]); only
/// `ready` is required of each rank.
pub fn run_local(
    np: usize,
    program: &std::path::Path,
    args: &[String],
    timeout: Duration,
    grace: Duration,
) -> Result<Vec<RankExit>> {
    let o = LocalOptions {
        timeout,
        grace,
        require_result: false,
    };
    run_local_with(np, program, args, &o)
}

/// One rank while it runs.
struct Running {
    child: Child,
    state: Arc<Mutex<Seen>>,
}

/// What a rank said on its report pipe and stderr.
#[derive(Default)]
struct Seen {
    ready: bool,
    result: Option<i32>,
    last_line: Option<String>,
    /// The report pipe and stderr reached their end (the rank closed them).
    reports_done: bool,
    stderr_done: bool,
}

/// Runs `np` copies of `program args` on this host as ranks 0…np-1 (cclkit's `--np`).
///
/// This process hosts the bootstrap root and passes `CCLKIT_UNIQUE_ID`, `CCLKIT_RANK`,
/// `CCLKIT_NRANKS`, `CCLKIT_LOCAL_RANK`, `CCLKIT_LOCAL_SIZE` and [`REPORT_FD_ENV`].
/// It returns as soon as every rank is done, or soon after one fails: the others get
/// `grace` and are then killed (marked `stopped`).
pub fn run_local_with(
    np: usize,
    program: &std::path::Path,
    args: &[String],
    o: &LocalOptions,
) -> Result<Vec<RankExit>> {
    if np == 0 || np > crate::bootstrap::MAX_RANKS {
        return Err(Error::invalid_argument(format!(
            "--np {np}: must be in 1..={}",
            crate::bootstrap::MAX_RANKS
        )));
    }
    let bind: SocketAddr = match std::env::var("CCLKIT_BOOTSTRAP_IP") {
        Ok(ip) => format!("{ip}:0").parse().map_err(|_| {
            Error::invalid_argument(format!("CCLKIT_BOOTSTRAP_IP={} is not an IP", shown(&ip)))
        })?,
        Err(_) => SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let (id, root) = BootstrapRoot::start(bind, random_u64(), o.timeout)?;
    let mut ranks: Vec<Running> = Vec::with_capacity(np);
    for rank in 0..np {
        match spawn_rank(program, args, &id.to_string(), rank, np) {
            Ok(r) => ranks.push(r),
            Err(e) => {
                for r in &mut ranks {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                }
                return Err(Error::system(format!(
                    "launch rank {rank}: {}: {e}",
                    program.display()
                )));
            }
        }
    }
    let join_by = Instant::now() + join_limit(o.timeout);
    let exits = supervise(ranks, o, join_by);
    drop(root);
    Ok(exits)
}

fn spawn_rank(
    program: &std::path::Path,
    args: &[String],
    id: &str,
    rank: usize,
    np: usize,
) -> std::io::Result<Running> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two descriptors we then own. The read end is close-on-exec;
    // the write end is inherited by the rank (and closed here after the spawn).
    if unsafe { libc::pipe2(fds.as_mut_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(rd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    let mut child = Command::new(program)
        .args(args)
        .env("CCLKIT_UNIQUE_ID", id)
        .env("CCLKIT_RANK", rank.to_string())
        .env("CCLKIT_NRANKS", np.to_string())
        .env("CCLKIT_LOCAL_RANK", rank.to_string())
        .env("CCLKIT_LOCAL_SIZE", np.to_string())
        .env(REPORT_FD_ENV, wr.as_raw_fd().to_string())
        .stderr(Stdio::piped())
        .spawn()?;
    drop(wr);
    let state = Arc::new(Mutex::new(Seen::default()));
    let s = state.clone();
    let reports = std::fs::File::from(rd);
    std::thread::spawn(move || {
        for line in BufReader::new(reports.take(1 << 20)).lines() {
            let Ok(line) = line else { break };
            let mut seen = s.lock().unwrap_or_else(|p| p.into_inner());
            match line.trim().split_once(' ') {
                None if line.trim() == "ready" => seen.ready = true,
                Some(("result", v)) => seen.result = v.trim().parse().ok().or(Some(1)),
                _ => {}
            }
        }
        s.lock().unwrap_or_else(|p| p.into_inner()).reports_done = true;
    });
    if let Some(err) = child.stderr.take() {
        let s = state.clone();
        std::thread::spawn(move || {
            forward_stderr(err, &s);
            s.lock().unwrap_or_else(|p| p.into_inner()).stderr_done = true;
        });
    } else {
        state.lock().unwrap_or_else(|p| p.into_inner()).stderr_done = true;
    }
    Ok(Running { child, state })
}

/// Copies a rank's stderr to ours one whole line at a time (lines of different ranks
/// never interleave) and remembers its last non-empty line.
fn forward_stderr(err: impl Read, seen: &Mutex<Seen>) {
    const MAX_LINE: usize = 64 << 10;
    let mut r = BufReader::new(err);
    let mut line = Vec::new();
    loop {
        line.clear();
        // Bounded: a rank that prints without newlines is forwarded in pieces.
        match (&mut r).take(MAX_LINE as u64).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        let _ = std::io::stderr().lock().write_all(&line);
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if !text.is_empty() {
            seen.lock().unwrap_or_else(|p| p.into_inner()).last_line = Some(shown(text));
        }
    }
}

/// Waits for every rank; after the first failure (or the join deadline), gives the
/// rest `grace` and kills them.
fn supervise(mut ranks: Vec<Running>, o: &LocalOptions, join_by: Instant) -> Vec<RankExit> {
    use std::os::unix::process::ExitStatusExt;
    let mut exits: Vec<Option<RankExit>> = ranks.iter().map(|_| None).collect();
    let mut kill_at: Option<Instant> = None;
    let mut order = 0;
    let mut hung: Vec<usize> = Vec::new();
    let mut killed = vec![false; ranks.len()];
    while exits.iter().any(Option::is_none) {
        let mut progressed = false;
        for (rank, r) in ranks.iter_mut().enumerate() {
            if exits[rank].is_some() {
                continue;
            }
            let Ok(Some(status)) = r.child.try_wait() else {
                continue;
            };
            // Its last reports and stderr lines may still be in flight: wait for both
            // pipes to close (bounded: a process it left behind may hold them; a rank
            // this launcher killed has nothing more to say).
            let wait = if killed[rank] { 0 } else { 2000 };
            let drained = Instant::now() + Duration::from_millis(wait);
            while Instant::now() < drained
                && !r
                    .state
                    .lock()
                    .is_ok_and(|s| s.reports_done && s.stderr_done)
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            let seen = r.state.lock().unwrap_or_else(|p| p.into_inner());
            let note = if hung.contains(&rank) {
                Some(format!(
                    "did not join its communicator within {:?}: stuck in plugin loading or init?",
                    join_limit(o.timeout)
                ))
            } else if status.success() && !seen.ready {
                Some(
                    "exited 0 without joining its communicator (did a plugin end the process?)"
                        .into(),
                )
            } else if status.success() && o.require_result && seen.result.is_none() {
                Some("exited 0 without reporting a result (did a plugin end the process?)".into())
            } else {
                None
            };
            let e = RankExit {
                rank,
                code: status.code(),
                signal: status.signal(),
                ready: seen.ready,
                result: seen.result,
                stopped: killed[rank] && !hung.contains(&rank),
                note,
                last_line: seen.last_line.clone(),
                order,
            };
            order += 1;
            if !e.ok() && kill_at.is_none() {
                kill_at = Some(Instant::now() + o.grace);
            }
            exits[rank] = Some(e);
            progressed = true;
        }
        if kill_at.is_none() && Instant::now() >= join_by {
            for (rank, r) in ranks.iter().enumerate() {
                if exits[rank].is_none() && !r.state.lock().is_ok_and(|s| s.ready) {
                    hung.push(rank);
                }
            }
            if !hung.is_empty() {
                kill_at = Some(Instant::now());
            }
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            for (rank, r) in ranks.iter_mut().enumerate() {
                if exits[rank].is_none() && !killed[rank] {
                    let _ = r.child.kill();
                    killed[rank] = true;
                }
            }
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    exits.into_iter().flatten().collect()
}

/// A summary of a failed job, or `None` when every rank did its part: the first rank
/// that failed and how (exit code or signal, its last stderr line), then the others,
/// with the ranks the launcher stopped listed apart.
pub fn failures(exits: &[RankExit]) -> Option<String> {
    let mut failed: Vec<&RankExit> = exits.iter().filter(|e| !e.ok() && !e.stopped).collect();
    failed.sort_by_key(|e| e.order);
    let stopped: Vec<String> = exits
        .iter()
        .filter(|e| e.stopped)
        .map(|e| e.rank.to_string())
        .collect();
    if failed.is_empty() && stopped.is_empty() {
        return None;
    }
    let how = |e: &RankExit| {
        let mut s = match (e.code, e.signal) {
            (Some(c), _) => format!("rank {} exited with {c}", e.rank),
            (None, Some(sig)) => format!("rank {} was killed by signal {sig}", e.rank),
            _ => format!("rank {} ended abnormally", e.rank),
        };
        if let Some(n) = &e.note {
            s += &format!(" ({n})");
        }
        s
    };
    let mut parts = Vec::new();
    if let Some(first) = failed.first() {
        let mut s = format!("{} first", how(first));
        if let Some(l) = &first.last_line {
            s += &format!("; its last line: {l}");
        }
        parts.push(s);
    }
    parts.extend(failed.iter().skip(1).map(|e| how(e)));
    if !stopped.is_empty() {
        parts.push(format!(
            "the launcher stopped rank(s) {}",
            stopped.join(", ")
        ));
    }
    Some(parts.join("; "))
}

/// How long a rank may take to join its communicator: plugin loading and the
/// bootstrap, each bounded by the bootstrap timeout, plus a little.
fn join_limit(timeout: Duration) -> Duration {
    timeout.saturating_mul(2) + Duration::from_secs(2)
}
