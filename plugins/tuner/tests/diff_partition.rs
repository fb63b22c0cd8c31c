//! `config::diff` against a brute-force reference, and its cost counted (not timed).
//!
//! The reference evaluates both rule sets, first match by first match, at every
//! point of the grid cut at every boundary of every rule *and* every reported
//! region: a region that ends inside a cell, overlaps another or carries a wrong
//! decision is caught. The cost tests count the rule visits `diff_with_stats`
//! reports for 1,000 random rules per side and bound them by c·n·log₂n, and the
//! growth from 250 to 1,000 rules by what n log n allows.

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};
use cclkit_tuner::config::{self, CollSet, DiffStats, Difference, Interval, Query, Rule, RuleSet};

/// splitmix64: a fixed seed per case keeps failures reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

/// A range over `pool`: any, exact, closed, open-ended (`a..`) or `..=b`.
fn range(rng: &mut Rng, pool: &[u64], any_percent: u64) -> Interval {
    if rng.percent(any_percent) {
        return Interval::ANY;
    }
    let (x, y) = (rng.pick(pool), rng.pick(pool));
    let (lo, hi) = (x.min(y), x.max(y));
    match rng.below(4) {
        0 => Interval::exact(x),
        1 => Interval::new(lo, hi),
        2 => Interval::new(x, u64::MAX),
        _ => Interval::new(0, x),
    }
}

/// Pools of values rules are cut at, per axis.
struct Pools {
    nodes: Vec<u64>,
    ranks: Vec<u64>,
    pipes: Vec<u64>,
    sizes: Vec<u64>,
}

impl Pools {
    /// Few values per axis: small grids for the reference.
    fn small(rng: &mut Rng) -> Self {
        // Odd sizes, some shared between rules so that boundaries coincide.
        let sizes = (0..6).map(|_| rng.below(1 << 20) | 1).chain([0]).collect();
        Self {
            nodes: vec![1, 2, 3, 4, 8],
            ranks: vec![1, 2, 3, 4, 8, 16],
            pipes: vec![1, 2, 3],
            sizes,
        }
    }
}

fn rule(rng: &mut Rng, p: &Pools, line: u32) -> Rule {
    let mut collectives = CollSet::EMPTY;
    for f in 0..5 {
        if rng.percent(40) {
            collectives.insert(Func(f));
        }
    }
    let maybe = |rng: &mut Rng, pct: u64, v: i32| rng.percent(pct).then_some(v);
    let a = rng.below(3) as i32;
    let pr = rng.below(3) as i32;
    Rule {
        collectives,
        bytes: range(rng, &p.sizes, 10),
        nodes: range(rng, &p.nodes, 60),
        ranks: range(rng, &p.ranks, 60),
        pipe_ops: range(rng, &p.pipes, 75),
        reg_buff: rng.percent(25).then(|| rng.percent(50)),
        algorithm: maybe(rng, 80, a).map(Algorithm),
        protocol: maybe(rng, 75, pr).map(Protocol),
        channels: rng.percent(25).then(|| 1 + rng.below(8) as u32),
        chunk_size: rng.percent(30).then(|| (1 + rng.below(1 << 16)) | 1),
        is_default: false,
        line,
    }
}

fn set(rng: &mut Rng, p: &Pools, n: usize, first_line: u32) -> RuleSet {
    RuleSet {
        rules: (0..n)
            .map(|i| rule(rng, p, first_line + i as u32))
            .collect(),
        ..RuleSet::default()
    }
}

/// Algorithm, protocol, channels and chunk size a side decides (`None`: no rule).
type Decision = Option<(
    Option<Algorithm>,
    Option<Protocol>,
    Option<u32>,
    Option<u64>,
)>;

/// What one side decides at `q`, found from first principles: the first rule that
/// acts on getCollInfo, then the first chunk rule agreeing with its selection.
fn decide(s: &RuleSet, q: &Query) -> Decision {
    let main = s
        .rules
        .iter()
        .find(|r| r.acts_on_coll_info() && r.matches(q));
    let (a, p) = main.map_or((None, None), |r| (r.algorithm, r.protocol));
    let chunk = s.rules.iter().find(|r| {
        r.chunk_size.is_some()
            && r.matches(q)
            && r.algorithm.is_none_or(|x| Some(x) == a)
            && r.protocol.is_none_or(|x| Some(x) == p)
    });
    (main.is_some() || chunk.is_some()).then(|| {
        (
            a,
            p,
            main.and_then(|r| r.channels),
            chunk.and_then(|r| r.chunk_size),
        )
    })
}

fn decision(o: &Option<config::Outcome>) -> Decision {
    o.map(|o| (o.algorithm, o.protocol, o.channels, o.chunk_size))
}

