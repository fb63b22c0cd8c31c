//! The table, the lifecycle and connection setup: symbol, table, init, devices,
//! properties, listen, connect.

use std::time::Instant;

use cclkit_abi::raw::common::ptr;
use cclkit_abi::raw::net::{NCCL_NET_DEVICE_UNPACK_VERSION, NetDeviceType};

use super::setup::{self, CALL_LIMIT, Flow, OP_LIMIT, Ready, blocked, no_device};
use crate::check::child::{Env, step, within};
use crate::check::raw::{self, GuardedHandle};
use crate::check::{Checked, Family, Stop, fail};
use crate::elf::{ElfInfo, STT_FUNC, STT_OBJECT};
use cclkit_host::net::Properties;
use cclkit_host::net::table::TableRef;

/// The exported symbol is a data object at least as large as the version's table.
pub(crate) fn symbol(env: &Env) -> Checked {
    data_symbol(env, env.family)
}

/// Shared by the net and tuner `symbol` checks: reads the ELF, loads nothing.
pub(crate) fn data_symbol(env: &Env, family: Family) -> Checked {
    step("read the ELF dynamic symbols");
    let elf = ElfInfo::read(&env.library).map_err(|e| Stop::Fail(e.to_string()))?;
    let name = family.symbols().symbol(env.version);
    let Some(sym) = elf.symbols.iter().find(|s| s.name == name) else {
        return fail!("{name} is not in the dynamic symbol table");
    };
    let expected = family.symbols().table_size(env.version).unwrap_or(0);
    if sym.kind != STT_OBJECT {
        let kind = if sym.kind == STT_FUNC {
            "a function (STT_FUNC)".to_owned()
        } else {
            format!("of ELF type {}", sym.kind)
        };
        return fail!(
            "{name} is {kind}, not a data object: NCCL dlsym()s it and reads the {expected}-byte \
             table struct at that address (export `const <table type> {name} = {{...}};` in C, \
             or use export_net!/export_tuner!)"
        );
    }
    let size = usize::try_from(sym.size).unwrap_or(usize::MAX);
    if size < expected {
        return fail!(
            "{name} is {size} bytes but the v{} table is {expected}: NCCL would read past it",
            env.version
        );
    }
    Ok(format!("{name} is a {size}-byte data object"))
}

/// Whether a slot of the table is non-NULL, whatever its per-version type.
macro_rules! has {
    ($raw:expr, $field:ident) => {
        match $raw.get() {
            TableRef::V6(t) => t.$field.is_some(),
            TableRef::V7(t) => t.$field.is_some(),
            TableRef::V8(t) => t.$field.is_some(),
            TableRef::V9(t) => t.$field.is_some(),
            TableRef::V10(t) => t.$field.is_some(),
            TableRef::V11(t) => t.$field.is_some(),
            TableRef::V12(t) => t.$field.is_some(),
        }
    };
}

