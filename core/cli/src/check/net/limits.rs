//! Request limits: NCCL_NET_MAX_REQUESTS in flight per comm, and requests recycled
//! over many transfers.

use std::time::Duration;

use super::flow::{RecvPost, Region, SendPost};
use super::setup::{self, Flow, OP_LIMIT, Ready, buffer, reg_recv, reg_send};
use crate::check::child::{Env, step};
use crate::check::raw::LeakMeter;
use crate::check::rng::Rng;
use crate::check::{Checked, fail};
use cclkit_host::net::RecvBuffer;

/// How long a post may keep returning NULL with nothing able to progress.
const POST_LIMIT: Duration = Duration::from_secs(4);

/// The version's request limit of receives of maxRecvs buffers, posted before any
/// send (as NCCL's receive proxy does), then limit x maxRecvs sends with never more
/// than the limit in flight: every post accepted (NULL retried), every byte where it
/// belongs.
pub(crate) fn inflight(env: &Env) -> Checked {
    let r = Ready::for_data(env)?;
    let n = r.max_recvs();
    let mut flow = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    let limit = flow.limit();
    let mut rng = Rng::new(env.seed, 700);
    let (mut rreg, rmr) = Region::on_recv(&mut flow.recv, limit * n * 16_384)?;
    let (mut sreg, smr) = Region::on_send(&mut flow.send, limit * n * 16_384)?;
    let mut rbufs: Vec<Vec<&'static [u8]>> = Vec::new();
    let mut recvs = Vec::new();
    for _ in 0..limit {
        let mut bufs = Vec::new();
        let mut descs = Vec::new();
        for i in 0..n {
            let b = rreg.take(rng.range(1, 16_384));
            descs.push(RecvBuffer {
                data: b.as_mut_ptr(),
                size: b.len(),
                tag: i as i32,
                mr: Some(&rmr),
            });
            bufs.push(&*b);
        }
        recvs.push(RecvPost {
            bufs: descs,
            optional: false,
        });
        rbufs.push(bufs);
    }
    let mut sent = Vec::new();
    let mut sends = Vec::new();
    for bufs in &rbufs {
        for (i, b) in bufs.iter().enumerate() {
            let len = rng.range(0, b.len());
            let data = rng.bytes(len);
            let sbuf = sreg.take(len);
            sbuf.copy_from_slice(&data);
            sends.push(SendPost {
                data: sbuf,
                tag: i as i32,
                mr: Some(&smr),
            });
            sent.push(data);
        }
    }
    step(format!(
        "{limit} receives of {n} buffers, then {} sends (at most {limit} in flight per comm)",
        limit * n
    ));
    let tokens = flow.post(&recvs, &sends, POST_LIMIT).map_err(|e| {
        e.context(&format!(
            "a comm must accept the version's NCCL_NET_MAX_REQUESTS = {limit} outstanding \
             requests"
        ))
    })?;
    let early = flow.in_flight();
    step("wait for every request");
    let done = flow.wait_ok(&tokens, OP_LIMIT * 2)?;
    for (k, bufs) in rbufs.iter().enumerate() {
        for (i, buf) in bufs.iter().enumerate() {
            let data = &sent[k * n + i];
            let got = done[k].get(i).copied().unwrap_or(usize::MAX);
            if got != data.len() || buf[..data.len()] != data[..] {
                return fail!(
                    "receive {k}, buffer {i}: {got} bytes reported for a {}-byte send, or the \
                     data differs",
                    data.len()
                );
            }
        }
    }
    drop((recvs, sends));
    flow.send.dereg_mr(smr)?;
    flow.recv.dereg_mr(rmr)?;
    flow.close()?;
    Ok(format!(
        "{limit} receives of {n} buffers, then {} sends ({} sends and {} receives still in \
         flight after the last post): every byte where it belongs",
        limit * n,
        early.0,
        early.1
    ))
}

/// Transfers one after another on one comm, far more than NCCL_NET_MAX_REQUESTS: a
/// plugin that never releases completed requests runs out (or leaks heap).
pub(crate) fn request_reuse(env: &Env) -> Checked {
    const WARMUP: usize = 64;
    const MEASURED: usize = 1024;
    let (_r, mut flow) = {
        let r = Ready::for_data(env)?;
        let f = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
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
        let recvs = [RecvPost {
            bufs: vec![RecvBuffer {
                data: rbuf.as_mut_ptr(),
                size: rbuf.len(),
                tag: 5,
                mr: Some(&rmr),
            }],
            optional: false,
        }];
        let sends = [SendPost {
            data: &sbuf[..len],
            tag: 5,
            mr: Some(&smr),
        }];
        let tokens = flow
            .post(&recvs, &sends, POST_LIMIT)
            .map_err(|e| e.context(&hint()))?;
        let done = flow
            .wait_ok(&tokens, OP_LIMIT)
            .map_err(|e| e.context(&hint()))?;
        let n = done[0].first().copied().unwrap_or(0);
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
    let flow_limit = flow.limit();
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
        (WARMUP + MEASURED) / flow_limit
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn nccl_request_limit_per_version() {
        assert_eq!(super::setup::request_limit(6), 8);
        assert_eq!(super::setup::request_limit(7), 32);
        assert_eq!(super::setup::request_limit(12), 32);
    }
}
