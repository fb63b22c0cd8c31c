//! `cclkit perf`: nccl-tests on host memory. Measures collectives through the
//! reference runtime and whatever net plugin and tuner it loads, with nccl-tests'
//! flags, output, bandwidth maths and data check, so numbers compare directly.
//!
//! `--np N` runs N local ranks; under `mpirun`, `srun`, `torchrun` (or cclkit's own
//! launcher) each process joins the launch instead. Rank 0 prints; stdout stays
//! nccl-tests compatible, progress goes to stderr.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::{DataType, RedOp};

use cclkit_runtime::{Comm, Config, Error, Result, world};

pub mod check;
pub mod colls;
pub mod gpus;
pub mod launch;
pub mod options;
pub mod output;
pub mod place;
mod preflight;
mod profile;
mod ranks;

use colls::{Case, Coll, Slot};
use output::{Measure, Progress, Report, Row, Test};
use ranks::{buffers_note, device_line, tuner_name};

/// Arguments of `cclkit perf` (nccl-tests' flags; `-t`/`-g` do not apply).
#[derive(Debug, Clone, clap::Args)]
pub struct PerfArgs {
    /// Collective(s) as a positional alternative to --coll (`all_reduce_perf` works).
    #[arg(value_name = "COLL")]
    pub coll_positional: Option<String>,
    /// Collective(s): all_reduce, all_gather, broadcast, reduce, reduce_scatter,
    /// alltoall, gather, scatter, sendrecv (also `all_reduce_perf`, `allreduce`), a
    /// comma list, or `all`.
    #[arg(long = "coll", value_name = "COLL")]
    pub coll: Option<String>,
    /// Minimum size (K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = size_arg)]
    pub minbytes: usize,
    /// Maximum size (K/M/G suffixes).
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = size_arg)]
    pub maxbytes: usize,
    /// Additive step between sizes (used when the factor is 1).
    #[arg(short = 'i', long = "stepbytes", default_value = "1M", value_parser = size_arg)]
    pub stepbytes: usize,
    /// Multiplicative step between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 1)]
    pub stepfactor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Warmup iterations per size (and placement).
    #[arg(
        short = 'w',
        long = "warmup_iters",
        alias = "warmup-iters",
        default_value_t = 1
    )]
    pub warmup_iters: usize,
    /// Operations aggregated into one group per iteration.
    #[arg(
        short = 'm',
        long = "agg_iters",
        alias = "agg-iters",
        default_value_t = 1
    )]
    pub agg_iters: usize,
    /// Checked runs per size and placement (0 = no check: #wrong shows N/A).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: usize,
    /// Data type: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16
    /// f8e4m3 f8e5m2, a comma list, or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub datatype: String,
    /// Reduction op: sum prod max min avg, a comma list, or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// Root rank for rooted collectives, or all.
    #[arg(short = 'r', long = "root", default_value = "0")]
    pub root: String,
    /// Time reported: 0 rank 0's, 1 mean over ranks, 2 min, 3 max.
    #[arg(short = 'a', long = "average", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub average: u8,
    /// Seconds one operation may take before the communicator is aborted.
    #[arg(short = 'T', long = "timeout", value_parser = options::timeout_arg)]
    pub timeout: Option<f64>,
    /// Timed iterations are raised (from -n, at most 1000×) so each size's timed
    /// loop lasts about this many milliseconds: small sizes get the iterations a
    /// stable mean needs, large ones stay at -n.
    #[arg(long = "iter-time", value_name = "MS", value_parser = options::iter_time_arg)]
    pub iter_time: Option<f64>,
    /// Run this many local ranks (ignored under a launcher such as mpirun or srun).
    #[arg(long = "np", default_value_t = 1, value_parser = options::np_arg)]
    pub np: usize,
    /// Pinning of --np ranks: auto (as mpirun: a core each for up to 2 ranks; round
    /// robin for a multiple of the CPU count), core (round robin), or none.
    #[arg(long = "bind", value_enum, default_value = "auto")]
    pub bind: place::Bind,
    /// Where buffers live and reductions run: `host` (default), `cuda` (local rank
    /// i on GPU i, as nccl-tests) or `cuda:N` (every rank on GPU N); CUDA managed
    /// memory and device kernels, see docs/cuda.md. Overrides CCLKIT_DEVICE;
    /// CCLKIT_CUDA_EMULATE=1 runs the emulated GPU.
    #[arg(long = "device", value_name = "DEVICE")]
    pub device: Option<String>,
    /// Write a JSON report to PATH (`-` or no value: JSON on stdout instead of the table).
    #[arg(short = 'J', long = "json", value_name = "PATH", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<String>,
    /// Progress lines on stderr even when it is not a terminal.
    #[arg(long, conflicts_with = "no_progress")]
    pub progress: bool,
    /// No progress on stderr.
    #[arg(long)]
    pub no_progress: bool,
    /// Run every rank against cclkit's host-memory CUDA stand-in (docs/cuda-standin.md).
    #[arg(long)]
    pub cuda_standin: bool,
    /// `--net`/`--tuner NAME|PATH`: as NCCL_NET_PLUGIN/NCCL_TUNER_PLUGIN, but never
    /// replaced by a fallback (see `commands::plugin_args`).
    #[command(flatten)]
    pub plugins: super::plugin_args::PluginArgs,
    /// Profile every rank with cclkit's trace profiler: one Chrome-trace JSON file
    /// per rank (open in ui.perfetto.dev) and a summary, written to DIR.
    #[arg(long = "profile", value_name = "DIR")]
    pub profile: Option<std::path::PathBuf>,
}

