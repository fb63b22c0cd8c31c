//! The write path (`src/engine/write.rs`) on a connection to this process, with
//! the default range (sends of 16 KiB + 1 to 128 KiB - 1 on `tcp;ofi_rxm`):
//! - a registered receive larger than the send is offered, and a send in range
//!   lands in it as one write: the receive reports the send's size, the bytes
//!   match, and the bytes past them keep their sentinel;
//! - a receive without a registration is not offered: the send finds no offer,
//!   goes as a tagged message and arrives intact;
//! - a send under the range goes as a tagged message into an offered receive,
//!   whose offer is then dropped;
//! - with `large` (the range set to reach it), a send of 16 MiB + 4,099 bytes,
//!   past what 24 bits of length could say, lands as one write of its exact size.

use cclkit_host::net::{Mr, RecvBuffer, Request};
use cclkit_net_ofi::{WriteCounts, write_counts};

use crate::flows::{self, Link, check_deadline, say, wait};
use crate::net::{R, Side, err};
use crate::pattern::{fill, first_mismatch};

const SENTINEL: u8 = 0x5c;

/// Runs the checks; prints `WRITES ok`.
pub fn check(l: &mut Link, seed: u64, large: bool) -> R<()> {
    one(l, seed, 70_001, 100_003, true, |d| {
        (d.writes == 1 && d.landed == 1)
            .then_some(())
            .ok_or("the send was not written")
    })?;
    one(l, seed + 1, 40_009, 40_009, false, |d| {
        (d.writes == 0 && d.missed == 1 && d.offers == 0)
            .then_some(())
            .ok_or("an unregistered receive was offered or took a write")
    })?;
    one(l, seed + 2, 9_001, 65_536, true, |d| {
        (d.writes == 0 && d.offers == 1)
            .then_some(())
            .ok_or("a send under the range was written, or the receive not offered")
    })?;
    // The offer dropped above is not used by the next send of the same tag.
    one(l, seed + 3, 65_537, 65_537, true, |d| {
        (d.writes == 1 && d.landed == 1)
            .then_some(())
            .ok_or("the send was not written")
    })?;
    if large {
        one(
            l,
            seed + 4,
            (16 << 20) + 4_099,
            (16 << 20) + 8_192,
            true,
            |d| {
                (d.writes == 1 && d.landed == 1)
                    .then_some(())
                    .ok_or("the send was not written")
            },
        )?;
    }
    say("WRITES ok");
    Ok(())
}

/// One receive of `cap` bytes (registered when `registered`) and one send of
/// `len` random bytes on tag 77; `expect` judges the change in write counts.
fn one(
    l: &mut Link,
    seed: u64,
    len: usize,
    cap: usize,
    registered: bool,
    expect: impl Fn(&WriteCounts) -> Result<(), &'static str>,
) -> R<()> {
    let before = write_counts();
    let mut rbuf = vec![SENTINEL; cap];
    let mut sbuf = vec![0u8; len];
    fill(seed, 1, &mut sbuf);
    let rmr = if registered {
        // SAFETY: `rbuf` outlives its registration, released below.
        let mr = unsafe { Side::Recv(&mut l.recv).reg_mr(&mut rbuf) }?;
        Some(mr)
    } else {
        None
    };
    // SAFETY: as above.
    let smr = unsafe { Side::Send(&mut l.send).reg_mr(&mut sbuf) }?;
    let spec = RecvBuffer {
        data: rbuf.as_mut_ptr(),
        size: cap,
        tag: 77,
        mr: rmr.as_ref(),
    };
    // SAFETY: `rbuf` outlives the request, waited for below.
    let mut r = unsafe { l.recv.irecv(&[spec], false) }
        .map_err(err)?
        .ok_or("irecv not accepted")?;
    // Progress (both comms share this process's endpoint) until the offer has
    // reached the send comm, so that the send finds it (a send posted before its
    // offer arrives goes tagged, by design); an unregistered receive gets none.
    let deadline = std::time::Instant::now() + flows::WAIT;
    let mut spins = 0;
    while if registered {
        write_counts().arrived == before.arrived
    } else {
        spins < 50
    } {
        if Side::Recv(&mut l.recv).test(&mut r)?.is_some() {
            return Err("the receive completed before anything was sent".into());
        }
        check_deadline(deadline, "the receive's offer to reach the send comm")?;
        std::thread::sleep(std::time::Duration::from_micros(200));
        spins += 1;
    }
    let s = send(l, &sbuf, &smr)?;
    wait(Side::Send(&mut l.send), s)?;
    let sizes = wait(Side::Recv(&mut l.recv), r)?;
    if sizes != [len] {
        return Err(format!("received sizes {sizes:?}, sent {len}"));
    }
    if let Some(at) = first_mismatch(seed, 1, &rbuf[..len]) {
        return Err(format!("byte {at} of {len} differs"));
    }
    if let Some(at) = rbuf[len..].iter().position(|&b| b != SENTINEL) {
        return Err(format!("byte {} past the {len} sent was written", len + at));
    }
    let now = write_counts();
    let delta = WriteCounts {
        offers: now.offers - before.offers,
        writes: now.writes - before.writes,
        landed: now.landed - before.landed,
        missed: now.missed - before.missed,
        arrived: now.arrived - before.arrived,
    };
    expect(&delta).map_err(|m| format!("{len} bytes into {cap}: {m} ({delta:?})"))?;
    if let Some(m) = rmr {
        l.recv.dereg_mr(m).map_err(err)?;
    }
    l.send.dereg_mr(smr).map_err(err)
}

/// `isend` until it posts (NCCL calls again when it returns no request).
fn send(l: &mut Link, buf: &[u8], mr: &Mr) -> R<Request> {
    let deadline = std::time::Instant::now() + flows::WAIT;
    loop {
        // SAFETY: the caller keeps `buf` alive until the request completed.
        let posted = unsafe { l.send.isend(buf.as_ptr(), buf.len(), 77, Some(mr)) };
        if let Some(r) = posted.map_err(err)? {
            return Ok(r);
        }
        check_deadline(deadline, "isend to accept the send")?;
    }
}
