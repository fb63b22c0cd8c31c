//! `cclkit check LIB.so`: the conformance suite (see [`crate::check`]).
//!
//! Exit status: 0 passed (no check failed and at least one contract check exercised
//! the plugin), 1 failed (a contract check failed, or a probe under `--strict`),
//! 2 usage error or the file cannot be checked, 3 nothing tested (nothing failed, but
//! init failed or reported no device, so only the exported symbols were checked).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::check::{self, Event, Options};

/// Arguments of `cclkit check`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: 0 passed, 1 failed (a contract check, or a probe under \
                        --strict), 2 usage error or a file that cannot be checked, 3 nothing \
                        tested (init failed or no device: only the symbols were checked)."
)]
pub struct CheckArgs {
    /// The plugin library: a path, or a name the dynamic linker searches for.
    #[arg(required_unless_present_any = ["list", "net", "tuner"])]
    pub library: Option<String>,
    /// `--net`/`--tuner NAME|PATH`: check the library this setting resolves to.
    #[command(flatten)]
    pub plugins: super::plugin_args::PluginArgs,
    /// Check only this ABI version (default: every version the library exports).
    #[arg(long)]
    pub version: Option<u32>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Seconds each check may run before it is killed and fails.
    #[arg(long, default_value_t = 20)]
    pub timeout: u64,
    /// Checks run at the same time (default: one per CPU, at most 8).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Run only these checks (`sendrecv`, `net.sendrecv`, comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Fail (instead of skipping the data checks) when init fails or reports no device.
    #[arg(long)]
    pub require_devices: bool,
    /// Seed of the random data (default: fresh; printed in the report).
    #[arg(long)]
    pub seed: Option<u64>,
    /// KEY=VALUE for the peers of the namespace check; `{ip}` and `{ifname}` become the
    /// peer's address and interface (e.g. `MYNET_IFACE={ifname}`).
    #[arg(long = "peer-env")]
    pub peer_env: Vec<String>,
    /// Fail the run when a robustness probe fails (default: a WARN line).
    #[arg(long)]
    pub strict: bool,
    /// Do not run the tuner leak check under valgrind.
    #[arg(long)]
    pub no_valgrind: bool,
    /// List the checks and exit.
    #[arg(long)]
    pub list: bool,
    /// Run the plugin against cclkit's host-memory CUDA stand-in (docs/cuda-standin.md);
    /// a failed init then fails, as with --require-devices.
    #[arg(long)]
    pub cuda_standin: bool,
    /// Internal: run one check in this process (`net.sendrecv`).
    #[arg(long, hide = true)]
    pub child: Option<String>,
    /// Internal: be peer RANK of a two-process check.
    #[arg(long, hide = true)]
    pub peer: Option<usize>,
}

/// Runs `cclkit check`.
pub fn run(args: &CheckArgs) -> ExitCode {
    if args.list {
        for c in check::all_checks() {
            println!(
                "{}.{:<20} {:<8} {} (NCCL: {})",
                c.family,
                c.name,
                c.class.label(),
                c.about,
                c.nccl
            );
        }
        return ExitCode::SUCCESS;
    }
    let library = match args.plugins.library(args.library.as_deref()) {
        Ok(Some(l)) => l,
        Ok(None) => {
            eprintln!("cclkit check: no library given");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("cclkit check: {e}");
            return ExitCode::from(2);
        }
    };
    if args.child.is_some() || args.peer.is_some() {
        return run_internal(args, library);
    }
    if let Some(code) = crate::standin::relaunch(args.cuda_standin, args.json, "check") {
        return code;
    }
    let mut opts = match Options::new(library) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cclkit check: {e}");
            return ExitCode::from(2);
        }
    };
    opts.version = args.version;
    opts.only = args.only.clone();
    opts.timeout = Duration::from_secs(args.timeout.max(2));
    if let Some(j) = args.jobs {
        opts.jobs = j.max(1);
    }
    opts.require_devices = args.require_devices || args.cuda_standin;
    if let Some(s) = args.seed {
        opts.seed = s;
    }
    if let Some(bad) = args.peer_env.iter().find(|e| !e.contains('=')) {
        eprintln!("cclkit check: --peer-env {bad}: expected KEY=VALUE");
        return ExitCode::from(2);
    }
    opts.peer_env = args.peer_env.clone();
    opts.valgrind = !args.no_valgrind;
    opts.strict = args.strict;
    let json = args.json;
    let seed = opts.seed;
    let mut show = |e: Event<'_>| match e {
        _ if json => {}
        Event::Start { path, exports } => {
            println!("cclkit check {}", path.display());
            println!("{}", exports.line(seed));
            for line in exports.kinds.iter().filter_map(|k| k.not_checked()) {
                println!("{line}");
            }
        }
        Event::Result(r) => println!("{}", r.line()),
    };
    let report = match check::run(&opts, &mut show) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cclkit check: {e}");
            return ExitCode::from(2);
        }
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("cclkit check: cannot encode JSON: {e}"),
        }
    } else {
        println!("{}", report.summary());
    }
    if cclkit_host::kinds::nothing_checkable(&report.exports.kinds) {
        // Only kinds cclkit names but has no suite for (docs/check-c-plugin.md).
        if !json {
            println!("nothing could be checked: no kind in this library is checked by cclkit");
        }
        return ExitCode::from(cclkit_host::kinds::EXIT_NOTHING_CHECKED);
    }
    ExitCode::from(report.verdict.exit_code())
}

/// The hidden child and peer modes.
fn run_internal(args: &CheckArgs, library: String) -> ExitCode {
    let child = check::ChildArgs {
        library: PathBuf::from(library),
        check: args.child.clone().unwrap_or_default(),
        version: args.version.unwrap_or(0),
        seed: args.seed.unwrap_or(0),
        timeout: Duration::from_secs(args.timeout.max(2)),
        require_devices: args.require_devices,
        peer_env: args.peer_env.clone(),
    };
    match args.peer {
        Some(rank) if rank < 2 => check::run_peer(&child, rank),
        Some(rank) => {
            eprintln!("cclkit check: --peer {rank}: ranks are 0 and 1");
            ExitCode::from(2)
        }
        None => check::run_child(&child),
    }
}
