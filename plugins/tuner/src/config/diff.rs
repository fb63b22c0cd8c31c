//! Semantic difference of two rule sets: where, in the space of (collective, size,
//! nodes, ranks, numPipeOps, regBuff), they decide differently.
//!
//! The space is cut at every boundary either set mentions, so each cell is decided
//! by one rule (or none) on each side; neighbouring size cells with the same two
//! outcomes are merged. Decisions assume NCCL supports what a rule selects (the
//! plugin would try the next rule otherwise, which depends on the call).

use std::fmt;

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};

use super::names;
use super::{Interval, Query, Rule, RuleSet};

/// What one side decides in a cell.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Selected algorithm.
    pub algorithm: Option<Algorithm>,
    /// Selected protocol.
    pub protocol: Option<Protocol>,
    /// Channel count.
    pub channels: Option<u32>,
    /// Chunk size (from the first chunk rule compatible with the selection).
    pub chunk_size: Option<u64>,
    /// Line of the deciding rule (of the chunk rule when only a chunk size is set).
    pub line: u32,
}

impl PartialEq for Outcome {
    /// Equal when they decide the same; the line does not matter.
    fn eq(&self, o: &Self) -> bool {
        (
            self.algorithm,
            self.protocol,
            self.channels,
            self.chunk_size,
        ) == (o.algorithm, o.protocol, o.channels, o.chunk_size)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self.algorithm.map_or("*", names::algorithm_name);
        let p = self.protocol.map_or("*", names::protocol_name);
        write!(f, "{a}/{p}")?;
        if let Some(c) = self.channels {
            write!(f, " channels={c}")?;
        }
        if let Some(c) = self.chunk_size {
            write!(f, " chunk={}", super::format_size(c))?;
        }
        write!(f, " (line {})", self.line)
    }
}

/// One region decided differently.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// Collective.
    pub collective: Func,
    /// Sizes.
    pub bytes: Interval,
    /// Node counts.
    pub nodes: Interval,
    /// Rank counts.
    pub ranks: Interval,
    /// numPipeOps values.
    pub pipe_ops: Interval,
    /// regBuff (`None`: either).
    pub reg_buff: Option<bool>,
    /// First set's decision (`None`: no rule, NCCL or the model decides).
    pub before: Option<Outcome>,
    /// Second set's decision.
    pub after: Option<Outcome>,
}

/// Counts start at 1, so `1..` is every value.
fn count(iv: Interval) -> Interval {
    if iv.lo <= 1 && iv.hi == u64::MAX {
        Interval::ANY
    } else {
        iv
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} size {} nodes {} ranks {}",
            names::collective_name(self.collective),
            self.bytes.display(true),
            count(self.nodes).display(false),
            count(self.ranks).display(false)
        )?;
        if !count(self.pipe_ops).is_any() {
            write!(f, " pipe_ops {}", self.pipe_ops.display(false))?;
        }
        if let Some(r) = self.reg_buff {
            write!(f, " reg_buff {r}")?;
        }
        let side = |o: &Option<Outcome>| o.map_or_else(|| "no rule".to_owned(), |o| o.to_string());
        write!(f, ": {} -> {}", side(&self.before), side(&self.after))
    }
}

