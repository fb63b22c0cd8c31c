//! What `cclkit perf` prints: nccl-tests' text format on stdout (header, one row per
//! size with out-of-place then in-place columns, footer), the `--json` report, and
//! progress lines on stderr.

use std::io::{IsTerminal, Write};

use serde::Serialize;

/// nccl-tests' `getFloatStr`: `value` in `width` columns with as many decimals as fit.
pub fn float_str(value: f64, width: usize) -> String {
    let mut power = 0usize;
    let mut v = 1u64;
    while value >= v as f64 && power < 20 {
        power += 1;
        v = v.saturating_mul(10);
    }
    if power + 2 < width {
        format!("{value:>width$.2}")
    } else if power + 1 < width {
        format!("{value:>width$.1}")
    } else if power < width + 1 {
        format!("{value:>width$.0}")
    } else {
        format!("{value:>width$.1e}")
    }
}

/// One out-of-place or in-place measurement, as printed and reported.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Measure {
    /// Timed iterations.
    pub iterations: usize,
    /// Mean time per operation in µs.
    pub time: f64,
    /// Algorithm bandwidth, GB/s.
    pub alg_bw: f64,
    /// Bus bandwidth, GB/s.
    pub bus_bw: f64,
    /// Wrong elements over every rank (`None` = not checked).
    pub nwrong: Option<u64>,
    /// Algorithm the runtime picked (collectives only).
    pub algo: Option<&'static str>,
    /// Protocol the runtime picked (collectives only).
    pub proto: Option<&'static str>,
    /// Channels used.
    pub channels: Option<usize>,
}

/// One row: a size with both measurements.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// `size (B)`: the larger of the send and receive bytes.
    pub size: usize,
    /// `count (elements)`.
    pub count: usize,
    /// Type name.
    #[serde(rename = "type")]
    pub dtype: &'static str,
    /// Op name (`none` for collectives that do not reduce).
    pub redop: &'static str,
    /// Root (-1 when none).
    pub root: i64,
    /// Out-of-place measurement.
    pub out_of_place: Measure,
    /// In-place measurement.
    pub in_place: Measure,
}

/// The fixed part of the header and of the JSON `config`.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Ranks.
    pub nranks: usize,
    /// `-b`.
    pub minimum_bytes: usize,
    /// `-e`.
    pub maximum_bytes: usize,
    /// `-f` (when > 1).
    pub step_factor: Option<usize>,
    /// `-i` (when no factor).
    pub step_bytes: Option<usize>,
    /// `-w`.
    pub warmup_iters: usize,
    /// `-n`.
    pub iterations: usize,
    /// `-m`.
    pub aggregated_iterations: usize,
    /// `-c`.
    pub validation: usize,
    /// `-a`.
    pub average: u8,
}

/// The header lines up to the device list; `buffers` says where the data lives
/// (host memory, a GPU, or the CUDA stand-in), so no output misstates it.
pub fn header(cfg: &Config, buffers: &str, devices: &[String]) -> String {
    let (step, kind) = match cfg.step_factor {
        Some(f) => (f, "factor"),
        None => (cfg.step_bytes.unwrap_or(0), "bytes"),
    };
    let mut s = format!(
        "# cclkit perf {} (nccl-tests output format; {buffers})\n",
        env!("CARGO_PKG_VERSION")
    );
    s += &format!(
        "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {step}({kind}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: 0\n",
        cfg.minimum_bytes,
        cfg.maximum_bytes,
        cfg.warmup_iters,
        cfg.iterations,
        cfg.aggregated_iterations,
        cfg.validation
    );
    s += "#\n# Using devices\n";
    for d in devices {
        s += d;
        s.push('\n');
    }
    for line in crate::commands::plugin_args::not_used() {
        s += &format!("# WARNING: {line}\n");
    }
    s
}

/// The start of one collective's table.
pub fn table_header(perf_name: &str) -> String {
    let mut s = format!("#\n# Collective test starting: {perf_name}\n#\n");
    s += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          \n",
        "", "", "", "", ""
    );
    s += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    s += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
    s
}

