//! Bundle slots: standing write targets that let a bundle outgrow one eager
//! message.
//!
//! A bundle travels as one tagged message, so on `tcp;ofi_rxm` it holds what
//! one eager message holds (16 KiB): two 8 KiB sends never share one, and a
//! stream of 8-16 KiB sends costs a message each, exactly as the raw loop. A
//! receive comm that takes bundles and writes therefore also offers a few
//! slots, registered for remote writes, once at connect. Once its sender has
//! seen one, the open bundle may grow to a slot's size and take sends of up to
//! half a slot (those in the write range when their receive's offer has not
//! come); if it outgrows a tagged bundle, it goes as one `fi_writedata` into a
//! slot, whose CQ data names it.
//!
//! ```text
//! receiver                                        sender
//! accept: SLOTS offers {token, gen, cap, key, addr} ──▶ free slots
//!                                                  open bundle > eager size:
//!        ◀── fi_writedata(bundle, data = comm id | slot token | gen | len)
//! records delivered (or kept until their receive),
//! then the slot is offered again (new generation) ──▶ free slots
//! ```
//! A grown bundle waits for a slot at most 50 µs (`bundle/tx.rs`), then its
//! sends go alone: the wait is what paces a stream to its receiver, the bound
//! what keeps a receiver that holds every slot (records for receives it has not
//! posted) from holding its sender. The slots are the receiver's memory,
//! page-aligned and registered on their own, so a write is confined to them by
//! the registration; a write naming a slot that is not on offer (or a stale
//! generation) fails the connection.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use cclkit_abi::{Error, Result, nccl_warn};

use super::Engine;
use super::bundle::BundleBuf;
use crate::fabric::MemIface;
use crate::mr::RmaTarget;
use crate::proto::Cts;

/// Slots a receive comm offers.
pub(in crate::engine) const SLOTS: usize = 8;
/// Bytes per slot: 7 records of 16 KiB (a stream with `NCCL_STEPS` = 8 sends
/// in flight has one on the wire and the rest waiting for the next bundle), or
/// one of 128 KiB, NCCL's default p2p chunk (`NCCL_P2P_NET_CHUNKSIZE`), with its
/// bundle and record headers: an idle connection writes such a send into a
/// slot (`bundle/tx.rs`).
pub(in crate::engine) const SLOT_BYTES: usize =
    SLOT_RECORD + crate::bundle::HEADER + crate::bundle::RECORD;
/// Largest record a slot holds: the whole slot but its two headers.
pub(in crate::engine) const SLOT_RECORD: usize = 128 << 10;
/// Largest send four of which share one slot (32,752 bytes). Sends of the
/// write range up to it go into slots rather than being written
/// (`Device::open`): a slot write of four costs the receiver one message where
/// writing each costs an offer and a write, and streams of 20-28 KiB ran
/// 1.2-2.3x raw libfabric in slots against 0.9-1.3x written (`tcp;ofi_rxm`,
/// libfabric 1.17 and 2.6). At 32 KiB three share a slot and writes won on
/// libfabric 2.6 (1.1-1.2x against 0.9x).
pub const SLOT_SHARED: usize =
    ((SLOT_BYTES - crate::bundle::HEADER) / 4 - crate::bundle::RECORD) / 8 * 8;
const _: () =
    assert!(4 * crate::bundle::record_bytes(SLOT_SHARED) + crate::bundle::HEADER <= SLOT_BYTES);
/// First token of the slots: tokens of single receives' offers stay below.
pub(in crate::engine) const SLOT_TOKEN0: u16 = 0xff0;
/// Slot offers a sender keeps (a peer repeating offers cannot grow the list).
const MAX_HELD_OFFERS: usize = 2 * SLOTS;

static SLOT_WRITES: AtomicU64 = AtomicU64::new(0);
static SLOT_OFFERS: AtomicU64 = AtomicU64::new(0);
static SLOT_OFFERS_READ: AtomicU64 = AtomicU64::new(0);

/// Bundles written into slots, slot offers made (receiving side) and slot
/// offers read (sending side) by this process (all devices).
pub(in crate::engine) fn slot_counts() -> (u64, u64, u64) {
    (
        SLOT_WRITES.load(Ordering::Relaxed),
        SLOT_OFFERS.load(Ordering::Relaxed),
        SLOT_OFFERS_READ.load(Ordering::Relaxed),
    )
}

/// Page-aligned memory a peer may write into; the engine closes its
/// registration (`mr`) before dropping it (`Engine::write_retired`).
pub(in crate::engine) struct Arena {
    ptr: NonNull<u8>,
    layout: Layout,
    mr: u64,
    rma: RmaTarget,
}

impl Arena {
    fn new(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len, crate::mr::page_size())
            .map_err(|e| Error::internal(format!("slot arena layout: {e}")))?;
        // SAFETY: the layout's size is not zero (callers ask for SLOTS slots).
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| Error::system(format!("allocating {len} bytes of bundle slots")))?;
        Ok(Self {
            ptr,
            layout,
            mr: 0,
            rma: RmaTarget { key: 0, base: 0 },
        })
    }

    /// Address of slot `i`.
    fn slot(&self, i: usize) -> usize {
        self.ptr.as_ptr() as usize + i * SLOT_BYTES
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("mr", &self.mr).finish()
    }
}

