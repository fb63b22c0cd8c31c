//! `--cuda-standin`: run a plugin against cclkit's host-memory CUDA stand-in
//! (`libcuda.so.1` and `libcudart.so.12` built from `kernels/cuda-standin`), so a
//! plugin that links CUDA initialises on a machine without a GPU driver.
//!
//! The dynamic loader reads `LD_LIBRARY_PATH` once, when a process starts, so the
//! stand-in cannot be switched on inside a running `cclkit`: [`relaunch`] runs the
//! same command line again in a child with the stand-in's directory first on the
//! library path and [`ACTIVE_ENV`] set. That child, and every process it starts
//! (check children and peers, perf ranks), inherit both, so the plugin resolves its
//! CUDA libraries to the stand-in everywhere. The parent only prints the banner,
//! before and after, and passes the child's exit status on. See
//! docs/cuda-standin.md.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// A directory holding a built stand-in; overrides every other place.
pub const DIR_ENV: &str = "CCLKIT_CUDA_STANDIN_DIR";
/// Set (to the stand-in's directory) in every process that runs with the stand-in.
pub const ACTIVE_ENV: &str = "CCLKIT_CUDA_STANDIN_ACTIVE";
/// The stand-in logs every CUDA call to stderr when this is `1`.
pub const TRACE_ENV: &str = "CCLKIT_CUDA_STANDIN_TRACE";
/// The libraries a directory must hold to be a stand-in.
pub const LIBRARIES: [&str; 2] = ["libcuda.so.1", "libcudart.so.12"];

/// The banner printed around every output made with the stand-in.
pub fn banner(dir: &Path) -> String {
    format!(
        "*** cclkit --cuda-standin: CUDA is the host-memory stand-in from {} (no GPU: \
         \"device\" memory is host memory; results say nothing about GPU behaviour) ***",
        dir.display()
    )
}

/// Whether `dir` holds both stand-in libraries.
fn complete(dir: &Path) -> bool {
    LIBRARIES.iter().all(|l| dir.join(l).is_file())
}

/// The places a stand-in is looked for, in order: [`DIR_ENV`], `cuda-standin/`
/// next to the executable, `build/cuda-standin/` above it (the repository layout:
/// `target/<profile>/cclkit`), then this source tree's `build/cuda-standin/`.
pub fn candidates(env_dir: Option<&OsStr>, exe: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(d) = env_dir.filter(|d| !d.is_empty()) {
        out.push(PathBuf::from(d));
        return out; // an explicit choice is never second-guessed
    }
    if let Some(dir) = exe.and_then(Path::parent) {
        out.push(dir.join("cuda-standin"));
        out.extend(
            dir.ancestors()
                .skip(1)
                .take(4)
                .map(|a| a.join("build/cuda-standin")),
        );
    }
    out.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/cuda-standin"));
    out
}

/// The directory of a built stand-in, or why there is none.
pub fn locate() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().ok();
    let env_dir = std::env::var_os(DIR_ENV);
    let places = candidates(env_dir.as_deref(), exe.as_deref());
    if let Some(found) = places.iter().find(|d| complete(d)) {
        return std::fs::canonicalize(found).map_err(|e| format!("{}: {e}", found.display()));
    }
    let looked: Vec<String> = places.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "no CUDA stand-in found (need {} in one of: {}); build it with `make cuda-standin`, \
         or `kernels/cuda-standin/build.sh DIR` and {DIR_ENV}=DIR",
        LIBRARIES.join(" and "),
        looked.join(", ")
    ))
}

/// `LD_LIBRARY_PATH` with `dir` first, the old entries after it (empty ones, which
/// mean the current directory to the loader, dropped).
pub fn library_path(dir: &Path, old: Option<&OsStr>) -> OsString {
    let mut parts: Vec<PathBuf> = vec![dir.to_path_buf()];
    if let Some(old) = old {
        parts.extend(std::env::split_paths(old).filter(|p| !p.as_os_str().is_empty() && p != dir));
    }
    std::env::join_paths(parts).unwrap_or_else(|_| dir.as_os_str().to_owned())
}

/// The variables a process needs to run with the stand-in in `dir`.
pub fn child_env(dir: &Path, old_library_path: Option<&OsStr>) -> Vec<(OsString, OsString)> {
    vec![
        (
            OsString::from("LD_LIBRARY_PATH"),
            library_path(dir, old_library_path),
        ),
        (OsString::from(ACTIVE_ENV), dir.as_os_str().to_owned()),
    ]
}

