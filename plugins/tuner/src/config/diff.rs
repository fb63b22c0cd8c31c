//! Semantic difference of two rule sets: where, in the space of (collective, size,
//! nodes, ranks, numPipeOps, regBuff), they decide differently.
//!
//! The space is cut only where either side's decision changes (see `partition`),
//! so each region is decided by one rule (or none) on each side; neighbouring
//! regions with the same two outcomes are then joined. Decisions assume NCCL
//! supports what a rule selects (the plugin would try the next rule otherwise,
//! which depends on the call).

use std::fmt;

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};

use super::partition;
use super::{Interval, RuleSet, names};

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

/// What one diff cost, for tests and `cclkit tune`: the work is counted, not timed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiffStats {
    /// Boxes of the space partition visited.
    pub boxes: u64,
    /// Rules looked at, summed over the boxes (each box looks at its rules a fixed
    /// number of times).
    pub rule_visits: u64,
    /// Whether the diff stopped at its work or region limit
    /// ([`MAX_DIFF_RULE_VISITS`], [`MAX_DIFF_REGIONS`]): the regions are then only
    /// part of the answer.
    pub truncated: bool,
}

/// Most rule visits one diff spends before it stops, truncated.
pub const MAX_DIFF_RULE_VISITS: u64 = partition::MAX_RULE_VISITS;

/// Most regions one diff reports before it stops, truncated.
pub const MAX_DIFF_REGIONS: usize = partition::MAX_REGIONS;

/// Where `a` and `b` decide differently, ordered by collective, then nodes, ranks,
/// pipe ops, regBuff and size. Regions are disjoint; a region with `reg_buff:
/// None` holds for both values. See [`diff_with_stats`] for the cost and whether
/// the limits cut the answer short.
pub fn diff(a: &RuleSet, b: &RuleSet) -> Vec<Difference> {
    diff_with_stats(a, b).0
}

/// [`diff()`] with what it cost.
pub fn diff_with_stats(a: &RuleSet, b: &RuleSet) -> (Vec<Difference>, DiffStats) {
    let mut stats = DiffStats::default();
    let mut out = Vec::new();
    for func in (0..5).map(Func) {
        partition::regions(a, b, func, &mut stats, &mut out);
    }
    (join(out), stats)
}

/// The axes of a region, in output order (regBuff `None` is 0..=1).
fn axes(d: &Difference) -> [Interval; 5] {
    let reg = match d.reg_buff {
        None => Interval::new(0, 1),
        Some(b) => Interval::exact(u64::from(b)),
    };
    [d.nodes, d.ranks, d.pipe_ops, reg, d.bytes]
}

fn set_axis(d: &mut Difference, axis: usize, iv: Interval) {
    match axis {
        0 => d.nodes = iv,
        1 => d.ranks = iv,
        2 => d.pipe_ops = iv,
        3 => d.reg_buff = partition::reg_of(iv),
        _ => d.bytes = iv,
    }
}

type Decision = Option<(
    Option<Algorithm>,
    Option<Protocol>,
    Option<u32>,
    Option<u64>,
)>;

fn decision(o: &Option<Outcome>) -> Decision {
    o.map(|o| (o.algorithm, o.protocol, o.channels, o.chunk_size))
}

/// Sort key: collective, decisions, every axis but `axis`, then `axis`, so that
/// regions that can be joined along `axis` end up next to each other.
fn along(d: &Difference, axis: usize) -> (Func, Decision, Decision, [(u64, u64); 5]) {
    let a = axes(d);
    let mut k = [(0, 0); 5];
    let others = (0..5).filter(|&i| i != axis).chain([axis]);
    for (slot, i) in k.iter_mut().zip(others) {
        *slot = (a[i].lo, a[i].hi);
    }
    (d.collective, decision(&d.before), decision(&d.after), k)
}

/// Joins neighbouring regions with the same two decisions, along size first, then
/// the other axes, twice (each pass is a sort, O(k log k)); the result is in output
/// order.
fn join(mut v: Vec<Difference>) -> Vec<Difference> {
    // Two rounds take random rule sets within 1% of a fixed point (measured on
    // the families of tests/diff_partition.rs); more cost a sort each for little.
    for _ in 0..2 {
        let before = v.len();
        for axis in [4, 0, 1, 2, 3] {
            v.sort_by_cached_key(|d| along(d, axis));
            let mut out: Vec<Difference> = Vec::with_capacity(v.len());
            for d in v {
                if let Some(last) = out.last_mut() {
                    let (l, n) = (axes(last), axes(&d));
                    let joinable = last.collective == d.collective
                        && decision(&last.before) == decision(&d.before)
                        && decision(&last.after) == decision(&d.after)
                        && (0..5).all(|i| i == axis || l[i] == n[i])
                        && l[axis].hi != u64::MAX
                        && l[axis].hi + 1 == n[axis].lo;
                    if joinable {
                        set_axis(last, axis, Interval::new(l[axis].lo, n[axis].hi));
                        continue;
                    }
                }
                out.push(d);
            }
            v = out;
        }
        if v.len() == before {
            break;
        }
    }
    v.sort_by_key(|d| (d.collective, axes(d).map(|i| i.lo)));
    v
}