/// The name is set and every function NCCL calls without a NULL check is present.
pub(crate) fn table(env: &Env) -> Checked {
    let plugin = setup::load_plugin(env)?;
    let raw = &plugin.shared.raw;
    let missing_now = || {
        [
            ("listen", has!(raw, listen)),
            ("connect", has!(raw, connect)),
            ("accept", has!(raw, accept)),
            ("regMr", has!(raw, regMr)),
            ("deregMr", has!(raw, deregMr)),
            ("isend", has!(raw, isend)),
            ("irecv", has!(raw, irecv)),
            ("test", has!(raw, test)),
            ("closeSend", has!(raw, closeSend)),
            ("closeRecv", has!(raw, closeRecv)),
            ("closeListen", has!(raw, closeListen)),
        ]
        .into_iter()
        .filter(|(_, present)| !present)
        .map(|(n, _)| n)
        .collect::<Vec<&str>>()
    };
    // A plugin may complete its table inside `init` (the IB/UCX plugin does), and
    // NCCL reads those slots only after `init` returned: look again after one.
    let mut missing = missing_now();
    let _ctx = if missing.is_empty() {
        None
    } else {
        setup::init(env, &plugin, 0x7AB1E).ok()
    };
    if _ctx.is_some() {
        missing = missing_now();
    }
    if !missing.is_empty() {
        return fail!(
            "{}: {} NULL; NCCL calls these without checking",
            plugin.symbol(),
            missing.join(", ")
        );
    }
    let mut optional = vec![];
    if has!(raw, iflush) {
        optional.push("iflush");
    }
    if has!(raw, regMrDmaBuf) {
        optional.push("regMrDmaBuf");
    }
    match raw.get() {
        TableRef::V12(t) => {
            for (n, p) in [
                ("getDeviceMr", t.getDeviceMr.is_some()),
                ("irecvConsumed", t.irecvConsumed.is_some()),
                ("makeVDevice", t.makeVDevice.is_some()),
                ("setNetAttr", t.setNetAttr.is_some()),
            ] {
                if p {
                    optional.push(n);
                }
            }
        }
        TableRef::V11(t) => {
            for (n, p) in [
                ("getDeviceMr", t.getDeviceMr.is_some()),
                ("irecvConsumed", t.irecvConsumed.is_some()),
                ("makeVDevice", t.makeVDevice.is_some()),
                ("setNetAttr", t.setNetAttr.is_some()),
            ] {
                if p {
                    optional.push(n);
                }
            }
        }
        _ => {}
    }
    Ok(format!(
        "name \"{}\"; every required function present; optional: {}",
        plugin.name(),
        if optional.is_empty() {
            "none".to_owned()
        } else {
            optional.join(", ")
        }
    ))
}

/// v11+: a context per communicator, several alive at once, each finalized on its
/// own; re-init after every context was finalized. Older: one init shared by every
/// communicator (what NCCL's shims do).
pub(crate) fn init(env: &Env) -> Checked {
    let plugin = setup::load_plugin(env)?;
    let c1 = setup::init(env, &plugin, 0x1001)?;
    step("devices");
    if c1.devices()? == 0 {
        return Err(no_device(env, "devices() reported 0 devices".into()));
    }
    let c2 = within(
        CALL_LIMIT,
        || "the second init did not return".into(),
        || setup::init(env, &plugin, 0x1002),
    )
    .map_err(|e| e.context("a second communicator's init while the first is alive"))?;
    let mut f1 = Flow::new(setup::pair(&c1, &c1, 0)?, env.version);
    let mut f2 = Flow::new(setup::pair(&c2, &c2, 0)?, env.version);
    step("transfers on both communicators");
    small_transfer(&mut f1, env.seed, 1)?;
    small_transfer(&mut f2, env.seed, 2)?;
    if env.version < 11 {
        f1.close()?;
        f2.close()?;
        drop((c1, c2));
        return Ok(format!(
            "v{}: init ran once for 2 communicators (refcounted, as NCCL's shim does); \
             both transferred data",
            env.version
        ));
    }
    step("close and finalize the first communicator");
    f1.close()?;
    if !c1.finalize()? {
        return fail!("the first context still had comms open at finalize");
    }
    step("transfer on the second communicator after the first was finalized");
    small_transfer(&mut f2, env.seed, 3)
        .map_err(|e| e.context("after finalize of another communicator's context"))?;
    f2.close()?;
    c2.finalize()?;
    step("init again after every context was finalized");
    let c3 = setup::init(env, &plugin, 0x1003)
        .map_err(|e| e.context("init after all contexts were finalized"))?;
    let mut f3 = Flow::new(setup::pair(&c3, &c3, 0)?, env.version);
    small_transfer(&mut f3, env.seed, 4)?;
    f3.close()?;
    c3.finalize()?;
    Ok(
        "3 communicators: 2 contexts alive at once, each finalized on its own, the other \
         kept working, and init after the last finalize worked"
            .into(),
    )
}

