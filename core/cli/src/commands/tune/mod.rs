//! `cclkit tune`: see, measure and compare tuner decisions without a GPU.
//!
//! | subcommand | job |
//! | --- | --- |
//! | [`show`] | load any tuner through the real ABI and print its decision table |
//! | [`auto`] | measure every algorithm × protocol × channel count on the reference runtime, write the winners as rules; `--verify FILE` checks a run honours a rule file |
//! | [`diff`] | where two rule files or two tuners decide differently |
//!
//! [`eval`] turns a tuner (a library, a rule file, or nothing) into the runtime's own
//! [`Tuning`](cclkit_runtime::tune::Tuning), so every table printed here is the one
//! the reference runtime would act on.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cclkit_abi::raw::common::Func;
use cclkit_tuner::config::{format_size, names, parse_size};

pub mod auto;
pub mod diff;
pub mod eval;
mod ranks;
pub mod show;
mod verify;

/// Arguments of `cclkit tune`.
#[derive(Debug, clap::Args)]
pub struct TuneArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: TuneCommand,
}

/// The `tune` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TuneCommand {
    /// Print a tuner's decisions over collectives × sizes (no GPU, no network).
    Show(show::ShowArgs),
    /// Measure every algorithm × protocol × channel count and write the winners as rules.
    Auto(auto::AutoArgs),
    /// Show where two rule files or two tuners decide differently (exit 1 if they do).
    Diff(diff::DiffArgs),
}

/// Runs `cclkit tune`.
pub fn run(args: &TuneArgs) -> ExitCode {
    match &args.command {
        TuneCommand::Show(a) => show::run(a),
        TuneCommand::Auto(a) => match &a.verify {
            Some(file) => verify::run(a, file),
            None => auto::run(a),
        },
        TuneCommand::Diff(a) => diff::run(a),
    }
}

/// Exit status for a usage or setup error (1 is reserved for "different"/"mismatch").
pub(crate) const EXIT_ERROR: u8 = 2;

/// Prints `cclkit tune: <msg>` and returns exit status 2.
pub(crate) fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("cclkit tune: {msg}");
    ExitCode::from(EXIT_ERROR)
}

/// The communicator shape a decision table is computed for.
#[derive(Debug, Clone, clap::Args)]
pub struct ShapeArgs {
    /// Ranks in the communicator.
    #[arg(long, default_value_t = 8)]
    pub nranks: usize,
    /// Nodes (hosts) in the communicator.
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// Channels the communicator connected (the runtime connects 2 unless a plugin has
    /// more devices or NCCL_MIN/MAX_NCHANNELS say otherwise).
    #[arg(long, default_value_t = 2)]
    pub channels: usize,
    /// Network speed the built-in model assumes, Mb/s (the runtime takes the slowest
    /// device's `speed`; 10000 when a plugin reports none).
    #[arg(long, default_value_t = 10_000)]
    pub net_speed: u32,
    /// Network latency the built-in model assumes, µs (the runtime takes the largest
    /// device `latency`; 20 when a plugin reports none).
    #[arg(long, default_value_t = 20.0)]
    pub net_latency: f64,
}

/// A size sweep and the collectives to sweep.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// Smallest size in bytes (`8`, `64K`, `1M`); sizes are nccl-tests sizes, i.e.
    /// the `nBytes` a tuner is asked about.
    #[arg(short = 'b', long = "minbytes", value_parser = size_arg)]
    pub min_bytes: Option<u64>,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", value_parser = size_arg)]
    pub max_bytes: Option<u64>,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor")]
    pub step_factor: Option<u64>,
    /// Collectives, comma-separated (`allreduce,allgather`; `all` = all five).
    #[arg(long, value_parser = colls_arg)]
    pub colls: Option<Colls>,
}

/// A list of collectives from `--colls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Colls(pub Vec<Func>);

/// Every collective a tuner is asked about, in NCCL's `ncclFunc_t` order.
pub(crate) fn all_colls() -> Vec<Func> {
    names::COLLECTIVES.iter().map(|(_, f)| *f).collect()
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// `allreduce,AllGather,reduce_scatter` or `all`.
fn colls_arg(s: &str) -> Result<Colls, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.eq_ignore_ascii_case("all") {
            return Ok(Colls(all_colls()));
        }
        let want: String = part
            .chars()
            .filter(|c| !matches!(c, '_' | '-'))
            .map(|c| c.to_ascii_lowercase())
            .collect();
        let f = names::COLLECTIVES
            .iter()
            .find(|(n, _)| *n == want)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                let known: Vec<&str> = names::COLLECTIVES.iter().map(|(n, _)| *n).collect();
                format!(
                    "unknown collective \"{part}\" (known: {}, all)",
                    known.join(", ")
                )
            })?;
        if !out.contains(&f) {
            out.push(f);
        }
    }
    if out.is_empty() {
        return Err("no collective given".to_owned());
    }
    Ok(Colls(out))
}

