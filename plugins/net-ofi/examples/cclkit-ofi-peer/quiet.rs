//! `test` of a request that already completed must not read the completion
//! queue: NCCL tests one request per call, oldest first, so the completions of
//! later requests are usually read while an earlier one is tested, and on IP
//! providers every CQ read is a `poll(2)` system call (issue 21).

use std::time::Instant;

use cclkit_host::net::{RecvBuffer, Request};
use cclkit_net_ofi::engine::cq_reads;

use crate::flows::{self, Link, check_deadline};
use crate::net::{R, err};
use crate::pattern::Rng;

/// Messages in flight each way: NCCL_STEPS.
const IN_FLIGHT: usize = 8;
const TAG: i32 = 3;

/// Posts 8 receives and 8 sends of odd sizes with random data, waits for the
/// newest of each, then tests the older ones: each must be complete with its data
/// intact, and those tests must make no `fi_cq_read`.
///
/// Sizes stay below 1 KiB, inside every provider's eager/inject protocol, so
/// completions come in posting order (`shm` completes a larger send only when
/// the peer has copied it, which may overtake a smaller one).
pub fn completed_tests_stay_quiet(l: &mut Link, seed: u64) -> R<()> {
    let mut rng = Rng::new(seed ^ 0x9e37);
    let sizes: Vec<usize> = (0..IN_FLIGHT).map(|_| 1 + rng.below(1000)).collect();
    let sent: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&n| (0..n).map(|_| rng.below(256) as u8).collect())
        .collect();
    let mut got: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let mut recvs = Vec::with_capacity(IN_FLIGHT);
    let mut sends = Vec::with_capacity(IN_FLIGHT);
    for (buf, data) in got.iter_mut().zip(&sent) {
        let one = RecvBuffer {
            data: buf.as_mut_ptr(),
            size: buf.len(),
            tag: TAG,
            mr: None,
        };
        // SAFETY: `got` and `sent` outlive every request (all are waited for below,
        // and an error closes the process before the buffers are dropped).
        let (r, s) = unsafe {
            (
                l.recv.irecv(&[one], false).map_err(err)?,
                l.send
                    .isend(data.as_ptr(), data.len(), TAG, None)
                    .map_err(err)?,
            )
        };
        recvs.push(r.ok_or("receive not accepted")?);
        sends.push(s.ok_or("send not accepted")?);
    }
    let (mut newest_recv, mut newest_send) = (
        recvs.pop().ok_or("no receive")?,
        sends.pop().ok_or("no send")?,
    );
    wait(l, &mut newest_recv, &mut newest_send)?;
    for (i, (mut r, mut s)) in recvs.into_iter().zip(sends).enumerate() {
        let before = cq_reads();
        let done_r = l.recv.test(&mut r).map_err(err)?;
        let done_s = l.send.test(&mut s).map_err(err)?;
        let reads = cq_reads() - before;
        let sizes_r = done_r.ok_or(format!("receive {i} incomplete after a later one"))?;
        done_s.ok_or(format!("send {i} incomplete after a later one"))?;
        if reads != 0 {
            return Err(format!(
                "testing completed requests {i} read the completion queue {reads} times"
            ));
        }
        if sizes_r.as_slice() != [sizes[i]] || got[i] != sent[i] {
            return Err(format!("message {i}: wrong size or bytes"));
        }
    }
    flows::say("QUIET ok");
    Ok(())
}

/// Tests the newest receive and send until both are complete.
fn wait(l: &mut Link, r: &mut Request, s: &mut Request) -> R<()> {
    let deadline = Instant::now() + flows::WAIT;
    let (mut r_done, mut s_done) = (false, false);
    while !(r_done && s_done) {
        if !r_done {
            r_done = l.recv.test(r).map_err(err)?.is_some();
        }
        if !s_done {
            s_done = l.send.test(s).map_err(err)?.is_some();
        }
        check_deadline(deadline, "newest request of the quiet-test step")?;
    }
    Ok(())
}