/// One 4099-byte round trip with checked contents.
fn small_transfer(flow: &mut Flow, seed: u64, stream: u64) -> Result<(), Stop> {
    let data = crate::check::rng::Rng::new(seed, stream).bytes(4099);
    let (got, _, n) = setup::transfer(flow, &data, data.len(), 7, false)?;
    if n != data.len() || got != data {
        return fail!("a 4099-byte transfer arrived wrong (reported {n} bytes)");
    }
    Ok(())
}

/// devices() > 0, and the same answer when asked again.
pub(crate) fn devices(env: &Env) -> Checked {
    let plugin = setup::load_plugin(env)?;
    let ctx = setup::init(env, &plugin, 0x2001)?;
    step("devices");
    let n = ctx.devices()?;
    if n == 0 {
        return Err(no_device(env, "devices() reported 0 devices".into()));
    }
    let again = ctx.devices()?;
    if again != n {
        return fail!("devices() reported {n}, then {again}");
    }
    Ok(format!("{n} device{}", if n == 1 { "" } else { "s" }))
}

/// Every device's properties, read through a buffer of exactly the version's size
/// with canaries after it (the adapter's), then checked field by field.
pub(crate) fn properties(env: &Env) -> Checked {
    let r = Ready::new(env)?;
    let mut lines = Vec::new();
    for dev in 0..r.ndev {
        step(format!("getProperties({dev})"));
        let p = r
            .ctx
            .properties(dev)
            .map_err(|e| Stop::Fail(format!("device {dev}: {e}")))?;
        sane(&r, env, dev, &p).map_err(|e| e.context(&format!("device {dev}")))?;
        // NCCL's topology reads a speed of 0 or less as 10000 Mb/s ("some NICs define
        // speed = -1", graph/topo.cc): legal, but worth a word.
        let speed = if p.speed_mbps <= 0 {
            format!("{} Mb/s (NCCL assumes 10000)", p.speed_mbps)
        } else {
            format!("{} Mb/s", p.speed_mbps)
        };
        lines.push(format!(
            "dev {dev} '{}' {speed} maxRecvs {}",
            p.name, p.max_recvs
        ));
    }
    Ok(lines.join("; "))
}

fn sane(r: &Ready, env: &Env, dev: usize, p: &Properties) -> Result<(), Stop> {
    if p.name.is_empty() {
        return fail!("name is NULL or empty (NCCL prints it with %s)");
    }
    if p.ptr_support & ptr::HOST == 0 {
        return fail!("ptrSupport {:#x} lacks NCCL_PTR_HOST", p.ptr_support);
    }
    if p.ptr_support & !(ptr::HOST | ptr::CUDA | ptr::DMABUF) != 0 {
        return fail!("ptrSupport {:#x} has unknown bits", p.ptr_support);
    }
    let raw = &r.plugin.shared.raw;
    if p.ptr_support & ptr::DMABUF != 0 && !has!(raw, regMrDmaBuf) {
        return fail!(
            "ptrSupport has NCCL_PTR_DMABUF but regMrDmaBuf is NULL (NCCL only checks it at init)"
        );
    }
    if !p.latency_us.is_finite() || p.latency_us < 0.0 {
        return fail!("latency is {} µs", p.latency_us);
    }
    if p.max_comms <= 0 {
        return fail!("maxComms is {}", p.max_comms);
    }
    if !(1..=64).contains(&p.max_recvs) {
        return fail!(
            "maxRecvs is {}: it must be 1..64 (test() reports sizes into int[64])",
            p.max_recvs
        );
    }
    let unpack_ok = p.device_type == NetDeviceType::UNPACK
        && p.device_version == NCCL_NET_DEVICE_UNPACK_VERSION;
    if p.device_type != NetDeviceType::HOST && !unpack_ok {
        return fail!(
            "netDeviceType {:?} version {}: NCCL accepts HOST, or UNPACK version {} (else it \
             finalizes and skips the plugin)",
            p.device_type,
            p.device_version,
            NCCL_NET_DEVICE_UNPACK_VERSION
        );
    }
    if env.version >= 9 {
        if p.vdevs.is_empty() {
            return fail!("vProps.ndevs is 0 (a physical device is {{1, [{dev}]}})");
        }
        if let Some(bad) = p.vdevs.iter().find(|&&d| d < 0 || d as usize >= r.ndev) {
            return fail!(
                "vProps.devs holds {bad}, not a device index below {}",
                r.ndev
            );
        }
    }
    if env.version >= 11 && p.max_multi_request_size < 1 {
        return fail!(
            "maxMultiRequestSize is {} (1 = none)",
            p.max_multi_request_size
        );
    }
    Ok(())
}

