//! The parent side of `cclkit check`: find what the library exports (without loading
//! it), run every check in its own child process on a few workers, and turn exits,
//! signals and timeouts into results.

use std::collections::VecDeque;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::child::{RESULT_PREFIX, STEP_PREFIX, WireResult};
use super::report::{CheckResult, Exports, Report, Status};
use super::{CheckDef, Family, all_checks, netns};
use crate::elf::ElfInfo;
use crate::elf::deps::Resolver;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The library: a path, or a name the dynamic linker would search for.
    pub library: String,
    /// Check only this ABI version (of every family that exports it).
    pub version: Option<u32>,
    /// Run only these checks (`sendrecv`, or `net.sendrecv`); empty = all.
    pub only: Vec<String>,
    /// Limit per check (a child still running then is killed and fails).
    pub timeout: Duration,
    /// Checks run at the same time.
    pub jobs: usize,
    /// A failed `init` or zero devices fails instead of skipping the data checks.
    pub require_devices: bool,
    /// Seed of the random data.
    pub seed: u64,
    /// `KEY=VALUE` set for peer processes of the namespace check (`{ip}`, `{ifname}`
    /// are replaced by the peer's address and interface).
    pub peer_env: Vec<String>,
    /// The `cclkit` executable children run (normally this program).
    pub exe: PathBuf,
    /// Run the tuner leak check under valgrind when it is installed.
    pub valgrind: bool,
}

impl Options {
    /// Defaults for `library`: every version and check, 20 s per check, one job per
    /// CPU, a fresh seed, this program as the child executable.
    pub fn new(library: impl Into<String>) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find cclkit itself: {e}"))?;
        Ok(Self {
            library: library.into(),
            version: None,
            only: Vec::new(),
            timeout: Duration::from_secs(20),
            jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
            require_devices: false,
            seed: super::rng::fresh_seed(),
            peer_env: Vec::new(),
            exe,
            valgrind: true,
        })
    }
}

/// One child process to run.
#[derive(Debug, Clone)]
struct Job {
    check: CheckDef,
    version: u32,
}

/// Progress of a run, for live output.
#[derive(Debug)]
pub enum Event<'a> {
    /// The file and what it exports, before any check runs.
    Start {
        /// The file checked.
        path: &'a Path,
        /// Its exported versions.
        exports: &'a Exports,
    },
    /// A result, in report order, as soon as it and every one before it are known.
    Result(&'a CheckResult),
}

