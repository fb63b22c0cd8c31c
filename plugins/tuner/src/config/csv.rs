//! NCCL's example-tuner CSV, read exactly as NVIDIA's plugin reads it.
//!
//! `collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]`
//!
//! Same as NCCL: lines starting with `#` and blank lines are skipped, fields are
//! trimmed of spaces and tabs, 8–10 fields, `-1` is a wildcard (and keeps NCCL's
//! channel count), an unknown collective is allreduce, an unknown algorithm ring and
//! an unknown protocol simple, `max_bytes = -1` is the largest size (strtoull), one
//! trailing comma is ignored. Those readings are kept but reported as warnings.
//!
//! Stricter than NCCL (each is an error: the file is not used): a wrong field count
//! (NCCL silently skips the line), an empty field (NCCL's two implementations
//! disagree on it), and a number field that is not a plain integer such as `64K`,
//! `abc` or `8 # note` (NCCL's atoi/strtoull would read 64, 0 and 8).

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};

use super::names::{self, ALGORITHMS, COLLECTIVES, PROTOCOLS};
use super::{CollSet, Interval, Rule, RuleSet, Sink};

const FIELDS: [&str; 10] = [
    "collective",
    "min_bytes",
    "max_bytes",
    "algorithm",
    "protocol",
    "channels",
    "nNodes",
    "nRanks",
    "numPipeOps",
    "regBuff",
];

pub(super) fn parse(text: &str, sink: &mut Sink<'_>) -> RuleSet {
    let mut rules = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let line_no = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = trim(line);
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if let Some(rule) = parse_line(line, line_no, sink) {
            rules.push(rule);
        }
    }
    RuleSet {
        rules,
        ..RuleSet::default()
    }
}

fn trim(s: &str) -> &str {
    s.trim_matches([' ', '\t'])
}

fn parse_line(line: &str, n: u32, sink: &mut Sink<'_>) -> Option<Rule> {
    let mut fields: Vec<&str> = line.split(',').map(trim).collect();
    if fields.len() > 1 && fields.last().is_some_and(|f| f.is_empty()) {
        fields.pop();
    }
    if !(8..=10).contains(&fields.len()) {
        sink.error(
            n,
            format!(
                "expected 8 to 10 comma-separated fields \
                 (collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks\
                 [,numPipeOps[,regBuff]]), found {}",
                fields.len()
            ),
        );
        return None;
    }
    let before = sink.out.len();
    if let Some(i) = fields.iter().position(|f| f.is_empty()) {
        sink.error(n, format!("field {} ({}) is empty", i + 1, FIELDS[i]));
        return None;
    }

    let func = lenient(
        &COLLECTIVES,
        fields[0],
        Func::ALL_REDUCE,
        "collective",
        n,
        sink,
    );
    let min = bytes(fields[1], FIELDS[1], n, sink);
    let max = bytes(fields[2], FIELDS[2], n, sink);
    let algorithm = lenient(
        &ALGORITHMS,
        fields[3],
        Algorithm::RING,
        "algorithm",
        n,
        sink,
    );
    let protocol = lenient(&PROTOCOLS, fields[4], Protocol::SIMPLE, "protocol", n, sink);
    let channels = int(fields[5], FIELDS[5], n, sink).and_then(|c| match c {
        -1 | 0 => Some(None),
        c if c > 0 => Some(u32::try_from(c).ok()),
        c => {
            sink.error(
                n,
                format!("channels must be -1 (keep NCCL's) or a channel count, got {c}"),
            );
            None
        }
    });
    let nodes = count(fields[6], FIELDS[6], n, sink);
    let ranks = count(fields[7], FIELDS[7], n, sink);
    let pipe_ops = match fields.get(8) {
        Some(f) => count(f, FIELDS[8], n, sink),
        None => Some(Interval::ANY),
    };
    let reg_buff = match fields.get(9) {
        Some(f) => int(f, FIELDS[9], n, sink).and_then(|v| match v {
            -1 => Some(None),
            0 => Some(Some(false)),
            1 => Some(Some(true)),
            v => {
                sink.error(n, format!("regBuff must be -1, 0 or 1, got {v}"));
                None
            }
        }),
        None => Some(None),
    };

    if sink.out[before..]
        .iter()
        .any(|d| d.severity == super::Severity::Error)
    {
        return None;
    }
    let (min, max, channels, nodes, ranks, pipe_ops, reg_buff) =
        (min?, max?, channels?, nodes?, ranks?, pipe_ops?, reg_buff?);
    if min > max {
        sink.warn(
            n,
            format!("min_bytes {min} is greater than max_bytes {max}: the rule never matches"),
        );
    }
    for (iv, name) in [(nodes, "nNodes"), (ranks, "nRanks")] {
        if iv == Interval::exact(0) {
            sink.warn(n, format!("{name} 0 never matches"));
        }
    }
    Some(Rule {
        collectives: CollSet::single(func).unwrap_or(CollSet::EMPTY),
        bytes: Interval::new(min, max),
        nodes,
        ranks,
        pipe_ops,
        reg_buff,
        algorithm: Some(algorithm),
        protocol: Some(protocol),
        channels,
        chunk_size: None,
        is_default: false,
        line: n,
    })
}

