//! Unit tests of the sending side's slot bookkeeping (`tx.rs`).

use super::*;
use crate::engine::slots::SLOT_TOKEN0;

fn offer(token: u16) -> Cts {
    Cts {
        token,
        generation: 0,
        seq: 0,
        tag: 0,
        cap: SLOT_BYTES as u32,
        key: 1,
        addr: 0,
        slot: true,
    }
}

/// A connection with tagged bundles of 16,128 bytes that asked for slots.
fn slotted() -> Tx {
    Tx {
        max: 16_128,
        slot_record: 16_384,
        ..Tx::default()
    }
}

#[test]
fn slots_count_once_the_receiver_offered_one() {
    let mut tx = slotted();
    // Asked for, none offered yet: a receiver without slots must not make
    // sends wait for one.
    assert_eq!(tx.max_queued(), tx.max_record());
    assert_eq!(tx.buf_len(), 16_128);
    assert!(tx.take_slot_offer(offer(SLOT_TOKEN0), 4));
    assert_eq!(tx.max_queued(), 16_384);
    assert_eq!(tx.buf_len(), SLOT_BYTES);
    // Offers past the bound are dropped.
    for t in 1..10 {
        assert!(tx.take_slot_offer(offer(SLOT_TOKEN0 + t), 4));
    }
    assert_eq!(tx.slots.len(), 4);
    // A connection that asked for none refuses them.
    let mut plain = Tx {
        max: 16_128,
        ..Tx::default()
    };
    assert!(!plain.take_slot_offer(offer(SLOT_TOKEN0), 4));
    assert_eq!(plain.max_queued(), plain.max_record());
}

#[test]
fn a_grown_bundle_takes_a_slot_or_waits_for_one() {
    let mut tx = slotted();
    assert!(tx.take_slot_offer(offer(SLOT_TOKEN0 + 3), 8));
    let mut w = Writer::with_limit(vec![0u8; SLOT_BYTES].into_boxed_slice(), SLOT_BYTES);
    w.push(1, &[7u8; 9_000]);
    tx.open = Some(w);
    // Within a tagged bundle: no slot needed, none taken.
    assert!(!tx.wants_slot());
    assert!(tx.slot.is_none());
    if let Some(w) = tx.open.as_mut() {
        w.push(2, &[8u8; 9_000]);
    }
    // Grown past it: takes the slot on offer.
    assert!(!tx.wants_slot());
    assert_eq!(tx.slot.map(|s| s.token), Some(SLOT_TOKEN0 + 3));
    // With none left, the next grown bundle waits.
    tx.slot = None;
    assert!(tx.wants_slot());
}

#[test]
fn a_tagged_bundle_takes_sends_two_fit_up_to_the_copy_limit() {
    let rxm = Tx {
        max: 16_128,
        ..Tx::default()
    };
    // `ofi_rxm`'s 16 KiB bundles: two sends must fit, below the copy limit.
    let two = rxm.max_record();
    assert!(two < MAX_COPIED && 2 * bundle::record_bytes(two) + bundle::HEADER <= rxm.max);
    assert!(2 * bundle::record_bytes(two + 8) + bundle::HEADER > rxm.max);
    // `tcp` alone: 128 KiB bundles take 32 KiB sends (three to a bundle), not
    // the 48 KiB ones two of which would fit.
    let native = Tx {
        max: 128 << 10,
        ..Tx::default()
    };
    assert_eq!(native.max_record(), MAX_COPIED);
    assert!(3 * bundle::record_bytes(MAX_COPIED) + bundle::HEADER <= native.max);
}
