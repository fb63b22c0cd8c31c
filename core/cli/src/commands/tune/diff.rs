//! `cclkit tune diff A B`: where two rule files or two tuners decide differently.
//!
//! * Two rule files: a semantic comparison of the rules over every collective, size,
//!   node count, rank count, numPipeOps and regBuff (`cclkit_tuner::config::diff`),
//!   independent of any communicator.
//! * Otherwise (a tuner library on either side, or `--table`): both are evaluated like
//!   `tune show` for one communicator shape over a size sweep, and the sizes where the
//!   runtime would run differently are printed as ranges of the sampled sizes.
//!
//! Exit status as `diff(1)`: 0 same, 1 different, 2 trouble (including a rule-file
//! comparison cut short by its work bound, `config::MAX_DIFF_RULE_VISITS`).

use std::process::ExitCode;

use cclkit_abi::raw::common::Func;
use cclkit_tuner::config::{self, format_size};

use super::eval::{Evaluator, Shape, Spec, read_rules, same, short};
use super::{ShapeArgs, SweepArgs, all_colls, coll_name, fail};

/// Arguments of `cclkit tune diff`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Default sweep (tuners): -b 8 -e 1G -f 2, all five collectives.")]
pub struct DiffArgs {
    /// First rule file or tuner library.
    pub a: String,
    /// Second rule file or tuner library.
    pub b: String,
    /// Compare two rule files through the runtime's decisions for one communicator
    /// (as for tuners) instead of rule by rule.
    #[arg(long)]
    pub table: bool,
    /// Ranks: the communicator compared (tuners; default 8), or only regions that
    /// hold for it (rule files).
    #[arg(long)]
    pub nranks: Option<usize>,
    /// Nodes: as `--nranks` (default 1).
    #[arg(long)]
    pub nnodes: Option<usize>,
    /// Channels the communicator connected (tuners).
    #[arg(long, default_value_t = 2)]
    pub channels: usize,
    /// Network speed of the built-in model, Mb/s (tuners).
    #[arg(long, default_value_t = 10_000)]
    pub net_speed: u32,
    /// Network latency of the built-in model, µs (tuners).
    #[arg(long, default_value_t = 20.0)]
    pub net_latency: f64,
    /// Sizes (tuners; default 8 B to 1 GiB by 2) and collectives (both).
    #[command(flatten)]
    pub sweep: SweepArgs,
}

/// Runs `cclkit tune diff`.
pub fn run(a: &DiffArgs) -> ExitCode {
    let (sa, sb) = (Spec::classify(&a.a), Spec::classify(&a.b));
    let r = match (&sa, &sb) {
        (Spec::Rules(pa), Spec::Rules(pb)) if !a.table => rules(a, pa, pb),
        _ => tables(a, &sa, &sb),
    };
    match r {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => fail(e),
    }
}

/// Rule by rule; returns the number of regions printed.
fn rules(a: &DiffArgs, pa: &std::path::Path, pb: &std::path::Path) -> Result<usize, String> {
    let ra = read_rules(pa)?;
    let rb = read_rules(pb)?;
    let colls = a.sweep.colls_or(all_colls());
    let (found, stats) = config::diff_with_stats(&ra.rules, &rb.rules);
    let regions = merge(
        found
            .into_iter()
            .filter(|d| colls.contains(&d.collective))
            .filter(|d| a.nranks.is_none_or(|n| d.ranks.contains(n as u64)))
            .filter(|d| a.nnodes.is_none_or(|n| d.nodes.contains(n as u64)))
            .collect(),
    );
    println!("# A: {}\n# B: {}", pa.display(), pb.display());
    if regions.is_empty() {
        println!("# the rules decide the same everywhere");
    } else {
        println!(
            "# {} region(s) decided differently (\"no rule\": NCCL or the tuner's model decides)",
            regions.len()
        );
        for d in &regions {
            println!("{d}");
        }
    }
    if stats.truncated {
        // A cut-short answer must never look complete: say so and exit 2 (trouble).
        return Err(format!(
            "the comparison stopped early (more than {} rule visits or {} regions): \
             the regions above are only part of the answer; compare smaller files \
             (for example one collective's rules at a time)",
            config::MAX_DIFF_RULE_VISITS,
            config::MAX_DIFF_REGIONS
        ));
    }
    Ok(regions.len())
}

/// Joins regions that differ only in adjacent rank (or node) counts: the semantic
/// diff cuts every dimension at every boundary either file mentions, even where
/// the cut changes nothing. Near-linear: regions are grouped by everything but the
/// dimension being joined, sorted along it, and runs of adjacent ones joined; rank
/// and node passes alternate until nothing changes. The order of first appearance
/// is kept.
fn merge(v: Vec<config::Difference>) -> Vec<config::Difference> {
    let mut items: Vec<(usize, config::Difference)> = v.into_iter().enumerate().collect();
    loop {
        let before = items.len();
        items = join_along(items, false);
        items = join_along(items, true);
        if items.len() == before {
            items.sort_by_key(|(i, _)| *i);
            return items.into_iter().map(|(_, d)| d).collect();
        }
    }
}