/// NCCL's lookup: exact name, else its default, with a warning.
fn lenient<T: Copy>(
    table: &[(&'static str, T)],
    s: &str,
    fallback: T,
    what: &str,
    n: u32,
    sink: &mut Sink<'_>,
) -> T {
    if let Some(v) = names::exact(table, s) {
        return v;
    }
    let default_name = match what {
        "collective" => "allreduce",
        "algorithm" => "ring",
        _ => "simple",
    };
    let hint = match names::loose(table, s) {
        Some(_) => " (names are lower-case)".to_owned(),
        None => format!(" (expected {})", names::expected(table)),
    };
    sink.warn(
        n,
        format!("unknown {what} \"{s}\": read as {default_name}, as NCCL does{hint}"),
    );
    fallback
}

/// A signed decimal integer that fits NCCL's `int`.
fn int(s: &str, name: &str, n: u32, sink: &mut Sink<'_>) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        sink.error(n, format!("{name} \"{s}\" is not an integer"));
        return None;
    }
    match s.parse::<i64>() {
        Ok(v) if i32::try_from(v).is_ok() => Some(v),
        _ => {
            sink.error(n, format!("{name} {s} is out of range"));
            None
        }
    }
}

/// nNodes/nRanks/numPipeOps: -1 (any) or a count.
fn count(s: &str, name: &str, n: u32, sink: &mut Sink<'_>) -> Option<Interval> {
    match int(s, name, n, sink)? {
        -1 => Some(Interval::ANY),
        v if v >= 0 => Some(Interval::exact(v as u64)),
        v => {
            sink.error(n, format!("{name} must be -1 (any) or a count, got {v}"));
            None
        }
    }
}

/// min/max bytes: an unsigned decimal, or -1 (strtoull reads it as the largest size).
fn bytes(s: &str, name: &str, n: u32, sink: &mut Sink<'_>) -> Option<u64> {
    if s == "-1" {
        if name == "min_bytes" {
            sink.warn(
                n,
                "min_bytes -1 is read as 18446744073709551615, as NCCL's strtoull does: \
                 the rule never matches",
            );
        }
        return Some(u64::MAX);
    }
    let digits = s.strip_prefix('+').unwrap_or(s);
    let lead = digits.bytes().take_while(u8::is_ascii_digit).count();
    if lead == 0 || lead != digits.len() {
        let hint = if lead > 0 && super::parse_size(digits).is_ok() {
            format!(
                " (NCCL would read it as {}; size suffixes are only allowed in TOML)",
                &digits[..lead]
            )
        } else {
            String::new()
        };
        if s.starts_with('-') {
            sink.error(n, format!("{name} {s} is negative"));
        } else {
            sink.error(n, format!("{name} \"{s}\" is not a number{hint}"));
        }
        return None;
    }
    match digits.parse::<u64>() {
        Ok(v) => Some(v),
        Err(_) => {
            sink.error(n, format!("{name} {s} is out of range"));
            None
        }
    }
}

/// Values a bounded interval is expanded into when CSV needs one line per value.
const MAX_EXPANSION: u64 = 64;

fn values(iv: Interval) -> Option<Vec<Option<u64>>> {
    if iv.is_any() {
        Some(vec![None])
    } else if iv.is_empty() {
        Some(Vec::new())
    } else if iv.hi - iv.lo < MAX_EXPANSION {
        Some((iv.lo..=iv.hi).map(Some).collect())
    } else {
        None
    }
}

fn field(v: Option<u64>) -> String {
    v.map_or_else(|| "-1".to_owned(), |v| v.to_string())
}

pub(super) fn write(set: &RuleSet) -> (String, Vec<String>) {
    let mut out = String::from(
        "# NCCL tuner rules (written by cclkit)\n\
         # collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff\n",
    );
    let mut notes = Vec::new();
    for (i, r) in set.rules.iter().enumerate() {
        let which = if r.line > 0 {
            format!("rule from line {}", r.line)
        } else {
            format!("rule {}", i + 1)
        };
        let (Some(algo), Some(proto)) = (r.algorithm, r.protocol) else {
            if r.acts_on_coll_info() {
                notes.push(format!(
                    "{which} left out: CSV needs both an algorithm and a protocol"
                ));
            } else {
                notes.push(format!("{which} left out: it only sets a chunk size"));
            }
            continue;
        };
        if r.chunk_size.is_some() {
            notes.push(format!(
                "{which}: chunk_size dropped (CSV has no such field)"
            ));
        }
        let (Some(nodes), Some(ranks), Some(pipes)) =
            (values(r.nodes), values(r.ranks), values(r.pipe_ops))
        else {
            notes.push(format!(
                "{which} left out: node, rank or numPipeOps range too wide for CSV \
                 (one value or any)"
            ));
            continue;
        };
        if r.bytes.is_empty() {
            notes.push(format!("{which} left out: its size range is empty"));
            continue;
        }
        let max = if r.bytes.hi == u64::MAX {
            "-1".to_owned()
        } else {
            r.bytes.hi.to_string()
        };
        let channels = r
            .channels
            .map_or_else(|| "-1".to_owned(), |c| c.to_string());
        let tail = |p: Option<u64>| -> String {
            match (p, r.reg_buff) {
                (None, None) => String::new(),
                (p, None) => format!(",{}", field(p)),
                (p, Some(b)) => format!(",{},{}", field(p), u8::from(b)),
            }
        };
        for func in r.collectives.iter() {
            for nn in &nodes {
                for nr in &ranks {
                    for np in &pipes {
                        out.push_str(&format!(
                            "{},{},{},{},{},{},{},{}{}\n",
                            names::collective_name(func),
                            r.bytes.lo,
                            max,
                            names::algorithm_name(algo),
                            names::protocol_name(proto),
                            channels,
                            field(*nn),
                            field(*nr),
                            tail(*np),
                        ));
                    }
                }
            }
        }
    }
    if !set.model.is_empty() {
        notes.push("[model] settings dropped (CSV has no such section)".to_owned());
    }
    (out, notes)
}