/// Cells along one dimension: cut at every `lo` and `hi + 1` of either set.
fn classes(a: &RuleSet, b: &RuleSet, dim: fn(&Rule) -> Interval, floor: u64) -> Vec<Interval> {
    let mut cuts = vec![floor];
    for r in a.rules.iter().chain(&b.rules) {
        let iv = dim(r);
        if iv.is_empty() {
            continue;
        }
        cuts.push(iv.lo.max(floor));
        if iv.hi < u64::MAX {
            cuts.push((iv.hi + 1).max(floor));
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts.iter()
        .enumerate()
        .map(|(i, &lo)| Interval::new(lo, cuts.get(i + 1).map_or(u64::MAX, |n| n - 1)))
        .collect()
}

fn outcome(rules: &[&Rule], q: &Query) -> Option<Outcome> {
    let main = rules.iter().find(|r| r.acts_on_coll_info() && r.matches(q));
    let (algorithm, protocol) = main.map_or((None, None), |r| (r.algorithm, r.protocol));
    // The chunk rule NCCL would consult after this choice.
    let chunk = rules.iter().find(|r| {
        r.chunk_size.is_some()
            && r.matches(q)
            && r.algorithm.is_none_or(|x| Some(x) == algorithm)
            && r.protocol.is_none_or(|x| Some(x) == protocol)
    });
    if main.is_none() && chunk.is_none() {
        return None;
    }
    Some(Outcome {
        algorithm,
        protocol,
        channels: main.and_then(|r| r.channels),
        chunk_size: chunk.and_then(|r| r.chunk_size),
        line: main.or(chunk).map_or(0, |r| r.line),
    })
}

/// Where `a` and `b` decide differently, by collective, then nodes, ranks, pipe
/// ops, regBuff and size.
pub fn diff(a: &RuleSet, b: &RuleSet) -> Vec<Difference> {
    let nodes = classes(a, b, |r| r.nodes, 1);
    let ranks = classes(a, b, |r| r.ranks, 1);
    let pipes = classes(a, b, |r| r.pipe_ops, 1);
    let regs: Vec<Option<bool>> = if a.rules.iter().chain(&b.rules).any(|r| r.reg_buff.is_some()) {
        vec![Some(false), Some(true)]
    } else {
        vec![None]
    };
    let mut out: Vec<Difference> = Vec::new();
    for func in (0..5).map(Func) {
        let fa: Vec<&Rule> = a
            .rules
            .iter()
            .filter(|r| r.collectives.contains(func))
            .collect();
        let fb: Vec<&Rule> = b
            .rules
            .iter()
            .filter(|r| r.collectives.contains(func))
            .collect();
        if fa.is_empty() && fb.is_empty() {
            continue;
        }
        for nn in &nodes {
            for nr in ranks.iter().filter(|r| r.hi >= nn.lo) {
                let shape = |r: &&&Rule| r.matches_comm(nn.lo, nr.lo);
                let sa: Vec<&Rule> = fa.iter().filter(shape).copied().collect();
                let sb: Vec<&Rule> = fb.iter().filter(shape).copied().collect();
                if sa.is_empty() && sb.is_empty() {
                    continue;
                }
                for np in &pipes {
                    for &reg in &regs {
                        cell_diffs(&sa, &sb, func, *nn, *nr, *np, reg, &mut out);
                    }
                }
            }
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn cell_diffs(
    sa: &[&Rule],
    sb: &[&Rule],
    func: Func,
    nodes: Interval,
    ranks: Interval,
    pipe_ops: Interval,
    reg_buff: Option<bool>,
    out: &mut Vec<Difference>,
) {
    let mut cuts = vec![0u64];
    for r in sa.iter().chain(sb) {
        if r.bytes.is_empty() {
            continue;
        }
        cuts.push(r.bytes.lo);
        if r.bytes.hi < u64::MAX {
            cuts.push(r.bytes.hi + 1);
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut open: Option<Difference> = None;
    for (i, &lo) in cuts.iter().enumerate() {
        let hi = cuts.get(i + 1).map_or(u64::MAX, |n| n - 1);
        let q = Query {
            func,
            n_bytes: lo,
            n_nodes: nodes.lo,
            n_ranks: ranks.lo,
            num_pipe_ops: i32::try_from(pipe_ops.lo).unwrap_or(i32::MAX),
            reg_buff: Some(reg_buff.unwrap_or(false)),
        };
        let (before, after) = (outcome(sa, &q), outcome(sb, &q));
        if before == after {
            out.extend(open.take());
            continue;
        }
        match &mut open {
            Some(d) if d.before == before && d.after == after => d.bytes.hi = hi,
            _ => {
                out.extend(open.take());
                open = Some(Difference {
                    collective: func,
                    bytes: Interval::new(lo, hi),
                    nodes,
                    ranks,
                    pipe_ops,
                    reg_buff,
                    before,
                    after,
                });
            }
        }
    }
    out.extend(open);
}
