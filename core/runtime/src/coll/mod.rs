//! Collectives: AllReduce (ring or tree), Broadcast, Reduce, AllGather, ReduceScatter,
//! AllToAll, Gather, Scatter and Barrier, in-place and out-of-place, alone or
//! aggregated in a group.
//!
//! Sizes follow NCCL: `count` elements per rank for AllReduce, Broadcast and Reduce;
//! AllGather takes `count` per rank and fills `n × count`; ReduceScatter reduces
//! `n × count` into `count`; AllToAll, Gather and Scatter move `count` per peer.
//! In-place layouts are NCCL's: AllGather's input is its own slot of the output,
//! ReduceScatter's output is its own slot of the input.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::profile::{CollInfo, GroupEvents};
use cclkit_abi::raw::common::{Algorithm, DataType, Func, RedOp};
use cclkit_host::profiler::EventHandle;

use super::comm::{Comm, StepCache, StepKey};
use super::error::{Error, Result};
use super::op::{OpRef, UserBufs};
use super::schedule::{self, Cut, Plan};
use super::tune::{Decision, PatKind, pat_limit};

/// Bytes the runtime copied while running primitives, by copy site (process-wide):
/// snapshot [`copy_counts`] before and after an operation and subtract
/// ([`CopyCounts::since`]) to see what it copied and what took a direct path.
pub use super::schedule::copies::{CopyCounts, copy_counts};

/// Slices the engine ran one step ahead on a channel while the step before them
/// waited for data (process-wide; see `proxy/engine/ahead.rs`).
pub use super::proxy::ahead_slices;

/// Collective groups that reran the steps of the group before them (process-wide),
/// for tests and benchmarks that check the plan cache: see [`step_reuses`].
static STEP_REUSES: AtomicU64 = AtomicU64::new(0);

/// How many collective groups of this process reran the previous group's steps
/// instead of planning (same collectives, sizes, types, ops, roots and decisions;
/// any buffers).
pub fn step_reuses() -> u64 {
    STEP_REUSES.load(Ordering::Relaxed)
}

/// One collective of a group.
#[derive(Clone, Copy, Debug)]
struct Desc {
    func: Func,
    bufs: UserBufs,
    /// Bytes per rank (see the module docs).
    bytes: usize,
    dtype: DataType,
    op: RedOp,
    root: usize,
}

/// A group of collectives run together (`ncclGroupStart` … `ncclGroupEnd`).
pub struct CollGroup<'c, 'b> {
    comm: &'c Comm,
    ops: Vec<Desc>,
    _bufs: std::marker::PhantomData<&'b mut [u8]>,
    error: Option<Error>,
}

fn elem(dtype: DataType) -> Result<usize> {
    dtype
        .size()
        .ok_or_else(|| Error::invalid_argument(format!("unknown data type {dtype:?}")))
}

impl<'c, 'b> CollGroup<'c, 'b> {
    pub(crate) fn new(comm: &'c Comm) -> Self {
        Self {
            comm,
            ops: Vec::new(),
            _bufs: std::marker::PhantomData,
            error: None,
        }
    }

