//! Schedules: every collective and point-to-point operation as per-channel lists of
//! NCCL-style primitives, before any byte moves.
//!
//! A [`Prim`] is NCCL's generic primitive: read `src` (this rank's input) and/or one
//! slice from each `recv` link, combine them (copy, or reduce with the op), and write
//! the result to every `send` link and/or to `dst`. NCCL's named primitives are
//! instances: `send` = src→send, `recvReduceSend` = recv⊕src→send,
//! `recvReduceCopySend` = recv⊕src→dst+send, `recvCopySend` = recv→dst+send,
//! `recv` = recv→dst. A prim moves `len` bytes in slices; the proxy engine pipelines
//! slices through the connections' FIFOs.
//!
//! Both ends of a link run mirrored prims in the same order with the same lengths, so
//! the slice streams match without any extra signalling; `tests` run every schedule
//! over an in-memory network to check exactly that, and the results.

use cclkit_kernels::Reduction;

use super::error::{Error, Result};

/// Which set of connections a link uses (NCCL keeps ring, tree and p2p connections apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkClass {
    /// Ring neighbours.
    Ring,
    /// Tree parent/children.
    Tree,
    /// Point-to-point peers.
    P2p,
}

/// One direction of a connection: to/from `peer` on `channel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Link {
    /// The other rank.
    pub peer: usize,
    /// Channel index.
    pub channel: usize,
    /// Connection set.
    pub class: LinkClass,
}

/// The user buffer a span lies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer {
    /// `sendbuff`.
    Send,
    /// `recvbuff`.
    Recv,
}

/// `len` bytes of a user buffer starting at `offset` (the length is the prim's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Which buffer.
    pub buf: Buffer,
    /// Byte offset.
    pub offset: usize,
}

/// How inputs combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// Copy the single input (`pre` applies the reduction's pre-op to `src`, for data
    /// entering a reduction).
    Copy {
        /// Apply the pre-op to `src`.
        pre: bool,
    },
    /// `pre(src) ⊕ recv…`; `finish` applies the post-op (the reduction completes here).
    Reduce {
        /// Apply the post-op.
        finish: bool,
    },
}

/// NCCL's generic primitive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prim {
    /// Bytes moved.
    pub len: usize,
    /// Links to receive one slice from, per slice.
    pub recv: Vec<Link>,
    /// Links to send the result to.
    pub send: Vec<Link>,
    /// This rank's input.
    pub src: Option<Span>,
    /// Where the result lands locally.
    pub dst: Option<Span>,
    /// How inputs combine.
    pub combine: Combine,
    /// NCCL's direct paths: the engine may let a receive land straight in `dst`
    /// and send straight from `dst` (or from `src`, for a plain copy without `dst`,
    /// out of place only) instead of staging through FIFO slots. Only a schedule
    /// can promise what that needs: no later primitive of the plan (and none on
    /// another channel) writes those bytes, so a send in flight never sees them
    /// change; and the data received can only arrive after every earlier
    /// primitive touching them ran (it depends on what this rank sent), so a
    /// receive posted ahead never lands early.
    pub direct: bool,
}

impl Prim {
    fn new(len: usize) -> Self {
        Self {
            len,
            recv: Vec::new(),
            send: Vec::new(),
            src: None,
            dst: None,
            combine: Combine::Copy { pre: false },
            direct: false,
        }
    }
    fn src(mut self, buf: Buffer, offset: usize) -> Self {
        self.src = Some(Span { buf, offset });
        self
    }
    fn dst(mut self, buf: Buffer, offset: usize) -> Self {
        self.dst = Some(Span { buf, offset });
        self
    }
    fn recv(mut self, l: impl IntoIterator<Item = Link>) -> Self {
        self.recv.extend(l);
        self
    }
    fn send(mut self, l: impl IntoIterator<Item = Link>) -> Self {
        self.send.extend(l);
        self
    }
    fn combine(mut self, c: Combine) -> Self {
        self.combine = c;
        self
    }
    fn direct(mut self) -> Self {
        self.direct = true;
        self
    }
}

/// Ring neighbours of this rank on every channel (channels may use different rings).
#[derive(Clone, Debug)]
pub struct RingView {
    /// Ranks in ring order.
    pub order: Vec<usize>,
    /// This rank's index in `order`.
    pub index: usize,
}

impl RingView {
    fn n(&self) -> usize {
        self.order.len()
    }
    /// The rank `k` positions after this one.
    fn after(&self, k: usize) -> usize {
        self.order[(self.index + k) % self.n()]
    }
    /// The rank `k` positions before this one.
    fn before(&self, k: usize) -> usize {
        let n = self.n();
        self.order[(self.index + n - k % n) % n]
    }
}

