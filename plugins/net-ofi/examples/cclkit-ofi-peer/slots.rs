//! Bundle slots (`src/engine/slots.rs`) on a connection to this process, with
//! bundles and writes on (`tcp;ofi_rxm`'s defaults):
//! - a burst of odd sizes up to 16 KiB outgrows a tagged bundle: all but the
//!   first send are written as one bundle into a slot, in more rounds than
//!   there are slots (so each slot came back), with the receives posted before
//!   the burst in odd rounds and after it in even ones; every byte is checked,
//!   and so is the sentinel past it;
//! - bursts nobody receives hold every slot; the next bundle finds none within
//!   its time bound and each of its sends goes on its own. A send that does
//!   not fit such a full bundle is held in `isend` until the bundle has gone.
//!   All of them then arrive intact, in order;
//! - two bursts with sends in the write range (40,000 and 65,000 bytes, their
//!   receives not offered), written into one to three slots each (a send too
//!   large for the open bundle's room goes into a slot of its own);
//! - a 30,001-byte send on an idle connection goes into a slot too, where
//!   `ofi_rxm` would segment it, and so does a 100,003-byte one (more than the
//!   half slot a busy connection's bundle takes), which it would make a
//!   rendezvous.

use cclkit_host::net::Request;
use cclkit_net_ofi::{BundleCounts, bundle_counts};

use std::time::Instant;

use crate::flows::{self, Link, check_deadline, post_one, say, send_one, wait};
use crate::net::{R, Side};
use crate::pattern::{fill, first_mismatch};

/// The first goes out on its own; the other six (61,165 bytes) outgrow a
/// tagged bundle (16 KiB) and fit one slot (128 KiB).
const SIZES: [usize; 7] = [5000, 9001, 16384, 12000, 7777, 3, 16000];
/// The same with sends in the write range, where a send whose receive was not
/// offered (these receives are not registered) queues like a small one; its
/// `isend` reads completions once more, which may send the bundle so far.
const WIDE: [usize; 7] = [5000, 9001, 16384, 40_000, 7777, 3, 65_000];
/// Slots a receive comm offers (`SLOTS` in `src/engine/slots.rs`).
const SLOTS: usize = 8;
const TAG: i32 = 31;
const SENTINEL: u8 = 0xa7;

/// Runs the checks; prints `SLOTS ok`.
pub fn check(l: &mut Link, seed: u64) -> R<()> {
    // The link's first offers (one per slot, made at accept) were read long
    // ago, by the checks before this one. Each round's slot is offered again
    // once its records were delivered; the counts are the process's, but
    // only this link's send comm is left to read any (other links closed).
    let read = bundle_counts().slot_offers_read;
    for round in 0..SLOTS + 2 {
        offers_read(l, read + round as u64)?;
        one_round(l, &SIZES, seed + round as u64, round % 2 == 1)?;
    }
    offers_read(l, read + SLOTS as u64 + 2)?;
    held_slots(l, seed ^ 0x51075)?;
    // Wide sends last: they may take more than one slot a round, each
    // offered again once delivered.
    let start = bundle_counts();
    for round in 0..2 {
        let written = bundle_counts().written - start.written;
        offers_read(l, start.slot_offers_read + written)?;
        one_round(l, &WIDE, seed + 100 + round, round == 1)?;
    }
    let written = bundle_counts().written - start.written;
    offers_read(l, start.slot_offers_read + written)?;
    idle_send(l, seed ^ 0x1d1e)?;
    say("SLOTS ok");
    Ok(())
}

fn payloads(sizes: &[usize], seed: u64) -> Vec<Vec<u8>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut b = vec![0u8; n];
            fill(seed, i as u64, &mut b);
            b
        })
        .collect()
}

/// Progresses (a receive on a tag nobody sends keeps the engine reading its
/// completions) until send comms have read `want` slot offers in all.
fn offers_read(l: &mut Link, want: u64) -> R<()> {
    let mut probe = [0u8; 8];
    // `probe` outlives the request, cancelled below by closing it unfinished.
    let mut r = post_one(l, &mut probe, TAG + 100)?;
    let deadline = std::time::Instant::now() + flows::WAIT;
    loop {
        let b = bundle_counts();
        if b.slot_offers_read >= want {
            break;
        }
        if Side::Recv(&mut l.recv).test(&mut r)?.is_some() {
            return Err("a receive completed without a send".into());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "timed out: slot offers to reach the send comm ({b:?})"
            ));
        }
    }
    // Satisfy the probe so it does not linger.
    let s = send_one(l, &[1u8; 8], TAG + 100)?;
    wait(Side::Send(&mut l.send), s)?;
    wait(Side::Recv(&mut l.recv), r)?;
    Ok(())
}

