//! The rule model shared by the plugin and `cclkit tune`: NCCL CSV and cclkit TOML
//! read into one [`RuleSet`], matched, written back out in either format, and
//! compared semantically ([`diff()`]).
//!
//! ```
//! use cclkit_tuner::config::{self, Format, Query};
//! use cclkit_abi::raw::common::{Algorithm, Func};
//!
//! let parsed = config::parse("allreduce,0,65535,tree,ll,4,-1,-1\n", "t.conf", Format::Csv);
//! assert!(parsed.is_ok());
//! let q = Query { func: Func::ALL_REDUCE, n_bytes: 4096, n_nodes: 2, n_ranks: 16,
//!                 num_pipe_ops: 1, reg_buff: Some(false) };
//! let (_, rule) = parsed.rules.first_match(&q).unwrap();
//! assert_eq!(rule.algorithm, Some(Algorithm::TREE));
//! ```

use std::fmt;
use std::path::Path;

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};

mod csv;
pub mod diff;
pub mod names;
mod partition;
mod size;
mod toml;

pub use diff::{
    DiffStats, Difference, MAX_DIFF_REGIONS, MAX_DIFF_RULE_VISITS, Outcome, diff, diff_with_stats,
};
pub use size::{Interval, IntervalDisplay, format_size, parse_interval, parse_size};

use crate::hw::{Arch, IntraLink};

/// The two file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// NVIDIA's example-tuner CSV (`NCCL_TUNER_CONFIG_FILE`, NCCL_ABI.md §4.5).
    Csv,
    /// cclkit's TOML rules.
    Toml,
}

/// A set of collectives (`ncclFunc_t` 0…4) as a bit mask.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CollSet(u8);

impl CollSet {
    /// Every collective a tuner is asked about.
    pub const ALL: Self = Self(0x1f);
    /// No collective.
    pub const EMPTY: Self = Self(0);

    /// `{f}`; `None` for a value outside 0…4.
    pub fn single(f: Func) -> Option<Self> {
        (0..5).contains(&f.0).then(|| Self(1 << f.0))
    }

    /// Adds `f` (ignored outside 0…4).
    pub fn insert(&mut self, f: Func) {
        if let Some(s) = Self::single(f) {
            self.0 |= s.0;
        }
    }

    /// Whether `f` is in the set.
    #[inline]
    pub fn contains(&self, f: Func) -> bool {
        (0..5).contains(&f.0) && self.0 & (1 << f.0) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }

    /// The collectives in `ncclFunc_t` order.
    pub fn iter(&self) -> impl Iterator<Item = Func> + '_ {
        (0..5).map(Func).filter(|f| self.contains(*f))
    }
}

impl fmt::Debug for CollSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::ALL {
            return f.write_str("*");
        }
        let names: Vec<&str> = self.iter().map(names::collective_name).collect();
        f.write_str(&names.join("|"))
    }
}

/// One rule: conditions (collective, size, communicator shape, call details) and
/// what to do when they hold.
///
/// A rule with both `algorithm` and `protocol` selects that entry of the cost table
/// when NCCL supports it (otherwise the next rule is tried, as in NCCL's example);
/// with only one of them it selects the cheapest supported entry of that algorithm
/// or protocol; `channels` and `chunk_size` apply when the rule is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Collectives the rule is for.
    pub collectives: CollSet,
    /// `nBytes` range (inclusive).
    pub bytes: Interval,
    /// Communicator node counts.
    pub nodes: Interval,
    /// Communicator rank counts.
    pub ranks: Interval,
    /// `numPipeOps` values.
    pub pipe_ops: Interval,
    /// `regBuff` (v4+): `None` matches either.
    pub reg_buff: Option<bool>,
    /// Algorithm to select.
    pub algorithm: Option<Algorithm>,
    /// Protocol to select.
    pub protocol: Option<Protocol>,
    /// Channel count to set (`None` keeps NCCL's).
    pub channels: Option<u32>,
    /// Chunk size for `getChunkSize` (v6).
    pub chunk_size: Option<u64>,
    /// Whether this came from a `[defaults]` table (it then follows every rule).
    pub is_default: bool,
    /// 1-based line in the source file (0 when built in code).
    pub line: u32,
}

