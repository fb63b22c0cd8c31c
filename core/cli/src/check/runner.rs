//! The parent side of `cclkit check`: find what the library exports (without loading
//! it), run every check in its own child process on a few workers, and turn exits,
//! signals and timeouts into results.

use std::collections::VecDeque;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::process::{classify, spawn_and_wait};
use super::report::{CheckResult, Exports, Report, Status};
use super::valgrind::Valgrind;
use super::{CheckDef, Family, all_checks};
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
    /// A failed robustness probe fails the run (instead of a WARN).
    pub strict: bool,
}

impl Options {
    /// Defaults for `library`: every version and check, 20 s per check, one job per
    /// CPU (at most 8), a fresh seed, this program as the child executable.
    pub fn new(library: impl Into<String>) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find cclkit itself: {e}"))?;
        Ok(Self {
            library: library.into(),
            version: None,
            only: Vec::new(),
            timeout: Duration::from_secs(20),
            // Each check may start peers and sockets of its own: a few at a time is
            // plenty, even on a large machine.
            jobs: std::thread::available_parallelism().map_or(2, |n| n.get().min(8)),
            require_devices: false,
            seed: super::rng::fresh_seed(),
            peer_env: Vec::new(),
            exe,
            valgrind: true,
            strict: false,
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
    let mut report = Report::new(
        opts.library.clone(),
        path.display().to_string(),
        exports,
        opts.seed,
        results,
        start.elapsed().as_secs_f64(),
    );
    report.strict = opts.strict;
    Ok(report)
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
        kinds: cclkit_host::kinds::classify_names(elf.symbols.iter().map(|s| s.name.as_str())),
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
    let profiler = super::profiler::exported(&exports.kinds);
    let env = super::env::exported(&exports.kinds);
    let families = [
        (Family::Net, &exports.net),
        (Family::Tuner, &exports.tuner),
        (Family::Profiler, &profiler),
        (Family::Env, &env),
    ];
    for (family, exported) in families {
        for &v in exported {
            if opts.version.is_some_and(|f| f != v) {
                continue;
            }
            if !family.checkable().contains(&v) {
                fixed.push(CheckResult {
                    family,
                    version: v,
                    check: "symbol".into(),
                    class: super::Class::Contract,
                    nccl: "NCCL 2.26+ loads only the versions it knows".into(),
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
        && !profiler.contains(&v)
        && !env.contains(&v)
    {
        return Err(format!(
            "--version {v}: the library exports no ncclNetPlugin_v{v} or ncclTunerPlugin_v{v} \
             (net {:?}, tuner {:?})",
            exports.net, exports.tuner
        ));
    }
    // A library of kinds cclkit only names (profiler, env, …) is not a failure: the
    // command reports "nothing could be checked" (issue 22).
    if exports.net.is_empty()
        && exports.tuner.is_empty()
        && profiler.is_empty()
        && env.is_empty()
        && !cclkit_host::kinds::nothing_checkable(&exports.kinds)
    {
        fixed.push(CheckResult {
            family: Family::Net,
            version: 0,
            check: "symbol".into(),
            class: super::Class::Contract,
            nccl: "NCCL dlsym()s ncclNetPlugin_vN / ncclTunerPlugin_vN".into(),
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
    let valgrind = (opts.valgrind
        && job.check.family == Family::Tuner
        && job.check.name == super::tuner::VALGRIND_CHECK)
        .then(Valgrind::find)
        .flatten();
    let mut cmd = match &valgrind {
        Some(vg) => vg.command(&opts.exe),
        None => Command::new(&opts.exe),
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
    let named = CheckResult {
        family: job.check.family,
        version: job.version,
        check: job.check.name.to_owned(),
        class: job.check.class,
        nccl: job.check.nccl.to_owned(),
        status: Status::Fail,
        message: String::new(),
        seconds: 0.0,
    };
    let mut result = classify(named, ended, limit);
    if let Some(vg) = &valgrind {
        vg.judge(&mut result);
    }
    // A probe does what NCCL never does: its failure (a crash included) is a warning
    // unless the run is strict.
    if job.check.class == super::Class::Probe && result.status == Status::Fail && !opts.strict {
        result.status = Status::Warn;
    }
    result.seconds = start.elapsed().as_secs_f64();
    result
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
}