/// This rank's place in one tree.
#[derive(Clone, Debug, Default)]
pub struct TreeView {
    /// Parent.
    pub up: Option<usize>,
    /// Children.
    pub down: Vec<usize>,
}

/// Everything a schedule needs to know about the communicator.
#[derive(Clone, Debug)]
pub struct Shape {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// The ring.
    pub ring: RingView,
    /// Trees 0 and 1 (channel c uses tree c % 2).
    pub trees: [TreeView; 2],
}

/// How to cut the data.
#[derive(Clone, Copy, Debug)]
pub struct Cut {
    /// Channels to spread over (≥ 1).
    pub channels: usize,
    /// Bytes per chunk (an algorithm step's unit), a multiple of `elem`.
    pub chunk: usize,
    /// Element size: chunks never split an element.
    pub elem: usize,
}

/// Per-channel primitive lists for one operation on one rank.
pub type Plan = Vec<Vec<Prim>>;

/// This rank's ring links on channel `ch`: (send to next, receive from previous).
fn ring_links(s: &Shape, ch: usize) -> (Link, Link) {
    (
        link(s.ring.after(1), ch, LinkClass::Ring),
        link(s.ring.before(1), ch, LinkClass::Ring),
    )
}

fn link(peer: usize, channel: usize, class: LinkClass) -> Link {
    Link {
        peer,
        channel,
        class,
    }
}

/// Splits `[0, total)` into loops of `channels × parts` pieces of at most `chunk`
/// bytes, NCCL style: each loop covers `channels × parts × chunk` bytes (less at the
/// end), cut evenly into element-aligned pieces. Calls `f(channel, loop_base, piece)`
/// per channel and loop, where piece `p` of the loop is at `loop_base + p × piece`
/// (the last piece may be shorter; use [`piece_len`]).
fn loops(total: usize, parts: usize, cut: Cut, mut f: impl FnMut(usize, usize, usize)) {
    let per_loop = cut.channels * parts * cut.chunk;
    let mut base = 0;
    while base < total {
        let this = per_loop.min(total - base);
        let piece = this.div_ceil(cut.channels * parts).div_ceil(cut.elem) * cut.elem;
        for ch in 0..cut.channels {
            let ch_base = base + ch * parts * piece;
            if ch_base < base + this {
                f(ch, ch_base, piece);
            }
        }
        base += this;
    }
}

/// Length of piece `p` starting at `at` with nominal size `piece`, clipped to `end`.
fn piece_len(at: usize, piece: usize, end: usize) -> usize {
    piece.min(end.saturating_sub(at))
}

/// Ring AllReduce: reduce-scatter then all-gather around the ring, per chunk.
pub fn ring_all_reduce(s: &Shape, bytes: usize, cut: Cut) -> Plan {
    let n = s.nranks;
    let mut plan: Plan = vec![Vec::new(); cut.channels];
    if n == 1 {
        return local_reduce(cut, bytes);
    }
    loops(bytes, n, cut, |ch, base, piece| {
        let (next, prev) = ring_links(s, ch);
        let end = (base + n * piece).min(bytes);
        // Chunk owned by the rank `k` positions after us in the ring order.
        let at = |k: usize| base + s.ring.order[(s.ring.index + k) % n] * piece;
        let len = |k: usize| piece_len(at(k), piece, end);
        let p = &mut plan[ch];
        // Out of place the first piece leaves straight from the input (NCCL's
        // directSend); in place the engine stages it (`sends_from_input`).
        p.push(
            Prim::new(len(n - 1))
                .src(Buffer::Send, at(n - 1))
                .send([next])
                .combine(Combine::Copy { pre: true })
                .direct(),
        );
        for j in 2..n {
            let k = n - j;
            p.push(
                Prim::new(len(k))
                    .src(Buffer::Send, at(k))
                    .recv([prev])
                    .send([next])
                    .combine(Combine::Reduce { finish: false }),
            );
        }
        p.push(
            Prim::new(len(0))
                .src(Buffer::Send, at(0))
                .recv([prev])
                .send([next])
                .dst(Buffer::Recv, at(0))
                .combine(Combine::Reduce { finish: true })
                .direct(),
        );
        // The all-gather phase: every output chunk is written once, by the fully
        // reduced data that can only arrive after this rank's contribution to it left
        // (in place, its input is read before). So receives land in the output and
        // forwards leave from it, as MPI does, with no copy through FIFO slots.
        for j in 1..n - 1 {
            let k = n - j;
            p.push(
                Prim::new(len(k))
                    .recv([prev])
                    .send([next])
                    .dst(Buffer::Recv, at(k))
                    .direct(),
            );
        }
        p.push(
            Prim::new(len(1))
                .recv([prev])
                .dst(Buffer::Recv, at(1))
                .direct(),
        );
    });
    drop_empty(plan)
}

