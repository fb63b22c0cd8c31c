//! Which sends join the open bundle, and when a send must wait for it.

use super::super::super::Engine;
use super::super::super::slots::SLOT_RECORD;
use super::{MAX_TX_BUNDLES, Tx};

impl Tx {
    /// Whether a send of `len` bytes joins the open bundle (see
    /// [`Engine::joins_bundle`]).
    fn takes(&self, len: usize) -> bool {
        let busy = self.inflight > 0 || self.open.is_some();
        let slot = len > self.max && self.slots_on() && !self.slots.is_empty();
        let most = if busy { self.max_queued() } else { SLOT_RECORD };
        len <= most && (busy || slot)
    }
}

impl Engine {
    /// Whether [`Engine::send_data`] copies a send of `len` bytes on `conn` into
    /// the open bundle rather than posting it alone: a send of up to a bundle
    /// record (half a slot with slots on) while the connection has sends in
    /// flight or a bundle open; or, on an idle connection with a slot on
    /// offer, a send larger than a tagged bundle, which may then fill the
    /// whole slot (no other send will share it soon). `ofi_rxm` would segment
    /// such a send or make it a rendezvous, in steps that each need the other
    /// side's progress, where a slot write is one message. With ranks sharing
    /// cores those steps cost 200-300 us an operation (3 ranks on 2 CPUs,
    /// `sendrecv` through the runtime: 32 KiB 250 us, 96 KiB 317-332 us).
    pub(in crate::engine) fn joins_bundle(&self, conn: u64, len: usize) -> bool {
        self.tx_ref(conn).is_some_and(|tx| tx.takes(len))
    }

    /// Whether a send of `len` bytes on `conn` would join the open bundle but
    /// finds it full, and the bundle cannot go yet: the connection has
    /// `MAX_TX_BUNDLES` bundles in flight, or the bundle outgrew a tagged one
    /// and waits for a slot. Such a send would otherwise go alone as a tagged
    /// message, which `ofi_rxm` segments above 16 KiB; `isend` holds it
    /// instead (`data::isend`) until the bundle goes, within the bundle's own
    /// time bound. Streams of 16-28 KiB on libfabric 2.6 then travelled 90-100
    /// % in slots instead of 47-85 %, at 1.6-1.7x raw libfabric instead of
    /// 1.1-1.5x (`docs/PERFORMANCE.md`, fourteenth pass).
    pub fn bundle_full(&self, conn: u64, len: usize) -> bool {
        self.tx_ref(conn).is_some_and(|tx| {
            tx.open.as_ref().is_some_and(|w| !w.fits(len))
                && tx.takes(len)
                && (tx.bundles >= MAX_TX_BUNDLES || tx.waits_for_slot())
        })
    }
}