fn size_arg(s: &str) -> std::result::Result<usize, String> {
    options::parse_size(s)
}

/// Everything resolved from the arguments, before any rank starts.
struct Plan {
    colls: Vec<Coll>,
    sizes: Vec<usize>,
    types: Vec<DataType>,
    ops: Vec<RedOp>,
}

fn plan(a: &PerfArgs) -> std::result::Result<Plan, String> {
    let spec = match (&a.coll_positional, &a.coll) {
        (Some(p), Some(c)) if Coll::parse(p) != Coll::parse(c) => {
            return Err(format!("collective given twice: '{p}' and --coll '{c}'"));
        }
        (Some(p), _) => p.clone(),
        (None, Some(c)) => c.clone(),
        (None, None) => "all_reduce".into(),
    };
    let colls = if spec.trim().eq_ignore_ascii_case("all") {
        colls::ALL.to_vec()
    } else {
        spec.split(',')
            .map(|c| {
                Coll::parse(c).ok_or_else(|| {
                    format!(
                        "unknown collective '{}' (one of {}, or all)",
                        c.trim(),
                        colls::ALL.map(Coll::name).join(", ")
                    )
                })
            })
            .collect::<std::result::Result<_, _>>()?
    };
    if a.iters == 0 {
        return Err("-n/--iters must be at least 1".into());
    }
    if a.agg_iters == 0 {
        return Err("-m/--agg_iters must be at least 1".into());
    }
    Ok(Plan {
        colls,
        sizes: options::sweep(a.minbytes, a.maxbytes, a.stepbytes, a.stepfactor)?,
        types: options::parse_types(&a.datatype)?,
        ops: options::parse_ops(&a.op)?,
    })
}

