//! Robustness probes: calls NCCL never makes (§2.11b "Things NCCL never does"). A
//! plugin may rely on NCCL's discipline, so a failure here is a WARN, and a FAIL only
//! under `--strict`.

use std::time::{Duration, Instant};

use super::flow::{RecvPost, SendPost};
use super::setup::{self, Flow, OP_LIMIT, Ready, buffer, reg_recv, reg_send};
use crate::check::child::{Env, step};
use crate::check::rng::Rng;
use crate::check::{Checked, Stop, fail};
use cclkit_host::net::RecvBuffer;

/// How long the newest request may take while only it is tested.
const NEWEST_LIMIT: Duration = Duration::from_secs(3);

/// Two messages of different sizes in flight on one connection; the newest receive
/// and send are tested first, until they complete, and only then the older ones.
pub(crate) fn out_of_order(env: &Env) -> Checked {
    let r = Ready::for_data(env)?;
    let (mut send, mut recv) = setup::pair(&r.ctx, &r.ctx, 0)?;
    let mut rng = Rng::new(env.seed, 1100);
    let msgs = [rng.bytes(3001), rng.bytes(7013)];
    let room = 8192;
    let mut sbufs: Vec<&'static mut [u8]> = msgs
        .iter()
        .map(|m| {
            let b = buffer(m.len());
            b.copy_from_slice(m);
            b
        })
        .collect();
    let mut rbufs: Vec<&'static mut [u8]> = (0..2).map(|_| buffer(room)).collect();
    let smrs = [
        reg_send(&mut send, &mut *sbufs[0])?,
        reg_send(&mut send, &mut *sbufs[1])?,
    ];
    let rmrs = [
        reg_recv(&mut recv, &mut *rbufs[0])?,
        reg_recv(&mut recv, &mut *rbufs[1])?,
    ];
    step("post 2 receives and 2 sends of 3001 and 7013 bytes");
    let descs: Vec<[RecvBuffer<'_>; 1]> = rbufs
        .iter()
        .zip(&rmrs)
        .map(|(b, mr)| {
            [RecvBuffer {
                data: b.as_ptr().cast_mut(),
                size: room,
                tag: 9,
                mr: Some(mr),
            }]
        })
        .collect();
    let (mut rreqs, mut sreqs) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + OP_LIMIT;
    // Receives first; a NULL request is retried after trying the other side.
    while rreqs.len() < 2 || sreqs.len() < 2 {
        if let Some(d) = descs.get(rreqs.len())
            // SAFETY: registered buffers that live for the process.
            && let Some(r) = unsafe { recv.irecv(d, false) }?
        {
            rreqs.push(r);
            continue;
        }
        if let Some(b) = sbufs.get(sreqs.len())
            // SAFETY: as above.
            && let Some(r) = unsafe { send.isend(b.as_ptr(), b.len(), 9, Some(&smrs[sreqs.len()])) }?
        {
            sreqs.push(r);
            continue;
        }
        if Instant::now() > deadline {
            return fail!(
                "isend/irecv kept returning NULL for {} s ({} receives and {} sends posted)",
                OP_LIMIT.as_secs(),
                rreqs.len(),
                sreqs.len()
            );
        }
        std::thread::yield_now();
    }
    step("test the newest receive and send until they complete");
    let deadline = Instant::now() + NEWEST_LIMIT;
    let (mut rdone, mut sdone) = (None, None);
    while rdone.is_none() || sdone.is_none() {
        if sdone.is_none() {
            sdone = send.test(&mut sreqs[1]).map_err(Stop::from)?;
        }
        if rdone.is_none() {
            rdone = recv.test(&mut rreqs[1]).map_err(|e| {
                Stop::Fail(format!(
                    "testing the newest receive before the oldest failed: {e} (NCCL tests \
                     only the oldest request of a comm)"
                ))
            })?;
        }
        if Instant::now() > deadline {
            return fail!(
                "the newest {} did not complete within {} s while only it was tested: the \
                 plugin progresses only the oldest request (NCCL tests only the oldest)",
                if rdone.is_none() { "receive" } else { "send" },
                NEWEST_LIMIT.as_secs()
            );
        }
        std::thread::yield_now();
    }
    step("then the oldest");
    let deadline = Instant::now() + OP_LIMIT;
    let (mut r0, mut s0) = (None, None);
    while r0.is_none() || s0.is_none() {
        if s0.is_none() {
            s0 = send.test(&mut sreqs[0]).map_err(Stop::from)?;
        }
        if r0.is_none() {
            r0 = recv.test(&mut rreqs[0]).map_err(Stop::from)?;
        }
        if Instant::now() > deadline {
            return fail!("the oldest requests did not complete after the newest");
        }
        std::thread::yield_now();
    }
    for (i, (m, got)) in msgs.iter().zip([r0, rdone]).enumerate() {
        let n = got.map_or(0, |s| s.as_slice().first().copied().unwrap_or(0));
        if n != m.len() || rbufs[i][..m.len()] != m[..] {
            return fail!(
                "tested newest first, receive {i} reported {n} bytes for a {}-byte message, or \
                 its data is another message's",
                m.len()
            );
        }
    }
    for m in smrs {
        send.dereg_mr(m)?;
    }
    for m in rmrs {
        recv.dereg_mr(m)?;
    }
    drop((send, recv));
    Ok(
        "2 messages in flight; the newest receive and send completed when tested first, and \
        each receive held its own message"
            .into(),
    )
}

/// Transfers posted with a NULL `mhandle` on both sides (NCCL always passes one).
pub(crate) fn null_mhandle(env: &Env) -> Checked {
    let r = Ready::for_data(env)?;
    let mut flow = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    let mut rng = Rng::new(env.seed, 1200);
    for len in [0usize, 1, 4099, 65_536] {
        step(format!("isend/irecv of {len} B with a NULL mhandle"));
        let data = rng.bytes(len);
        let sbuf = buffer(len);
        sbuf.copy_from_slice(&data);
        let rbuf = buffer(len);
        let recvs = [RecvPost {
            bufs: vec![RecvBuffer {
                data: rbuf.as_mut_ptr(),
                size: len,
                tag: 10,
                mr: None,
            }],
            optional: false,
        }];
        let sends = [SendPost {
            data: sbuf,
            tag: 10,
            mr: None,
        }];
        let t = flow.post(&recvs, &sends, OP_LIMIT)?;
        let done = flow.wait_ok(&t, OP_LIMIT)?;
        let n = done[0].first().copied().unwrap_or(0);
        if n != len || rbuf[..] != data[..] {
            return fail!("a {len}-byte transfer with NULL mhandles arrived wrong ({n} bytes)");
        }
    }
    flow.close()?;
    Ok("4 transfers (0 B … 64 KiB) posted with NULL mhandles arrived intact".into())
}
