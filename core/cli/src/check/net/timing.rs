//! Calls that must not block: NCCL makes every setup and data call from a thread that
//! polls many connections (§2.11b "Threads"), so one call that sleeps stalls them all.
//!
//! A call is timed by how long its thread was *blocked* (off the CPU and not waiting
//! for it), read from `/proc/thread-self/schedstat`: on a loaded machine a thread
//! that was merely preempted is not blamed. Where that file is missing, wall time is
//! used.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use super::setup::{self, CALL_LIMIT, Ready, blocked};
use crate::check::child::{Env, step, within};
use crate::check::{Checked, Stop, fail};

/// Longest a setup or data call may keep its thread blocked.
pub(crate) const BLOCK_LIMIT: Duration = Duration::from_millis(100);

thread_local! {
    static SCHEDSTAT: Option<File> = File::open("/proc/thread-self/schedstat").ok();
}

/// Nanoseconds this thread ran and waited for a CPU, if the kernel reports them.
fn on_cpu_or_runnable() -> Option<u64> {
    SCHEDSTAT.with(|f| {
        let f = f.as_ref()?;
        let mut buf = [0u8; 96];
        let n = f.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let mut it = text.split_whitespace().map(|x| x.parse::<u64>().ok());
        Some(it.next()??.saturating_add(it.next()??))
    })
}

/// Time `f` kept this thread blocked (wall time less time running or runnable).
pub(crate) fn blocked_time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let (t0, s0) = (Instant::now(), on_cpu_or_runnable());
    let r = f();
    let wall = t0.elapsed();
    let busy = match (s0, on_cpu_or_runnable()) {
        (Some(a), Some(b)) => Duration::from_nanos(b.saturating_sub(a)),
        _ => Duration::ZERO,
    };
    (r, wall.saturating_sub(busy))
}

/// Runs one plugin call `call` and fails when it blocked longer than [`BLOCK_LIMIT`].
pub(crate) fn timed<T>(call: &str, f: impl FnOnce() -> T) -> Result<T, Stop> {
    let (r, b) = blocked_time(f);
    if b > BLOCK_LIMIT {
        return fail!(
            "{call} blocked for {} ms (limit {} ms): NCCL calls it from a thread that polls \
             every connection, so it must return at once and let NCCL call again",
            b.as_millis(),
            BLOCK_LIMIT.as_millis()
        );
    }
    Ok(r)
}

/// `accept` on a fresh listen comm, before anyone connects, returns at once with no
/// comm; then connect and accept complete with every call timed.
pub(crate) fn accept_first(env: &Env) -> Checked {
    let r = Ready::new(env)?;
    step("listen");
    let (handle, mut listen) = r.ctx.listen(0)?;
    step("accept before any connect");
    let first = within(CALL_LIMIT, blocked("accept"), || {
        timed("accept before any connect", || listen.accept())
    })??;
    if first.is_some() {
        return fail!("accept returned a receive comm although nobody had connected");
    }
    step("connect/accept, every call timed");
    let mut connecting = r.ctx.connect(0, &handle);
    let (mut send, mut recv, mut calls) = (None, None, 1u32);
    let deadline = Instant::now() + setup::OP_LIMIT;
    let mut listen = Some(listen);
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            calls += 1;
            send = within(CALL_LIMIT, blocked("connect"), || {
                timed("connect", || connecting.poll())
            })??;
        }
        if recv.is_none()
            && let Some(l) = listen.as_mut()
        {
            calls += 1;
            recv = within(CALL_LIMIT, blocked("accept"), || {
                timed("accept", || l.accept())
            })??;
            if recv.is_some()
                && let Some(l) = listen.take()
            {
                within(CALL_LIMIT, blocked("closeListen"), || l.close())?;
            }
        }
        if Instant::now() > deadline {
            return fail!(
                "no connection within {} s after accept was called first",
                setup::OP_LIMIT.as_secs()
            );
        }
        std::thread::yield_now();
    }
    if let Some(s) = send {
        within(CALL_LIMIT, blocked("closeSend"), || s.close())?;
    }
    if let Some(rc) = recv {
        within(CALL_LIMIT, blocked("closeRecv"), || rc.close())?;
    }
    Ok(format!(
        "accept before any connect returned at once with no comm; {calls} connect/accept calls, \
         none blocked longer than {} ms",
        BLOCK_LIMIT.as_millis()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeping_counts_as_blocked_and_spinning_does_not() {
        let ((), slept) = blocked_time(|| std::thread::sleep(Duration::from_millis(150)));
        assert!(slept >= Duration::from_millis(140), "{slept:?}");
        let start = Instant::now();
        let ((), spun) = blocked_time(|| while start.elapsed() < Duration::from_millis(150) {});
        if on_cpu_or_runnable().is_some() {
            assert!(spun < Duration::from_millis(100), "{spun:?}");
        }
        let Err(Stop::Fail(m)) = timed("accept", || std::thread::sleep(Duration::from_millis(130)))
        else {
            panic!("a 130 ms sleep was not reported");
        };
        assert!(m.starts_with("accept blocked for 1"), "{m}");
    }
}
