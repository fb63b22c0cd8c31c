//! User buffers registered on a connection's comm for NCCL's direct paths: a receive
//! that lands straight in the user's output, a send that leaves straight from it.
//!
//! The runtime always hands a plugin registered memory (NCCL_ABI.md §2.11), so a
//! user buffer is registered (`regMr(NCCL_PTR_HOST)`) on each comm that touches it,
//! once per batch: every later slice of the batch finds the registration here. The
//! engine deregisters them when the batch ends, after the last send from them
//! completed, so no registration outlives the buffer the caller may free or reuse.

use cclkit_abi::raw::common::ptr;
use cclkit_host::net::Mr;

use super::SlotStep;
use crate::device::mem::Registrar;
use crate::device::{Placement, SlotKind};
use crate::error::{Error, Result};
use crate::protocol::ProtoParams;

/// Where the slices of one expected primitive land when they skip the FIFO slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectRecv {
    /// Address of the primitive's first byte in the user buffer.
    pub addr: usize,
    /// The primitive's bytes.
    pub len: usize,
    /// Data bytes per slice.
    pub slice: usize,
}

impl DirectRecv {
    /// Address and length of slice `i`.
    pub fn slice(&self, i: usize) -> (usize, usize) {
        let off = i * self.slice;
        (
            self.addr + off,
            self.slice.min(self.len.saturating_sub(off)),
        )
    }
}

/// User-buffer registrations alive in this process (all comms): see
/// [`user_registrations`].
static LIVE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many user-buffer registrations of the direct paths this process holds now.
/// Between operations it is 0: a batch deregisters what it registered when it
/// ends (tests check it).
pub fn user_registrations() -> u64 {
    LIVE.load(std::sync::atomic::Ordering::Relaxed)
}

/// One comm's registrations of user buffers: `(address, bytes, registration)`.
#[derive(Default)]
pub(super) struct UserMrs {
    regs: Vec<(usize, usize, Mr)>,
}

impl UserMrs {
    /// Index of the registration covering `[addr, addr + len)`.
    pub(super) fn find(&self, addr: usize, len: usize) -> Option<usize> {
        self.regs
            .iter()
            .position(|&(a, l, _)| addr >= a && addr + len <= a + l)
    }

    /// Registration `i`.
    pub(super) fn get(&self, i: usize) -> Option<&Mr> {
        self.regs.get(i).map(|(_, _, m)| m)
    }

    /// Registers `[addr, addr + len)` on `comm` unless a registration covers it
    /// already; `false` (nothing registered) when the connection's slots are not
    /// plain host memory, where the direct paths are not used.
    ///
    /// # Safety
    /// The memory stays valid until [`take`](Self::take) hands the registration back
    /// for deregistration.
    pub(super) unsafe fn register<R: Registrar<Mr = Mr>>(
        &mut self,
        comm: &mut R,
        place: &Placement,
        addr: *mut u8,
        len: usize,
    ) -> Result<bool> {
        if place.plan.slots != SlotKind::Host || len == 0 {
            return Ok(false);
        }
        if self.find(addr as usize, len).is_some() {
            return Ok(true);
        }
        // SAFETY: forwarded from the caller.
        let mr = unsafe { comm.reg(addr, len, ptr::HOST) }?;
        self.regs.push((addr as usize, len, mr));
        LIVE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }

    /// Every registration, for deregistration.
    pub(super) fn take(&mut self) -> impl Iterator<Item = Mr> + use<> {
        LIVE.fetch_sub(self.regs.len() as u64, std::sync::atomic::Ordering::Relaxed);
        std::mem::take(&mut self.regs)
            .into_iter()
            .map(|(_, _, m)| m)
    }
}

impl super::SendConn {
    /// Registers `[data, data + len)` (a user buffer) on this comm for
    /// [`filled_from`](Self::filled_from); `false` when this connection does not
    /// send from user buffers (device placements).
    ///
    /// # Safety
    /// The memory stays valid until [`release_user`](Self::release_user).
    pub unsafe fn register_user(&mut self, data: *mut u8, len: usize) -> Result<bool> {
        // SAFETY: forwarded from the caller.
        unsafe { self.user.register(&mut self.comm, &self.place, data, len) }
            .map_err(|e| e.context(&self.label))
    }

    /// Whether `[data, data + len)` lies in a registered user buffer.
    pub fn covers(&self, data: *const u8, len: usize) -> bool {
        self.user.find(data as usize, len).is_some()
    }

    /// As [`filled`](Self::filled), but the slot's send leaves straight from `data`
    /// (registered user memory, see [`covers`](Self::covers)) instead of the slot,
    /// which only keeps its place in the `NCCL_STEPS` window.
    pub(crate) fn filled_from(
        &mut self,
        p: &ProtoParams,
        data: *const u8,
        wire: usize,
        group_tag: Option<i32>,
        step: Option<SlotStep>,
    ) -> Result<()> {
        let Some(mr) = self.user.find(data as usize, wire) else {
            return Err(Error::internal(format!(
                "{}: send from unregistered user memory",
                self.label
            )));
        };
        self.fill_slot(p, wire, group_tag, step, Some((data as usize, mr)))
    }

    /// True when no send from a user buffer is in flight.
    pub fn user_idle(&self) -> bool {
        self.user_inflight == 0
    }

    /// Deregisters the user buffers (once [`user_idle`](Self::user_idle)).
    pub fn release_user(&mut self) {
        for mr in self.user.take() {
            if let Err(e) = self.comm.dereg_mr(mr) {
                tracing::warn!(target: "cclkit::proxy", "{}: deregMr(user buffer): {e}", self.label);
            }
        }
    }
}

impl super::RecvConn {
    /// Registers `[data, data + len)` (a user buffer) on this comm for receives
    /// straight into it ([`Expect::direct`]); `false` when this connection does not
    /// receive into user buffers (device placements, GPU flushes).
    ///
    /// # Safety
    /// The memory stays valid until [`release_user`](Self::release_user).
    pub unsafe fn register_user(&mut self, data: *mut u8, len: usize) -> Result<bool> {
        if self.place.plan.flush {
            return Ok(false);
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.user.register(&mut self.comm, &self.place, data, len) }
            .map_err(|e| e.context(&self.label))
    }

    /// Deregisters the user buffers (once every receive into them was consumed).
    pub fn release_user(&mut self) {
        for mr in self.user.take() {
            if let Err(e) = self.comm.dereg_mr(mr) {
                tracing::warn!(target: "cclkit::proxy", "{}: deregMr(user buffer): {e}", self.label);
            }
        }
    }
}