    fn push(
        &mut self,
        func: Func,
        bufs: UserBufs,
        bytes: usize,
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> &mut Self {
        let n = self.comm.nranks();
        let check = || -> Result<()> {
            let e = elem(dtype)?;
            if bytes % e != 0 {
                return Err(Error::invalid_argument(format!(
                    "{func:?}: {bytes} bytes is not a whole number of {dtype:?}"
                )));
            }
            if root >= n {
                return Err(Error::invalid_argument(format!(
                    "{func:?}: root {root} is not a rank (nranks {n})"
                )));
            }
            let me = self.comm.rank();
            let (need_send, need_recv) = match func {
                Func::ALL_REDUCE => (bytes, bytes),
                Func::BROADCAST => (if me == root { bytes } else { 0 }, bytes),
                Func::REDUCE => (bytes, if me == root { bytes } else { 0 }),
                Func::ALL_GATHER => (bytes, n * bytes),
                Func::REDUCE_SCATTER => (n * bytes, bytes),
                Func::ALL_TO_ALL => (n * bytes, n * bytes),
                Func::GATHER => (bytes, if me == root { n * bytes } else { 0 }),
                Func::SCATTER => (if me == root { n * bytes } else { 0 }, bytes),
                f => {
                    return Err(Error::invalid_argument(format!(
                        "{f:?} is not a collective"
                    )));
                }
            };
            if bufs.send_len < need_send || bufs.recv_len < need_recv {
                return Err(Error::invalid_argument(format!(
                    "{func:?} of {bytes} bytes per rank on {n} ranks needs a {need_send}-byte send and a {need_recv}-byte \
                     receive buffer, got {} and {}",
                    bufs.send_len, bufs.recv_len
                )));
            }
            Ok(())
        };
        match check() {
            Ok(()) => self.ops.push(Desc {
                func,
                bufs,
                bytes,
                dtype,
                op,
                root,
            }),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    /// AllReduce of `send` into `recv` (same length).
    pub fn all_reduce(
        &mut self,
        send: &'b [u8],
        recv: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> &mut Self {
        let bytes = recv.len();
        self.push(
            Func::ALL_REDUCE,
            Comm::bufs(send, recv),
            bytes,
            dtype,
            op,
            0,
        )
    }

    /// AllReduce in place.
    pub fn all_reduce_in_place(
        &mut self,
        buf: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> &mut Self {
        let bytes = buf.len();
        self.push(Func::ALL_REDUCE, in_place(buf), bytes, dtype, op, 0)
    }

    /// Broadcast of the root's `send` into every `recv`.
    pub fn broadcast(&mut self, send: &'b [u8], recv: &'b mut [u8], root: usize) -> &mut Self {
        let bytes = recv.len();
        self.push(
            Func::BROADCAST,
            Comm::bufs(send, recv),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            root,
        )
    }

    /// Broadcast in place.
    pub fn broadcast_in_place(&mut self, buf: &'b mut [u8], root: usize) -> &mut Self {
        let bytes = buf.len();
        self.push(
            Func::BROADCAST,
            in_place(buf),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            root,
        )
    }

    /// Reduce of every `send` into the root's `recv`.
    pub fn reduce(
        &mut self,
        send: &'b [u8],
        recv: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> &mut Self {
        let bytes = send.len();
        self.push(Func::REDUCE, Comm::bufs(send, recv), bytes, dtype, op, root)
    }

    /// Reduce in place (the root's buffer receives the result).
    pub fn reduce_in_place(
        &mut self,
        buf: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> &mut Self {
        let bytes = buf.len();
        self.push(Func::REDUCE, in_place(buf), bytes, dtype, op, root)
    }

    /// AllGather: every rank's `send` lands at `rank × len` of every `recv`.
    pub fn all_gather(&mut self, send: &'b [u8], recv: &'b mut [u8]) -> &mut Self {
        let bytes = send.len();
        self.push(
            Func::ALL_GATHER,
            Comm::bufs(send, recv),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            0,
        )
    }

    /// AllGather in place: this rank's input is already at `rank × len/n` of `buf`.
    pub fn all_gather_in_place(&mut self, buf: &'b mut [u8]) -> &mut Self {
        let n = self.comm.nranks();
        let bytes = buf.len() / n;
        let mut b = in_place(buf);
        // SAFETY: `rank × bytes` is inside `buf` (bytes = len / n).
        b.send = unsafe { b.send.add(self.comm.rank() * bytes) };
        b.send_len = bytes;
        self.push(Func::ALL_GATHER, b, bytes, DataType::UINT8, RedOp::SUM, 0)
    }

    /// ReduceScatter: block r of every `send` reduces into rank r's `recv`.
    pub fn reduce_scatter(
        &mut self,
        send: &'b [u8],
        recv: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> &mut Self {
        let bytes = recv.len();
        self.push(
            Func::REDUCE_SCATTER,
            Comm::bufs(send, recv),
            bytes,
            dtype,
            op,
            0,
        )
    }

    /// ReduceScatter in place: the result lands at `rank × len/n` of `buf`.
    pub fn reduce_scatter_in_place(
        &mut self,
        buf: &'b mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> &mut Self {
        let n = self.comm.nranks();
        let bytes = buf.len() / n;
        let mut b = in_place(buf);
        // SAFETY: `rank × bytes` is inside `buf`.
        b.recv = unsafe { b.recv.add(self.comm.rank() * bytes) };
        b.recv_len = bytes;
        self.push(Func::REDUCE_SCATTER, b, bytes, dtype, op, 0)
    }

    /// AllToAll: block p of `send` goes to rank p, block p of `recv` comes from it.
    pub fn all_to_all(&mut self, send: &'b [u8], recv: &'b mut [u8]) -> &mut Self {
        let bytes = send.len() / self.comm.nranks();
        self.push(
            Func::ALL_TO_ALL,
            Comm::bufs(send, recv),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            0,
        )
    }

    /// Gather: every `send` lands at `rank × len` of the root's `recv`.
    pub fn gather(&mut self, send: &'b [u8], recv: &'b mut [u8], root: usize) -> &mut Self {
        let bytes = send.len();
        self.push(
            Func::GATHER,
            Comm::bufs(send, recv),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            root,
        )
    }

    /// Scatter: block r of the root's `send` lands in rank r's `recv`.
    pub fn scatter(&mut self, send: &'b [u8], recv: &'b mut [u8], root: usize) -> &mut Self {
        let bytes = recv.len();
        self.push(
            Func::SCATTER,
            Comm::bufs(send, recv),
            bytes,
            DataType::UINT8,
            RedOp::SUM,
            root,
        )
    }

    /// Runs the group; returns the decision each collective ran with (p2p-based ones
    /// report Ring/Simple).
    pub fn run(self) -> Result<Vec<Decision>> {
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
        let mut decisions = Vec::with_capacity(self.ops.len());
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
        Ok(decisions)
    }

    /// Reruns the steps of an identical earlier group with this group's buffers.
    fn rerun(
        &self,
        cache: StepCache,
        decisions: &[Decision],
        mut prof: Option<&mut GroupEvents>,
    ) -> Result<()> {
        let comm = self.comm;
        if !cache.peers.is_empty() {
            comm.ensure_p2p(&cache.peers, &cache.peers)?;
        }
        let mut cache = cache;
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
        // Peers of the PAT schedules (kept with the steps).
        let mut pat_peers = Vec::new();
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
                        pat_peers.extend_from_slice(&peers);
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
                    peers: pat_peers,
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
    source: super::tune::Source::Model,
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

fn in_place(buf: &mut [u8]) -> UserBufs {
    UserBufs {
        send: buf.as_ptr(),
        send_len: buf.len(),
        recv: buf.as_mut_ptr(),
        recv_len: buf.len(),
    }
}

impl Comm {
    /// Starts a group of collectives.
    pub fn collectives<'c, 'b>(&'c self) -> CollGroup<'c, 'b> {
        CollGroup::new(self)
    }

    /// AllReduce (see [`CollGroup::all_reduce`]).
    pub fn all_reduce(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<Decision> {
        let mut g = self.collectives();
        g.all_reduce(send, recv, dtype, op);
        one(g.run())
    }

    /// AllReduce in place.
    pub fn all_reduce_in_place(
        &self,
        buf: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<Decision> {
        let mut g = self.collectives();
        g.all_reduce_in_place(buf, dtype, op);
        one(g.run())
    }

    /// Broadcast from `root`.
    pub fn broadcast(&self, send: &[u8], recv: &mut [u8], root: usize) -> Result<Decision> {
        let mut g = self.collectives();
        g.broadcast(send, recv, root);
        one(g.run())
    }

    /// Reduce to `root`.
    pub fn reduce(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> Result<Decision> {
        let mut g = self.collectives();
        g.reduce(send, recv, dtype, op, root);
        one(g.run())
    }

    /// AllGather.
    pub fn all_gather(&self, send: &[u8], recv: &mut [u8]) -> Result<Decision> {
        let mut g = self.collectives();
        g.all_gather(send, recv);
        one(g.run())
    }

    /// ReduceScatter.
    pub fn reduce_scatter(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<Decision> {
        let mut g = self.collectives();
        g.reduce_scatter(send, recv, dtype, op);
        one(g.run())
    }

    /// AllToAll.
    pub fn all_to_all(&self, send: &[u8], recv: &mut [u8]) -> Result<Decision> {
        let mut g = self.collectives();
        g.all_to_all(send, recv);
        one(g.run())
    }

    /// Gather to `root`.
    pub fn gather(&self, send: &[u8], recv: &mut [u8], root: usize) -> Result<Decision> {
        let mut g = self.collectives();
        g.gather(send, recv, root);
        one(g.run())
    }

    /// Scatter from `root`.
    pub fn scatter(&self, send: &[u8], recv: &mut [u8], root: usize) -> Result<Decision> {
        let mut g = self.collectives();
        g.scatter(send, recv, root);
        one(g.run())
    }

    /// Barrier: a one-element AllReduce every rank must join.
    pub fn barrier(&self) -> Result<()> {
        let mut b = [0u8; 4];
        self.all_reduce_in_place(&mut b, DataType::INT32, RedOp::SUM)
            .map(|_| ())
    }
}

mod pat;

fn one(r: Result<Vec<Decision>>) -> Result<Decision> {
    r?.into_iter()
        .next()
        .ok_or_else(|| Error::internal("empty group"))
}
