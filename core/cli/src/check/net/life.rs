//! Lifecycle checks: closing with requests in flight, dlclose and reload, and the
//! two-process variants (loopback, network namespaces).

use std::process::Command;
use std::time::{Duration, Instant};

use super::setup::{self, CALL_LIMIT, Flow, Ready, blocked, buffer};
use crate::check::child::{Env, step, within};
use crate::check::netns::{self, Netns};
use crate::check::rng::Rng;
use crate::check::{Checked, Stop, fail, load, peer};
use cclkit_host::library::is_loaded;
use cclkit_host::net::RecvBuffer;

/// Teardown as `ncclCommAbort` does it: receives with no sends, and sends with no
/// receives, are in flight (polled, never completed) when their registrations are
/// released and their comms closed, without a further `test`. Every call returns
/// promptly and succeeds, and the context still makes new connections afterwards.
pub(crate) fn close_inflight(env: &Env) -> Checked {
    let r = Ready::for_data(env)?;
    let mut a = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    let mut b = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    let posts = a.limit().min(8);
    step(format!(
        "{posts} registered receives posted with no matching send"
    ));
    let rbuf = buffer(posts * 65_536);
    let rmr = setup::reg_recv(&mut a.recv, rbuf)?;
    let mut recvs = 0;
    for k in 0..posts {
        let desc = [RecvBuffer {
            data: rbuf[k * 65_536..].as_mut_ptr(),
            size: 65_536,
            tag: 6,
            mr: Some(&rmr),
        }];
        // A plugin may answer "not now" until the peer sends (UCX does): a few tries.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(200) {
            if a.try_irecv(&desc, false)?.is_some() {
                recvs += 1;
                break;
            }
            a.progress()?;
        }
    }
    step("2 registered sends of 4 MiB posted with no receive");
    let big = buffer(4 << 20);
    big.fill(0x3C);
    let smr = setup::reg_send(&mut b.send, big)?;
    let mut sends = 0;
    for _ in 0..2 {
        // A plugin may refuse ("not now") a send without a receive; that is fine here.
        if b.try_isend(big, 6, Some(&smr))?.is_some() {
            sends += 1;
        }
    }
    step("poll the oldest requests, as the proxy does while it waits");
    for _ in 0..100 {
        a.progress()?;
        b.progress()?;
    }
    let (ar, bs) = (a.in_flight().1, b.in_flight().0);
    step("deregMr with requests in flight");
    within(
        CALL_LIMIT,
        blocked("deregMr with receives in flight"),
        || a.recv.dereg_mr(rmr),
    )
    .map_err(|e| Stop::from(e).context(&format!("deregMr with {ar} receives in flight")))?;
    within(CALL_LIMIT, blocked("deregMr with sends in flight"), || {
        b.send.dereg_mr(smr)
    })
    .map_err(|e| Stop::from(e).context(&format!("deregMr with {bs} sends in flight")))?;
    step("close the comms with requests in flight");
    let Flow { send, recv, .. } = a;
    within(
        CALL_LIMIT,
        blocked("closeRecv with receives in flight"),
        || recv.close(),
    )
    .map_err(|e| Stop::from(e).context(&format!("closeRecv with {ar} receives in flight")))?;
    within(CALL_LIMIT, blocked("closeSend"), || send.close())?;
    let Flow { send, recv, .. } = b;
    within(
        CALL_LIMIT,
        blocked("closeSend with sends in flight"),
        || send.close(),
    )
    .map_err(|e| Stop::from(e).context(&format!("closeSend with {bs} sends in flight")))?;
    within(CALL_LIMIT, blocked("closeRecv"), || recv.close())?;
    step("a new connection on the same context");
    let mut c = Flow::new(setup::pair(&r.ctx, &r.ctx, 0)?, env.version);
    let data = Rng::new(env.seed, 900).bytes(10_000);
    let (got, _, n) = setup::transfer(&mut c, &data, data.len(), 6, false)?;
    if n != data.len() || got != data {
        return fail!(
            "after closing comms with requests in flight, a new connection delivered wrong data"
        );
    }
    c.close()?;
    let Ready { ctx, .. } = r;
    step("finalize");
    within(CALL_LIMIT, blocked("finalize"), || ctx.finalize())?;
    Ok(format!(
        "deregistered and closed a receive comm with {ar} of {recvs} receives and a send comm \
         with {bs} of {sends} sends in flight, never tested again; a new connection then worked"
    ))
}

