//! Running a group: every collective decided first, then either the previous
//! group's steps rerun (same keys, see [`StepKey`]) or a plan per collective, a
//! batch per run of collectives with one protocol.

use std::sync::atomic::{AtomicU64, Ordering};

use cclkit_abi::raw::common::{Algorithm, Func, RedOp};
use cclkit_host::profiler::EventHandle;

use super::pat;
use super::{CollGroup, Decisions, Desc, Few, elem};
use crate::comm::{Comm, StepCache, StepKey};
use crate::error::{Error, Result};
use crate::op::OpRef;
use crate::profile::{CollInfo, GroupEvents};
use crate::schedule::{self, Cut, Plan};
use crate::tune::{Decision, PatKind, pat_limit};

/// Collective groups that reran the steps of the group before them (process-wide),
/// for tests and benchmarks that check the plan cache: see [`step_reuses`].
static STEP_REUSES: AtomicU64 = AtomicU64::new(0);

/// How many collective groups of this process reran the previous group's steps
/// instead of planning (same collectives, sizes, types, ops, roots and decisions;
/// any buffers).
pub fn step_reuses() -> u64 {
    STEP_REUSES.load(Ordering::Relaxed)
}

impl CollGroup<'_, '_> {
    /// Runs the group; returns the decision each collective ran with (p2p-based ones
    /// report Ring/Simple).
    pub fn run(self) -> Result<Decisions> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let comm = self.comm;
        // Profiler: the group's API events now, each Coll once it is planned.
        let mut prof = comm
            .profile()
            .ctx()
            .map(|c| GroupEvents::begin(c, comm.rank()));
        if let Some(g) = prof.as_mut() {
            for d in &self.ops {
                g.coll_api(d.func, d.bytes / elem(d.dtype)?, d.dtype, d.root);
            }
            g.enqueue();
        }
        // Every collective is decided once, in order, before any runs (a tuner
        // plugin sees each call once, as under NCCL).
        let mut decisions = Few::default();
        for d in &self.ops {
            decisions.push(if is_p2p(d.func) {
                P2P_DECISION
            } else {
                let tuned = match d.func {
                    Func::ALL_GATHER | Func::REDUCE_SCATTER => d.bytes * comm.nranks(),
                    _ => d.bytes,
                };
                comm.tuning()
                    .decide(d.func, tuned, comm.channels(), &|p| comm.params(p))?
            });
        }
        // A group of collectives that runs as one batch (one protocol) keeps its
        // steps; the next group with the same keys reruns them without planning.
        let one_batch = !self.ops.iter().any(|d| is_p2p(d.func))
            && decisions.windows(2).all(|w| w[0].proto == w[1].proto);
        let cached = comm.take_steps().filter(|c| {
            one_batch
                && c.keys.len() == self.ops.len()
                && c.keys
                    .iter()
                    .zip(self.ops.iter().zip(&decisions))
                    .all(|(k, (d, dec))| *k == step_key(d, dec))
        });
        if let Some(cache) = cached {
            STEP_REUSES.fetch_add(1, Ordering::Relaxed);
            self.rerun(cache, &decisions, prof.as_mut())?;
        } else {
            self.plan_and_run(&decisions, one_batch, prof.as_mut())?;
        }
        drop(prof);
        Ok(Decisions(decisions))
    }

    /// Reruns the steps of an identical earlier group with this group's buffers.
    fn rerun(
        &self,
        mut cache: StepCache,
        decisions: &[Decision],
        mut prof: Option<&mut GroupEvents>,
    ) -> Result<()> {
        let comm = self.comm;
        // No `ensure_p2p` here: the group that planned these steps connected their
        // PAT peers, and p2p links stay for the communicator's life.
        let mut ops = std::mem::take(&mut cache.ops);
        ops.clear();
        // Profiler events per operation; none (and no allocation) without one.
        let mut tasks = Vec::new();
        for (i, (d, dec)) in self.ops.iter().zip(decisions).enumerate() {
            let (op, extra) = op_refs(comm, d, dec)?;
            let task = prof
                .as_mut()
                .map(|g| g.coll(i, CollInfo::of(comm, d.func, &d.bufs, d.root, dec)));
            ops.push(op);
            tasks.extend(task);
            if let Some(op) = extra {
                ops.push(op);
                tasks.extend(task);
            }
        }
        let Some(proto) = decisions.first().map(|d| d.proto) else {
            return Ok(());
        };
        if let Some(g) = prof.as_deref() {
            g.launch();
        }
        let (channels, ops) = comm.run_steps(cache.channels, ops, proto, false, &tasks)?;
        comm.keep_steps(StepCache {
            channels,
            ops,
            ..cache
        });
        Ok(())
    }

    /// Plans every collective and runs the plans, a batch per run of consecutive
    /// collectives with one protocol; keeps the steps when the group is
    /// `one_batch`.
    fn plan_and_run(
        &self,
        decisions: &[Decision],
        one_batch: bool,
        mut prof: Option<&mut GroupEvents>,
    ) -> Result<()> {
        let comm = self.comm;
        let n = comm.nranks();
        let shape = comm.shape();
        let mut tasks: Vec<EventHandle> = Vec::new();
        // Runs of consecutive ops with one protocol (and kind) become one batch.
        let mut pending: Vec<(Plan, OpRef)> = Vec::new();
        let mut pending_key = None;
        for (i, (d, &dec)) in self.ops.iter().zip(decisions).enumerate() {
            let (op, extra_op) = op_refs(comm, d, &dec)?;
            let e = op.red.elem_size();
            let p2p = is_p2p(d.func);
            // A second part of the same operation, run right after it (same channel).
            let mut extra: Option<Plan> = None;
            let plan = if p2p {
                let ops = schedule::p2p_collective(shape, d.func, d.bytes, d.root)?;
                let peers = |send: bool| -> Vec<usize> {
                    ops.iter()
                        .filter_map(|o| match (o, send) {
                            (schedule::P2pOp::Send { peer, .. }, true)
                            | (schedule::P2pOp::Recv { peer, .. }, false) => Some(*peer),
                            _ => None,
                        })
                        .collect()
                };
                comm.ensure_p2p(&peers(true), &peers(false))?;
                vec![schedule::p2p(shape, &ops, 0)?]
            } else {
                let chunk = (dec.chunk / e * e).max(e);
                let cut = Cut {
                    channels: dec.channels,
                    chunk,
                    elem: e,
                };
                match (d.func, dec.algo) {
                    (Func::ALL_REDUCE, Algorithm::PAT) => {
                        let (first, rest, peers) = match comm.tuning().pat_kind(d.bytes, dec.proto)
                        {
                            PatKind::Doubling => pat::doubling(shape.rank, n, d.bytes),
                            PatKind::HalvingDoubling => {
                                // A step sends at most half a FIFO before it
                                // receives, so no message size can deadlock.
                                let piece = (pat_limit(dec.proto) / 2 / e * e).max(e);
                                pat::halving_doubling(shape.rank, n, d.bytes, e, piece)
                            }
                        };
                        comm.ensure_p2p(&peers, &peers)?;
                        extra = Some(vec![rest]);
                        vec![first]
                    }
                    (Func::ALL_REDUCE, Algorithm::TREE) => {
                        schedule::tree_all_reduce(shape, d.bytes, cut)
                    }
                    (Func::ALL_REDUCE, _) => schedule::ring_all_reduce(shape, d.bytes, cut),
                    (Func::BROADCAST, _) => schedule::ring_broadcast(shape, d.bytes, d.root, cut)?,
                    (Func::REDUCE, _) => schedule::ring_reduce(shape, d.bytes, d.root, cut)?,
                    (Func::ALL_GATHER, _) => schedule::ring_all_gather(shape, d.bytes, cut),
                    (Func::REDUCE_SCATTER, _) => schedule::ring_reduce_scatter(shape, d.bytes, cut),
                    (f, _) => {
                        return Err(Error::invalid_argument(format!(
                            "{f:?} is not a collective"
                        )));
                    }
                }
            };
            let key = (dec.proto, p2p);
            if pending_key.is_some_and(|k| k != key) {
                let (proto, was_p2p) = pending_key.unwrap_or(key);
                let t = std::mem::take(&mut tasks);
                if let Some(g) = prof.as_deref() {
                    g.launch();
                }
                comm.run_profiled(std::mem::take(&mut pending), proto, was_p2p, &t)?;
            }
            pending_key = Some(key);
            let task = prof.as_mut().map_or(EventHandle::NULL, |g| {
                g.coll(i, CollInfo::of(comm, d.func, &d.bufs, d.root, &dec))
            });
            pending.push((plan, op));
            tasks.push(task);
            // op_refs gives PAT its second reduction exactly when it plans two parts.
            if let (Some(plan), Some(op)) = (extra, extra_op) {
                pending.push((plan, op));
                tasks.push(task);
            }
        }
        if let Some((proto, p2p)) = pending_key {
            if let Some(g) = prof.as_deref() {
                g.launch();
            }
            let (channels, ops) = comm.run_profiled(pending, proto, p2p, &tasks)?;
            if one_batch {
                comm.keep_steps(StepCache {
                    keys: self
                        .ops
                        .iter()
                        .zip(decisions)
                        .map(|(d, dec)| step_key(d, dec))
                        .collect(),
                    channels,
                    ops,
                });
            }
        }
        Ok(())
    }
}

