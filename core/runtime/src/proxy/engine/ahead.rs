//! Looking one step ahead on a channel: while the current primitive only waits for
//! data to arrive, the next one may already send.
//!
//! NCCL's kernel runs a channel's primitives one after another, and so does the
//! engine. In a ring that leaves a link idle at every loop boundary. The last
//! primitive of a loop (a plain receive) keeps the incoming direction busy. The
//! first of the next loop (a plain send of fresh input) could use the outgoing
//! direction at the same time, and nothing it touches depends on the receive. On
//! two ranks that is one step in three.
//!
//! The engine runs the next step's slices early when all of this holds:
//! * the current step has no send links, so the order of sends on every link
//!   stays the schedule's;
//! * the next step has send links and no receive links, so the receive
//!   expectations stay in order;
//! * the next step's bytes do not overlap the current step's. Overlap is checked
//!   on the actual buffers, in place or not: the next step's output against the
//!   current step's input and output, and its input against the current step's
//!   output.
//!
//! Only on host memory, without a profiler (whose per-step events are ordered),
//! and with a core per rank: when ranks share cores the CPU, not the link, is what
//! runs out, and data sent early only waits in the socket and leaves the cache.

use super::{Batch, Step};
use crate::op::OpRef;
use crate::schedule::{Buffer, Span};

/// Whether `next` may run slices while `cur` (the step before it on the same
/// channel) is unfinished.
pub(super) fn may_run_ahead(b: &Batch, cur: &Step, next: &Step) -> bool {
    if !cur.prim.send.is_empty() || !next.prim.recv.is_empty() || next.prim.send.is_empty() {
        return false;
    }
    let (Some(cur_op), Some(next_op)) = (b.ops.get(cur.op), b.ops.get(next.op)) else {
        return false;
    };
    let range = |op: &OpRef, span: Option<Span>, len: usize| {
        span.map(|s| {
            let base = match s.buf {
                Buffer::Send => op.bufs.send as usize,
                Buffer::Recv => op.bufs.recv as usize,
            };
            let start = base.wrapping_add(s.offset);
            (start, start.wrapping_add(len))
        })
    };
    let overlap = |a: Option<(usize, usize)>, b: Option<(usize, usize)>| match (a, b) {
        (Some((a0, a1)), Some((b0, b1))) => a0 < b1 && b0 < a1,
        _ => false,
    };
    let cur_in = range(cur_op, cur.prim.src, cur.prim.len);
    let cur_out = range(cur_op, cur.prim.dst, cur.prim.len);
    let next_in = range(next_op, next.prim.src, next.prim.len);
    let next_out = range(next_op, next.prim.dst, next.prim.len);
    !overlap(next_out, cur_in) && !overlap(next_out, cur_out) && !overlap(next_in, cur_out)
}
