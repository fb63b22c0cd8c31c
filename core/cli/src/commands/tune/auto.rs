//! `cclkit tune auto`: measure every algorithm × protocol × channel count the
//! reference runtime supports, on the net plugin it selects (NCCL_NET_PLUGIN, …),
//! over a size sweep, and write the winners as rules that both cclkit's tuner and
//! NVIDIA's example tuner accept (`--out x.conf`: NCCL CSV; `--out x.toml`: TOML).
//!
//! How one point is measured: a communicator per algorithm/protocol pair and channel
//! count (`NCCL_ALGO`/`NCCL_PROTO` forced to that pair, `NCCL_MIN_NCHANNELS` =
//! `NCCL_MAX_NCHANNELS` = the count, no tuner plugin), `--warmup` calls, then
//! `--iters` timed calls; the point's time is the slowest rank's median. The
//! channels recorded are the ones the call actually ran with (the runtime uses one
//! channel per 64 KiB up to the count, so small sizes never run on more).
//!
//! `--verify FILE` runs the sweep again with a tuner and that file and checks every
//! decision follows the file (see `super::verify`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::{
    Algorithm, Func, NCCL_ALGO_PROTO_IGNORE, NCCL_NUM_PROTOCOLS, Protocol,
};
use cclkit_tuner::config::{CollSet, Format, Interval, Rule, RuleSet, format_size, names};

use super::ranks::{Buffers, Joined, join, sub_comm, valid_size};
use super::{SweepArgs, all_colls, coll_name, fail};
use cclkit_host::LoaderConfig;
use cclkit_host::select::TunerRegistry;
use cclkit_runtime::{Comm, Config};

/// Arguments of `cclkit tune auto`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Default sweep: -b 8 -e 4M -f 4, all five collectives (--verify: those the file has rules for)."
)]
pub struct AutoArgs {
    /// Local ranks to run (ignored when started by a launcher: mpirun, srun, torchrun).
    #[arg(long, default_value_t = 2)]
    pub np: usize,
    /// Sizes and collectives (default: 8 B to 4 MiB by 4, all five collectives).
    #[command(flatten)]
    pub sweep: SweepArgs,
    /// Timed calls per point.
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Untimed calls before them (at least one is always made).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Write the rules here: `.toml` is cclkit TOML, anything else NCCL CSV.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Do not measure: run with a tuner and this rule file and check every decision
    /// follows it (exit 1 when one does not).
    #[arg(long)]
    pub verify: Option<PathBuf>,
    /// The tuner for `--verify` (default: the packaged cclkit tuner,
    /// `$CCLKIT_LIB_DIR/libnccl-tuner-cclkit.so`).
    #[arg(long, requires = "verify")]
    pub tuner: Option<String>,
    /// Seconds ranks wait for each other to start and connect.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
}

/// Default sweep of `auto` and `--verify`.
pub(crate) const DEFAULT_SWEEP: (u64, u64, u64) = (8, 4 << 20, 4);

/// One measured point.
#[derive(Debug, Clone, Copy)]
struct Sample {
    func: Func,
    size: u64,
    algo: Algorithm,
    proto: Protocol,
    channels: usize,
    us: f64,
}

/// Runs `cclkit tune auto` (without `--verify`; the dispatcher sends that to `verify`).
pub fn run(a: &AutoArgs) -> ExitCode {
    if a.iters == 0 {
        return fail("--iters must be at least 1");
    }
    let mut config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let timeout = match Duration::try_from_secs_f64(a.timeout) {
        Ok(t) if !t.is_zero() => t,
        _ => return fail(format!("--timeout {} is not a positive number", a.timeout)),
    };
    config.bootstrap_timeout = timeout;
    let comm = match join(a.np, &config, timeout) {
        Ok(Joined::Launched(code)) => return code,
        Ok(Joined::Rank(c)) => c,
        Err(e) => return fail(e),
    };
    let comm = *comm;
    let rank = comm.rank();
    let result = measure_and_write(a, &comm);
    let destroyed = comm.destroy();
    match (result, destroyed) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(e), _) => fail(format!("rank {rank}: {e}")),
        (Ok(()), Err(e)) => fail(format!("rank {rank}: destroy: {e}")),
    }
}