impl SweepArgs {
    /// The sizes `b, b·f, b·f², … ≤ e` with these defaults where unset.
    pub(crate) fn sizes(&self, b: u64, e: u64, f: u64) -> Result<Vec<u64>, String> {
        let (b, e, f) = (
            self.min_bytes.unwrap_or(b),
            self.max_bytes.unwrap_or(e),
            self.step_factor.unwrap_or(f),
        );
        if b == 0 {
            return Err("-b must be at least 1 byte".to_owned());
        }
        if e < b {
            return Err(format!(
                "-e {} is smaller than -b {}",
                format_size(e),
                format_size(b)
            ));
        }
        if f < 2 {
            return Err("-f must be at least 2".to_owned());
        }
        let mut out = vec![b];
        let mut s = b;
        while let Some(next) = s.checked_mul(f).filter(|n| *n <= e) {
            out.push(next);
            s = next;
        }
        Ok(out)
    }

    /// The collectives asked for, or `default`.
    pub(crate) fn colls_or(&self, default: Vec<Func>) -> Vec<Func> {
        self.colls.as_ref().map_or(default, |c| c.0.clone())
    }
}

/// `allreduce` for a collective.
pub(crate) fn coll_name(f: Func) -> &'static str {
    names::collective_name(f)
}

/// The packaged cclkit tuner: `$CCLKIT_LIB_DIR/libnccl-tuner-cclkit.so`, else
/// `<workspace>/build/lib/libnccl-tuner-cclkit.so` (where `make package` puts it),
/// else the plugin name `cclkit`, which the loader resolves to
/// `libnccl-tuner-cclkit.so` on the library search path as NCCL would.
pub(crate) fn packaged_tuner() -> String {
    const FILE: &str = "libnccl-tuner-cclkit.so";
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

/// Points `NCCL_TUNER_CONFIG_FILE` (read by cclkit's tuner, and NVIDIA's example
/// tuner, in their `init`) at `path`.
///
/// Only called by `cclkit tune` on its main thread before it starts any
/// communicator (whose proxy threads are the only threads cclkit itself starts).
/// The one place a foreign library is already loaded is `tune diff LIB FILE`: the
/// library's tuner is initialised first (so it reads the user's own setting), and a
/// tuner that left a thread reading the environment behind would race with this.
pub(crate) fn set_tuner_config_file(path: &Path) {
    if std::env::var_os(CONFIG_FILE_VAR).is_some_and(|v| Path::new(&v) == path) {
        return;
    }
    // SAFETY: see above: no thread started by cclkit exists yet that could read or
    // write the environment concurrently (setenv/getenv are not thread-safe in glibc).
    unsafe { std::env::set_var(CONFIG_FILE_VAR, path) };
}

/// The variable tuners read their rule file name from.
pub(crate) const CONFIG_FILE_VAR: &str = "NCCL_TUNER_CONFIG_FILE";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colls_parse_in_any_spelling() {
        assert_eq!(
            colls_arg("AllReduce, all_gather,allreduce").unwrap(),
            Colls(vec![Func::ALL_REDUCE, Func::ALL_GATHER])
        );
        assert_eq!(colls_arg("all").unwrap().0.len(), 5);
        let e = colls_arg("allreduse").unwrap_err();
        assert!(e.contains("unknown collective \"allreduse\""), "{e}");
        assert!(colls_arg(" , ").is_err());
    }

    #[test]
    fn sweeps_stop_at_the_largest_size() {
        let s = SweepArgs {
            min_bytes: Some(8),
            max_bytes: Some(100),
            step_factor: Some(3),
            colls: None,
        };
        assert_eq!(s.sizes(1, 1, 2).unwrap(), [8, 24, 72]);
        let d = SweepArgs {
            min_bytes: None,
            max_bytes: None,
            step_factor: None,
            colls: None,
        };
        assert_eq!(
            d.sizes(1 << 20, 4 << 20, 2).unwrap(),
            [1 << 20, 2 << 20, 4 << 20]
        );
        assert_eq!(d.sizes(u64::MAX / 2, u64::MAX, 4).unwrap().len(), 1);
        assert!(d.sizes(0, 8, 2).is_err());
        assert!(d.sizes(16, 8, 2).is_err());
        assert!(d.sizes(8, 16, 1).is_err());
    }
}