/// listen writes within the 128-byte handle and returns a listen comm; two listens
/// give two usable endpoints.
pub(crate) fn listen(env: &Env) -> Checked {
    let r = Ready::new(env)?;
    step("listen into a canary-guarded 128-byte handle");
    let mut h1 = GuardedHandle::new();
    let l1 = raw::listen(&r.ctx, 0, &mut h1)?;
    let bytes = h1.bytes();
    let used = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if used == 0 {
        return fail!(
            "listen left the 128-byte handle all zero: the peer's connect needs an address in it"
        );
    }
    step("a second listen while the first is open");
    let mut h2 = GuardedHandle::new();
    let l2 = raw::listen(&r.ctx, 0, &mut h2)?;
    within(CALL_LIMIT, blocked("closeListen"), || l2.close())?;
    within(CALL_LIMIT, blocked("closeListen"), || l1.close())?;
    Ok(format!(
        "handle uses {used} of 128 bytes; listenComm non-NULL; two listens at once"
    ))
}

/// connect is called before the peer accepts and must not block; connect and accept
/// are re-called (connect with the same handle address) until both return comms;
/// the listen comm is closed as soon as accept returns.
pub(crate) fn connect(env: &Env) -> Checked {
    let r = Ready::new(env)?;
    step("listen");
    let mut lh = GuardedHandle::new();
    let mut listen = Some(raw::listen(&r.ctx, 0, &mut lh)?);
    // The peer receives a copy of the handle (bootstrap) and connects with it.
    let mut h = GuardedHandle::from_bytes(&lh.bytes());
    let (mut send, mut recv) = (None, None);
    let (mut connects, mut nulls, mut accepts) = (0u32, 0u32, 0u32);
    let deadline = Instant::now() + OP_LIMIT;
    step("connect before the peer accepts, then connect/accept until both are done");
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            connects += 1;
            send = within(
                CALL_LIMIT,
                || {
                    format!(
                        "connect call {connects} did not return within {} s{}: connect must \
                         be non-blocking (return ncclSuccess with *sendComm = NULL and let NCCL \
                         call again with the same handle)",
                        CALL_LIMIT.as_secs(),
                        if accepts == 0 {
                            " while the peer had not called accept yet"
                        } else {
                            ""
                        }
                    )
                },
                || raw::connect(&r.ctx, 0, &mut h),
            )?;
            if send.is_none() {
                nulls += 1;
            }
        }
        if recv.is_none()
            && let Some(l) = listen.as_mut()
        {
            accepts += 1;
            recv = within(CALL_LIMIT, blocked("accept"), || l.accept())?;
            if recv.is_some()
                && let Some(l) = listen.take()
            {
                within(CALL_LIMIT, blocked("closeListen"), || l.close())?;
            }
        }
        if Instant::now() > deadline {
            return fail!(
                "no connection after {} s: connect called {connects} times ({nulls} returned \
                 NULL), accept {accepts} times",
                OP_LIMIT.as_secs()
            );
        }
        std::thread::yield_now();
    }
    step("closeSend / closeRecv");
    if let Some(s) = send {
        within(CALL_LIMIT, blocked("closeSend"), || s.close())?;
    }
    if let Some(rc) = recv {
        within(CALL_LIMIT, blocked("closeRecv"), || rc.close())?;
    }
    Ok(format!(
        "connected after {connects} connect calls ({nulls} returned NULL, same handle address) \
         and {accepts} accept calls; handle stayed within 128 bytes; listenComm closed right \
         after accept"
    ))
}
