//! The per-communicator decision engine: rules compiled for one communicator shape,
//! indexed by collective and size, plus the model. Built at init; `decide` and
//! `chunk_size` neither allocate, lock nor read the environment.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use cclkit_abi::raw::common::{Algorithm, Func, Protocol};
use cclkit_abi::tuner::{CollInfo, CostTable};

use crate::config::{Rule, RuleSet, pipe_ops_key};
use crate::model::Model;

/// How the tuner decides (`CCLKIT_TUNER_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Rules only; a call no rule takes is left to NCCL.
    Rules,
    /// The model only.
    Model,
    /// Rules first, the model for calls no rule takes (default).
    Auto,
}

impl Mode {
    /// Parses `rules`, `model` or `auto` (any case).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "rules" => Ok(Self::Rules),
            "model" => Ok(Self::Model),
            "auto" => Ok(Self::Auto),
            _ => Err(format!(
                "unknown mode \"{s}\" (expected rules, model or auto)"
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Rules => "rules",
            Self::Model => "model",
            Self::Auto => "auto",
        })
    }
}

/// What `decide` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A rule was taken.
    Rule {
        /// Its line in the file (0 if built in code).
        line: u32,
    },
    /// The model ranked the table.
    Model,
    /// Nothing was changed: NCCL's own choice stands.
    Unchanged,
}

/// A rule compiled for the hot path (communicator conditions already checked).
#[derive(Debug)]
struct Compiled {
    bytes_lo: u64,
    bytes_hi: u64,
    pipe_lo: u64,
    pipe_hi: u64,
    /// -1 any, 0/1 required regBuff.
    reg: i8,
    algo: Option<Algorithm>,
    proto: Option<Protocol>,
    /// 0 = keep NCCL's.
    channels: i32,
    /// 0 = none.
    chunk: u64,
    line: u32,
    /// Times the conditions held.
    matched: AtomicU64,
    /// Times the rule was taken (its entry was supported).
    taken: AtomicU64,
}

/// Counters are bumped with a relaxed load + store: exact when one thread uses the
/// communicator (NCCL's case), approximate under concurrent calls, never a lock.
#[inline]
fn bump(c: &AtomicU64) {
    c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
}

impl Compiled {
    #[inline]
    fn matches(&self, n_bytes: u64, pipe: u64, reg: Option<bool>) -> bool {
        self.bytes_lo <= n_bytes
            && n_bytes <= self.bytes_hi
            && self.pipe_lo <= pipe
            && pipe <= self.pipe_hi
            && match (self.reg, reg) {
                (-1, _) => true,
                (want, Some(got)) => (want == 1) == got,
                (_, None) => false,
            }
    }
}

/// Most candidate entries an index may hold before it falls back to a linear list
/// (only pathological, heavily nested size ranges get there).
const MAX_INDEX_ENTRIES: usize = 1 << 20;

/// Rule indices of one collective, by size segment.
#[derive(Debug, Default)]
struct SegIndex {
    /// Segment start sizes, ascending, `starts[0] == 0`; empty = linear mode.
    starts: Box<[u64]>,
    /// `cands[offsets[s]..offsets[s + 1]]` are segment `s`'s rules in order.
    offsets: Box<[u32]>,
    /// Rule indices (into `Engine::rules`).
    cands: Box<[u32]>,
}

impl SegIndex {
    fn build(rules: &[Compiled], members: &[u32]) -> Self {
        let mut bounds: Vec<u64> = vec![0];
        for &i in members {
            let r = &rules[i as usize];
            bounds.push(r.bytes_lo);
            if r.bytes_hi < u64::MAX {
                bounds.push(r.bytes_hi + 1);
            }
        }
        bounds.sort_unstable();
        bounds.dedup();
        let seg = |v: u64| bounds.partition_point(|b| *b <= v) - 1;
        let total: usize = members
            .iter()
            .map(|&i| {
                let r = &rules[i as usize];
                seg(r.bytes_hi) + 1 - seg(r.bytes_lo)
            })
            .sum();
        if total > MAX_INDEX_ENTRIES {
            return Self {
                starts: Box::new([]),
                offsets: Box::new([0, members.len() as u32]),
                cands: members.into(),
            };
        }
        let mut per_seg: Vec<Vec<u32>> = vec![Vec::new(); bounds.len()];
        for &i in members {
            let r = &rules[i as usize];
            for list in &mut per_seg[seg(r.bytes_lo)..=seg(r.bytes_hi)] {
                list.push(i);
            }
        }
        // Merge neighbouring segments with the same rules (sorted files give few).
        let mut starts = Vec::new();
        let mut offsets = vec![0u32];
        let mut cands: Vec<u32> = Vec::new();
        let mut last: Option<&Vec<u32>> = None;
        for (s, list) in per_seg.iter().enumerate() {
            if last == Some(list) {
                continue;
            }
            starts.push(bounds[s]);
            cands.extend_from_slice(list);
            offsets.push(cands.len() as u32);
            last = Some(list);
        }
        Self {
            starts: starts.into(),
            offsets: offsets.into(),
            cands: cands.into(),
        }
    }

