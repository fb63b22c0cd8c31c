//! `cclkit tune show`: a tuner's decision table over collectives × sizes, computed
//! exactly as the reference runtime would for a communicator of the given shape,
//! with every call going through the tuner's real ABI (v1 … v7). No GPU, no network.

use std::path::PathBuf;
use std::process::ExitCode;

use cclkit_abi::raw::common::Func;
use cclkit_tuner::config::format_size;
use serde::Serialize;

use super::eval::{DecisionJson, Evaluator, Shape, Spec, same};
use super::{ShapeArgs, SweepArgs, all_colls, coll_name, fail};

/// Arguments of `cclkit tune show`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["tuner", "config"])))]
#[command(after_help = "Default sweep: -b 8 -e 1G -f 4, all five collectives.")]
pub struct ShowArgs {
    /// The tuner library (a path, or a name such as `cclkit` resolved as
    /// NCCL_TUNER_PLUGIN would be).
    #[arg(long)]
    pub tuner: Option<String>,
    /// A rule file (NCCL CSV or cclkit TOML), shown through cclkit's tuner.
    #[arg(long, conflicts_with = "tuner")]
    pub config: Option<PathBuf>,
    /// Communicator shape and built-in model inputs.
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// Sizes and collectives (default: 8 B to 1 GiB by 4, all five collectives).
    #[command(flatten)]
    pub sweep: SweepArgs,
    /// One line per collective and size, with the built-in choice next to the tuner's.
    #[arg(long)]
    pub long: bool,
    /// Print the table as JSON.
    #[arg(long)]
    pub json: bool,
    /// Emulate RCCL's tuner host (as `CCLKIT_FLAVOR=rccl`): RCCL's constants struct
    /// with `bwRatio` and 8 algorithms (7 with `CCLKIT_RCCL_NUM_ALGO=7`), no v7.
    #[arg(long)]
    pub rccl: bool,
}

/// One cell of the table.
#[derive(Debug, Serialize)]
pub struct Cell {
    /// Collective (NCCL's lower-case name).
    pub collective: &'static str,
    /// `nBytes` the tuner was asked about.
    pub bytes: u64,
    /// What the runtime would run with this tuner (`None`: no choice possible).
    pub decision: Option<DecisionJson>,
    /// What it would run with no tuner.
    pub builtin: Option<DecisionJson>,
    /// The tuner's choice differs from the built-in one.
    pub changed: bool,
    /// Why there is no decision.
    pub error: Option<String>,
}

/// The whole `show` output.
#[derive(Debug, Serialize)]
pub struct Table {
    /// What decided.
    pub tuner: String,
    /// The host emulated for v5/v6 tuners (constants layout and cost-table width).
    pub host: &'static str,
    /// The communicator.
    pub shape: Shape,
    /// The tuner has a v6 `getChunkSize` (chunk sizes are then part of each decision).
    pub chunk_size: bool,
    /// Calls for which the tuner failed (the built-in choice was used).
    pub fallbacks: u64,
    /// Every collective × size.
    pub cells: Vec<Cell>,
}

/// Computes the table of `spec` over `colls` × `sizes`.
pub fn table(spec: &Spec, shape: &Shape, colls: &[Func], sizes: &[u64]) -> Result<Table, String> {
    let builtin = Evaluator::builtin(shape)?;
    let tuner = Evaluator::open(spec, shape)?;
    let mut cells = Vec::with_capacity(colls.len() * sizes.len());
    for &func in colls {
        for &bytes in sizes {
            let (d, b) = (tuner.decide(func, bytes), builtin.decide(func, bytes));
            let changed = match (&d, &b) {
                (Ok(d), Ok(b)) => !same(d, b),
                _ => false,
            };
            cells.push(Cell {
                collective: coll_name(func),
                bytes,
                decision: d.as_ref().ok().map(DecisionJson::from),
                builtin: b.as_ref().ok().map(DecisionJson::from),
                changed,
                error: d.err(),
            });
        }
    }
    Ok(Table {
        tuner: tuner.label.clone(),
        host: tuner
            .layout
            .map_or("none (the built-in model decides)", |l| l.describe()),
        shape: *shape,
        chunk_size: tuner.has_chunk_size,
        fallbacks: tuner.fallbacks(),
        cells,
    })
}