fn measure_str(m: &Measure) -> String {
    let wrong = match m.nwrong {
        Some(w) => format!("{w:>6}"),
        None => "   N/A".to_string(),
    };
    format!(
        "  {}  {}  {}  {wrong}",
        float_str(m.time, 7),
        float_str(m.alg_bw, 6),
        float_str(m.bus_bw, 6)
    )
}

/// One row, as nccl-tests prints it.
pub fn row(r: &Row) -> String {
    format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}",
        r.size,
        r.count,
        r.dtype,
        r.redop,
        r.root,
        measure_str(&r.out_of_place),
        measure_str(&r.in_place)
    )
}

/// One collective's results and footer numbers.
#[derive(Clone, Debug, Serialize)]
pub struct Test {
    /// Short name (`all_reduce`).
    pub collective: &'static str,
    /// nccl-tests binary name.
    pub name: &'static str,
    /// Every row.
    pub results: Vec<Row>,
    /// Wrong elements over all rows.
    pub out_of_bounds: u64,
    /// Mean bus bandwidth over every measurement (both placements).
    pub average_bus_bandwidth: f64,
}

impl Test {
    /// A test with no rows yet.
    pub fn new(collective: &'static str, name: &'static str) -> Self {
        Self {
            collective,
            name,
            results: Vec::new(),
            out_of_bounds: 0,
            average_bus_bandwidth: 0.0,
        }
    }

    /// Adds a row and updates the footer numbers.
    pub fn push(&mut self, r: Row) {
        self.out_of_bounds += r.out_of_place.nwrong.unwrap_or(0) + r.in_place.nwrong.unwrap_or(0);
        self.results.push(r);
        let all: Vec<f64> = self
            .results
            .iter()
            .flat_map(|r| [r.out_of_place.bus_bw, r.in_place.bus_bw])
            .collect();
        self.average_bus_bandwidth = all.iter().sum::<f64>() / all.len().max(1) as f64;
    }

    /// The footer lines.
    pub fn footer(&self) -> String {
        format!(
            "# {:<20} : {} {}\n# {:<20} : {} \n#\n# Collective test concluded: {}\n",
            "Out of bounds values",
            self.out_of_bounds,
            if self.out_of_bounds == 0 {
                "OK"
            } else {
                "FAILED"
            },
            "Avg bus bandwidth",
            g_format(self.average_bus_bandwidth),
            self.name
        )
    }
}

