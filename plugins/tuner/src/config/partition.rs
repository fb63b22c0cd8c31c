//! The space partition behind [`super::diff()`].
//!
//! The space (nodes × ranks × numPipeOps × regBuff × size) of one collective is cut
//! recursively, k-d tree style, only where it matters: a box is split while either
//! side's decision varies inside it, at the median boundary (of the rules still
//! alive in the box) along the axis that leaves the smaller child list. In each box
//! every rule shadowed by an earlier rule covering the whole box is dropped, and a
//! box where both sides hold the same rules (lines aside) is done at once. Rule sets
//! whose rules are local along some axis (sorted size buckets, a few node counts)
//! then cost O(n log n) rule visits instead of one scan of every rule per cell of the
//! full grid of boundaries (which grows as n⁵). The work is still at least the
//! number of regions printed, which two unrelated files can make quadratic: a budget
//! stops such a diff (reported as truncated) instead of letting it run for hours.

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};

use super::diff::{DiffStats, Difference, Outcome};
use super::{Interval, Rule, RuleSet};

const NODES: usize = 0;
const RANKS: usize = 1;
const PIPES: usize = 2;
/// regBuff as 0 (false) or 1 (true).
const REG: usize = 3;
const BYTES: usize = 4;
const DIMS: usize = 5;

type Space = [Interval; DIMS];

/// The whole space: counts start at 1 (NCCL never asks about an empty communicator
/// or zero pipelined operations), sizes at 0.
const SPACE: Space = [
    Interval::new(1, u64::MAX),
    Interval::new(1, u64::MAX),
    Interval::new(1, u64::MAX),
    Interval::new(0, 1),
    Interval::ANY,
];

/// Most rule visits one diff may spend (a few seconds): far above the n log n of
/// any real pair of files at the 1 MiB file limit, far below a quadratic blow-up.
pub(super) const MAX_RULE_VISITS: u64 = 1 << 27;

/// Most regions one diff reports.
pub(super) const MAX_REGIONS: usize = 1 << 20;

/// A rule of one collective with its conditions clipped to [`SPACE`].
struct Cond<'r> {
    iv: Space,
    rule: &'r Rule,
}

impl Cond<'_> {
    fn covers(&self, bx: &Space) -> bool {
        self.iv
            .iter()
            .zip(bx)
            .all(|(c, b)| c.lo <= b.lo && b.hi <= c.hi)
    }

    fn main(&self) -> bool {
        self.rule.acts_on_coll_info()
    }

    fn chunk(&self) -> bool {
        self.rule.chunk_size.is_some()
    }

    /// Whether a chunk rule applies after this selection (NCCL_ABI.md §4.5: the chunk
    /// rule must agree with the algorithm and protocol chosen).
    fn compatible(&self, algorithm: Option<Algorithm>, protocol: Option<Protocol>) -> bool {
        self.rule.algorithm.is_none_or(|x| Some(x) == algorithm)
            && self.rule.protocol.is_none_or(|x| Some(x) == protocol)
    }

    /// Same conditions (inside `bx`) and same actions; the line does not matter.
    fn same_as(&self, o: &Cond<'_>, bx: &Space) -> bool {
        let (r, s) = (self.rule, o.rule);
        (r.algorithm, r.protocol, r.channels, r.chunk_size)
            == (s.algorithm, s.protocol, s.channels, s.chunk_size)
            && (0..DIMS).all(|d| self.iv[d].intersect(&bx[d]) == o.iv[d].intersect(&bx[d]))
    }
}

fn conds(set: &RuleSet, func: Func) -> Vec<Cond<'_>> {
    set.rules
        .iter()
        .filter(|r| r.collectives.contains(func))
        .filter(|r| r.acts_on_coll_info() || r.chunk_size.is_some())
        .filter_map(|rule| {
            let reg = match rule.reg_buff {
                None => Interval::new(0, 1),
                Some(b) => Interval::exact(u64::from(b)),
            };
            let raw = [rule.nodes, rule.ranks, rule.pipe_ops, reg, rule.bytes];
            let iv: Space = std::array::from_fn(|d| raw[d].intersect(&SPACE[d]));
            iv.iter()
                .all(|i| !i.is_empty())
                .then_some(Cond { iv, rule })
        })
        .collect()
}