/// Whether an environment (`get` reads one variable) already runs with the stand-in:
/// [`ACTIVE_ENV`] names a directory and it is first on `LD_LIBRARY_PATH`.
pub fn active_in(get: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let dir = PathBuf::from(get(ACTIVE_ENV).filter(|d| !d.is_empty())?);
    let path = get("LD_LIBRARY_PATH")?;
    let first = std::env::split_paths(&path).next()?;
    (first == dir).then_some(dir)
}

/// Whether this process runs with the stand-in (see [`active_in`]).
pub fn active() -> Option<PathBuf> {
    active_in(&|k| std::env::var_os(k))
}

/// Runs this command line again with the stand-in when `requested` and this process
/// does not already run with it: prints the banner (on stderr when `json_stdout`,
/// so JSON on stdout stays parseable), runs the child, prints the banner again and
/// returns the child's exit status. `None`: go on in this process (not requested,
/// or already running with the stand-in). `what` names the command in errors.
pub fn relaunch(requested: bool, json_stdout: bool, what: &str) -> Option<ExitCode> {
    if !requested || active().is_some() {
        return None;
    }
    let dir = match locate() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cclkit {what} --cuda-standin: {e}");
            return Some(ExitCode::from(2));
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cclkit {what} --cuda-standin: cannot find cclkit itself: {e}");
            return Some(ExitCode::from(2));
        }
    };
    let say = |text: &str| {
        if json_stdout {
            eprintln!("{text}");
        } else {
            let mut out = std::io::stdout().lock();
            // A closed stdout must not turn into a panic here; the child reports it.
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
    };
    let text = banner(&dir);
    say(&text);
    tracing::info!(dir = %dir.display(), "running with the CUDA stand-in");
    let status = Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .envs(child_env(
            &dir,
            std::env::var_os("LD_LIBRARY_PATH").as_deref(),
        ))
        .status();
    say(&text);
    Some(match status {
        Ok(s) => exit_code(s),
        Err(e) => {
            eprintln!(
                "cclkit {what} --cuda-standin: cannot run {}: {e}",
                exe.display()
            );
            ExitCode::from(2)
        }
    })
}

/// A child's exit status as ours: its code, or 128 + signal as a shell reports it.
fn exit_code(s: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)),
        (None, None) => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stand_in_goes_first_and_keeps_the_rest() {
        let dir = Path::new("/opt/standin");
        let p = library_path(dir, Some(OsStr::new("/a::/opt/standin:/b")));
        assert_eq!(p, OsString::from("/opt/standin:/a:/b"));
        assert_eq!(library_path(dir, None), OsString::from("/opt/standin"));
        let env = child_env(dir, Some(OsStr::new("/x")));
        assert!(env.contains(&(OsString::from(ACTIVE_ENV), OsString::from("/opt/standin"))));
        assert!(env.contains(&(
            OsString::from("LD_LIBRARY_PATH"),
            OsString::from("/opt/standin:/x")
        )));
    }

    #[test]
    fn active_only_when_the_marked_directory_is_first() {
        let env = |marker: Option<&str>, path: Option<&str>| {
            let (m, p) = (marker.map(OsString::from), path.map(OsString::from));
            active_in(&move |k| match k {
                ACTIVE_ENV => m.clone(),
                "LD_LIBRARY_PATH" => p.clone(),
                _ => None,
            })
        };
        assert_eq!(env(Some("/s"), Some("/s:/x")), Some(PathBuf::from("/s")));
        assert_eq!(env(Some("/s"), Some("/x:/s")), None);
        assert_eq!(env(Some("/s"), None), None);
        assert_eq!(env(None, Some("/s")), None);
        assert_eq!(env(Some(""), Some("")), None);
    }

    #[test]
    fn an_explicit_directory_is_the_only_candidate() {
        let c = candidates(
            Some(OsStr::new("/mine")),
            Some(Path::new("/r/target/release/cclkit")),
        );
        assert_eq!(c, vec![PathBuf::from("/mine")]);
        let c = candidates(None, Some(Path::new("/r/target/release/cclkit")));
        assert_eq!(c[0], PathBuf::from("/r/target/release/cuda-standin"));
        assert!(c.contains(&PathBuf::from("/r/build/cuda-standin")), "{c:?}");
    }

    #[test]
    fn a_directory_needs_both_libraries() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(!complete(dir.path()));
        std::fs::write(dir.path().join("libcuda.so.1"), b"").expect("write");
        assert!(!complete(dir.path()), "one library is not a stand-in");
        std::fs::write(dir.path().join("libcudart.so.12"), b"").expect("write");
        assert!(complete(dir.path()));
    }
}