/// Runs `cclkit perf`.
pub fn run(a: &PerfArgs) -> ExitCode {
    let json_stdout = a.json.as_deref() == Some("-");
    if let Some(code) = crate::standin::relaunch(a.cuda_standin, json_stdout, "perf") {
        return code;
    }
    let plan = match plan(a) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cclkit perf: {e}");
            return ExitCode::from(2);
        }
    };
    // SAFETY: no other thread exists yet (logging starts none).
    unsafe { super::plugin_args::settle_env(&a.plugins) };
    // SAFETY: as above.
    if let Err(e) = unsafe { profile::settle(a.profile.as_deref()) } {
        eprintln!("cclkit perf: {e}");
        return ExitCode::from(2);
    }
    // A device that cannot be opened fails here, before ranks wait for each other.
    if let Some(d) = &a.device {
        use cclkit_runtime::device::{Device, DeviceKind, emulate_requested};
        let emulated = emulate_requested(&|k| std::env::var(k).ok());
        if let Err(e) = DeviceKind::parse(d, emulated).and_then(Device::probe) {
            eprintln!("cclkit perf: {e}");
            return ExitCode::FAILURE;
        }
    }
    let launched = match world::detect() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cclkit perf: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(code) = preflight::child(launched.as_ref().map_or(a.np, |l| l.nranks)) {
        return code;
    }
    let Some(launched) = launched else {
        // Every local run, one rank included, runs its ranks in child processes: a
        // plugin that crashes, hangs or ends the process in its constructor then
        // becomes a failed rank, never a silent exit 0.
        return launch::run(a.np);
    };
    // Under any launcher, mpirun and srun included: a plugin that ends, crashes or
    // hangs its process fails this rank loudly instead of passing as exit 0.
    if let Err(e) = preflight::enabled().and_then(|on| if on { preflight::run() } else { Ok(()) }) {
        eprintln!("cclkit perf: rank {}: {e}", launched.rank);
        world::report_result(1);
        return ExitCode::from(preflight::FAILED);
    }
    let code = run_rank(a, &plan);
    // The launcher counts a rank that exits 0 without this as failed.
    world::report_result(i32::from(code != 0));
    ExitCode::from(code)
}

/// One rank's run; its exit status.
fn run_rank(a: &PerfArgs, plan: &Plan) -> u8 {
    let comm = match join(a) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cclkit perf: {e}");
            return 1;
        }
    };
    let rank = comm.rank();
    match bench(&comm, a, plan) {
        Ok(wrong) => {
            if let Err(e) = comm.destroy() {
                eprintln!("cclkit perf: rank {rank}: {e}");
                return 1;
            }
            u8::from(wrong != 0)
        }
        Err(e) => {
            eprintln!("cclkit perf: rank {rank}: {e}");
            comm.abort();
            1
        }
    }
}

/// What `--np` set in its ranks' environment (for the header).
pub(crate) const LAUNCHER_ENV: &str = "CCLKIT_PERF_LAUNCHER_ENV";

fn join(a: &PerfArgs) -> Result<Comm> {
    let launched = world::detect()?;
    if let Some(l) = &launched
        && l.engine == "cclkit"
    {
        place::bind(a.bind, l.local_rank, l.local_size);
    }
    super::plugin_args::preflight(&a.plugins).map_err(Error::invalid_usage)?;
    let mut config = Config::from_env()?;
    if let Some(t) = a.timeout {
        // Checked by the argument parser: positive, finite, at most a week.
        config.op_timeout = Duration::from_secs_f64(t);
    }
    // `--device`, else `CCLKIT_DEVICE`; a GPU named without an ordinal is local
    // rank i's GPU i, as nccl-tests does.
    if let Some(d) = a
        .device
        .clone()
        .or_else(|| std::env::var("CCLKIT_DEVICE").ok())
    {
        use cclkit_runtime::device::{DeviceKind, emulate_requested};
        let emulated = emulate_requested(&|k| std::env::var(k).ok());
        let local_rank = launched.as_ref().map_or(0, |l| l.local_rank);
        config.device = DeviceKind::parse_or(&d, emulated, || gpus::ordinal_of(local_rank))?;
    }
    match world::init_from_env(&config)? {
        Some(c) => Ok(c),
        None => world::single(&config),
    }
}