/// Load, init, transfer, finalize and dlclose three times: the plugin must come back
/// from a reload (NCCL unloads it when the last communicator is destroyed).
pub(crate) fn reload(env: &Env) -> Checked {
    let mut unloaded = 0;
    let mut stayed_mapped = false;
    for round in 1..=3 {
        step(format!("round {round}: dlopen, init, transfer"));
        let lib = load::open(&env.library).map_err(Stop::Fail)?;
        let plugin = load::net(&lib, env.version).map_err(Stop::Fail)?;
        drop(lib);
        let ctx =
            if round == 1 {
                setup::init(env, &plugin, 0x3000)?
            } else {
                step(format!("round {round}: init after reload"));
                // The first init worked on this machine, so a failure now is no missing
                // hardware: the plugin cannot come back after its last finalize.
                plugin.init(0x3000 + round, Default::default()).map_err(|e| {
                Stop::Fail(format!(
                    "not reloadable: init failed after finalize and dlclose (round {round}; \
                     the library {} in between): {e}; NCCL unloads the plugin with the last \
                     communicator and loads it again for the next",
                    if stayed_mapped {
                        "stayed mapped, so its globals kept their state"
                    } else {
                        "was unmapped and loaded afresh"
                    }
                ))
            })?
            };
        if ctx.devices()? == 0 {
            return Err(setup::no_device(env, "devices() reported 0 devices".into()));
        }
        let mut flow = Flow::new(setup::pair(&ctx, &ctx, 0)?, env.version);
        let data = Rng::new(env.seed, 1000 + round).bytes(70_001);
        let (got, _, n) = setup::transfer(&mut flow, &data, data.len(), 8, false)
            .map_err(|e| e.context(&format!("round {round}")))?;
        if n != data.len() || got != data {
            return fail!("round {round}: a 70001-byte transfer arrived wrong");
        }
        flow.close()?;
        step(format!("round {round}: finalize and dlclose"));
        within(CALL_LIMIT, blocked("finalize"), || ctx.finalize())?;
        drop(plugin);
        stayed_mapped = is_loaded(&env.library);
        if !stayed_mapped {
            unloaded += 1;
        }
    }
    Ok(if unloaded == 3 {
        "3 rounds of dlopen/init/transfer/finalize/dlclose; the library was unloaded each time \
         and came back"
            .into()
    } else {
        format!(
            "3 rounds of dlopen/init/transfer/finalize/dlclose worked; the library stayed mapped \
             after dlclose in {} of 3 rounds (thread-local destructors, RTLD_NODELETE or a \
             dependency pin it), so globals were not re-initialised then",
            3 - unloaded
        )
    })
}

/// The arguments of a peer process.
fn peer_args(env: &Env, rank: usize) -> Vec<String> {
    vec![
        "check".into(),
        env.library.display().to_string(),
        "--peer".into(),
        rank.to_string(),
        "--version".into(),
        env.version.to_string(),
        "--seed".into(),
        env.seed.to_string(),
        "--timeout".into(),
        env.timeout.as_secs().max(1).to_string(),
    ]
    .into_iter()
    .chain(env.require_devices.then(|| "--require-devices".to_owned()))
    .collect()
}

/// Two processes on this host connect to each other both ways and exchange data.
pub(crate) fn two_process(env: &Env) -> Checked {
    let cmds = [0, 1].map(|rank| {
        let mut c = Command::new(&env.exe);
        c.args(peer_args(env, rank));
        c
    });
    peer::orchestrate(cmds, "two processes")
}

/// The same across two network namespaces joined by a veth pair (root only).
pub(crate) fn netns(env: &Env) -> Checked {
    let name = setup::load_plugin(env)?.name().to_owned();
    step("create two network namespaces and a veth pair");
    let ns = Netns::create()?;
    let vars = netns::default_env(&name, &env.peer_env);
    let cmds = [0, 1].map(|rank| {
        let mut c = ns.command(rank, &env.exe, &vars);
        c.args(peer_args(env, rank));
        c
    });
    let r = peer::orchestrate(
        cmds,
        &format!(
            "namespaces {} ({}) and {} ({})",
            ns.sides[0].ns, ns.sides[0].ip, ns.sides[1].ns, ns.sides[1].ip
        ),
    );
    drop(ns);
    r
}
