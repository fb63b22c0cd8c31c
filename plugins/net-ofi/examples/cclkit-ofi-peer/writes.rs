//! The write path (`src/engine/write.rs`) on a connection to this process, with
//! the default range (sends of 32,753 bytes to 128 KiB - 1 on `tcp;ofi_rxm`
//! under BBR; smaller ones go into bundle slots):
//! - the first send in range on a new connection is written (its receive's
//!   offer is not held up behind the receiver's slot offers);
//! - a registered receive larger than the send is offered, and a send in range
//!   lands in it as one write: the receive reports the send's size, the bytes
//!   match, and the bytes past them keep their sentinel;
//! - a receive without a registration is not offered: the send finds no offer,
//!   goes as a tagged message and arrives intact;
//! - a send under the range goes as a tagged message into an offered receive,
//!   whose offer is then dropped;
//! - a sender ahead of its receiver: once a tag's receives have been offered, a
//!   send whose offer has not come yet waits for it (`isend` gives no request)
//!   and is written when it comes; a send
//!   whose receive is never offered waits only a bounded time, then goes
//!   tagged, and once such waits have been slow the connection stops waiting
//!   for a while;
//! - with `large` (the range set to reach it), a send of 16 MiB + 4,099 bytes,
//!   past what 24 bits of length could say, lands as one write of its exact size.

use cclkit_host::net::{Mr, RecvBuffer, Request};
use cclkit_net_ofi::{WriteCounts, write_counts};

use crate::flows::{self, Link, check_deadline, say, wait};
use crate::net::{Abi, R, Side, err};
use crate::pattern::{fill, first_mismatch};
use crate::scenarios::self_link;

const SENTINEL: u8 = 0x5c;

/// On a new comm pair, the first send in range is written: the receive's offer
/// reaches the sender right away, though the receiver's bundle slots (when it
/// has them) are offered at the same time (8 offers at once, which through a
/// single offer receive came one per progress call and made it miss).
fn first_offer(abi: Abi, seed: u64) -> R<()> {
    let mut fresh = self_link(abi)?;
    one(&mut fresh, seed, 70_001, 100_003, true, |d| {
        (d.writes == 1 && d.landed == 1)
            .then_some(())
            .ok_or("the first send of a new connection was not written")
    })?;
    flows::close(fresh)
}

/// Runs the checks; prints `WRITES ok`.
pub fn check(l: &mut Link, abi: Abi, seed: u64, large: bool) -> R<()> {
    first_offer(abi, seed ^ 0xf1)?;
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
    ahead(l, seed + 5)?;
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
    let s = send(l, 77, &sbuf, &smr)?;
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
        waited: now.waited - before.waited,
        expired: now.expired - before.expired,
    };
    expect(&delta).map_err(|m| format!("{len} bytes into {cap}: {m} ({delta:?})"))?;
    if let Some(m) = rmr {
        l.recv.dereg_mr(m).map_err(err)?;
    }
    l.send.dereg_mr(smr).map_err(err)
}

/// How each send of [`ahead`] meets its receive.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ahead {
    /// The receive is posted, and its offer read, before the send.
    Offered,
    /// The send comes first (the one before it still in flight, as in a
    /// stream): `isend` must give no request until the receive is posted and
    /// offered; then it is written.
    Waits,
    /// The receive is never offered (not registered): `isend` waits a bounded
    /// time, then posts it tagged; once such waits have been slow, the
    /// connection stops waiting and posts at once.
    NeverOffered,
}

/// Most never-offered sends before the connection must have stopped waiting.
const SLOW_WAITS: usize = 12;

