//! One direction's FIFO memory: `slots × slot_wire` bytes, allocated and registered
//! as the connection's placement says.

use crate::device::{self, Placement, SlotMem};
use crate::error::Result;
use crate::protocol::ProtoParams;

/// A slot buffer of `slots × slot_wire` bytes: 8-byte aligned host memory, or
/// on a CUDA communicator pinned host or GPU memory ([`device::mem`]).
pub(super) struct Slots {
    mem: SlotMem,
    /// Wire bytes of one slot.
    pub(super) slot_wire: usize,
}

impl Slots {
    pub(super) fn new(p: &ProtoParams, place: &Placement) -> Result<Self> {
        let bytes = p.slots() * p.slot_wire();
        Ok(Self {
            mem: SlotMem::alloc(&place.device, &place.plan, bytes)?,
            slot_wire: p.slot_wire(),
        })
    }
    /// Slot `i`'s first byte.
    pub(super) fn slot(&mut self, i: usize) -> *mut u8 {
        // `i < slots`, so the slot lies inside the buffer; a GPU address is
        // only offset here, never dereferenced on the host.
        self.mem.base().wrapping_add(i * self.slot_wire)
    }
    /// Registers the slots on `comm` as the placement says.
    ///
    /// # Safety
    /// The registration is deregistered before the slots are dropped.
    pub(super) unsafe fn register<R: device::mem::Registrar>(
        &mut self,
        comm: &mut R,
        place: &Placement,
    ) -> Result<R::Mr> {
        // SAFETY: forwarded from the caller.
        unsafe { device::mem::register(comm, &mut self.mem, &place.plan, &place.device) }
    }
}
