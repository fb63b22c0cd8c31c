//! Probe `test-after-close`: `test` on requests that `ncclCommAbort` left behind.
//!
//! NCCL's abort path (`sendProxyFree`/`recvProxyFree` in net.cc) deregisters the
//! buffers and closes the comms with requests still in flight, and never tests those
//! requests again. A plugin may therefore keep its requests inside the comm and free
//! them with it (NCCL's own socket and IB transports do). A host that is not NCCL may
//! still test such a request, first after `deregMr`, then after the close; this probe
//! does both and wants every call to return at once without crashing, and no receive
//! to report success although nothing was ever sent to it.
//!
//! The adapter refuses a `test` through a closed comm, so the second stage calls the
//! table's `test` slot itself, with the request pointer the plugin returned.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use super::setup::{self, CALL_LIMIT, Flow, Ready, buffer, reg_recv, reg_send};
use super::timing::timed;
use crate::check::child::{Env, step, within};
use crate::check::rng::Rng;
use crate::check::{Checked, Stop, fail};
use cclkit_host::error::NetError;
use cclkit_host::logger;
use cclkit_host::net::table::common_slot;
use cclkit_host::net::{NetShared, RecvBuffer, Request, Sizes};

/// Receives posted with no send (and sends with no receive), at most.
const POSTS: usize = 4;
/// Bytes of each receive.
const RECV_LEN: usize = 65_536;
/// Bytes of each send: more than a loopback socket buffers, so it stays in flight.
const SEND_LEN: usize = 4 << 20;

/// What one `test` of an abandoned request returned.
enum Tested {
    Pending,
    Done,
    Error(String),
}

impl Tested {
    fn label(&self) -> &'static str {
        match self {
            Tested::Pending => "pending",
            Tested::Done => "done",
            Tested::Error(_) => "an error",
        }
    }
}

/// Posts receives with no send and sends with no receive, polls them as the proxy
/// does, deregisters their memory and tests them once, closes their comms and tests
/// them once more through the raw table.
pub(crate) fn test_after_close(env: &Env) -> Checked {
    let r = Ready::for_data(env)?;
    let mut a = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    let mut b = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    step(format!(
        "post up to {POSTS} receives with no send and {POSTS} sends with no receive"
    ));
    let rbuf = buffer(POSTS * RECV_LEN);
    let rmr = reg_recv(&mut a.recv, rbuf)?;
    let sbuf = buffer(SEND_LEN);
    sbuf.fill(0x5C);
    let smr = reg_send(&mut b.send, sbuf)?;
    let (mut recvs, mut sends): (Vec<Request>, Vec<Request>) = (Vec::new(), Vec::new());
    for k in 0..POSTS {
        let desc = [RecvBuffer {
            data: rbuf[k * RECV_LEN..].as_mut_ptr(),
            size: RECV_LEN,
            tag: 8,
            mr: Some(&rmr),
        }];
        // "Not now" until the peer sends is fine (UCX-style): a few tries each.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(100) {
            // SAFETY: a registered buffer that lives for the process (`buffer`).
            if let Some(q) = timed("irecv", || unsafe { a.recv.irecv(&desc, false) })?? {
                recvs.push(q);
                break;
            }
        }
        // SAFETY: as above; the send buffer is never written again.
        if let Some(q) = timed("isend", || unsafe {
            b.send.isend(sbuf.as_ptr(), SEND_LEN, 8, Some(&smr))
        })?? {
            sends.push(q);
        }
    }
    step("poll the oldest requests, as the proxy does while it waits");
    for _ in 0..50 {
        poll_oldest(&mut recvs, |q| timed("test (receive)", || a.recv.test(q)))?;
        poll_oldest(&mut sends, |q| timed("test (send)", || b.send.test(q)))?;
    }
    let (nr, ns) = (recvs.len(), sends.len());
    step("deregMr with the requests in flight");
    within(CALL_LIMIT, setup::blocked("deregMr"), || {
        a.recv.dereg_mr(rmr)
    })?;
    within(CALL_LIMIT, setup::blocked("deregMr"), || {
        b.send.dereg_mr(smr)
    })?;
    step("test each request once after deregMr");
    let mut after_dereg = Vec::new();
    for (i, q) in recvs.iter_mut().enumerate() {
        let t = within(CALL_LIMIT, setup::blocked("test after deregMr"), || {
            timed("test after deregMr", || a.recv.test(q))
        })?;
        let t = tested(t.map(|s| s.is_some()).map_err(|e| e.to_string()));
        if matches!(t, Tested::Done) {
            return fail!(
                "after deregMr, receive {i} reported success although nothing was ever sent \
                 to it"
            );
        }
        after_dereg.push(t);
    }
    for q in sends.iter_mut() {
        let t = within(CALL_LIMIT, setup::blocked("test after deregMr"), || {
            timed("test after deregMr", || b.send.test(q))
        })?;
        after_dereg.push(tested(t.map(|s| s.is_some()).map_err(|e| e.to_string())));
    }
    // A request that ended (done or failed) is over: NCCL never tests it again.
    let open_recvs: Vec<&Request> = recvs.iter().filter(|q| !q.is_done()).collect();
    let open_sends: Vec<&Request> = sends.iter().filter(|q| !q.is_done()).collect();
    step("close the comms with the requests in flight");
    // Memory the close frees is filled with a pattern from now on, so a plugin that
    // reads a freed request gets garbage instead of the stale values that happened to
    // remain (glibc's M_PERTURB; small blocks kept in a thread cache are not filled).
    // SAFETY: mallopt only changes an allocator setting.
    unsafe { libc::mallopt(libc::M_PERTURB, 0xA7) };
    let shared = std::sync::Arc::clone(&r.ctx.inner.plugin.shared);
    let Flow { send, recv, .. } = a;
    within(CALL_LIMIT, setup::blocked("closeRecv"), || recv.close())?;
    within(CALL_LIMIT, setup::blocked("closeSend"), || send.close())?;
    let Flow { send, recv, .. } = b;
    within(CALL_LIMIT, setup::blocked("closeSend"), || send.close())?;
    within(CALL_LIMIT, setup::blocked("closeRecv"), || recv.close())?;
    step(format!(
        "test {} receives and {} sends after their comm was closed",
        open_recvs.len(),
        open_sends.len()
    ));
    let mut after_close = Vec::new();
    for (i, q) in open_recvs.iter().enumerate() {
        let t = raw_test(&shared, q)?;
        if matches!(t, Tested::Done) {
            return fail!(
                "after closeRecv, receive {i} reported success although nothing was ever sent \
                 to it"
            );
        }
        after_close.push(t);
    }
    for q in &open_sends {
        after_close.push(raw_test(&shared, q)?);
    }
    step("a new connection on the same context");
    let mut c = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    let data = Rng::new(env.seed, 1400).bytes(12_345);
    let (got, _, n) = setup::transfer(&mut c, &data, data.len(), 8, false)?;
    if n != data.len() || got[..data.len()] != data[..] {
        return fail!(
            "after requests of closed comms were tested, a new connection delivered wrong data"
        );
    }
    c.close()?;
    Ok(format!(
        "{nr} receives and {ns} sends left in flight: tested after deregMr ({}), then {} \
         tested after their comm was closed ({}); every call returned at once and a new \
         connection then worked",
        summary(&after_dereg),
        after_close.len(),
        summary(&after_close)
    ))
}

