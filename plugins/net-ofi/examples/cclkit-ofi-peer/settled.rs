//! `settled`: a send that `test` reported complete needs no later call.
//!
//! NCCL's proxy stops calling the plugin once its requests are done (it sleeps
//! until new work comes), so a send whose bytes still wait in the provider
//! when `test` says done reaches its peer at the next collective, or never: the
//! runtime hung that way on bundled sends. The sender posts each send of a
//! burst while the one before is in flight, as the proxy posts steps (with
//! bundle slots on, sends of up to half a slot then queue, and go out when that
//! one completes), waits for every send, says `SENT` and makes no call at all
//! for [`IDLE`]. The receiver posts its receives once told `GO` (which the test
//! sends on `SENT`) or after [`LATE`], whichever comes first, and must get
//! every byte within [`WITHIN`] of posting them. The burst is larger than what
//! the kernel's socket buffers hold while the receiver is not reading, so a
//! sender that reports sends done too early goes silent with bytes it still
//! has to write.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::flows::{Link, check_deadline, fin, hear, post_one, say, send_one, wait};
use crate::net::{Abi, Net, R, Side};
use crate::pattern::{Rng, fill, first_mismatch};

/// How long the sender makes no call once its sends are done.
const IDLE: Duration = Duration::from_secs(3);
/// Longest the receiver waits for `GO` before posting its receives.
const LATE: Duration = Duration::from_secs(1);
/// How long the receiver gives the burst once its receives are posted.
const WITHIN: Duration = Duration::from_secs(2);
/// Sends in the burst: about 1.2 MB in all.
const COUNT: usize = 32;
const TAG: i32 = 9;
/// Bytes each receive has beyond its message.
const SLACK: usize = 64;
const SENTINEL: u8 = 0xa5;

/// The burst's sizes: odd, from above `ofi_rxm`'s 16 KiB eager limit (which
/// segments them) to about half a bundle slot.
fn sizes(seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed ^ 0x5e77);
    (0..COUNT)
        .map(|_| (16_400 + rng.below(44_000)) | 1)
        .collect()
}

/// One side; `seed` picks the sizes and bytes.
pub fn settled(abi: Abi, sender: bool, seed: u64) -> R<()> {
    let mut l = crate::flows::link(Net::init(abi)?)?;
    if sender {
        send_then_idle(&mut l, seed)?;
        fin(&mut l, false)?;
    } else {
        receive_late(&mut l, seed)?;
        fin(&mut l, true)?;
    }
    crate::flows::close(l)
}

fn send_then_idle(l: &mut Link, seed: u64) -> R<()> {
    let data: Vec<Vec<u8>> = sizes(seed)
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let mut b = vec![0u8; n];
            fill(seed, i as u64, &mut b);
            b
        })
        .collect();
    let mut reqs = std::collections::VecDeque::new();
    for d in &data {
        // `data` outlives the requests, all waited for below.
        reqs.push_back(send_one(l, d, TAG)?);
        if reqs.len() > 1
            && let Some(r) = reqs.pop_front()
        {
            wait(Side::Send(&mut l.send), r)?;
        }
    }
    for r in reqs {
        wait(Side::Send(&mut l.send), r)?;
    }
    say("SENT");
    std::thread::sleep(IDLE);
    Ok(())
}

fn receive_late(l: &mut Link, seed: u64) -> R<()> {
    let (tx, go) = mpsc::channel();
    // The line may never come (a sender that waits for this side first); the
    // thread then ends with the process.
    std::thread::spawn(move || {
        let _ = tx.send(hear());
    });
    match go.recv_timeout(LATE) {
        Ok(Ok(line)) if line != "GO" => return Err(format!("expected GO, got {line:?}")),
        _ => {}
    }
    let want = sizes(seed);
    let mut bufs: Vec<Vec<u8>> = want.iter().map(|&n| vec![SENTINEL; n + SLACK]).collect();
    let mut reqs = Vec::new();
    for b in &mut bufs {
        // `bufs` outlives the requests, all tested to completion below.
        reqs.push(Some(post_one(l, b, TAG)?));
    }
    let deadline = Instant::now() + WITHIN;
    let mut got = vec![usize::MAX; want.len()];
    while reqs.iter().any(Option::is_some) {
        for (i, slot) in reqs.iter_mut().enumerate() {
            if let Some(r) = slot
                && let Some(sizes) = Side::Recv(&mut l.recv).test(r)?
            {
                got[i] = sizes.first().copied().unwrap_or(usize::MAX);
                *slot = None;
            }
        }
        check_deadline(
            deadline,
            "the burst while its sender makes no call (a send reported done before \
             the provider had written it)",
        )?;
    }
    for (i, (&n, b)) in want.iter().zip(&bufs).enumerate() {
        if got[i] != n {
            return Err(format!("message {i}: received {} bytes, sent {n}", got[i]));
        }
        if let Some(at) = first_mismatch(seed, i as u64, &b[..n]) {
            return Err(format!("message {i} ({n} bytes): wrong byte at {at}"));
        }
        if b[n..].iter().any(|&x| x != SENTINEL) {
            return Err(format!("message {i}: bytes written past its {n}"));
        }
    }
    say("RECEIVED");
    Ok(())
}