impl Rule {
    /// A rule matching everything and doing nothing; fill in what you need.
    pub fn any() -> Self {
        Self {
            collectives: CollSet::ALL,
            bytes: Interval::ANY,
            nodes: Interval::ANY,
            ranks: Interval::ANY,
            pipe_ops: Interval::ANY,
            reg_buff: None,
            algorithm: None,
            protocol: None,
            channels: None,
            chunk_size: None,
            is_default: false,
            line: 0,
        }
    }

    /// Whether the rule can act in `getCollInfo` (it sets an algorithm, protocol or channels).
    pub fn acts_on_coll_info(&self) -> bool {
        self.algorithm.is_some() || self.protocol.is_some() || self.channels.is_some()
    }

    /// Whether the rule holds for a communicator of this shape.
    pub fn matches_comm(&self, n_nodes: u64, n_ranks: u64) -> bool {
        self.nodes.contains(n_nodes) && self.ranks.contains(n_ranks)
    }

    /// Whether every condition holds for `q`.
    pub fn matches(&self, q: &Query) -> bool {
        self.collectives.contains(q.func)
            && self.bytes.contains(q.n_bytes)
            && self.matches_comm(q.n_nodes, q.n_ranks)
            && self.pipe_ops.contains(pipe_ops_key(q.num_pipe_ops))
            && match (self.reg_buff, q.reg_buff) {
                (None, _) => true,
                (Some(want), Some(got)) => want == got,
                // A v3 host does not say; a rule that asks cannot be checked.
                (Some(_), None) => false,
            }
    }
}

/// `numPipeOps` as an interval key (NCCL never passes a negative count).
pub(crate) fn pipe_ops_key(n: i32) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// One `getCollInfo` question with the communicator's shape, for static matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    /// Collective.
    pub func: Func,
    /// Bytes.
    pub n_bytes: u64,
    /// Nodes in the communicator.
    pub n_nodes: u64,
    /// Ranks in the communicator.
    pub n_ranks: u64,
    /// Pipelined operations.
    pub num_pipe_ops: i32,
    /// Registered buffers (`None` for a v3 host).
    pub reg_buff: Option<bool>,
}

/// Model parameters a TOML file may set in `[model]` (environment variables win).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ModelSettings {
    /// Intra-node bus bandwidth per GPU, GB/s.
    pub intra_bw: Option<f64>,
    /// Network bandwidth per node, GB/s.
    pub net_bw: Option<f64>,
    /// Extra latency per network step, µs.
    pub net_lat: Option<f64>,
    /// Intra-node link type.
    pub intra_link: Option<IntraLink>,
    /// GPU generation (picks the bandwidth-ceiling column).
    pub arch: Option<Arch>,
    /// Channels assumed for per-channel bandwidth ceilings.
    pub channels: Option<u32>,
}

impl ModelSettings {
    /// `self` with every field `other` sets replaced.
    pub fn overridden_by(&self, other: &Self) -> Self {
        Self {
            intra_bw: other.intra_bw.or(self.intra_bw),
            net_bw: other.net_bw.or(self.net_bw),
            net_lat: other.net_lat.or(self.net_lat),
            intra_link: other.intra_link.or(self.intra_link),
            arch: other.arch.or(self.arch),
            channels: other.channels.or(self.channels),
        }
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Rules in first-match order (`[defaults]` after all others) plus model settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuleSet {
    /// The rules; the first that holds and applies wins.
    pub rules: Vec<Rule>,
    /// `[model]` settings (TOML only).
    pub model: ModelSettings,
}

impl RuleSet {
    /// The first rule that holds for `q` and acts on `getCollInfo`, assuming NCCL
    /// supports whatever it selects (the plugin also skips rules whose entry is
    /// unsupported for the call).
    pub fn first_match(&self, q: &Query) -> Option<(usize, &Rule)> {
        self.rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.acts_on_coll_info() && r.matches(q))
    }

    /// Writes NCCL CSV. Rules CSV cannot express (no algorithm or protocol, node or
    /// rank ranges wider than 64 values) are left out; chunk sizes and `[model]` are
    /// dropped. Each loss is described in the returned notes.
    pub fn to_csv(&self) -> (String, Vec<String>) {
        csv::write(self)
    }

    /// Writes cclkit TOML (lossless).
    pub fn to_toml(&self) -> String {
        toml::write(self)
    }
}

/// How bad a [`Diagnostic`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Read the same way NCCL reads it, but probably not what was meant.
    Warning,
    /// A bad line: the file is not used.
    Error,
}