/// Runs every measurement; returns the wrong elements found (rank 0's total).
fn bench(comm: &Comm, a: &PerfArgs, plan: &Plan) -> Result<u64> {
    let (me, n) = (comm.rank(), comm.nranks());
    let roots = options::parse_roots(&a.root, n).map_err(Error::invalid_argument)?;
    let cfg = output::Config {
        nranks: n,
        minimum_bytes: a.minbytes,
        maximum_bytes: a.maxbytes,
        step_factor: (a.stepfactor > 1).then_some(a.stepfactor),
        step_bytes: (a.stepfactor <= 1).then_some(a.stepbytes),
        warmup_iters: a.warmup_iters,
        iterations: a.iters,
        aggregated_iterations: a.agg_iters,
        validation: a.check,
        average: a.average,
    };
    let devices: Vec<String> = comm
        .bootstrap()
        .allgather(device_line(comm).as_bytes())?
        .into_iter()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect();
    let json_only = a.json.as_deref() == Some("-");
    let mut out = Out {
        print: me == 0 && !json_only,
    };
    out.put(&output::header(&cfg, buffers_note(comm), &devices));
    if let Ok(note) = std::env::var(LAUNCHER_ENV) {
        out.put(&format!("# --np set {note}\n"));
    }
    if let Some(note) = gpus::sharing_note_of(comm)? {
        out.put(&note);
    }
    // Buffers for the largest layout of the sweep, one pair per aggregated op.
    let max_bytes = plan
        .colls
        .iter()
        .flat_map(|c| {
            plan.types.iter().flat_map(move |t| {
                plan.sizes.iter().map(move |&s| {
                    let l = c.layout(s, t.size().unwrap_or(1), n);
                    l.send.max(l.recv)
                })
            })
        })
        .max()
        .unwrap_or(0);
    // On a CUDA communicator: managed memory, filled and checked on the host.
    let mut slots: Vec<Slot> = (0..a.agg_iters)
        .map(|_| {
            Ok(Slot {
                send: comm.device().alloc_user(max_bytes)?,
                recv: comm.device().alloc_user(max_bytes)?,
            })
        })
        .collect::<Result<_>>()?;
    let force = if a.progress {
        Some(true)
    } else if a.no_progress {
        Some(false)
    } else {
        None
    };
    let mut progress = Progress::new(force, me);
    let mut tests = Vec::new();
    let mut wrong_total = 0;
    for &coll in &plan.colls {
        let mut test = Test::new(coll.name(), coll.perf_name());
        out.put(&output::table_header(coll.perf_name()));
        let ops: Vec<Option<RedOp>> = if coll.reduces() {
            plan.ops.iter().copied().map(Some).collect()
        } else {
            vec![None]
        };
        let roots: Vec<Option<usize>> = if coll.rooted() {
            roots.iter().copied().map(Some).collect()
        } else {
            vec![None]
        };
        for &dtype in &plan.types {
            for &op in &ops {
                for &root in &roots {
                    for (k, &size) in plan.sizes.iter().enumerate() {
                        progress.step(&format!(
                            "cclkit perf: {} {} {} {size} B [{}/{}]",
                            coll.name(),
                            options::type_name(dtype),
                            op.map_or("", options::op_name),
                            k + 1,
                            plan.sizes.len()
                        ));
                        let l = coll.layout(size, dtype.size().unwrap_or(1), n);
                        let mut case = Case {
                            coll,
                            layout: l,
                            dtype,
                            op: op.unwrap_or(RedOp::SUM),
                            root: root.unwrap_or(0),
                            in_place: false,
                        };
                        let oop = measure(comm, a, &case, &mut slots)?;
                        case.in_place = true;
                        let ip = measure(comm, a, &case, &mut slots)?;
                        let r = Row {
                            size: l.send.max(l.recv),
                            count: l.count,
                            dtype: options::type_name(dtype),
                            redop: op.map_or("none", options::op_name),
                            root: root.map_or(-1, |r| r as i64),
                            out_of_place: oop,
                            in_place: ip,
                        };
                        progress.clear();
                        out.put(&(output::row(&r) + "\n"));
                        test.push(r);
                    }
                }
            }
        }
        progress.clear();
        out.put(&test.footer());
        wrong_total += test.out_of_bounds;
        tests.push(test);
    }
    if me == 0
        && let Some(path) = &a.json
    {
        let net = comm.net();
        let report = Report {
            version: 1,
            args: std::env::args().collect(),
            config: cfg,
            devices,
            net: format!("{} v{}", net.name, net.version),
            tuner: tuner_name(comm),
            tests,
            tuner_report: output::tuner_entries(comm.tuning()),
        };
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::internal(format!("JSON report: {e}")))?;
        if path == "-" {
            println!("{text}");
        } else {
            std::fs::write(path, text + "\n")
                .map_err(|e| Error::from_io(format!("writing the JSON report to {path}"), e))?;
        }
    }
    Ok(wrong_total)
}