/// The receiving side's slots.
#[derive(Debug)]
pub(in crate::engine) struct SlotsRx {
    arena: Arena,
    generation: [u8; SLOTS],
    offered: [bool; SLOTS],
}

impl SlotsRx {
    /// The registration to close before the arena goes.
    pub(in crate::engine) fn mr(&self) -> u64 {
        self.arena.mr
    }
}

impl Engine {
    /// Gives receive connection `conn` (which takes bundles and writes) its slots
    /// and offers them. Nothing is done when the connection takes no writes or
    /// this device cannot offer host memory for them.
    pub fn enable_slots_rx(&mut self, conn: u64) -> Result<()> {
        if self.conn(conn)?.wrx.is_none() {
            return Ok(());
        }
        let mut arena = Arena::new(SLOTS * SLOT_BYTES)?;
        let base = arena.ptr.as_ptr() as usize;
        // SAFETY: the arena stays allocated until its connection retires, which
        // releases this registration first (`write_retired`); on the way out
        // below, it is released before the arena drops.
        let r = unsafe {
            self.mrs.acquire(
                &self.domain,
                &self.ep,
                base,
                SLOTS * SLOT_BYTES,
                MemIface::System,
            )
        }?;
        let (Some(rma), Some(w)) = (
            r.rma,
            self.conns.get_mut(&conn).and_then(|c| c.wrx.as_mut()),
        ) else {
            self.mrs.release(r.id);
            return Ok(());
        };
        arena.mr = r.id;
        arena.rma = rma;
        w.slots = Some(SlotsRx {
            arena,
            generation: [0; SLOTS],
            offered: [false; SLOTS],
        });
        for i in 0..SLOTS {
            self.offer_slot(conn, i)?;
        }
        Ok(())
    }

    /// Offers slot `i` of receive connection `conn` (again) to its sender.
    pub(in crate::engine) fn offer_slot(&mut self, conn: u64, i: usize) -> Result<()> {
        let Some(c) = self.conns.get_mut(&conn).filter(|c| !c.closing) else {
            return Ok(());
        };
        let dest = c.peer;
        let Some(w) = c.wrx.as_mut() else {
            return Ok(());
        };
        let peer_id = w.peer_id;
        let Some(s) = w.slots.as_mut() else {
            return Ok(());
        };
        s.offered[i] = true;
        let cts = Cts {
            token: SLOT_TOKEN0 + i as u16,
            generation: s.generation[i],
            seq: 0,
            tag: 0,
            cap: SLOT_BYTES as u32,
            key: s.arena.rma.key,
            addr: s.arena.rma.addr_of(s.arena.slot(i)),
            slot: true,
        };
        SLOT_OFFERS.fetch_add(1, Ordering::Relaxed);
        self.send_cts(conn, dest, peer_id, &cts)
    }

    /// A bundle was written into slot token `token` of receive connection
    /// `conn`: its records are delivered, and the slot is offered again once
    /// none is kept.
    pub(in crate::engine) fn slot_written(
        &mut self,
        conn: u64,
        token: u16,
        generation: u8,
        len: usize,
    ) {
        let i = usize::from(token - SLOT_TOKEN0);
        let Some(s) = self
            .conns
            .get_mut(&conn)
            .and_then(|c| c.wrx.as_mut())
            .and_then(|w| w.slots.as_mut())
        else {
            return self.fail_conn(
                conn,
                format!("the peer wrote a bundle into slot {i}, which was never offered"),
            );
        };
        if i >= SLOTS || !s.offered[i] || s.generation[i] != generation || len > SLOT_BYTES {
            return self.fail_conn(
                conn,
                format!(
                    "the peer wrote {len} bytes into bundle slot {i} (generation {generation}), \
                     which is not on offer"
                ),
            );
        }
        s.offered[i] = false;
        s.generation[i] = s.generation[i].wrapping_add(1);
        let buf = BundleBuf::Slot {
            index: i,
            ptr: s.arena.slot(i),
        };
        self.unbundle(conn, buf, len);
    }

    /// Takes a slot offer on send connection `conn`.
    pub(in crate::engine) fn slot_offered(&mut self, conn: u64, cts: Cts) {
        let Some(tx) = self.conns.get_mut(&conn).and_then(|c| c.tx.as_mut()) else {
            return;
        };
        SLOT_OFFERS_READ.fetch_add(1, Ordering::Relaxed);
        if !tx.take_slot_offer(cts, MAX_HELD_OFFERS) {
            nccl_warn!("NET/OFI: ignored a bundle slot offer this connection did not ask for");
        }
    }

    /// Counts a bundle written into a slot.
    pub(in crate::engine) fn count_slot_write(&self) {
        SLOT_WRITES.fetch_add(1, Ordering::Relaxed);
    }
}