/// One problem found while reading a file, with its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// File name as given.
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// Warning or error.
    pub severity: Severity,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.severity {
            Severity::Error => write!(f, "{}:{}: {}", self.file, self.line, self.message),
            Severity::Warning => {
                write!(f, "{}:{}: warning: {}", self.file, self.line, self.message)
            }
        }
    }
}

/// Collects diagnostics for one file.
pub(crate) struct Sink<'a> {
    pub file: &'a str,
    pub out: Vec<Diagnostic>,
}

impl Sink<'_> {
    pub fn error(&mut self, line: u32, message: impl Into<String>) {
        self.push(line, Severity::Error, message.into());
    }

    pub fn warn(&mut self, line: u32, message: impl Into<String>) {
        self.push(line, Severity::Warning, message.into());
    }

    fn push(&mut self, line: u32, severity: Severity, message: String) {
        self.out.push(Diagnostic {
            file: self.file.to_owned(),
            line,
            severity,
            message: cut_echoes(&message),
        });
    }
}

/// A run of non-blank characters longer than `LONG_RUN` is an echoed value (no
/// fixed text is that long) and is cut to `MAX_ECHO`; a message is cut to
/// `MAX_MESSAGE`: a hostile field must not turn into megabytes of NCCL WARN.
const LONG_RUN: usize = 120;
const MAX_ECHO: usize = 80;
const MAX_MESSAGE: usize = 400;

/// `message` with echoed values cut (marked `…`), the whole at most [`MAX_MESSAGE`]
/// characters.
fn cut_echoes(message: &str) -> String {
    let mut out = String::new();
    for (i, word) in message.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        if word.chars().count() > LONG_RUN {
            out.extend(word.chars().take(MAX_ECHO));
            out.push('…');
        } else {
            out.push_str(word);
        }
        if out.chars().count() > MAX_MESSAGE {
            let cut: String = out.chars().take(MAX_MESSAGE).collect();
            return cut + "…";
        }
    }
    out
}

/// A file read into rules, with everything found wrong on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The format it was read as.
    pub format: Format,
    /// The rules (incomplete when there are errors).
    pub rules: RuleSet,
    /// Warnings and errors in line order.
    pub diagnostics: Vec<Diagnostic>,
}

impl Parsed {
    /// Whether no error was found (warnings allowed).
    pub fn is_ok(&self) -> bool {
        !self
            .diagnostics
            .iter()
            .any(|d| d.severity == Severity::Error)
    }

    /// The errors only.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
    }
}

/// Reads `text` (named `file` in diagnostics) as `format`.
pub fn parse(text: &str, file: &str, format: Format) -> Parsed {
    let mut sink = Sink {
        file,
        out: Vec::new(),
    };
    let rules = match format {
        Format::Csv => csv::parse(text, &mut sink),
        Format::Toml => toml::parse(text, &mut sink),
    };
    let mut diagnostics = sink.out;
    diagnostics.sort_by_key(|d| d.line);
    Parsed {
        format,
        rules,
        diagnostics,
    }
}

/// Picks the format: a name ending in `.toml` is TOML; otherwise the first line that
/// is neither blank nor a `#` comment decides: one starting with `[` or holding `=`
/// is TOML, anything else (a CSV rule has commas and no `=`) is CSV.
pub fn detect_format(path: &Path, text: &str) -> Format {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
    {
        return Format::Toml;
    }
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'));
    match first {
        Some(l) if l.starts_with('[') || l.contains('=') => Format::Toml,
        _ => Format::Csv,
    }
}

/// Largest file read: 1 MiB (a rule file is tens of kB; this bounds the time and
/// memory every communicator init spends on a file that is something else).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Reads and parses a file, picking the format with [`detect_format`].
pub fn load(path: &Path) -> std::io::Result<Parsed> {
    let len = std::fs::metadata(path)?.len();
    if len > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{len} bytes is larger than the {MAX_FILE_BYTES}-byte limit"),
        ));
    }
    // Bounded even if the file grows after the check.
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::fs::File::open(path)?, MAX_FILE_BYTES + 1),
        &mut bytes,
    )?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than the {MAX_FILE_BYTES}-byte limit"),
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        )
    })?;
    let name = path.display().to_string();
    Ok(parse(&text, &name, detect_format(path, &text)))
}