/// Rank 0's stdout (quiet on the other ranks and when JSON goes to stdout).
struct Out {
    print: bool,
}

impl Out {
    fn put(&mut self, s: &str) {
        if self.print {
            use std::io::Write;
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(s.as_bytes());
            let _ = o.flush();
        }
    }
}

/// Warmup, timed iterations and checks of one case; every rank returns the same
/// numbers (times combined per `-a`, wrong elements summed over ranks).
fn measure(comm: &Comm, a: &PerfArgs, case: &Case, slots: &mut [Slot]) -> Result<Measure> {
    let (me, n) = (comm.rank(), comm.nranks());
    for _ in 0..a.warmup_iters {
        colls::run_group(comm, case, slots)?;
    }
    let iters = match a.iter_time.filter(|t| *t > 0.0 && t.is_finite()) {
        None => {
            comm.bootstrap().barrier()?;
            a.iters
        }
        Some(ms) => {
            // One probe iteration; every rank takes the slowest rank's time, so all
            // agree on the count.
            let t = Instant::now();
            colls::run_group(comm, case, slots)?;
            let mine = t.elapsed().as_secs_f64();
            let slowest = gather_f64(comm, mine)?
                .into_iter()
                .fold(mine, f64::max)
                .max(1e-7);
            ((ms * 1e-3 / slowest).ceil() as usize).clamp(a.iters, a.iters.saturating_mul(1000))
        }
    };
    let start = Instant::now();
    let mut decision = None;
    for _ in 0..iters {
        decision = colls::run_group(comm, case, slots)?.or(decision);
    }
    let secs = start.elapsed().as_secs_f64() / (iters * slots.len()) as f64;
    let mut wrong = 0u64;
    for rep in 0..a.check {
        let data = check::Data::new(case.dtype, case.op, n, rep as u64 + 1);
        check::prepare(case, &data, me, &mut slots[0]);
        colls::run_group(comm, case, &mut slots[..1])?;
        wrong += check::verify(case, &data, me, n, &slots[0]);
    }
    let mine = [secs.to_le_bytes(), wrong.to_le_bytes()].concat();
    let all: Vec<(f64, u64)> = comm
        .bootstrap()
        .allgather(&mine)?
        .iter()
        .map(|b| {
            let f = |r: std::ops::Range<usize>| {
                b.get(r)
                    .and_then(|s| <[u8; 8]>::try_from(s).ok())
                    .unwrap_or([0; 8])
            };
            (f64::from_le_bytes(f(0..8)), u64::from_le_bytes(f(8..16)))
        })
        .collect();
    let times = all.iter().map(|x| x.0);
    let secs = match a.average {
        0 => all.first().map_or(secs, |x| x.0),
        2 => times.fold(f64::INFINITY, f64::min),
        3 => times.fold(0.0, f64::max),
        _ => times.sum::<f64>() / all.len().max(1) as f64,
    };
    let elem = case.dtype.size().unwrap_or(1);
    let (alg_bw, bus_bw) = case.coll.bandwidth(case.layout.count, elem, secs, n);
    Ok(Measure {
        iterations: iters,
        time: secs * 1e6,
        alg_bw,
        bus_bw,
        nwrong: (a.check > 0).then(|| all.iter().map(|x| x.1).sum()),
        algo: decision.and_then(|d| d.algo.name()),
        proto: decision.and_then(|d| d.proto.name()),
        channels: decision.map(|d| d.channels),
    })
}

/// Every rank's `v` (a bootstrap allgather; also a barrier).
fn gather_f64(comm: &Comm, v: f64) -> Result<Vec<f64>> {
    Ok(comm
        .bootstrap()
        .allgather(&v.to_le_bytes())?
        .iter()
        .map(|b| {
            f64::from_le_bytes(
                b.get(..8)
                    .and_then(|s| <[u8; 8]>::try_from(s).ok())
                    .unwrap_or([0; 8]),
            )
        })
        .collect())
}