/// Runs the suite, reporting progress to `on_event`. `Err` only when nothing could be
/// checked (no such file, not an ELF library, no export of the forced version).
pub fn run(opts: &Options, on_event: &mut dyn FnMut(Event<'_>)) -> Result<Report, String> {
    let start = Instant::now();
    let path = locate(&opts.library)?;
    let elf = ElfInfo::read(&path).map_err(|e| e.to_string())?;
    let exports = exports_of(&elf);
    let (jobs, fixed) = plan(opts, &exports)?;
    on_event(Event::Start {
        path: &path,
        exports: &exports,
    });
    let mut on_result = |r: &CheckResult| on_event(Event::Result(r));
    for r in &fixed {
        on_result(r);
    }
    let mut slots: Vec<Option<CheckResult>> = vec![None; jobs.len()];
    let queue = Arc::new(Mutex::new(
        jobs.iter().cloned().enumerate().collect::<VecDeque<_>>(),
    ));
    let (tx, rx) = mpsc::channel();
    let workers = opts.jobs.clamp(1, 64).min(jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let (queue, tx, path) = (Arc::clone(&queue), tx.clone(), path.clone());
            scope.spawn(move || {
                loop {
                    let next = queue.lock().map(|mut q| q.pop_front());
                    let Ok(Some((i, job))) = next else { break };
                    if tx.send((i, run_job(opts, &path, &job))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut shown = 0;
        for (i, r) in rx {
            slots[i] = Some(r);
            while let Some(Some(r)) = slots.get(shown) {
                on_result(r);
                shown += 1;
            }
        }
    });
    let mut results = fixed;
    results.extend(slots.into_iter().flatten());
    Ok(Report::new(
        opts.library.clone(),
        path.display().to_string(),
        exports,
        opts.seed,
        results,
        start.elapsed().as_secs_f64(),
    ))
}

/// A path as given, or the file the dynamic linker would find for a bare name.
fn locate(library: &str) -> Result<PathBuf, String> {
    let p = Path::new(library);
    if library.contains('/') || p.exists() {
        return std::fs::canonicalize(p).map_err(|e| format!("{library}: {e}"));
    }
    Resolver::from_env()
        .locate(library, None)
        .map(|l| PathBuf::from(l.path))
        .ok_or_else(|| {
            format!(
                "{library}: not found (not a file here, and not on LD_LIBRARY_PATH, \
                 RUNPATH or the ld.so cache)"
            )
        })
}

/// Versioned plugin data symbols in the ELF dynamic symbol table.
fn exports_of(elf: &ElfInfo) -> Exports {
    let versions = |prefix: &str| {
        let mut v: Vec<u32> = elf
            .symbols
            .iter()
            .filter_map(|s| s.name.strip_prefix(prefix)?.parse().ok())
            .collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v.dedup();
        v
    };
    Exports {
        net: versions("ncclNetPlugin_v"),
        collnet: versions("ncclCollNetPlugin_v"),
        tuner: versions("ncclTunerPlugin_v"),
    }
}

/// The jobs to run, and the results known without running anything.
fn plan(opts: &Options, exports: &Exports) -> Result<(Vec<Job>, Vec<CheckResult>), String> {
    let wanted = |c: &CheckDef| {
        opts.only.is_empty()
            || opts
                .only
                .iter()
                .any(|o| o == c.name || *o == format!("{}.{}", c.family, c.name))
    };
    if let Some(bad) = opts.only.iter().find(|o| {
        !all_checks()
            .iter()
            .any(|c| **o == c.name || **o == format!("{}.{}", c.family, c.name))
    }) {
        let names: Vec<String> = all_checks()
            .iter()
            .map(|c| format!("{}.{}", c.family, c.name))
            .collect();
        return Err(format!(
            "unknown check '{bad}'; checks: {}",
            names.join(", ")
        ));
    }
    let mut jobs = Vec::new();
    let mut fixed = Vec::new();
    for (family, exported) in [(Family::Net, &exports.net), (Family::Tuner, &exports.tuner)] {
        for &v in exported {
            if opts.version.is_some_and(|f| f != v) {
                continue;
            }
            if !family.checkable().contains(&v) {
                fixed.push(CheckResult {
                    family,
                    version: v,
                    check: "symbol".into(),
                    status: Status::Skip,
                    message: format!(
                        "{}{v} is exported but no NCCL since 2.26 loads it; not checked",
                        family.symbols().prefix()
                    ),
                    seconds: 0.0,
                });
                continue;
            }
            for c in all_checks()
                .into_iter()
                .filter(|c| c.family == family && wanted(c))
            {
                jobs.push(Job {
                    check: c,
                    version: v,
                });
            }
        }
    }
    if let Some(v) = opts.version
        && !exports.net.contains(&v)
        && !exports.tuner.contains(&v)
    {
        return Err(format!(
            "--version {v}: the library exports no ncclNetPlugin_v{v} or ncclTunerPlugin_v{v} \
             (net {:?}, tuner {:?})",
            exports.net, exports.tuner
        ));
    }
    if exports.net.is_empty() && exports.tuner.is_empty() {
        fixed.push(CheckResult {
            family: Family::Net,
            version: 0,
            check: "symbol".into(),
            status: Status::Fail,
            message: "the library exports no ncclNetPlugin_vN or ncclTunerPlugin_vN symbol: \
                      NCCL would close it as unsupported"
                .into(),
            seconds: 0.0,
        });
    }
    Ok((jobs, fixed))
}

/// The arguments of a child for `job` (also used by the peer processes).
fn child_args(opts: &Options, path: &Path, job: &Job) -> Vec<String> {
    let mut a = vec![
        "check".to_owned(),
        path.display().to_string(),
        "--child".to_owned(),
        format!("{}.{}", job.check.family, job.check.name),
        "--version".to_owned(),
        job.version.to_string(),
        "--seed".to_owned(),
        opts.seed.to_string(),
        "--timeout".to_owned(),
        opts.timeout.as_secs().max(1).to_string(),
    ];
    if opts.require_devices {
        a.push("--require-devices".to_owned());
    }
    for e in &opts.peer_env {
        a.push("--peer-env".to_owned());
        a.push(e.clone());
    }
    a
}

/// Runs one check in a child process and classifies how it ended.
fn run_job(opts: &Options, path: &Path, job: &Job) -> CheckResult {
    let start = Instant::now();
    let valgrind =
        (opts.valgrind && job.check.family == Family::Tuner && job.check.name == "finalize")
            .then(valgrind_path)
            .flatten();
    let log = valgrind.as_ref().and_then(|_| tempfile_path("valgrind"));
    let mut cmd = match (&valgrind, &log) {
        (Some(vg), Some(log)) => {
            let mut c = Command::new(vg);
            c.args([
                "--leak-check=full",
                "--errors-for-leak-kinds=definite",
                "--show-leak-kinds=definite",
                "--num-callers=12",
            ])
            .arg(format!("--log-file={}", log.display()))
            .arg(&opts.exe)
            .env("CCLKIT_CHECK_UNDER_VALGRIND", "1");
            c
        }
        _ => Command::new(&opts.exe),
    };
    cmd.args(child_args(opts, path, job))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let limit = if valgrind.is_some() {
        opts.timeout * 4
    } else {
        opts.timeout
    };
    let ended = spawn_and_wait(cmd, limit);
    let mut result = classify(job, ended, limit);
    if let (Some(log), Status::Pass) = (&log, result.status) {
        match read_leaks(log) {
            Ok(note) => result.message.push_str(&note),
            Err(leak) => {
                result.status = Status::Fail;
                result.message = leak;
            }
        }
    }
    if let Some(log) = log {
        let _ = std::fs::remove_file(log);
    }
    result.seconds = start.elapsed().as_secs_f64();
    result
}

/// How a child ended.
enum Ended {
    /// It exited (normally or by a signal) with this output.
    Exited(Output),
    /// It was still running at the limit: killed; its partial output.
    TimedOut { pid: u32, output: Option<Output> },
    /// It could not be started.
    NotStarted(String),
}

/// Spawns `cmd` in its own process group, waits up to `limit`, then kills the group.
fn spawn_and_wait(mut cmd: Command, limit: Duration) -> Ended {
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ended::NotStarted(e.to_string()),
    };
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let ended = match rx.recv_timeout(limit) {
        Ok(Ok(out)) => Ended::Exited(out),
        Ok(Err(e)) => Ended::NotStarted(e.to_string()),
        Err(_) => {
            kill_group(pid);
            let output = rx
                .recv_timeout(Duration::from_secs(10))
                .ok()
                .and_then(Result::ok);
            Ended::TimedOut { pid, output }
        }
    };
    // Peers a child left behind (it should not) go with their group.
    kill_group(pid);
    if let Ended::TimedOut { pid, .. } = &ended {
        netns::cleanup_for(*pid);
    }
    ended
}

fn kill_group(pid: u32) {
    if let Ok(pgid) = i32::try_from(pid) {
        // SAFETY: kill(2) on the process group we created for this child (its pgid is
        // its pid); ESRCH when it is already gone is harmless.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
}

/// Turns a child's end into a result.
fn classify(job: &Job, ended: Ended, limit: Duration) -> CheckResult {
    let mut r = CheckResult {
        family: job.check.family,
        version: job.version,
        check: job.check.name.to_owned(),
        status: Status::Fail,
        message: String::new(),
        seconds: 0.0,
    };
    let (output, what) = match ended {
        Ended::NotStarted(e) => {
            r.message = format!("could not start the check process: {e}");
            return r;
        }
        Ended::TimedOut { output, .. } => {
            let secs = limit.as_secs();
            (output, format!("timed out after {secs} s (killed)"))
        }
        Ended::Exited(out) => {
            let what = exit_text(&out);
            (Some(out), what)
        }
    };
    let stdout = output
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let stderr = output
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .unwrap_or_default();
    let step = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(STEP_PREFIX))
        .map(str::to_owned);
    let result = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(RESULT_PREFIX))
        .and_then(|j| serde_json::from_str::<WireResult>(j).ok());
    let clean_exit = output.as_ref().is_some_and(|o| o.status.success());
    match result {
        Some(w) if clean_exit => {
            r.status = w.status;
            r.message = w.message;
        }
        Some(w) => {
            r.status = Status::Fail;
            r.message = format!(
                "{}; then the process {what} while exiting (a library destructor, atexit \
                 handler or leftover thread of the plugin){}",
                w.message,
                tail(&stderr)
            );
        }
        None => {
            let at = step.map_or_else(String::new, |s| format!(" during: {s}"));
            r.message = format!("the check process {what}{at}{}", tail(&stderr));
        }
    }
    r
}

/// "was killed by SIGSEGV (signal 11)" / "exited with code 3".
fn exit_text(out: &Output) -> String {
    if let Some(sig) = out.status.signal() {
        format!("was killed by {} (signal {sig})", signal_name(sig))
    } else {
        match out.status.code() {
            Some(0) => "exited without a result".to_owned(),
            Some(c) => format!("exited with code {c}"),
            None => "ended".to_owned(),
        }
    }
}

/// The usual name of a signal number.
pub(crate) fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}

/// The last lines the child wrote to stderr (plugin WARNs, panics), for crash reports.
fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let last: Vec<String> = lines[lines.len().saturating_sub(4)..]
        .iter()
        .map(|l| {
            let l = l.trim();
            match l.char_indices().nth(240) {
                Some((cut, _)) => format!("{}…", &l[..cut]),
                None => l.to_owned(),
            }
        })
        .collect();
    format!("; stderr: {}", last.join(" | "))
}