/// Drops the rules of `list` that cannot decide anything in `bx`: main rules after
/// the first main rule covering `bx`, chunk rules after the first covering chunk rule
/// that every possible selection in `bx` agrees with.
fn prune(conds: &[Cond<'_>], bx: &Space, list: Vec<u32>) -> Vec<u32> {
    let at = |i: u32| &conds[i as usize];
    let last_main = list.iter().position(|&i| at(i).main() && at(i).covers(bx));
    // What every possible selection in the box shares ("no main rule" selects
    // neither algorithm nor protocol).
    let possible = || {
        list[..last_main.map_or(list.len(), |p| p + 1)]
            .iter()
            .filter(|&&i| at(i).main())
            .map(|&i| (at(i).rule.algorithm, at(i).rule.protocol))
            .chain(last_main.is_none().then_some((None, None)))
    };
    let algo = shared(possible().map(|p| p.0));
    let proto = shared(possible().map(|p| p.1));
    let last_chunk = list.iter().position(|&i| {
        let c = at(i);
        c.chunk()
            && c.covers(bx)
            && c.rule.algorithm.is_none_or(|x| algo == Some(Some(x)))
            && c.rule.protocol.is_none_or(|x| proto == Some(Some(x)))
    });
    list.iter()
        .enumerate()
        .filter(|&(p, &i)| {
            (at(i).main() && last_main.is_none_or(|m| p <= m))
                || (at(i).chunk() && last_chunk.is_none_or(|c| p <= c))
        })
        .map(|(_, &i)| i)
        .collect()
}

/// The one value every item has, if they agree.
fn shared<T: PartialEq + Copy>(mut it: impl Iterator<Item = T>) -> Option<T> {
    let first = it.next()?;
    it.all(|x| x == first).then_some(first)
}

/// The decision of one side when it is the same everywhere in `bx`.
fn constant(conds: &[Cond<'_>], list: &[u32], bx: &Space) -> Option<Option<Outcome>> {
    let mut rules = list.iter().map(|&i| &conds[i as usize]);
    let main = rules.clone().find(|c| c.main());
    if main.is_some_and(|m| !m.covers(bx)) {
        return None;
    }
    let (algorithm, protocol) = main.map_or((None, None), |m| (m.rule.algorithm, m.rule.protocol));
    let chunk = rules.find(|c| c.chunk() && c.compatible(algorithm, protocol));
    if chunk.is_some_and(|c| !c.covers(bx)) {
        return None;
    }
    if main.is_none() && chunk.is_none() {
        return Some(None);
    }
    Some(Some(Outcome {
        algorithm,
        protocol,
        channels: main.and_then(|m| m.rule.channels),
        chunk_size: chunk.and_then(|c| c.rule.chunk_size),
        line: main.or(chunk).map_or(0, |c| c.rule.line),
    }))
}

/// One collective's walk.
struct Walk<'r, 's> {
    func: Func,
    a: Vec<Cond<'r>>,
    b: Vec<Cond<'r>>,
    stats: &'s mut DiffStats,
    out: &'s mut Vec<Difference>,
}

/// What a box turned out to be, so that a parent whose halves agree reports one
/// region instead of two (a cut that changed nothing is undone).
#[derive(Clone, Copy)]
enum Summary {
    /// Holds no communicator (fewer ranks than nodes): agrees with anything.
    Empty,
    /// Both sides decide alike everywhere.
    Same,
    /// One pair of decisions everywhere, not reported yet.
    Differ(Option<Outcome>, Option<Outcome>),
    /// Reported already (or cut short by the limits).
    Mixed,
}

impl Walk<'_, '_> {
    fn visit(&mut self, bx: Space, la: Vec<u32>, lb: Vec<u32>) -> Summary {
        if self.stats.truncated {
            return Summary::Mixed;
        }
        self.stats.boxes += 1;
        self.stats.rule_visits += (la.len() + lb.len()) as u64;
        if self.stats.rule_visits > MAX_RULE_VISITS || self.out.len() >= MAX_REGIONS {
            self.stats.truncated = true;
            return Summary::Mixed;
        }
        // No communicator has fewer ranks than nodes.
        if bx[RANKS].hi < bx[NODES].lo {
            return Summary::Empty;
        }
        let la = prune(&self.a, &bx, la);
        let lb = prune(&self.b, &bx, lb);
        let same = la.len() == lb.len()
            && la
                .iter()
                .zip(&lb)
                .all(|(&x, &y)| self.a[x as usize].same_as(&self.b[y as usize], &bx));
        if same {
            return Summary::Same;
        }
        if let (Some(before), Some(after)) =
            (constant(&self.a, &la, &bx), constant(&self.b, &lb, &bx))
        {
            return if before == after {
                Summary::Same
            } else {
                Summary::Differ(before, after)
            };
        }
        // A decision that varies has a boundary inside the box, so a cut exists.
        let Some((d, cut)) = self.split(&bx, &la, &lb) else {
            return Summary::Mixed;
        };
        let mut left = bx;
        left[d].hi = cut - 1;
        let mut right = bx;
        right[d].lo = cut;
        let keep = |conds: &[Cond<'_>], list: &[u32], half: &Space| -> Vec<u32> {
            list.iter()
                .copied()
                .filter(|&i| {
                    let iv = conds[i as usize].iv[d];
                    iv.lo <= half[d].hi && half[d].lo <= iv.hi
                })
                .collect()
        };
        let (al, bl) = (keep(&self.a, &la, &left), keep(&self.b, &lb, &left));
        let (ar, br) = (keep(&self.a, &la, &right), keep(&self.b, &lb, &right));
        drop((la, lb));
        let l = self.visit(left, al, bl);
        let r = self.visit(right, ar, br);
        match (l, r) {
            (Summary::Empty, x) | (x, Summary::Empty) => x,
            (Summary::Same, Summary::Same) => Summary::Same,
            (Summary::Differ(b1, a1), Summary::Differ(b2, a2)) if b1 == b2 && a1 == a2 => {
                Summary::Differ(b1, a1)
            }
            (l, r) => {
                self.report(&left, l);
                self.report(&right, r);
                Summary::Mixed
            }
        }
    }

    /// Reports a box whose summary is not going to be merged into its parent's.
    fn report(&mut self, bx: &Space, s: Summary) {
        if let Summary::Differ(before, after) = s {
            self.emit(bx, before, after);
        }
    }

    /// The axis and cut (first value of the right half) whose larger half holds the
    /// fewest rules: the median of the rule boundaries strictly inside the box.
    fn split(&self, bx: &Space, la: &[u32], lb: &[u32]) -> Option<(usize, u64)> {
        let all = || {
            la.iter()
                .map(|&i| &self.a[i as usize])
                .chain(lb.iter().map(|&i| &self.b[i as usize]))
        };
        let mut best: Option<((usize, usize), usize, u64)> = None;
        let mut cuts = Vec::with_capacity(2 * (la.len() + lb.len()));
        for (d, side) in bx.iter().enumerate() {
            cuts.clear();
            for c in all() {
                if c.iv[d].lo > side.lo {
                    cuts.push(c.iv[d].lo);
                }
                if c.iv[d].hi < side.hi {
                    cuts.push(c.iv[d].hi + 1);
                }
            }
            if cuts.is_empty() {
                continue;
            }
            let mid = cuts.len() / 2;
            let (_, &mut cut, _) = cuts.select_nth_unstable(mid);
            let left = all().filter(|c| c.iv[d].lo < cut).count();
            let right = all().filter(|c| c.iv[d].hi >= cut).count();
            let score = (left.max(right), left + right);
            if best.is_none_or(|(s, _, _)| score < s) {
                best = Some((score, d, cut));
            }
        }
        best.map(|(_, d, cut)| (d, cut))
    }

    fn emit(&mut self, bx: &Space, before: Option<Outcome>, after: Option<Outcome>) {
        self.out.push(Difference {
            collective: self.func,
            bytes: bx[BYTES],
            nodes: bx[NODES],
            ranks: bx[RANKS],
            pipe_ops: bx[PIPES],
            reg_buff: reg_of(bx[REG]),
            before,
            after,
        });
    }
}

/// regBuff of a box: both values are `None` (either).
pub(super) fn reg_of(iv: Interval) -> Option<bool> {
    (iv.lo == iv.hi).then_some(iv.lo == 1)
}

/// Appends the regions of `func` where `a` and `b` decide differently, unmerged.
pub(super) fn regions(
    a: &RuleSet,
    b: &RuleSet,
    func: Func,
    stats: &mut DiffStats,
    out: &mut Vec<Difference>,
) {
    let (ca, cb) = (conds(a, func), conds(b, func));
    if ca.is_empty() && cb.is_empty() {
        return;
    }
    let la: Vec<u32> = (0..ca.len() as u32).collect();
    let lb: Vec<u32> = (0..cb.len() as u32).collect();
    let mut walk = Walk {
        func,
        a: ca,
        b: cb,
        stats,
        out,
    };
    let whole = walk.visit(SPACE, la, lb);
    walk.report(&SPACE, whole);
}
