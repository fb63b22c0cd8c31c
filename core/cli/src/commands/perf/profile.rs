//! `cclkit perf --profile DIR`: every rank runs under cclkit's trace profiler
//! (`libnccl-profiler-cclkit.so`, docs/profiler-trace.md), which writes one
//! Chrome-trace JSON file per rank into DIR plus a summary.
//!
//! It only sets what a user would export by hand — `NCCL_PROFILER_PLUGIN` (the
//! packaged library's path when found, else the name `cclkit`, resolved on the
//! library path as NCCL would) and `CCLKIT_PROFILE_DIR` — before any rank starts, so
//! local ranks and launcher-started ranks inherit the same setting.

use std::path::{Path, PathBuf};

/// The library file NCCL's naming rule gives the name `cclkit`.
const FILE: &str = "libnccl-profiler-cclkit.so";

/// The packaged trace profiler: `$CCLKIT_LIB_DIR/…`, else `<workspace>/build/lib/…`
/// (where `make package` puts it), else the name `cclkit`.
fn packaged() -> String {
    let dirs = [
        std::env::var_os("CCLKIT_LIB_DIR").map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/lib")),
    ];
    dirs.into_iter()
        .flatten()
        .map(|d| d.join(FILE))
        .find(|p| p.is_file())
        .map_or_else(|| "cclkit".to_owned(), |p| p.display().to_string())
}

/// Creates `dir` and points the ranks' profiler at it; `Err` names what failed.
///
/// # Safety
/// No other thread may exist yet (it sets environment variables).
pub unsafe fn settle(dir: Option<&Path>) -> Result<(), String> {
    let Some(dir) = dir else { return Ok(()) };
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("--profile {}: cannot create it: {e}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("--profile {}: {e}", dir.display()))?;
    let lib = packaged();
    tracing::info!(target: "cclkit::perf", "profiling with {lib} into {}", dir.display());
    // SAFETY: the caller guarantees no other thread exists yet.
    unsafe {
        std::env::set_var("NCCL_PROFILER_PLUGIN", &lib);
        std::env::set_var("CCLKIT_PROFILE_DIR", &dir);
    }
    Ok(())
}