/// Sample points of one axis: every start of a cell of the grid cut at `ivs`.
fn starts(ivs: impl Iterator<Item = Interval>, floor: u64) -> Vec<u64> {
    let mut v = vec![floor];
    for iv in ivs.filter(|iv| !iv.is_empty()) {
        v.extend([iv.lo, iv.hi, iv.hi.saturating_add(1)].map(|x| x.max(floor)));
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Checks `d` against the reference at every point of the joint grid.
fn check_against_reference(a: &RuleSet, b: &RuleSet, d: &[Difference], case: u64) {
    let rules = || a.rules.iter().chain(&b.rules);
    let nodes = starts(rules().map(|r| r.nodes).chain(d.iter().map(|x| x.nodes)), 1);
    let ranks = starts(rules().map(|r| r.ranks).chain(d.iter().map(|x| x.ranks)), 1);
    let pipes = starts(
        rules()
            .map(|r| r.pipe_ops)
            .chain(d.iter().map(|x| x.pipe_ops)),
        1,
    );
    let sizes = starts(rules().map(|r| r.bytes).chain(d.iter().map(|x| x.bytes)), 0);
    let mut checked = 0u64;
    for func in (0..5).map(Func) {
        let here: Vec<&Difference> = d.iter().filter(|x| x.collective == func).collect();
        for &n in &nodes {
            // A communicator has at least as many ranks as nodes.
            for &r in ranks.iter().filter(|&&r| r >= n).chain([&n]) {
                for &p in &pipes {
                    for reg in [false, true] {
                        let shape: Vec<&&Difference> = here
                            .iter()
                            .filter(|x| {
                                x.nodes.contains(n)
                                    && x.ranks.contains(r)
                                    && x.pipe_ops.contains(p)
                                    && x.reg_buff.is_none_or(|v| v == reg)
                            })
                            .collect();
                        for &s in &sizes {
                            let q = Query {
                                func,
                                n_bytes: s,
                                n_nodes: n,
                                n_ranks: r,
                                num_pipe_ops: i32::try_from(p).unwrap_or(i32::MAX),
                                reg_buff: Some(reg),
                            };
                            let (before, after) = (decide(a, &q), decide(b, &q));
                            let hits: Vec<&&&Difference> =
                                shape.iter().filter(|x| x.bytes.contains(s)).collect();
                            let at = format!("case {case}: {q:?}");
                            if before == after {
                                assert!(
                                    hits.is_empty(),
                                    "{at}: same decision but reported {hits:?}"
                                );
                            } else {
                                assert_eq!(
                                    hits.len(),
                                    1,
                                    "{at}: {before:?} -> {after:?}, regions {hits:?}"
                                );
                                assert_eq!(decision(&hits[0].before), before, "{at}");
                                assert_eq!(decision(&hits[0].after), after, "{at}");
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 0);
}

#[test]
fn diff_equals_brute_force_on_random_small_sets() {
    for case in 0..40 {
        let mut rng = Rng(0x5eed_0000 + case);
        let pools = Pools::small(&mut rng);
        let n = 1 + rng.below(6) as usize;
        let a = set(&mut rng, &pools, n, 1);
        // Half the cases compare a set with an edited copy (the usual use).
        let b = if case % 2 == 0 {
            let mut b = a.clone();
            let i = rng.below(b.rules.len() as u64) as usize;
            b.rules[i] = rule(&mut rng, &pools, 100);
            if rng.percent(50) {
                b.rules.insert(0, rule(&mut rng, &pools, 101));
            }
            b
        } else {
            let n = 1 + rng.below(6) as usize;
            set(&mut rng, &pools, n, 100)
        };
        let d = config::diff(&a, &b);
        check_against_reference(&a, &b, &d, case);
        assert!(config::diff(&a, &a).is_empty(), "case {case}");
        // Swapping the sides swaps the decisions and nothing else.
        let swapped: Vec<Difference> = config::diff(&b, &a)
            .into_iter()
            .map(|x| Difference {
                before: x.after,
                after: x.before,
                ..x
            })
            .collect();
        assert_eq!(swapped.len(), d.len(), "case {case}");
        for (x, y) in swapped.iter().zip(&d) {
            assert_eq!(
                (x.collective, x.bytes, x.nodes, x.ranks),
                (y.collective, y.bytes, y.nodes, y.ranks)
            );
            assert_eq!((x.pipe_ops, x.reg_buff), (y.pipe_ops, y.reg_buff));
            assert_eq!(
                (decision(&x.before), decision(&x.after)),
                (decision(&y.before), decision(&y.after))
            );
        }
    }
}

#[test]
fn chunk_rules_and_defaults_against_brute_force() {
    // Chunk-only rules behind selections they may or may not agree with, and
    // `[defaults]`-style catch-alls at the end.
    for case in 0..30 {
        let mut rng = Rng(0xc4_0000 + case);
        let pools = Pools::small(&mut rng);
        let mk = |first: u32, rng: &mut Rng| {
            let n = 2 + rng.below(4) as usize;
            let mut s = set(rng, &pools, n, first);
            for r in &mut s.rules {
                if rng.percent(40) {
                    r.chunk_size = Some((1 + rng.below(1 << 12)) | 1);
                }
            }
            s.rules.push(Rule {
                algorithm: Some(Algorithm(rng.below(3) as i32)),
                protocol: Some(Protocol(rng.below(3) as i32)),
                chunk_size: rng.percent(50).then_some(4097),
                is_default: true,
                line: first + 50,
                ..Rule::any()
            });
            s
        };
        let a = mk(1, &mut rng);
        let b = mk(200, &mut rng);
        check_against_reference(&a, &b, &config::diff(&a, &b), 1000 + case);
    }
}

/// Pools for the cost tests: wide enough that 1,000 rules rarely share a bound.
fn wide(rng: &mut Rng) -> Pools {
    Pools {
        nodes: (1..=64).collect(),
        ranks: (1..=512).collect(),
        pipes: (1..=8).collect(),
        sizes: (0..4096).map(|_| rng.below(1 << 34) | 1).collect(),
    }
}

/// Rule sets of the shapes tuning files have, `n` rules each.
fn family(name: &str, n: usize, seed: u64) -> (RuleSet, RuleSet) {
    let mut rng = Rng(seed);
    let p = wide(&mut rng);
    match name {
        // Independent random rules on every axis.
        "random" => (set(&mut rng, &p, n, 1), set(&mut rng, &p, n, 5000)),
        // Open-ended ranges on size, nodes and ranks (what made the old diff blow up).
        "open" => {
            let mut mk = |first: u32| {
                let mut s = set(&mut rng, &p, n, first);
                for r in &mut s.rules {
                    r.bytes = Interval::new(rng.pick(&p.sizes), u64::MAX);
                    r.nodes = Interval::new(rng.pick(&p.nodes), u64::MAX);
                    r.ranks = Interval::new(rng.pick(&p.ranks), u64::MAX);
                }
                s
            };
            (mk(1), mk(5000))
        }
        // A sorted file of size buckets per node count, and an edited copy.
        "edited" => {
            let mut a = set(&mut rng, &p, n, 1);
            let mut sizes: Vec<u64> = (0..n).map(|_| rng.below(1 << 34) | 1).collect();
            sizes.sort_unstable();
            for (i, r) in a.rules.iter_mut().enumerate() {
                let hi = sizes.get(i + 1).map_or(u64::MAX, |s| s - 1);
                r.bytes = Interval::new(sizes[i], hi.max(sizes[i]));
                r.nodes = Interval::exact(1 + (i % 4) as u64);
            }
            let mut b = a.clone();
            for _ in 0..n / 20 {
                let i = rng.below(n as u64) as usize;
                b.rules[i].algorithm = Some(Algorithm(rng.below(3) as i32));
                b.rules[i].line += 10_000;
            }
            (a, b)
        }
        _ => unreachable!(),
    }
}

/// Rule visits of one diff and the regions it reported.
fn cost(name: &str, n: usize) -> (DiffStats, usize) {
    let (a, b) = family(name, n, 0xc057 + n as u64);
    let (d, stats) = config::diff_with_stats(&a, &b);
    assert!(!stats.truncated, "{name} {n}: truncated");
    assert!(!d.is_empty(), "{name} {n}: the sets should differ");
    (stats, d.len())
}

/// Visits per (rule + region) per level of a tree over the rules.
fn per_unit(stats: &DiffStats, n: usize, regions: usize) -> f64 {
    let n = 2.0 * n as f64;
    stats.rule_visits as f64 / ((n + regions as f64) * n.log2())
}

#[test]
fn diff_cost_is_near_linear_for_1000_rules_per_side() {
    // The work cannot be below the regions reported (two unrelated random files
    // differ in ~10^5 places), so the bound is c·(rules + regions)·log₂(rules).
    // Measured c: 1 (edited copy) to 24 (independent random); the old grid scan visited
    // ~10^13 rules here, a quadratic walk would give c in the hundreds.
    for name in ["random", "open", "edited"] {
        let (small, rs) = cost(name, 250);
        let (big, rb) = cost(name, 1000);
        let (cs, cb) = (per_unit(&small, 250, rs), per_unit(&big, 1000, rb));
        eprintln!(
            "{name}: 250 rules {small:?} {rs} regions; 1000 rules {big:?} {rb} regions; c {cs:.1} -> {cb:.1}"
        );
        assert!(
            cb < 40.0,
            "{name}: c = {cb:.1} for 1,000 rules per side ({big:?}, {rb} regions)"
        );
        // 4x the rules must not multiply the per-unit cost (quadratic would 4x it).
        assert!(
            cb < 2.5 * cs.max(1.0),
            "{name}: c grew {cs:.1} -> {cb:.1} from 250 to 1,000 rules"
        );
    }
}

#[test]
fn identical_sets_cost_one_box() {
    let (a, _) = family("random", 1000, 7);
    let (d, stats) = config::diff_with_stats(&a, &a);
    assert!(d.is_empty());
    // One box per collective any rule names: equal rule lists end the walk at once.
    assert!(stats.boxes <= 5, "{stats:?}");
}