/// C's `%g` (6 significant digits, trailing zeros removed).
pub fn g_format(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let exp = v.abs().log10().floor() as i32;
    if !(-5..6).contains(&exp) {
        let s = format!("{v:.5e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let m = trim_zeros(m);
        let e: i32 = e.parse().unwrap_or(0);
        return format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    let decimals = (5 - exp).max(0) as usize;
    trim_zeros(&format!("{v:.decimals$}")).to_string()
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// The `--json` report.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Report format version.
    pub version: u32,
    /// Command line.
    pub args: Vec<String>,
    /// Run parameters.
    pub config: Config,
    /// One line per rank (as in the header).
    pub devices: Vec<String>,
    /// Net plugin and ABI version.
    pub net: String,
    /// Tuner (plugin name, or the built-in cost model).
    pub tuner: String,
    /// One entry per collective.
    pub tests: Vec<Test>,
    /// Rank 0's tuner report: every distinct decision, its calls and exact sizes
    /// (each row's algo/proto/channels is one of these, at its size).
    pub tuner_report: Vec<TunerEntry>,
}

/// One entry of the tuner report (what `CCLKIT_TUNER_REPORT=1` prints).
#[derive(Debug, Serialize)]
pub struct TunerEntry {
    /// Collective (`AllReduce`, …).
    pub func: String,
    /// Algorithm.
    pub algo: &'static str,
    /// Protocol.
    pub proto: &'static str,
    /// Channels.
    pub channels: usize,
    /// Chunk bytes.
    pub chunk: usize,
    /// Who chose: `Model`, `Tuner` or `Fallback`.
    pub source: &'static str,
    /// Calls made with this decision.
    pub calls: u64,
    /// Smallest size (the bytes a tuner is asked about) that ran with it.
    pub min_bytes: usize,
    /// Largest such size; every size measured in between ran with it too.
    pub max_bytes: usize,
}

/// The tuner report of `tuning` as `--json` entries.
pub fn tuner_entries(tuning: &cclkit_runtime::tune::Tuning) -> Vec<TunerEntry> {
    tuning
        .entries()
        .into_iter()
        .map(|e| TunerEntry {
            func: format!("{:?}", e.func),
            algo: e.decision.algo.name().unwrap_or("?"),
            proto: e.decision.proto.name().unwrap_or("?"),
            channels: e.decision.channels,
            chunk: e.decision.chunk,
            source: cclkit_runtime::tune::report::source_name(e.decision.source),
            calls: e.calls,
            min_bytes: e.min_bytes,
            max_bytes: e.max_bytes,
        })
        .collect()
}

/// Progress on stderr (rank 0 only): overwritten in place on a terminal, one line
/// per step when asked for with `--progress`, silent otherwise.
pub struct Progress {
    on: bool,
    tty: bool,
    dirty: bool,
}

impl Progress {
    /// Progress for this run: `force` = `Some(true)` (`--progress`), `Some(false)`
    /// (`--no-progress`), or `None` (on when stderr is a terminal).
    pub fn new(force: Option<bool>, rank: usize) -> Self {
        let tty = std::io::stderr().is_terminal();
        Self {
            on: rank == 0 && force.unwrap_or(tty),
            tty,
            dirty: false,
        }
    }

    /// Reports a step.
    pub fn step(&mut self, what: &str) {
        if !self.on {
            return;
        }
        let mut e = std::io::stderr().lock();
        if self.tty {
            let _ = write!(e, "\r\x1b[K{what}");
            self.dirty = true;
        } else {
            let _ = writeln!(e, "{what}");
        }
        let _ = e.flush();
    }

    /// Clears a terminal progress line (before stdout output lands under it).
    pub fn clear(&mut self) {
        if self.on && self.tty && self.dirty {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K");
            let _ = e.flush();
            self.dirty = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_format_like_nccl_tests() {
        assert_eq!(float_str(12.345, 7), "  12.35");
        assert_eq!(float_str(123.45, 7), " 123.45");
        assert_eq!(float_str(12345.6, 7), "12345.6");
        assert_eq!(float_str(123456.7, 7), " 123457");
        assert_eq!(float_str(0.0, 6), "  0.00");
        assert_eq!(float_str(1.234, 6), "  1.23");
        assert_eq!(g_format(1.5), "1.5");
        assert_eq!(g_format(0.123456789), "0.123457");
        assert_eq!(g_format(123456.0), "123456");
        assert_eq!(g_format(1234567.0), "1.23457e+06");
        assert_eq!(g_format(0.0), "0");
    }

    fn m(t: f64, w: Option<u64>) -> Measure {
        Measure {
            iterations: 1,
            time: t,
            alg_bw: 1.0,
            bus_bw: 1.5,
            nwrong: w,
            algo: None,
            proto: None,
            channels: None,
        }
    }

    #[test]
    fn rows_and_footer() {
        let r = Row {
            size: 1024,
            count: 256,
            dtype: "float",
            redop: "sum",
            root: -1,
            out_of_place: m(10.0, Some(0)),
            in_place: m(11.0, None),
        };
        let line = row(&r);
        assert_eq!(
            line,
            "        1024           256     float     sum      -1    10.00    1.00    1.50       0    11.00    1.00    1.50     N/A"
        );
        let mut t = Test::new("all_reduce", "all_reduce_perf");
        t.push(r);
        let f = t.footer();
        assert!(
            f.starts_with("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1.5 \n"),
            "{f}"
        );
        let h = table_header("all_reduce_perf");
        for line in h.lines() {
            assert!(line.starts_with('#'));
        }
        assert!(h.contains("#wrong"));
    }
}