/// Sends posted before their receives, as by a sender running ahead in a stream,
/// and the cases where such a send must not wait (see [`Ahead`]).
fn ahead(l: &mut Link, seed: u64) -> R<()> {
    const TAG: i32 = 78;
    use Ahead::*;
    let mut cases = vec![Offered];
    cases.extend([Waits; 8]);
    cases.extend([NeverOffered; SLOW_WAITS + 1]);
    let len = |i: usize| 40_011 - 7 * i;
    let before = write_counts();
    let n = cases.len();
    let mut rbufs: Vec<Vec<u8>> = (0..n).map(|i| vec![SENTINEL; len(i) + 5]).collect();
    let mut sbufs: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let mut b = vec![0u8; len(i)];
            fill(seed, i as u64, &mut b);
            b
        })
        .collect();
    let mut mrs = Vec::new();
    for (i, (r, s)) in rbufs.iter_mut().zip(sbufs.iter_mut()).enumerate() {
        let rmr = if cases[i] == NeverOffered {
            None
        } else {
            // SAFETY: the buffers outlive their registrations, released below.
            Some(unsafe { Side::Recv(&mut l.recv).reg_mr(r) }?)
        };
        // SAFETY: as above.
        let smr = unsafe { Side::Send(&mut l.send).reg_mr(s) }?;
        mrs.push((rmr, smr));
    }
    let mut in_flight: Option<Request> = None;
    // Never-offered sends that waited before one was posted at once.
    let mut slow = None;
    for (i, &case) in cases.iter().enumerate() {
        let rspec = RecvBuffer {
            data: rbufs[i].as_mut_ptr(),
            size: rbufs[i].len(),
            tag: TAG,
            mr: mrs[i].0.as_ref(),
        };
        let post_recv = |l: &mut Link| {
            // SAFETY: `rbufs[i]` outlives the request, waited for below.
            unsafe { l.recv.irecv(&[rspec], false) }
                .map_err(err)?
                .ok_or_else(|| "irecv not accepted".to_string())
        };
        let (sbuf, smr) = (&sbufs[i], &mrs[i].1);
        // SAFETY: `sbuf` outlives any request, waited for below.
        let try_send = |l: &mut Link| unsafe {
            l.send
                .isend(sbuf.as_ptr(), sbuf.len(), TAG, Some(smr))
                .map_err(err)
        };
        let (s, r) = match case {
            Offered => {
                let mut r = post_recv(l)?;
                let arrived = write_counts().arrived;
                let deadline = std::time::Instant::now() + flows::WAIT;
                while write_counts().arrived == arrived {
                    check_deadline(deadline, "an offer to reach the send comm")?;
                    if Side::Recv(&mut l.recv).test(&mut r)?.is_some() {
                        return Err("a receive completed before anything was sent".into());
                    }
                }
                (send(l, TAG, sbuf, smr)?, r)
            }
            Waits => {
                if try_send(l)?.is_some() {
                    return Err(format!(
                        "send {i} went before its receive was posted: it did not wait for the offer"
                    ));
                }
                let r = post_recv(l)?;
                (send(l, TAG, sbuf, smr)?, r)
            }
            NeverOffered => {
                let t0 = std::time::Instant::now();
                let s = match try_send(l)? {
                    Some(s) => {
                        slow = Some(i - cases.iter().position(|&c| c == NeverOffered).unwrap_or(i));
                        s
                    }
                    None => send(l, TAG, sbuf, smr)?,
                };
                if t0.elapsed() > std::time::Duration::from_secs(1) {
                    return Err(format!(
                        "send {i}, whose receive is never offered, waited {:?} in isend",
                        t0.elapsed()
                    ));
                }
                (s, post_recv(l)?)
            }
        };
        if let Some(prev) = in_flight.replace(s) {
            wait(Side::Send(&mut l.send), prev)?;
        }
        let sizes = wait(Side::Recv(&mut l.recv), r)?;
        if sizes != [len(i)] {
            return Err(format!(
                "send {i}: received sizes {sizes:?}, sent {}",
                len(i)
            ));
        }
        if let Some(at) = first_mismatch(seed, i as u64, &rbufs[i][..len(i)]) {
            return Err(format!("send {i}: byte {at} of {} differs", len(i)));
        }
        if rbufs[i][len(i)..].iter().any(|&b| b != SENTINEL) {
            return Err(format!(
                "send {i}: bytes past the {} sent were written",
                len(i)
            ));
        }
        if slow.is_some() {
            break;
        }
    }
    if let Some(s) = in_flight.take() {
        wait(Side::Send(&mut l.send), s)?;
    }
    let slow = slow.ok_or(format!(
        "{SLOW_WAITS} sends in a row waited for offers that never came: the connection never \
         stopped waiting"
    ))?;
    let now = write_counts();
    let got = (
        now.writes - before.writes,
        now.missed - before.missed,
        now.waited - before.waited,
        now.expired - before.expired,
    );
    let want = (9, 1 + slow as u64, 8, slow as u64);
    if got != want {
        return Err(format!(
            "a sender ahead: (written, missed, waited, expired) = {got:?}, want {want:?}"
        ));
    }
    for (rmr, smr) in mrs {
        if let Some(m) = rmr {
            l.recv.dereg_mr(m).map_err(err)?;
        }
        l.send.dereg_mr(smr).map_err(err)?;
    }
    Ok(())
}

/// `isend` until it posts (NCCL calls again when it returns no request).
fn send(l: &mut Link, tag: i32, buf: &[u8], mr: &Mr) -> R<Request> {
    let deadline = std::time::Instant::now() + flows::WAIT;
    loop {
        // SAFETY: the caller keeps `buf` alive until the request completed.
        let posted = unsafe { l.send.isend(buf.as_ptr(), buf.len(), tag, Some(mr)) };
        if let Some(r) = posted.map_err(err)? {
            return Ok(r);
        }
        check_deadline(deadline, "isend to accept the send")?;
    }
}