/// One rank: the result is the pre- and post-op of the input.
fn local_reduce(cut: Cut, bytes: usize) -> Plan {
    let mut plan: Plan = vec![Vec::new(); cut.channels];
    if bytes > 0 {
        plan[0].push(
            Prim::new(bytes)
                .src(Buffer::Send, 0)
                .dst(Buffer::Recv, 0)
                .combine(Combine::Reduce { finish: true }),
        );
    }
    plan
}

/// Tree AllReduce: every chunk reduced up the tree into the root's output, then
/// broadcast down (NCCL's `runTreeUpDown`). Channel `c` uses tree `c % 2`.
pub fn tree_all_reduce(s: &Shape, bytes: usize, cut: Cut) -> Plan {
    if s.nranks == 1 {
        return local_reduce(cut, bytes);
    }
    let mut plan: Plan = vec![Vec::new(); cut.channels];
    let mut pieces: Vec<Vec<(usize, usize)>> = vec![Vec::new(); cut.channels];
    loops(bytes, 1, cut, |ch, base, piece| {
        pieces[ch].push((base, piece_len(base, piece, bytes)))
    });
    for (ch, list) in pieces.iter().enumerate() {
        let t = &s.trees[ch % 2];
        let up = t.up.map(|u| link(u, ch, LinkClass::Tree));
        let down: Vec<Link> = t
            .down
            .iter()
            .map(|&d| link(d, ch, LinkClass::Tree))
            .collect();
        let p = &mut plan[ch];
        for &(off, len) in list {
            let prim = Prim::new(len)
                .src(Buffer::Send, off)
                .recv(down.iter().copied());
            p.push(match up {
                None => prim
                    .dst(Buffer::Recv, off)
                    .combine(Combine::Reduce { finish: true }),
                Some(u) if down.is_empty() => prim.send([u]).combine(Combine::Copy { pre: true }),
                Some(u) => prim.send([u]).combine(Combine::Reduce { finish: false }),
            });
        }
        for &(off, len) in list {
            let prim = Prim::new(len).send(down.iter().copied());
            p.push(match up {
                None => prim.src(Buffer::Recv, off),
                Some(u) => prim.recv([u]).dst(Buffer::Recv, off),
            });
        }
    }
    drop_empty(plan)
}

/// Ring starting at `root`: position of this rank after the root.
fn after_root(s: &Shape, root: usize) -> Result<usize> {
    let r = s
        .ring
        .order
        .iter()
        .position(|&x| x == root)
        .ok_or_else(|| Error::invalid_argument(format!("root {root} is not a rank")))?;
    Ok((s.ring.index + s.nranks - r) % s.nranks)
}

/// Ring Broadcast from `root` (in-place when the root's send and recv buffers coincide).
pub fn ring_broadcast(s: &Shape, bytes: usize, root: usize, cut: Cut) -> Result<Plan> {
    let n = s.nranks;
    let pos = after_root(s, root)?;
    let mut plan: Plan = vec![Vec::new(); cut.channels];
    loops(bytes, 1, cut, |ch, off, piece| {
        let len = piece_len(off, piece, bytes);
        let (next, prev) = ring_links(s, ch);
        let prim = Prim::new(len);
        plan[ch].push(if pos == 0 {
            prim.src(Buffer::Send, off)
                .dst(Buffer::Recv, off)
                .send((n > 1).then_some(next))
        } else if pos == n - 1 {
            prim.recv([prev]).dst(Buffer::Recv, off)
        } else {
            prim.recv([prev]).send([next]).dst(Buffer::Recv, off)
        });
    });
    Ok(drop_empty(plan))
}

/// Ring Reduce to `root`: the chain ends at the root, which writes the result.
pub fn ring_reduce(s: &Shape, bytes: usize, root: usize, cut: Cut) -> Result<Plan> {
    let n = s.nranks;
    let pos = after_root(s, root)?;
    let mut plan: Plan = vec![Vec::new(); cut.channels];
    loops(bytes, 1, cut, |ch, off, piece| {
        let len = piece_len(off, piece, bytes);
        let (next, prev) = ring_links(s, ch);
        let prim = Prim::new(len).src(Buffer::Send, off);
        plan[ch].push(if n == 1 {
            prim.dst(Buffer::Recv, off)
                .combine(Combine::Reduce { finish: true })
        } else if pos == 0 {
            prim.recv([prev])
                .dst(Buffer::Recv, off)
                .combine(Combine::Reduce { finish: true })
        } else if pos == 1 {
            prim.send([next]).combine(Combine::Copy { pre: true })
        } else {
            prim.recv([prev])
                .send([next])
                .combine(Combine::Reduce { finish: false })
        });
    });
    Ok(drop_empty(plan))
}

