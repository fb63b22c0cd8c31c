//! Bundles (`src/bundle.rs`) on a connection to this process: sends that complete
//! before any receive is posted (their records wait at the receiver), records
//! filling receives already posted, and a bundled send larger than its receive.
//! Each check first makes sure the sends really travelled in bundles. A fresh
//! receive comm posts one bundle receive until its first bundle comes, then the
//! others, exactly once.

use std::time::Instant;

use cclkit_host::net::Request;
use cclkit_net_ofi::bundle_counts;

use crate::flows::{self, Link, check_deadline, post_one, say, send_one, wait};
use crate::net::{Abi, R, Side};
use crate::pattern::{Rng, fill, first_mismatch};

/// Odd sizes, all small enough to bundle; the first goes out on its own (nothing
/// is in flight yet), the others queue behind it.
const SIZES: [usize; 9] = [1, 7, 300, 1000, 0, 2049, 13, 4095, 5];
const TAG: i32 = 5;

/// Runs the checks; prints `BUNDLES ok`.
pub fn check(l: &mut Link, abi: Abi, seed: u64) -> R<()> {
    early_records(l, seed)?;
    first_bundle_grows(abi, seed ^ 0x96)?;
    posted_receives(l, seed ^ 0x5eed)?;
    lone_record(l)?;
    truncated(l)?;
    say("BUNDLES ok");
    Ok(())
}

pub fn payloads(seed: u64, first_id: u64) -> Vec<Vec<u8>> {
    SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut b = vec![0u8; n];
            fill(seed, first_id + i as u64, &mut b);
            b
        })
        .collect()
}

/// Posts every send back to back (no completion is read in between, so all but
/// the first are bundled) and drives them to completion.
pub fn send_burst(l: &mut Link, data: &[Vec<u8>], tag: i32) -> R<()> {
    let before = bundle_counts();
    let mut reqs = Vec::new();
    for d in data {
        // `data` outlives the requests, which complete below.
        reqs.push(send_one(l, d, tag)?);
    }
    for r in reqs {
        wait(Side::Send(&mut l.send), r)?;
    }
    let now = bundle_counts();
    let bundled = now.records - before.records;
    if bundled != data.len() as u64 - 1 || now.bundles == before.bundles {
        return Err(format!(
            "{bundled} of {} sends went in {} bundle(s); expected all but the first",
            data.len(),
            now.bundles - before.bundles
        ));
    }
    Ok(())
}

/// Receives one message per size of [`SIZES`] with `tag`, one by one into larger
/// buffers, and checks each against its pattern.
pub fn receive_each(l: &mut Link, seed: u64, first_id: u64, tag: i32) -> R<()> {
    for (i, &want) in SIZES.iter().enumerate() {
        let mut buf = vec![0xa5u8; 4096 + 64];
        let r = post_one(l, &mut buf, tag)?;
        let sizes = wait(Side::Recv(&mut l.recv), r)?;
        if sizes != [want] {
            return Err(format!("message {i}: test reported {sizes:?}, sent {want}"));
        }
        if let Some(at) = first_mismatch(seed, first_id + i as u64, &buf[..want]) {
            return Err(format!("message {i} ({want} bytes): wrong byte at {at}"));
        }
        if buf[want..].iter().any(|&b| b != 0xa5) {
            return Err(format!("message {i}: bytes written past its {want}"));
        }
    }
    Ok(())
}

/// On a new comm pair (`l`'s receive comm grew long before this check), the
/// receive comm posts its other bundle receives when its first bundle comes
/// (`RX_FIRST` in `src/engine/bundle/rx.rs`), not at accept, and only once.
fn first_bundle_grows(abi: Abi, seed: u64) -> R<()> {
    let before = bundle_counts().grown;
    let mut fresh = crate::scenarios::self_link(abi)?;
    if bundle_counts().grown != before {
        return Err("a new receive comm posted all its bundle receives before any bundle".into());
    }
    let data = payloads(seed, 0);
    send_burst(&mut fresh, &data, TAG)?;
    receive_each(&mut fresh, seed, 0, TAG)?;
    send_burst(&mut fresh, &data, TAG)?;
    receive_each(&mut fresh, seed, 0, TAG)?;
    let grown = bundle_counts().grown - before;
    if grown != 1 {
        return Err(format!(
            "two bursts of bundles on a new comm pair: {grown} receive comms posted their \
             other bundle receives; expected 1"
        ));
    }
    flows::close(fresh)
}

/// Every send completes before its receive exists: the receiver must keep the
/// records until the receives come, in order.
fn early_records(l: &mut Link, seed: u64) -> R<()> {
    let data = payloads(seed, 0);
    let before = bundle_counts().early;
    send_burst(l, &data, TAG)?;
    // Let the bundle reach the receiving comm while no receive waits for it: a
    // receive on another tag keeps the engine progressing meanwhile.
    let mut probe = [0u8; 8];
    // `probe` outlives the request, completed at the end of this function.
    let mut pending = post_one(l, &mut probe, TAG + 100)?;
    let until = Instant::now() + std::time::Duration::from_millis(200);
    while Instant::now() < until {
        if Side::Recv(&mut l.recv).test(&mut pending)?.is_some() {
            return Err("a receive completed without a send".into());
        }
    }
    let early = bundle_counts().early - before;
    if early != data.len() as u64 - 1 {
        return Err(format!(
            "{early} records arrived before their receives; expected {}",
            data.len() - 1
        ));
    }
    receive_each(l, seed, 0, TAG)?;
    finish_probe(l, pending)
}