/// Posts the burst back to back (no completion read in between); returns its
/// requests. A queued send completes with the bundle that carries it, as a
/// send posted on its own does: a slot write without the receiver's help, a
/// send that went alone (the first; or a record too large for the bundle's
/// room, sent as the message it stands for) on `shm`, or above the eager limit,
/// only once its receive is posted.
fn burst(l: &mut Link, data: &[Vec<u8>], tag: i32) -> R<Vec<Request>> {
    // `data` outlives the requests: the callers wait for all of them before
    // dropping it.
    data.iter().map(|d| send_one(l, d, tag)).collect()
}

/// Waits for every send of `reqs`.
fn wait_sends(l: &mut Link, reqs: Vec<Request>) -> R<()> {
    reqs.into_iter()
        .try_for_each(|r| wait(Side::Send(&mut l.send), r).map(drop))
}

/// Tests the sends of `reqs` (keeping those still pending) until `done` holds:
/// the burst has gone out as far as it can before its receives are posted.
fn progress_until(
    l: &mut Link,
    reqs: &mut Vec<Request>,
    what: &str,
    done: impl Fn(&BundleCounts) -> bool,
) -> R<()> {
    let deadline = Instant::now() + flows::WAIT;
    while !done(&bundle_counts()) {
        let mut pending = Vec::with_capacity(reqs.len());
        for mut r in reqs.drain(..) {
            if Side::Send(&mut l.send).test(&mut r)?.is_none() {
                pending.push(r);
            }
        }
        *reqs = pending;
        check_deadline(deadline, what)?;
    }
    Ok(())
}

/// Receives the burst of `seed` on `tag` into buffers 64 bytes larger than
/// each message, one by one.
fn receive_each(l: &mut Link, sent: &[usize], seed: u64, tag: i32) -> R<()> {
    for (i, &want) in sent.iter().enumerate() {
        let mut buf = vec![SENTINEL; want + 64];
        let r = post_one(l, &mut buf, tag)?;
        let sizes = wait(Side::Recv(&mut l.recv), r)?;
        judge(want, seed, i, &buf, &sizes)?;
    }
    Ok(())
}

fn judge(want: usize, seed: u64, i: usize, buf: &[u8], sizes: &[usize]) -> R<()> {
    if sizes != [want] {
        return Err(format!("message {i}: test reported {sizes:?}, sent {want}"));
    }
    if let Some(at) = first_mismatch(seed, i as u64, &buf[..want]) {
        return Err(format!("message {i} ({want} bytes): wrong byte at {at}"));
    }
    if buf[want..].iter().any(|&b| b != SENTINEL) {
        return Err(format!("message {i}: bytes written past its {want}"));
    }
    Ok(())
}

fn delta(before: &BundleCounts) -> BundleCounts {
    let now = bundle_counts();
    BundleCounts {
        records: now.records - before.records,
        written: now.written - before.written,
        singles: now.singles - before.singles,
        early: now.early - before.early,
        ..BundleCounts::default()
    }
}

/// One burst written into a slot (`WIDE`: one to three); its receives posted
/// first or after.
fn one_round(l: &mut Link, sizes: &[usize], seed: u64, posted_first: bool) -> R<()> {
    let data = payloads(sizes, seed);
    let before = bundle_counts();
    if posted_first {
        let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![SENTINEL; n + 64]).collect();
        let mut reqs = Vec::new();
        for b in &mut bufs {
            // `bufs` outlives the requests, all waited for below.
            reqs.push(post_one(l, b, TAG)?);
        }
        let sends = burst(l, &data, TAG)?;
        wait_sends(l, sends)?;
        for (i, (r, b)) in reqs.into_iter().zip(&bufs).enumerate() {
            let got = wait(Side::Recv(&mut l.recv), r)?;
            judge(sizes[i], seed, i, b, &got)?;
        }
    } else {
        let mut sends = burst(l, &data, TAG)?;
        // Until a slot write has landed records no receive waits for yet.
        progress_until(l, &mut sends, "a slot write before the receives", |now| {
            now.written > before.written && now.early > before.early
        })?;
        receive_each(l, sizes, seed, TAG)?;
        wait_sends(l, sends)?;
    }
    let d = delta(&before);
    let queued = sizes.len() as u64 - 1;
    let expected = if sizes == SIZES {
        (d.written, d.records, d.singles) == (1, queued, 0)
    } else {
        (1..=3).contains(&d.written) && d.records + 2 >= queued && d.singles == 0
    };
    if !expected {
        return Err(format!(
            "round of {sizes:?} with receives posted {}: expected {queued} sends \
             written into slots, got {d:?}",
            if posted_first { "first" } else { "after" },
        ));
    }
    if !posted_first && d.early == 0 {
        return Err(format!(
            "receives posted after the burst met no early record: {d:?}"
        ));
    }
    Ok(())
}