    #[inline]
    fn candidates(&self, n_bytes: u64) -> &[u32] {
        let s = if self.starts.is_empty() {
            0
        } else {
            self.starts.partition_point(|b| *b <= n_bytes) - 1
        };
        match (self.offsets.get(s), self.offsets.get(s + 1)) {
            (Some(&a), Some(&b)) => self.cands.get(a as usize..b as usize).unwrap_or(&[]),
            _ => &[],
        }
    }

    fn entries(&self) -> usize {
        self.cands.len()
    }
}

/// One communicator's compiled rules and model.
#[derive(Debug)]
pub struct Engine {
    mode: Mode,
    rules: Box<[Compiled]>,
    coll: [SegIndex; 5],
    chunk: [SegIndex; 5],
    model: Option<Model>,
    model_calls: AtomicU64,
    unchanged_calls: AtomicU64,
}

/// Per-rule counters for the finalize report and `cclkit tune`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleStats {
    /// The rule's line.
    pub line: u32,
    /// Times its conditions held.
    pub matched: u64,
    /// Times it was taken.
    pub taken: u64,
}

impl Engine {
    /// Compiles `set` for a communicator of `n_ranks` ranks on `n_nodes` nodes.
    /// `model` is used in `Model` and `Auto` modes (and ignored in `Rules`); in
    /// `Model` mode the rules are ignored.
    pub fn new(
        set: &RuleSet,
        n_ranks: usize,
        n_nodes: usize,
        mode: Mode,
        model: Option<Model>,
    ) -> Self {
        let keep: Vec<&Rule> = if mode == Mode::Model {
            Vec::new()
        } else {
            set.rules
                .iter()
                .filter(|r| r.matches_comm(n_nodes as u64, n_ranks as u64))
                .filter(|r| !r.collectives.is_empty() && !r.bytes.is_empty())
                .collect()
        };
        let rules: Box<[Compiled]> = keep
            .iter()
            .map(|r| Compiled {
                bytes_lo: r.bytes.lo,
                bytes_hi: r.bytes.hi,
                pipe_lo: r.pipe_ops.lo,
                pipe_hi: r.pipe_ops.hi,
                reg: r.reg_buff.map_or(-1, i8::from),
                algo: r.algorithm,
                proto: r.protocol,
                channels: r
                    .channels
                    .map_or(0, |c| i32::try_from(c).unwrap_or(i32::MAX)),
                chunk: r.chunk_size.unwrap_or(0),
                line: r.line,
                matched: AtomicU64::new(0),
                taken: AtomicU64::new(0),
            })
            .collect();
        let index = |f: i32, want: &dyn Fn(&Rule) -> bool| {
            let members: Vec<u32> = keep
                .iter()
                .enumerate()
                .filter(|(_, r)| r.collectives.contains(Func(f)) && want(r))
                .map(|(i, _)| i as u32)
                .collect();
            SegIndex::build(&rules, &members)
        };
        let coll = std::array::from_fn(|f| index(f as i32, &Rule::acts_on_coll_info));
        let chunk = std::array::from_fn(|f| index(f as i32, &|r: &Rule| r.chunk_size.is_some()));
        let model = if mode == Mode::Rules { None } else { model };
        Self {
            mode,
            rules,
            coll,
            chunk,
            model,
            model_calls: AtomicU64::new(0),
            unchanged_calls: AtomicU64::new(0),
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Rules that apply to this communicator.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Candidate entries held by the size indexes (a measure of index size).
    pub fn index_entries(&self) -> usize {
        self.coll
            .iter()
            .chain(&self.chunk)
            .map(SegIndex::entries)
            .sum()
    }

    /// The model, when the mode uses one.
    pub fn model(&self) -> Option<&Model> {
        self.model.as_ref()
    }

    /// Adjusts `table` and `n_channels` for one call (see the README for the rules):
    /// the first rule whose conditions hold and whose choice NCCL supports is taken;
    /// otherwise the model ranks the table (`Auto`/`Model`); otherwise nothing
    /// changes. `n_channels` is only written by a taken rule with a channel count.
    pub fn decide(
        &self,
        info: &CollInfo,
        table: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Decision {
        let n = info.n_bytes as u64;
        let pipe = pipe_ops_key(info.num_pipe_ops);
        let mut modelled = false;
        if let Some(index) = usize::try_from(info.func.0)
            .ok()
            .and_then(|f| self.coll.get(f))
        {
            for &i in index.candidates(n) {
                let Some(r) = self.rules.get(i as usize) else {
                    continue;
                };
                if !r.matches(n, pipe, info.reg_buff) {
                    continue;
                }
                bump(&r.matched);
                let taken = match (r.algo, r.proto) {
                    (Some(a), Some(p)) => table.prefer(a, p),
                    (a, p) => {
                        if !modelled && let Some(m) = &self.model {
                            m.apply(info, table);
                            modelled = true;
                        }
                        if a.is_none() && p.is_none() {
                            true
                        } else {
                            prefer_cheapest(table, a, p)
                        }
                    }
                };
                if taken {
                    if r.channels > 0 {
                        *n_channels = r.channels;
                    }
                    bump(&r.taken);
                    return Decision::Rule { line: r.line };
                }
            }
        }
        match &self.model {
            Some(m) if modelled || m.apply(info, table) => {
                bump(&self.model_calls);
                Decision::Model
            }
            _ => {
                bump(&self.unchanged_calls);
                Decision::Unchanged
            }
        }
    }

    /// The chunk size of the first chunk rule holding for `(func, n_bytes)` whose
    /// algorithm/protocol (when given) are the ones NCCL chose; `None` leaves NCCL's.
    pub fn chunk_size(
        &self,
        func: Func,
        n_bytes: usize,
        algo: Algorithm,
        proto: Protocol,
    ) -> Option<(u64, u32)> {
        let index = self.chunk.get(usize::try_from(func.0).ok()?)?;
        let n = n_bytes as u64;
        index.candidates(n).iter().find_map(|&i| {
            let r = self.rules.get(i as usize)?;
            (r.bytes_lo <= n
                && n <= r.bytes_hi
                && r.algo.is_none_or(|a| a == algo)
                && r.proto.is_none_or(|p| p == proto))
            .then_some((r.chunk, r.line))
        })
    }

    /// Per-rule counters, in rule order.
    pub fn rule_stats(&self) -> impl Iterator<Item = RuleStats> + '_ {
        self.rules.iter().map(|r| RuleStats {
            line: r.line,
            matched: r.matched.load(Relaxed),
            taken: r.taken.load(Relaxed),
        })
    }

    /// Calls decided by the model, and calls left unchanged.
    pub fn fallback_stats(&self) -> (u64, u64) {
        (
            self.model_calls.load(Relaxed),
            self.unchanged_calls.load(Relaxed),
        )
    }
}

/// Selects the cheapest supported entry with algorithm `a` (or protocol `p`).
fn prefer_cheapest(table: &mut CostTable<'_>, a: Option<Algorithm>, p: Option<Protocol>) -> bool {
    let best = table
        .supported()
        .filter(|(ea, ep, _)| a.is_none_or(|a| a == *ea) && p.is_none_or(|p| p == *ep))
        .fold(
            None,
            |best: Option<(Algorithm, Protocol, f32)>, e| match best {
                Some(b) if b.2 <= e.2 => Some(b),
                _ => Some(e),
            },
        );
    match best {
        Some((ba, bp, _)) => table.prefer(ba, bp),
        None => false,
    }
}