/// Tests the oldest request of `reqs` until one is still pending; drops the ended ones.
fn poll_oldest(
    reqs: &mut Vec<Request>,
    mut test: impl FnMut(&mut Request) -> Result<Result<Option<Sizes>, NetError>, Stop>,
) -> Result<(), Stop> {
    while let Some(q) = reqs.first_mut() {
        match test(q)? {
            Ok(None) => return Ok(()),
            // Ended (completed, or failed because nothing matched): not in flight.
            Ok(Some(_)) | Err(_) => {
                reqs.remove(0);
            }
        }
    }
    Ok(())
}

fn tested(r: Result<bool, String>) -> Tested {
    match r {
        Ok(false) => Tested::Pending,
        Ok(true) => Tested::Done,
        Err(e) => Tested::Error(e),
    }
}

/// `test(request, &done, sizes)` through the table, for a request whose comm is closed.
fn raw_test(s: &NetShared, q: &Request) -> Result<Tested, Stop> {
    let f = common_slot!(s.raw, test).ok_or_else(|| Stop::Fail("test is NULL".into()))?;
    let mut done: c_int = 0;
    // NCCL passes an int[64] for receives (NCCL_NET_MAX_RECVS); sends write one.
    let mut sizes = [0 as c_int; 64];
    let mark = logger::warn_mark();
    let raw = q.as_raw();
    let rc = within(CALL_LIMIT, setup::blocked("test after close"), || {
        timed("test after close", || {
            // SAFETY: the request pointer this plugin returned, with a writable done
            // flag and a 64-entry sizes array: the call shape NCCL uses. That its comm
            // is closed is the point of the probe; the check runs in its own process.
            unsafe { f(raw, &mut done, sizes.as_mut_ptr()) }
        })
    })?;
    Ok(match s.check("test", mark, rc) {
        Err(e) => Tested::Error(e.to_string()),
        Ok(()) if done != 0 => Tested::Done,
        Ok(()) => Tested::Pending,
    })
}

/// "2 pending, 1 an error: …" (or "none").
fn summary(ts: &[Tested]) -> String {
    let mut parts = Vec::new();
    for label in ["pending", "done", "an error"] {
        let n = ts.iter().filter(|t| t.label() == label).count();
        if n > 0 {
            parts.push(format!("{n} {label}"));
        }
    }
    let first_error = ts.iter().find_map(|t| match t {
        Tested::Error(e) => Some(e.as_str()),
        _ => None,
    });
    match (parts.is_empty(), first_error) {
        (true, _) => "none".into(),
        (false, Some(e)) => format!("{}: {e}", parts.join(", ")),
        (false, None) => parts.join(", "),
    }
}
