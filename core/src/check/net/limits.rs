//! Request limits: NCCL_NET_MAX_REQUESTS in flight per comm, and requests recycled
//! over many transfers.

use std::time::Duration;

use super::setup::{self, Flow, OP_LIMIT, Ready, buffer, reg_recv, reg_send};
use crate::check::child::{Env, step};
use crate::check::raw::LeakMeter;
use crate::check::rng::Rng;
use crate::check::{Checked, fail};
use crate::plugin::net::RecvBuffer;

/// NCCL_NET_MAX_REQUESTS: requests NCCL may have outstanding on one comm.
const MAX_REQUESTS: usize = cclkit_abi::raw::net::NCCL_NET_MAX_REQUESTS;

/// How long a post may keep returning NULL with nothing able to progress.
const POST_LIMIT: Duration = Duration::from_secs(4);

/// 32 receives of maxRecvs buffers posted before any send, then 32 × maxRecvs sends:
/// every post accepted (NULL retried), every byte where it belongs.
pub(crate) fn inflight(env: &Env) -> Checked {
    let r = Ready::for_data(env)?;
    let n = r.max_recvs();
    let mut flow = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?);
    let mut rng = Rng::new(env.seed, 700);
    let mut rbufs: Vec<Vec<&'static mut [u8]>> = Vec::new();
    let mut rtokens = Vec::new();
    step(format!(
        "{MAX_REQUESTS} receives of {n} buffers, no send posted"
    ));
    for k in 0..MAX_REQUESTS {
        let bufs: Vec<&'static mut [u8]> = (0..n).map(|_| buffer(rng.range(1, 16_384))).collect();
        let descs: Vec<RecvBuffer<'_>> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| RecvBuffer {
                data: b.as_ptr().cast_mut(),
                size: b.len(),
                tag: i as i32,
                mr: None,
            })
            .collect();
        let t = flow.irecv(&descs, false, POST_LIMIT).map_err(|e| {
            e.context(&format!(
                "receive {} with {k} receives in flight and no send posted (a comm must accept \
                 NCCL_NET_MAX_REQUESTS = {MAX_REQUESTS} outstanding requests)",
                k + 1
            ))
        })?;
        rtokens.push(t);
        rbufs.push(bufs);
    }
    let mut sent = Vec::new();
    let mut stokens = Vec::new();
    let mut most = 0;
    step(format!(
        "{} sends ({MAX_REQUESTS} x maxRecvs {n})",
        MAX_REQUESTS * n
    ));
    let rooms: Vec<Vec<usize>> = rbufs
        .iter()
        .map(|bufs| bufs.iter().map(|b| b.len()).collect())
        .collect();
    for (k, room) in rooms.iter().enumerate() {
        for (i, &cap) in room.iter().enumerate() {
            let len = rng.range(0, cap);
            let data = rng.bytes(len);
            let sbuf = buffer(len);
            sbuf.copy_from_slice(&data);
            let t = flow.isend(sbuf, i as i32, None, POST_LIMIT).map_err(|e| {
                e.context(&format!(
                    "send {} of {} (a send comm must accept {MAX_REQUESTS} x maxRecvs outstanding \
                     sends)",
                    k * n + i + 1,
                    MAX_REQUESTS * n
                ))
            })?;
            most = most.max(flow.in_flight().0);
            stokens.push(t);
            sent.push(data);
        }
    }
    step("wait for every request");
    let rdone = flow.wait_ok(&rtokens, OP_LIMIT * 2)?;
    flow.wait_ok(&stokens, OP_LIMIT)?;
    for (k, bufs) in rbufs.iter().enumerate() {
        for (i, buf) in bufs.iter().enumerate() {
            let data = &sent[k * n + i];
            let got = rdone[k].get(i).copied().unwrap_or(usize::MAX);
            if got != data.len() || buf[..data.len()] != data[..] {
                return fail!(
                    "receive {k}, buffer {i}: {got} bytes reported for a {}-byte send, or the \
                     data differs",
                    data.len()
                );
            }
        }
    }
    flow.close()?;
    Ok(format!(
        "{MAX_REQUESTS} receives of {n} buffers outstanding before any send, then {} sends \
         (up to {most} in flight at once): every byte where it belongs",
        MAX_REQUESTS * n
    ))
}

/// Transfers one after another on one comm, far more than NCCL_NET_MAX_REQUESTS: a
/// plugin that never releases completed requests runs out (or leaks heap).
pub(crate) fn request_reuse(env: &Env) -> Checked {
    const WARMUP: usize = 64;
    const MEASURED: usize = 1024;
    let (_r, mut flow) = {
        let r = Ready::for_data(env)?;
        let f = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?);
        (r, f)
    };
    let mut rng = Rng::new(env.seed, 800);
    let sbuf = buffer(4096);
    let rbuf = buffer(4096);
    let smr = reg_send(&mut flow.send, sbuf)?;
    let rmr = reg_recv(&mut flow.recv, rbuf)?;
    let mut meter = None;
    step(format!("{} transfers one after another", WARMUP + MEASURED));
    for i in 0..WARMUP + MEASURED {
        if i == WARMUP {
            meter = Some(LeakMeter::start(MEASURED / 4));
        }
        let len = rng.range(1, 4096);
        let fill = (i % 251) as u8;
        sbuf[..len].fill(fill);
        let hint = || {
            format!(
                "transfer {} (after {i} completed, nothing else in flight): completed requests \
                 must be released by test() so they can be reused",
                i + 1
            )
        };
        let rt = flow
            .irecv(
                &[RecvBuffer {
                    data: rbuf.as_mut_ptr(),
                    size: rbuf.len(),
                    tag: 5,
                    mr: Some(&rmr),
                }],
                false,
                POST_LIMIT,
            )
            .map_err(|e| e.context(&hint()))?;
        let st = flow
            .isend(&sbuf[..len], 5, Some(&smr), POST_LIMIT)
            .map_err(|e| e.context(&hint()))?;
        let done = flow
            .wait_ok(&[st, rt], OP_LIMIT)
            .map_err(|e| e.context(&hint()))?;
        let n = done[1].first().copied().unwrap_or(0);
        if n != len || rbuf[..len].iter().any(|&b| b != fill) {
            return fail!(
                "transfer {}: {n} bytes reported for {len}, or wrong data",
                i + 1
            );
        }
        if let Some(m) = meter.as_mut() {
            m.tick(i + 1 - WARMUP);
        }
    }
    let (grown, leak) = meter.map_or((0, None), |m| (m.total(), m.steady_leak(32)));
    flow.send.dereg_mr(smr)?;
    flow.recv.dereg_mr(rmr)?;
    flow.close()?;
    if let Some(per) = leak {
        return fail!(
            "the heap grew by {grown} bytes over {MEASURED} completed transfers (~{per} bytes each, \
             in every quarter): completed requests are not freed"
        );
    }
    Ok(format!(
        "{} transfers ({}x NCCL_NET_MAX_REQUESTS) one after another; heap in use grew by {grown} \
         bytes over the last {MEASURED}",
        WARMUP + MEASURED,
        (WARMUP + MEASURED) / MAX_REQUESTS
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn nccl_request_limit() {
        assert_eq!(super::MAX_REQUESTS, 32);
    }
}