/// Satisfies the other-tag receive with a send of its own.
fn finish_probe(l: &mut Link, pending: Request) -> R<()> {
    let b = [9u8; 8];
    let s = send_one(l, &b, TAG + 100)?;
    wait(Side::Send(&mut l.send), s)?;
    let sizes = wait(Side::Recv(&mut l.recv), pending)?;
    (sizes == [8])
        .then_some(())
        .ok_or(format!("probe got {sizes:?}"))
}

/// The receives are posted first: each record fills its receive and withdraws
/// the receive's own post (which must never complete on its own later).
fn posted_receives(l: &mut Link, seed: u64) -> R<()> {
    let data = payloads(seed, 100);
    let mut bufs: Vec<Vec<u8>> = (0..data.len()).map(|_| vec![0xa5u8; 4096 + 64]).collect();
    let mut reqs = Vec::new();
    for b in &mut bufs {
        // `bufs` outlives the requests, all waited for below.
        reqs.push(post_one(l, b, TAG + 1)?);
    }
    send_burst(l, &data, TAG + 1)?;
    for (i, (r, b)) in reqs.into_iter().zip(&bufs).enumerate() {
        let sizes = wait(Side::Recv(&mut l.recv), r)?;
        let want = SIZES[i];
        if sizes != [want] || first_mismatch(seed, 100 + i as u64, &b[..want]).is_some() {
            return Err(format!("posted receive {i}: {sizes:?}, or wrong bytes"));
        }
        if b[want..].iter().any(|&x| x != 0xa5) {
            return Err(format!("posted receive {i}: bytes written past its {want}"));
        }
    }
    // Everything withdrawn stays withdrawn: a later exchange on the same tag
    // lands where it should.
    let mut rng = Rng::new(seed);
    let n = 1 + rng.below(100);
    let mut got = vec![0u8; 128];
    let out: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    let r = post_one(l, &mut got, TAG + 1)?;
    let s = send_one(l, &out, TAG + 1)?;
    wait(Side::Send(&mut l.send), s)?;
    let sizes = wait(Side::Recv(&mut l.recv), r)?;
    if sizes != [n] || got[..n] != out[..] {
        return Err(format!("after the bundles: got {sizes:?}"));
    }
    Ok(())
}

/// A send queued alone behind another goes out as the message it stands for
/// (not as a bundle of one) and lands like any other.
fn lone_record(l: &mut Link) -> R<()> {
    let (a, b) = ([4u8; 3], [5u8; 77]);
    let before = bundle_counts();
    // Back to back: the second queues behind the first.
    let (ra, rb) = (send_one(l, &a, TAG + 5)?, send_one(l, &b, TAG + 5)?);
    wait(Side::Send(&mut l.send), ra)?;
    wait(Side::Send(&mut l.send), rb)?;
    let now = bundle_counts();
    if (now.bundles, now.records) != (before.bundles, before.records) {
        return Err(format!("a lone queued send went as a bundle: {now:?}"));
    }
    for want in [&a[..], &b[..]] {
        let mut got = [0u8; 128];
        let r = post_one(l, &mut got, TAG + 5)?;
        let sizes = wait(Side::Recv(&mut l.recv), r)?;
        if sizes != [want.len()] || got[..want.len()] != *want {
            return Err(format!("lone record: got {sizes:?}"));
        }
    }
    Ok(())
}

/// A bundled send larger than its receive fails that receive only: the send
/// bundled with it still arrives.
fn truncated(l: &mut Link) -> R<()> {
    let (lead, big, tail) = ([1u8; 1], [2u8; 300], [3u8; 5]);
    let before = bundle_counts();
    let mut sends = Vec::new();
    for (b, tag) in [
        (&lead[..], TAG + 2),
        (&big[..], TAG + 3),
        (&tail[..], TAG + 4),
    ] {
        // The buffers outlive the requests, waited for below.
        sends.push(send_one(l, b, tag)?);
    }
    for r in sends {
        wait(Side::Send(&mut l.send), r)?;
    }
    if bundle_counts().records != before.records + 2 {
        return Err("the second and third sends were not bundled together".into());
    }
    let (mut one, mut small, mut five) = ([0u8; 4], [0u8; 100], [0u8; 8]);
    let (rx, ry, rz) = (
        post_one(l, &mut one, TAG + 2)?,
        post_one(l, &mut small, TAG + 3)?,
        post_one(l, &mut five, TAG + 4)?,
    );
    let sizes = wait(Side::Recv(&mut l.recv), rx)?;
    if sizes != [1] || one[0] != 1 {
        return Err(format!("the lead message: {sizes:?}"));
    }
    let mut ry = ry;
    let deadline = Instant::now() + flows::WAIT;
    let msg = loop {
        match l.recv.test(&mut ry) {
            Err(e) => break e.to_string(),
            Ok(Some(sz)) => return Err(format!("a truncated bundled receive succeeded ({sz:?})")),
            Ok(None) => check_deadline(deadline, "bundled truncation")?,
        }
    };
    if !msg.contains("truncated") || !msg.contains("bundle") {
        return Err(format!("unexpected truncation error: {msg}"));
    }
    let sizes = wait(Side::Recv(&mut l.recv), rz)?;
    if sizes != [5] || five[..5] != tail {
        return Err(format!(
            "the send bundled with the truncated one: {sizes:?}"
        ));
    }
    say(&format!("BUNDLE TRUNCATED {msg}"));
    Ok(())
}
