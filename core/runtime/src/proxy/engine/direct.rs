//! NCCL's direct paths on host memory: which primitives may receive straight into
//! the user's output and send straight from the user's buffers, the registrations
//! that makes necessary, and their release when the batch ends.
//!
//! Only primitives the schedule marks [`Prim::direct`] take them, only with the
//! Simple protocol (LL/LL128 lines carry flags the user buffer has no room for) and
//! only on host communicators (a device communicator's kernels do their own
//! copies). `CCLKIT_DIRECT=0` turns them off, to compare with staging.

use std::sync::atomic::{AtomicBool, Ordering};

use cclkit_abi::raw::common::Protocol;

use super::super::Batch;
use super::{Busy, Engine};
use crate::fifo::DirectRecv;
use crate::op::OpRef;
use crate::schedule::{Buffer, Combine, Link, Prim, Span};

/// The whole user buffer `span` lies in (start, bytes), and the address of `len`
/// bytes at the span, if they fit.
fn buffer_of(op: &OpRef, span: Span, len: usize) -> Option<(*mut u8, usize, *mut u8)> {
    let (base, cap) = match span.buf {
        Buffer::Send => (op.bufs.send.cast_mut(), op.bufs.send_len),
        Buffer::Recv => (op.bufs.recv, op.bufs.recv_len),
    };
    (span.offset.checked_add(len)? <= cap && !base.is_null())
        .then(|| (base, cap, base.wrapping_add(span.offset)))
}

/// Whether `prim` of batch `b` may take a direct path (`allowed`: a host
/// communicator with `CCLKIT_DIRECT` on).
pub(super) fn eligible(allowed: bool, b: &Batch, prim: &Prim) -> bool {
    prim.direct && allowed && b.params.proto == Protocol::SIMPLE
}

/// Whether a slice of `prim` is this rank's input unchanged: nothing received, and
/// no pre-op or the identity one (every op but avg on a float type).
pub(super) fn plain_copy(prim: &Prim, op: &OpRef) -> bool {
    prim.recv.is_empty()
        && match prim.combine {
            Combine::Copy { pre } => !pre || !op.red.has_pre_op(),
            Combine::Reduce { .. } => false,
        }
}

/// Whether the sends of a plain copy without a destination may leave from the
/// input itself, as NCCL's `directSend` does. Only out of place: in place the
/// input is a range of the output, which later primitives write (ring AllReduce's
/// all-gather phase lands in the bytes its first send read).
pub(super) fn sends_from_input(prim: &Prim, op: &OpRef) -> bool {
    let (s, r) = (op.bufs.send as usize, op.bufs.recv as usize);
    let apart = s.saturating_add(op.bufs.send_len) <= r || r.saturating_add(op.bufs.recv_len) <= s;
    apart && prim.dst.is_none() && plain_copy(prim, op)
}

/// A plugin refused to register a user buffer: said once, then staging is used.
fn refused(e: &crate::error::Error) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            target: "cclkit::proxy",
            "regMr of a user buffer failed ({e}); sending and receiving through FIFO \
             slots instead (reported once)"
        );
    }
}

impl Engine {
    /// Registers, on each send connection of a direct primitive, the user buffer its
    /// slices will leave from (the output, or the input of a plain copy).
    pub(super) fn register_direct_sends(&mut self, b: &Batch) {
        for step in b.channels.iter().flatten() {
            let prim = &step.prim;
            if prim.send.is_empty() || !eligible(self.dev.is_none() && self.direct, b, prim) {
                continue;
            }
            let op = &b.ops[step.op];
            let span = prim.dst.or(prim.src.filter(|_| sends_from_input(prim, op)));
            let Some((base, cap, _)) = span.and_then(|s| buffer_of(op, s, prim.len)) else {
                continue;
            };
            for l in &prim.send {
                if let Some(c) = self.send.get_mut(l) {
                    // SAFETY: the caller's buffer stays valid while the batch runs, and
                    // the batch ends only after its sends from it completed and
                    // `release_direct` deregistered it.
                    match unsafe { c.register_user(base, cap) } {
                        Ok(true) => Busy::mark(&mut self.busy.direct_sends, l),
                        Ok(false) => {}
                        Err(e) => refused(&e),
                    }
                }
            }
        }
    }

    /// Where the slices `prim` receives on link `l` land when they skip the slots
    /// (registering the output on the receive connection), or `None`.
    pub(super) fn direct_recv(
        &mut self,
        b: &Batch,
        op: &OpRef,
        prim: &Prim,
        l: &Link,
        group: usize,
    ) -> Option<DirectRecv> {
        let simple_copy = prim.recv.len() == 1
            && prim.src.is_none()
            && matches!(prim.combine, Combine::Copy { .. })
            && group == 1;
        if !simple_copy || !eligible(self.dev.is_none() && self.direct, b, prim) {
            return None;
        }
        let (base, cap, addr) = buffer_of(op, prim.dst?, prim.len)?;
        let c = self.recv.get_mut(l)?;
        // SAFETY: as in `register_direct_sends`; receives into it are consumed
        // before the batch ends.
        match unsafe { c.register_user(base, cap) } {
            Ok(true) => {
                Busy::mark(&mut self.busy.direct_recvs, l);
                Some(DirectRecv {
                    addr: addr as usize,
                    len: prim.len,
                    slice: b.slice,
                })
            }
            Ok(false) => None,
            Err(e) => {
                refused(&e);
                None
            }
        }
    }

    /// Whether the batch may end: no send from a user buffer is still in flight.
    pub(super) fn direct_idle(&self) -> bool {
        self.busy
            .direct_sends
            .iter()
            .all(|l| self.send.get(l).is_none_or(|c| c.user_idle()))
    }

    /// Deregisters the batch's user buffers (it ended: sends from them completed,
    /// receives into them were consumed).
    pub(super) fn release_direct(&mut self) {
        for l in self.busy.direct_sends.drain(..) {
            if let Some(c) = self.send.get_mut(&l) {
                c.release_user();
            }
        }
        for l in self.busy.direct_recvs.drain(..) {
            if let Some(c) = self.recv.get_mut(&l) {
                c.release_user();
            }
        }
    }
}