/// Collectives that run as point-to-point operations.
fn is_p2p(func: Func) -> bool {
    matches!(func, Func::ALL_TO_ALL | Func::GATHER | Func::SCATTER)
}

/// What p2p-based collectives report (they run on p2p links with Simple).
const P2P_DECISION: Decision = Decision {
    algo: Algorithm::RING,
    proto: cclkit_abi::raw::common::Protocol::SIMPLE,
    channels: 1,
    chunk: 0,
    source: crate::tune::Source::Model,
};

/// What `d`'s steps depend on.
fn step_key(d: &Desc, dec: &Decision) -> StepKey {
    StepKey {
        func: d.func,
        bytes: d.bytes,
        dtype: d.dtype,
        op: d.op,
        root: d.root,
        dec: *dec,
    }
}

/// The operation `d` runs as, and for AllReduce PAT its second part: rounds after
/// the first fold partial results, which must not get the pre-op (AVG's 1/n
/// scaling) again.
fn op_refs(comm: &Comm, d: &Desc, dec: &Decision) -> Result<(OpRef, Option<OpRef>)> {
    let red = comm.reduction(d.dtype, d.op)?;
    let op = OpRef { bufs: d.bufs, red };
    if d.func != Func::ALL_REDUCE || dec.algo != Algorithm::PAT {
        return Ok((op, None));
    }
    let plain = if red.has_pre_op() {
        comm.reduction(d.dtype, RedOp::SUM)?
    } else {
        red
    };
    Ok((
        op,
        Some(OpRef {
            bufs: d.bufs,
            red: plain,
        }),
    ))
}