/// Ring AllGather: `bytes` per rank; rank r's input lands at `r × bytes` of every output.
pub fn ring_all_gather(s: &Shape, bytes: usize, cut: Cut) -> Plan {
    let n = s.nranks;
    let mut plan: Plan = vec![Vec::new(); cut.channels];
    loops(bytes, 1, cut, |ch, off, piece| {
        let len = piece_len(off, piece, bytes);
        let (next, prev) = ring_links(s, ch);
        let p = &mut plan[ch];
        let at = |rank: usize| rank * bytes + off;
        // Every rank's block of the output is written once (its own block by the
        // first primitive, the others by one receive each): all direct.
        p.push(
            Prim::new(len)
                .src(Buffer::Send, off)
                .dst(Buffer::Recv, at(s.rank))
                .send((n > 1).then_some(next))
                .direct(),
        );
        for k in 1..n {
            let owner = s.ring.before(k);
            let prim = Prim::new(len)
                .recv([prev])
                .dst(Buffer::Recv, at(owner))
                .direct();
            p.push(if k < n - 1 { prim.send([next]) } else { prim });
        }
    });
    drop_empty(plan)
}

/// Ring ReduceScatter: `bytes` per rank of output; block r of every input reduces
/// into rank r's output.
pub fn ring_reduce_scatter(s: &Shape, bytes: usize, cut: Cut) -> Plan {
    let n = s.nranks;
    let mut plan: Plan = vec![Vec::new(); cut.channels];
    loops(bytes, 1, cut, |ch, off, piece| {
        let len = piece_len(off, piece, bytes);
        let (next, prev) = ring_links(s, ch);
        let p = &mut plan[ch];
        let at = |rank: usize| rank * bytes + off;
        if n == 1 {
            p.push(
                Prim::new(len)
                    .src(Buffer::Send, at(0))
                    .dst(Buffer::Recv, off)
                    .combine(Combine::Reduce { finish: true }),
            );
            return;
        }
        // Block of the rank k after us starts its journey here after n-1-k hops…
        p.push(
            Prim::new(len)
                .src(Buffer::Send, at(s.ring.before(1)))
                .send([next])
                .combine(Combine::Copy { pre: true }),
        );
        for k in 2..n {
            p.push(
                Prim::new(len)
                    .src(Buffer::Send, at(s.ring.before(k)))
                    .recv([prev])
                    .send([next])
                    .combine(Combine::Reduce { finish: false }),
            );
        }
        p.push(
            Prim::new(len)
                .src(Buffer::Send, at(s.rank))
                .recv([prev])
                .dst(Buffer::Recv, off)
                .combine(Combine::Reduce { finish: true }),
        );
    });
    drop_empty(plan)
}

/// Computes one slice of a prim: `out` = the combination of `src` and `recvs`.
///
/// The one place where a primitive's arithmetic lives, shared by the proxy engine and
/// the schedule tests.
pub fn combine(
    c: Combine,
    red: &Reduction,
    src: Option<&[u8]>,
    recvs: &[&[u8]],
    out: &mut [u8],
) -> Result<()> {
    let k = |e: cclkit_kernels::KernelError| Error::internal(format!("reduction kernel: {e}"));
    match c {
        Combine::Copy { .. } if !recvs.is_empty() => cclkit_kernels::copy(out, recvs[0]).map_err(k),
        Combine::Copy { pre: true } => red
            .pre_op(
                out,
                src.ok_or_else(|| Error::internal("copy prim without input"))?,
            )
            .map_err(k),
        Combine::Copy { pre: false } => cclkit_kernels::copy(
            out,
            src.ok_or_else(|| Error::internal("copy prim without input"))?,
        )
        .map_err(k),
        Combine::Reduce { finish } => red.reduce_many(out, src, recvs, finish).map_err(k),
    }
}

fn drop_empty(plan: Plan) -> Plan {
    plan.into_iter()
        .map(|ch| ch.into_iter().filter(|p| p.len > 0).collect())
        .collect()
}

pub mod copies;
mod p2p;
#[cfg(test)]
pub(crate) mod tests;

pub use p2p::{P2pOp, p2p, p2p_collective};
