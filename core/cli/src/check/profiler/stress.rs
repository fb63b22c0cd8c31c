//! Load on a profiler: thousands of open events (a fixed pool must answer NULL when
//! full, as NCCL's example profiler does, never overrun), and event trees from
//! several threads at once (NCCL calls from user threads and proxy threads).

use cclkit_abi::profiler::{Coll, EventKind, ProxyOp};
use cclkit_host::profiler::EventHandle;

use super::super::child::{Env, step};
use super::super::{Checked, Stop, fail};
use super::tree::{Driver, summary};
use super::{finalize, init_ctx, load_profiler};

/// Collectives open at once in the pool check.
const OPEN_COLLS: usize = 512;
/// Steps open per collective (NCCL_STEPS).
const OPEN_STEPS: i32 = 8;

pub(super) fn pool(env: &Env) -> Checked {
    let (p, _dir) = load_profiler(env)?;
    let ctx = init_ctx(&p, 0xc0ff_ee00_0000_0005, 0)?;
    let mut d = Driver::new(&ctx, false);
    let none = EventHandle::NULL;
    step(format!(
        "open {OPEN_COLLS} Coll events with a ProxyOp and {OPEN_STEPS} ProxySteps each"
    ));
    let group = d.start(EventKind::Group, none, none)?;
    let mut open: Vec<(EventHandle, EventHandle, Vec<EventHandle>)> = Vec::new();
    for seq in 0..OPEN_COLLS {
        let coll = d.start(EventKind::Coll(coll(seq as u64)), group, group)?;
        let op = d.start(
            EventKind::ProxyOp(ProxyOp {
                pid: i32::try_from(std::process::id()).unwrap_or(0),
                channel_id: (seq % 32) as u8,
                peer: 1,
                n_steps: OPEN_STEPS,
                chunk_size: 4096,
                is_send: seq % 2 == 0,
            }),
            coll,
            none,
        )?;
        let mut steps = Vec::new();
        for n in 0..OPEN_STEPS {
            steps.push(d.start(EventKind::ProxyStep { step: n }, op, none)?);
        }
        open.push((coll, op, steps));
    }
    let first_accepted = open.first().is_some_and(|(c, _, _)| !c.is_null());
    step("stop every open event, newest first");
    for (coll, op, steps) in open.into_iter().rev() {
        for s in steps.into_iter().rev() {
            d.stop(s, "ProxyStep")?;
        }
        d.stop(op, "ProxyOp")?;
        d.stop(coll, "Coll")?;
    }
    d.stop(group, "Group")?;
    // Everything is stopped, so the pool is free again: a profiler that accepted
    // the first collective but declines one now does not return stopped events.
    step("one more collective after every event was stopped");
    let again = d.start(EventKind::Coll(coll(OPEN_COLLS as u64)), none, none)?;
    d.stop(again, "Coll")?;
    if first_accepted && again.is_null() {
        return fail!(
            "the first of {OPEN_COLLS} open collectives was accepted, but a collective \
             started after all of them were stopped got a NULL handle: stopped events \
             are not returned to the pool"
        );
    }
    d.collective(env.version, OPEN_COLLS as u64 + 1, 4096)?;
    finalize(&ctx)?;
    Ok(summary(&d.tally))
}

fn coll(seq: u64) -> Coll<'static> {
    Coll {
        seq_number: seq,
        func: Some("AllReduce"),
        send_buff: 0x1000,
        recv_buff: 0x2000,
        count: 1024,
        root: -1,
        datatype: Some("ncclFloat32"),
        n_channels: 1,
        n_warps: 16,
        algo: Some("RING"),
        proto: Some("SIMPLE"),
        comm_name: Some("cclkit-check"),
        comm_hash: Some(0x5eed),
        traffic_bytes: Some(8192),
        red_op: Some(0),
        kernel_variant: None,
        is_sym_coll: Some(false),
        user_tag: None,
    }
}

/// Threads driving event trees at once.
const THREADS: usize = 4;
/// Collectives per thread.
const PER_THREAD: u64 = 16;

pub(super) fn threads(env: &Env) -> Checked {
    let (p, _dir) = load_profiler(env)?;
    let ctx = init_ctx(&p, 0xc0ff_ee00_0000_0006, 0)?;
    step(format!("{THREADS} threads, {PER_THREAD} collectives each"));
    let results: Vec<Result<String, Stop>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let ctx = &ctx;
                s.spawn(move || {
                    let mut d = Driver::new(ctx, false);
                    for i in 0..PER_THREAD {
                        d.collective(env.version, t as u64 * PER_THREAD + i, 1024 * (t + 1))?;
                    }
                    Ok(summary(&d.tally))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Stop::Fail("a driver thread panicked".into())))
            })
            .collect()
    });
    let mut first = None;
    for r in results {
        let s = r?;
        first.get_or_insert(s);
    }
    finalize(&ctx)?;
    Ok(format!(
        "{THREADS} threads at once; per thread: {}",
        first.unwrap_or_default()
    ))
}