/// Runs `cclkit tune show`.
pub fn run(a: &ShowArgs) -> ExitCode {
    if a.rccl {
        // SAFETY: called from `main` before the command starts any thread; both the
        // host adapter and cclkit tuners read this variable at each `init`.
        unsafe { std::env::set_var("CCLKIT_FLAVOR", "rccl") };
    }
    let shape = match Shape::from_args(&a.shape) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let sizes = match a.sweep.sizes(8, 1 << 30, 4) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let colls = a.sweep.colls_or(all_colls());
    let spec = match (&a.tuner, &a.config) {
        (Some(t), _) => Spec::classify(t),
        (None, Some(c)) => Spec::Rules(c.clone()),
        (None, None) => return fail("give --tuner LIB or --config FILE"),
    };
    let t = match table(&spec, &shape, &colls, &sizes) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    if a.json {
        match serde_json::to_string_pretty(&t) {
            Ok(s) => println!("{s}"),
            Err(e) => return fail(format!("JSON: {e}")),
        }
    } else if a.long {
        print!("{}", header(&t));
        print!("{}", long(&t));
    } else {
        print!("{}", header(&t));
        print!("{}", matrix(&t, &colls, &sizes));
    }
    ExitCode::SUCCESS
}

fn header(t: &Table) -> String {
    let s = &t.shape;
    let changed = t.cells.iter().filter(|c| c.changed).count();
    let mut out = format!(
        "# tuner: {}\n\
         # host: {}\n\
         # communicator: {} rank(s) on {} node(s), up to {} channel(s); built-in table: the \
         runtime's cost model (net {} Mb/s, {} us)\n\
         # {changed} of {} decisions differ from the built-in choice",
        t.tuner,
        t.host,
        s.n_ranks,
        s.n_nodes,
        s.channels,
        s.net_speed_mbps,
        s.net_latency_us,
        t.cells.len()
    );
    if t.fallbacks > 0 {
        out.push_str(&format!(
            "; the tuner failed {} time(s) (built-in choice used, marked !)",
            t.fallbacks
        ));
    }
    out.push('\n');
    out
}

fn cell_text(c: &Cell, chunk: bool) -> String {
    match &c.decision {
        None => "-".to_owned(),
        Some(d) => {
            let mut s = format!("{}/{}/{}", d.algo, d.proto, d.channels);
            if chunk {
                s.push('@');
                s.push_str(&format_size(d.chunk as u64));
            }
            if d.source == "fallback" {
                s.push('!');
            } else if c.changed {
                s.push('*');
            }
            s
        }
    }
}

/// Sizes down, collectives across.
fn matrix(t: &Table, colls: &[Func], sizes: &[u64]) -> String {
    let mut out = format!(
        "# cell: algorithm/protocol/channels{}; * = the tuner changed the built-in choice\n",
        if t.chunk_size { "@chunk" } else { "" }
    );
    let cols: Vec<Vec<String>> = colls
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut col = vec![coll_name(*f).to_owned()];
            col.extend(
                t.cells[i * sizes.len()..(i + 1) * sizes.len()]
                    .iter()
                    .map(|c| cell_text(c, t.chunk_size)),
            );
            col
        })
        .collect();
    let widths: Vec<usize> = cols
        .iter()
        .map(|c| c.iter().map(String::len).max().unwrap_or(0))
        .collect();
    for row in 0..=sizes.len() {
        let size = if row == 0 {
            "size".to_owned()
        } else {
            format_size(sizes[row - 1])
        };
        let mut line = format!("{size:>8}");
        for (c, w) in cols.iter().zip(&widths) {
            line.push_str(&format!("  {:<w$}", c[row], w = *w));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if t.cells.iter().any(|c| c.error.is_some()) {
        for c in t.cells.iter().filter(|c| c.error.is_some()) {
            out.push_str(&format!(
                "# {} {}: {}\n",
                c.collective,
                format_size(c.bytes),
                c.error.as_deref().unwrap_or("")
            ));
        }
    }
    out
}

/// One line per cell, with the built-in choice and who decided.
fn long(t: &Table) -> String {
    let mut out = format!(
        "# {:<13} {:>8}  {:<22} {:<8} built-in\n",
        "collective", "size", "decision", "source"
    );
    for c in &t.cells {
        let b = c.builtin.as_ref().map_or_else(
            || "-".to_owned(),
            |b| {
                let mut s = format!("{}/{}/{}", b.algo, b.proto, b.channels);
                if t.chunk_size {
                    s.push('@');
                    s.push_str(&format_size(b.chunk as u64));
                }
                s
            },
        );
        let src = c.decision.as_ref().map_or("-", |d| d.source);
        let line = format!(
            "  {:<13} {:>8}  {:<22} {:<8} {:<22}{}",
            c.collective,
            format_size(c.bytes),
            cell_text(c, t.chunk_size),
            src,
            b,
            c.error
                .as_deref()
                .map_or_else(String::new, |e| format!("  ({e})"))
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