fn valgrind_path() -> Option<PathBuf> {
    if std::env::var_os("CCLKIT_CHECK_NO_VALGRIND").is_some() {
        return None;
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("valgrind"))
            .find(|f| f.is_file())
    })
}

/// A fresh path in the temporary directory.
fn tempfile_path(what: &str) -> Option<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    Some(std::env::temp_dir().join(format!(
        "cclkit-check-{what}-{}-{n}.log",
        std::process::id()
    )))
}

/// Reads a valgrind log of the tuner `finalize` check: a loss record with at least
/// as many blocks as init/finalize cycles is a per-cycle leak (`Err`, a failure
/// message); smaller records are one-time allocations (`Ok`, a note).
fn read_leaks(log: &Path) -> Result<String, String> {
    let Ok(text) = std::fs::read_to_string(log) else {
        return Ok("; valgrind wrote no log".into());
    };
    // "==pid== N bytes in M blocks are definitely lost in loss record …", then the
    // stack ("==pid==    at …" / "by …") up to an empty "==pid==" line.
    let bodies: Vec<&str> = text
        .lines()
        .map(|l| l.split_once("== ").map_or("", |(_, b)| b).trim())
        .collect();
    let mut once = Vec::new();
    for (at, b) in bodies.iter().enumerate() {
        let Some((head, _)) = b.split_once(" are definitely lost") else {
            continue;
        };
        let blocks: usize = head
            .split_whitespace()
            .rev()
            .nth(1)
            .and_then(|n| n.replace(',', "").parse().ok())
            .unwrap_or(0);
        let frames: Vec<&str> = bodies[at + 1..]
            .iter()
            .take_while(|f| !f.is_empty())
            .filter(|f| {
                ![
                    "vg_replace",
                    "malloc (",
                    "library/alloc",
                    "library/std",
                    "library/core",
                ]
                .iter()
                .any(|skip| f.contains(skip))
            })
            .take(3)
            .copied()
            .collect();
        let what = format!("{head}, allocated at {}", frames.join(" <- "));
        if blocks >= super::tuner::VALGRIND_CYCLES {
            return Err(format!(
                "finalize does not free what init allocated: valgrind, after {} init/finalize \
                 cycles: {what}",
                super::tuner::VALGRIND_CYCLES
            ));
        }
        once.push(what);
    }
    Ok(if once.is_empty() {
        "; valgrind: no definite leaks".into()
    } else {
        format!(
            "; valgrind: no per-cycle leak ({} one-time: {})",
            once.len(),
            once.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_are_read_from_symbol_names() {
        let elf = ElfInfo {
            symbols: [
                "ncclNetPlugin_v12",
                "ncclNetPlugin_v5",
                "ncclTunerPlugin_v6",
                "other",
            ]
            .iter()
            .map(|n| crate::elf::Symbol {
                name: (*n).to_owned(),
                kind: crate::elf::STT_OBJECT,
                size: 8,
            })
            .collect(),
            ..ElfInfo::default()
        };
        let e = exports_of(&elf);
        assert_eq!((e.net, e.tuner, e.collnet), (vec![12, 5], vec![6], vec![]));
    }

    #[test]
    fn unsupported_versions_are_skipped_and_unknown_checks_refused() {
        let mut opts = Options::new("x.so").expect("options");
        let exports = Exports {
            net: vec![12, 5],
            ..Exports::default()
        };
        let (jobs, fixed) = plan(&opts, &exports).expect("plan");
        assert!(
            jobs.iter()
                .all(|j| j.version == 12 && j.check.family == Family::Net)
        );
        assert_eq!(fixed.len(), 1);
        assert_eq!(fixed[0].status, Status::Skip);
        assert!(
            fixed[0].message.contains("ncclNetPlugin_v5"),
            "{}",
            fixed[0].message
        );
        opts.only = vec!["net.sendrecv".into()];
        let (jobs, _) = plan(&opts, &exports).expect("plan");
        assert_eq!(jobs.len(), 1);
        opts.only = vec!["nope".into()];
        assert!(
            plan(&opts, &exports)
                .unwrap_err()
                .contains("unknown check 'nope'")
        );
        opts.only.clear();
        opts.version = Some(9);
        assert!(plan(&opts, &exports).unwrap_err().contains("--version 9"));
    }

    #[test]
    fn signals_have_names_and_stderr_is_cut() {
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        let t = tail("a\n\nb\nc\nd\ne\n");
        assert_eq!(t, "; stderr: b | c | d | e");
        assert_eq!(tail(""), "");
    }
}