/// A send above a tagged bundle on an idle connection goes into a slot, one
/// message, where `ofi_rxm` would segment it: one slot write, one record. Also
/// one of more than half a slot (a bundle's limit on a busy connection), which
/// `ofi_rxm` would make a rendezvous.
fn idle_send(l: &mut Link, seed: u64) -> R<()> {
    for (k, size) in [30_001usize, 100_003].into_iter().enumerate() {
        let sizes = [size];
        let data = payloads(&sizes, seed + k as u64);
        let before = bundle_counts();
        let tag = TAG + 50 + k as i32;
        let mut sends = burst(l, &data, tag)?;
        progress_until(l, &mut sends, "an idle send's slot write", |now| {
            now.written > before.written
        })?;
        receive_each(l, &sizes, seed + k as u64, tag)?;
        wait_sends(l, sends)?;
        let d = delta(&before);
        if (d.written, d.records, d.singles) != (1, 1, 0) {
            return Err(format!(
                "a {size}-byte send on an idle connection: expected one slot write of \
                 one record, got {d:?}"
            ));
        }
    }
    Ok(())
}

/// `SLOTS` bursts nobody receives yet hold every slot; the next bundle goes
/// as single sends. Then everything is received, burst by burst.
fn held_slots(l: &mut Link, seed: u64) -> R<()> {
    let before = bundle_counts();
    let data: Vec<Vec<Vec<u8>>> = (0..=SLOTS)
        .map(|k| payloads(&SIZES, seed + k as u64))
        .collect();
    // Payloads of `overfill`, declared before the requests (dropped after).
    let mut overfill_data = Vec::new();
    // Their sends complete once received where they went alone (on `shm`,
    // or above the eager limit), so they are waited for after the receives.
    let mut sent = Vec::new();
    for (k, d) in data.iter().enumerate() {
        let mut sends = burst(l, d, TAG + 1 + k as i32)?;
        // Each burst but the last was written into a slot; the last, with
        // every slot held, went alone once the bound passed.
        let (written, singles) = (before.written + k as u64 + 1, before.singles);
        if k < SLOTS {
            progress_until(l, &mut sends, "a held burst's slot write", |now| {
                now.written >= written
            })?;
        } else {
            progress_until(l, &mut sends, "the sends held for a slot", |now| {
                now.singles > singles
            })?;
        }
        sent.extend(sends);
    }
    let d = delta(&before);
    // A burst's first send queues too when the previous bundle's write is
    // still in flight (then a slot bundle carries all seven).
    let queued = SIZES.len() as u64 - 1;
    if d.written != SLOTS as u64 || !(queued..=queued + 1).contains(&d.singles) {
        return Err(format!(
            "with every slot held, expected {SLOTS} bundles written and the last \
             burst's {queued} (or {}) queued sends alone, got {d:?}",
            queued + 1
        ));
    }
    overfill(
        l,
        seed ^ 0xf11,
        TAG + 2 + SLOTS as i32,
        &mut overfill_data,
        &mut sent,
    )?;
    for k in (0..=SLOTS).rev() {
        receive_each(l, &SIZES, seed + k as u64, TAG + 1 + k as i32)?;
    }
    wait_sends(l, sent)
}

/// A send that keeps the connection busy, then five that queue behind it: four
/// fill a slot's bundle (`SLOT_SHARED` in `src/engine/slots.rs`), the fifth
/// does not fit.
const OVERFILL: [usize; 6] = [1_000, 30_001, 30_002, 30_003, 30_004, 30_005];

/// Bursts of [`OVERFILL`] a test may try before one shows the hold: a
/// bundle's wait for a slot is bounded (50 us), and a burst whose bundle buffer
/// is freshly allocated (page faults) can take that long to fill it.
const OVERFILL_TRIES: u64 = 5;

/// With every slot held, a burst that overfills its bundle: `isend` holds the
/// send that does not fit (gives no request) until the bundle has gone (as
/// single sends, once its wait for a slot ran out), rather than sending it
/// alone at once. Every burst tried (on tags from `tag`) arrives intact; its
/// payloads go to `data` and its requests to `sent` (some complete only once
/// the held bursts are received, on `shm`), which the caller waits for.
fn overfill(
    l: &mut Link,
    seed: u64,
    tag: i32,
    data: &mut Vec<Vec<Vec<u8>>>,
    sent: &mut Vec<Request>,
) -> R<()> {
    let mut seen = Vec::new();
    for k in 0..OVERFILL_TRIES {
        data.push(payloads(&OVERFILL, seed + k));
        let before = bundle_counts();
        sent.extend(burst(l, &data[data.len() - 1], tag + k as i32)?);
        let now = bundle_counts();
        let held = now.held - before.held;
        let alone = now.singles - before.singles;
        receive_each(l, &OVERFILL, seed + k, tag + k as i32)?;
        if held == 1 && alone >= 4 {
            return Ok(());
        }
        seen.push((held, alone));
    }
    Err(format!(
        "a send not fitting a full bundle that waits for a slot: expected it held \
         once and the bundle's four sends gone alone; (held, alone) in each of \
         {OVERFILL_TRIES} bursts: {seen:?}"
    ))
}