/// The sweep's sizes, each rounded up to a size every collective takes on `n` ranks.
pub(crate) fn sweep_sizes(sweep: &SweepArgs, n: usize) -> Result<Vec<u64>, String> {
    let (b, e, f) = DEFAULT_SWEEP;
    let mut sizes: Vec<u64> = sweep
        .sizes(b, e, f)?
        .into_iter()
        .map(|s| valid_size(s, n))
        .collect();
    sizes.dedup();
    Ok(sizes)
}

fn measure_and_write(a: &AutoArgs, base: &Comm) -> Result<(), String> {
    let n = base.nranks();
    let sizes = sweep_sizes(&a.sweep, n)?;
    let colls = a.sweep.colls_or(all_colls());
    let max_ch = base.channels();
    let supported = |func: Func, size: u64| {
        base.tuning()
            .table(func, size as usize, max_ch)
            .map(|c| c != NCCL_ALGO_PROTO_IGNORE)
    };
    // Every pair the runtime offers for some collective and size, in table order.
    let mut pairs: Vec<usize> = Vec::new();
    for &f in &colls {
        for &s in &sizes {
            for (i, ok) in supported(f, s).iter().enumerate() {
                if *ok && !pairs.contains(&i) {
                    pairs.push(i);
                }
            }
        }
    }
    pairs.sort_unstable();
    let mut bufs = Buffers::new(sizes.iter().copied().max().unwrap_or(0))?;
    // Measurement communicators run without any tuner plugin: only the forced pair
    // and the channel count decide.
    let no_tuner = Arc::new(TunerRegistry::new(LoaderConfig {
        tuner_plugin: Some("none".to_owned()),
        ..LoaderConfig::from_env()
    }));
    let mut samples: Vec<Sample> = Vec::new();
    let mut seen: HashSet<(i32, u64, i32, i32, usize)> = HashSet::new();
    for &pair in &pairs {
        let algo = Algorithm((pair / NCCL_NUM_PROTOCOLS) as i32);
        let proto = Protocol((pair % NCCL_NUM_PROTOCOLS) as i32);
        for ch in 1..=max_ch {
            let mut cfg = base.config().clone();
            cfg.algo = Some(names::algorithm_name(algo).to_owned());
            cfg.proto = Some(names::protocol_name(proto).to_owned());
            (cfg.min_channels, cfg.max_channels) = (ch, ch);
            cfg.tuner_registry = Some(Arc::clone(&no_tuner));
            cfg.tuner_report = false;
            let comm = sub_comm(base, &cfg)?;
            for &func in &colls {
                for &size in sizes.iter().filter(|&&s| supported(func, s)[pair]) {
                    let d = bufs.run(&comm, func, size)?;
                    if (d.algo, d.proto) != (algo, proto) {
                        return Err(format!(
                            "{func:?} of {size} bytes ran {}/{} although {}/{} was forced",
                            d.algo, d.proto, algo, proto
                        ));
                    }
                    // The same configuration at a higher channel limit: measured already
                    // (every rank takes the same decision, so every rank skips it).
                    if !seen.insert((func.0, size, algo.0, proto.0, d.channels)) {
                        continue;
                    }
                    for _ in 1..a.warmup {
                        bufs.run(&comm, func, size)?;
                    }
                    let mut times = Vec::with_capacity(a.iters);
                    for _ in 0..a.iters {
                        let t = Instant::now();
                        bufs.run(&comm, func, size)?;
                        times.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    let us = slowest_median(&comm, &mut times)?;
                    samples.push(Sample {
                        func,
                        size,
                        algo,
                        proto,
                        channels: d.channels,
                        us,
                    });
                }
            }
            comm.destroy().map_err(|e| format!("destroy: {e}"))?;
        }
    }
    if base.rank() != 0 {
        return Ok(());
    }
    let net = base.net();
    let nodes = base.ring().hosts;
    println!(
        "# cclkit tune auto: {n} rank(s) on {nodes} node(s), net '{}' v{}, channels 1..={max_ch}, \
         {} algorithm/protocol pair(s); time = median of {} call(s) on the slowest rank",
        net.name,
        net.version,
        pairs.len(),
        a.iters
    );
    let winners = winners(&colls, &sizes, &samples);
    print!("{}", report(&winners, &samples));
    let rules = to_rules(&winners, nodes, n);
    let header = format!(
        "# written by cclkit tune auto: {n} rank(s) on {nodes} node(s), net '{}' v{}, \
         sizes {}..={}; each measured size decides up to the next one\n",
        net.name,
        net.version,
        format_size(sizes[0]),
        format_size(sizes[sizes.len() - 1])
    );
    let (text, format) = match &a.out {
        Some(p)
            if p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("toml")) =>
        {
            (rules.to_toml(), Format::Toml)
        }
        _ => {
            let (csv, notes) = rules.to_csv();
            for note in notes {
                eprintln!("cclkit tune: CSV: {note}");
            }
            (csv, Format::Csv)
        }
    };
    let text = format!("{header}{text}");
    match &a.out {
        Some(p) => {
            std::fs::write(p, &text).map_err(|e| format!("writing {}: {e}", p.display()))?;
            println!(
                "# wrote {} rule(s) to {} ({})",
                rules.rules.len(),
                p.display(),
                if format == Format::Toml {
                    "cclkit TOML"
                } else {
                    "NCCL CSV"
                }
            );
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// The median of this rank's times, then the largest over ranks (every rank gets
/// the same value, so every rank picks the same winners).
fn slowest_median(comm: &Comm, times: &mut [f64]) -> Result<f64, String> {
    times.sort_by(f64::total_cmp);
    let mid = times.len() / 2;
    let median = if times.len() % 2 == 1 {
        times[mid]
    } else {
        (times[mid - 1] + times[mid]) / 2.0
    };
    let all = comm
        .bootstrap()
        .allgather(&median.to_le_bytes())
        .map_err(|e| format!("sharing times: {e}"))?;
    Ok(all
        .iter()
        .filter_map(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map(f64::from_le_bytes)
        .fold(median, f64::max))
}

/// The fastest sample of each collective and size (first measured on a tie).
fn winners(colls: &[Func], sizes: &[u64], samples: &[Sample]) -> Vec<(Func, Vec<Sample>)> {
    colls
        .iter()
        .map(|&f| {
            let best = sizes
                .iter()
                .filter_map(|&s| {
                    samples.iter().filter(|x| x.func == f && x.size == s).fold(
                        None::<Sample>,
                        |b, x| match b {
                            Some(b) if b.us <= x.us => Some(b),
                            _ => Some(*x),
                        },
                    )
                })
                .collect();
            (f, best)
        })
        .collect()
}

fn label(s: &Sample) -> String {
    format!(
        "{}/{}/{}",
        names::algorithm_name(s.algo),
        names::protocol_name(s.proto),
        s.channels
    )
}

/// The winner and the runner-up of every point.
fn report(winners: &[(Func, Vec<Sample>)], samples: &[Sample]) -> String {
    let mut out = format!(
        "# {:<13} {:>8}  {:<16} {:>10}  {:<16} {:>10}  {}\n",
        "collective", "size", "winner", "us", "runner-up", "us", "measured"
    );
    for (f, best) in winners {
        for w in best {
            let others: Vec<&Sample> = samples
                .iter()
                .filter(|x| x.func == *f && x.size == w.size)
                .collect();
            let second = others
                .iter()
                .filter(|x| label(x) != label(w))
                .min_by(|a, b| a.us.total_cmp(&b.us));
            let (l2, t2) = second.map_or(("-".to_owned(), "-".to_owned()), |s| {
                (label(s), format!("{:.1}", s.us))
            });
            out.push_str(&format!(
                "  {:<13} {:>8}  {:<16} {:>10.1}  {:<16} {:>10}  {}\n",
                coll_name(*f),
                format_size(w.size),
                label(w),
                w.us,
                l2,
                t2,
                others.len()
            ));
        }
    }
    out
}

/// One rule per run of consecutive sizes with the same winner: the first run starts
/// at 0 bytes, each later one at its first measured size, the last has no end. The
/// rules hold for this communicator shape only (`nNodes`, `nRanks`).
fn to_rules(winners: &[(Func, Vec<Sample>)], nodes: usize, ranks: usize) -> RuleSet {
    let mut rules = Vec::new();
    for (f, best) in winners {
        let Some(coll) = CollSet::single(*f) else {
            continue;
        };
        let mut runs: Vec<(u64, Sample)> = Vec::new();
        for (i, w) in best.iter().enumerate() {
            let same = runs.last().is_some_and(|(_, r)| {
                (r.algo, r.proto, r.channels) == (w.algo, w.proto, w.channels)
            });
            if !same {
                runs.push((if i == 0 { 0 } else { w.size }, *w));
            }
        }
        for (i, (lo, w)) in runs.iter().enumerate() {
            let hi = runs.get(i + 1).map_or(u64::MAX, |(next, _)| next - 1);
            rules.push(Rule {
                collectives: coll,
                bytes: Interval::new(*lo, hi),
                nodes: Interval::exact(nodes as u64),
                ranks: Interval::exact(ranks as u64),
                algorithm: Some(w.algo),
                protocol: Some(w.proto),
                channels: u32::try_from(w.channels).ok(),
                ..Rule::any()
            });
        }
    }
    RuleSet {
        rules,
        ..RuleSet::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(func: Func, size: u64, algo: Algorithm, proto: Protocol, ch: usize, us: f64) -> Sample {
        Sample {
            func,
            size,
            algo,
            proto,
            channels: ch,
            us,
        }
    }

    #[test]
    fn winners_merge_into_ranges_from_zero_to_the_largest_size() {
        let (ar, ag) = (Func::ALL_REDUCE, Func::ALL_GATHER);
        let (t, r) = (Algorithm::TREE, Algorithm::RING);
        let (ll, simple) = (Protocol::LL, Protocol::SIMPLE);
        let samples = [
            s(ar, 8, t, ll, 1, 5.0),
            s(ar, 8, r, simple, 1, 9.0),
            s(ar, 64, t, ll, 1, 6.0),
            s(ar, 64, r, simple, 1, 6.5),
            s(ar, 512, t, ll, 1, 30.0),
            s(ar, 512, r, simple, 1, 12.0),
            s(ar, 512, r, simple, 2, 11.0),
            s(ag, 8, r, ll, 1, 3.0),
            s(ag, 64, r, ll, 1, 3.0),
            s(ag, 512, r, ll, 1, 3.0),
        ];
        let w = winners(&[ar, ag], &[8, 64, 512], &samples);
        assert_eq!(
            w[0].1.iter().map(|x| x.us).collect::<Vec<_>>(),
            [5.0, 6.0, 11.0]
        );
        let set = to_rules(&w, 1, 2);
        let got: Vec<(u64, u64, Algorithm, u32)> = set
            .rules
            .iter()
            .map(|r| {
                (
                    r.bytes.lo,
                    r.bytes.hi,
                    r.algorithm.unwrap(),
                    r.channels.unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [(0, 511, t, 1), (512, u64::MAX, r, 2), (0, u64::MAX, r, 1)]
        );
        assert!(
            set.rules
                .iter()
                .all(|r| r.ranks == Interval::exact(2) && r.nodes == Interval::exact(1))
        );
        // Exactly what NVIDIA's example reads: 8 fields, plain integers, -1 = largest.
        let (csv, notes) = set.to_csv();
        assert!(notes.is_empty(), "{notes:?}");
        assert!(csv.contains("\nallreduce,0,511,tree,ll,1,1,2\n"), "{csv}");
        assert!(
            csv.contains("\nallreduce,512,-1,ring,simple,2,1,2\n"),
            "{csv}"
        );
        assert!(csv.contains("\nallgather,0,-1,ring,ll,1,1,2\n"), "{csv}");
    }
}