/// What must be equal for two regions to be joined (the line of a decision does
/// not count, as in `Outcome`'s equality), plus the other count dimension.
fn join_key(d: &config::Difference, nodes: bool) -> String {
    let o = |x: &Option<config::Outcome>| {
        x.map(|o| format!("{:?}", (o.algorithm, o.protocol, o.channels, o.chunk_size)))
    };
    let other = if nodes { d.ranks } else { d.nodes };
    format!(
        "{:?}",
        (
            d.collective,
            (d.bytes.lo, d.bytes.hi),
            (d.pipe_ops.lo, d.pipe_ops.hi),
            d.reg_buff,
            o(&d.before),
            o(&d.after),
            (other.lo, other.hi),
        )
    )
}

/// One pass: joins runs of regions adjacent along nodes (`nodes`) or ranks.
fn join_along(
    items: Vec<(usize, config::Difference)>,
    nodes: bool,
) -> Vec<(usize, config::Difference)> {
    let dim = |d: &config::Difference| if nodes { d.nodes } else { d.ranks };
    let mut groups: std::collections::HashMap<String, Vec<(usize, config::Difference)>> =
        std::collections::HashMap::new();
    for it in items {
        groups.entry(join_key(&it.1, nodes)).or_default().push(it);
    }
    let mut out = Vec::new();
    for (_, mut g) in groups {
        g.sort_by_key(|(_, d)| (dim(d).lo, dim(d).hi));
        let mut cur: Option<(usize, config::Difference)> = None;
        for (i, d) in g {
            match &mut cur {
                Some((ci, c)) if dim(c).hi != u64::MAX && dim(c).hi + 1 == dim(&d).lo => {
                    *ci = (*ci).min(i);
                    if nodes {
                        c.nodes.hi = d.nodes.hi;
                    } else {
                        c.ranks.hi = d.ranks.hi;
                    }
                }
                _ => out.extend(cur.replace((i, d))),
            }
        }
        out.extend(cur);
    }
    out
}

/// Decision tables for one communicator; returns the number of regions printed.
fn tables(a: &DiffArgs, sa: &Spec, sb: &Spec) -> Result<usize, String> {
    let shape = Shape::from_args(&ShapeArgs {
        nranks: a.nranks.unwrap_or(8),
        nnodes: a.nnodes.unwrap_or(1),
        channels: a.channels,
        net_speed: a.net_speed,
        net_latency: a.net_latency,
    })?;
    let sizes = a.sweep.sizes(8, 1 << 30, 2)?;
    let colls = a.sweep.colls_or(all_colls());
    // A library is opened first: the packaged cclkit tuner reads NCCL_TUNER_CONFIG_FILE
    // at init, which opening a rule file sets.
    let (ea, eb) = if matches!(sa, Spec::Rules(_)) && matches!(sb, Spec::Library(_)) {
        let eb = Evaluator::open(sb, &shape)?;
        (Evaluator::open(sa, &shape)?, eb)
    } else {
        let ea = Evaluator::open(sa, &shape)?;
        (ea, Evaluator::open(sb, &shape)?)
    };
    let chunk = ea.has_chunk_size || eb.has_chunk_size;
    println!(
        "# A: {}\n# B: {}\n# {} rank(s) on {} node(s), up to {} channel(s); sizes {}..={}; \
         decisions are algorithm/protocol/channels{}",
        ea.label,
        eb.label,
        shape.n_ranks,
        shape.n_nodes,
        shape.channels,
        format_size(sizes[0]),
        format_size(sizes[sizes.len() - 1]),
        if chunk { "@chunk" } else { "" }
    );
    let mut regions = Vec::new();
    for &func in &colls {
        regions.extend(coll_regions(func, &sizes, &ea, &eb, chunk));
    }
    if regions.is_empty() {
        println!("# the same decision for every collective and size");
    } else {
        println!("# {} region(s) decided differently", regions.len());
        for r in &regions {
            println!("{r}");
        }
    }
    Ok(regions.len())
}

/// Ranges of consecutive sampled sizes with the same pair of differing decisions.
fn coll_regions(
    func: Func,
    sizes: &[u64],
    ea: &Evaluator,
    eb: &Evaluator,
    chunk: bool,
) -> Vec<String> {
    let text = |r: &Result<cclkit_runtime::tune::Decision, String>| match r {
        Ok(d) => short(d, chunk),
        Err(e) => format!("error ({e})"),
    };
    let mut out = Vec::new();
    // (first size, last size, A, B) of the region being extended.
    let mut open: Option<(u64, u64, String, String)> = None;
    for &s in sizes {
        let (da, db) = (ea.decide(func, s), eb.decide(func, s));
        let differ = match (&da, &db) {
            (Ok(x), Ok(y)) => !same(x, y),
            (Err(x), Err(y)) => x != y,
            _ => true,
        };
        if !differ {
            out.extend(open.take().map(region(func)));
            continue;
        }
        let (ta, tb) = (text(&da), text(&db));
        match &mut open {
            Some((_, hi, oa, ob)) if *oa == ta && *ob == tb => *hi = s,
            _ => {
                out.extend(open.take().map(region(func)));
                open = Some((s, s, ta, tb));
            }
        }
    }
    out.extend(open.map(region(func)));
    out
}

fn region(func: Func) -> impl Fn((u64, u64, String, String)) -> String {
    move |(lo, hi, a, b)| {
        let sizes = if lo == hi {
            format_size(lo)
        } else {
            format!("{}..={}", format_size(lo), format_size(hi))
        };
        format!("{} size {sizes}: {a} -> {b}", coll_name(func))
    }
}
