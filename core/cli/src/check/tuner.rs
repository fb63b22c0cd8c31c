//! Tuner checks (NCCL_ABI.md §4.4): the table, `init` in the version's argument
//! order with the host's constants (NCCL 1152 bytes, v7 1272, RCCL 1632/1488 under
//! `CCLKIT_FLAVOR=rccl`) inside canaries, cost-table edits limited to
//! supported entries, channel counts, chunk sizes, per-call latency, finalize without
//! leaks, reload.

use std::time::Instant;

use cclkit_abi::raw::common::{
    Algorithm, Func, NCCL_ALGO_PROTO_IGNORE, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, Protocol,
};

use super::child::{Env, step};
use super::raw::LeakMeter;
use super::rng::Rng;
use super::{CheckDef, Checked, Class, Family, Stop, fail, load};
use cclkit_host::tuner::{
    COST_TABLE_LEN, CostTable, NvlDomainInfo, TunerConstants, TunerContext, TunerPlugin,
};

/// Every tuner check, in report order.
pub(crate) const CHECKS: &[CheckDef] = &[
    def(
        "symbol",
        "NCCL dlsym()s ncclTunerPlugin_vN and reads the table struct at that address",
        "the table is an exported data object of the version's size",
        symbol,
    ),
    def(
        "table",
        "NCCL calls init, getCollInfo and finalize without a NULL check",
        "name non-NULL, init/getCollInfo/finalize present",
        table,
    ),
    def(
        "init",
        "NCCL calls init once per communicator with the version's arguments",
        "init in the version's argument order; constants inside the host's struct",
        init,
    ),
    def(
        "cost-table",
        "NCCL passes its cost table with unsupported entries at -1 and reads it back",
        "only supported cost-table entries touched, values valid",
        cost_table,
    ),
    def(
        "channels",
        "NCCL reads *nChannels after getCollInfo (0 = keep its own)",
        "nChannels left at 0 or set within 1..64",
        channels,
    ),
    def(
        "chunk-size",
        "NCCL 2.30 asks v6 tuners for the chunk size of each collective",
        "v6 getChunkSize returns a sane chunk",
        chunk_size,
    ),
    def(
        "latency",
        "NCCL calls getCollInfo on every collective it enqueues",
        "getCollInfo per-call latency (the collective hot path)",
        latency,
    ),
    def(
        "finalize",
        "NCCL calls finalize when the communicator is destroyed",
        "finalize frees what init allocated (valgrind when present)",
        finalize,
    ),
    def(
        "reload",
        "NCCL dlcloses the tuner with the last communicator and may load it again",
        "dlclose and reload, then init and tune again",
        reload,
    ),
];

/// Every tuner check is a contract check: each calls the tuner as NCCL does.
const fn def(
    name: &'static str,
    nccl: &'static str,
    about: &'static str,
    run: fn(&Env) -> Checked,
) -> CheckDef {
    CheckDef {
        name,
        family: Family::Tuner,
        class: Class::Contract,
        about,
        nccl,
        run,
    }
}

/// The check the parent runs under valgrind.
pub(crate) const VALGRIND_CHECK: &str = "finalize";

/// init/finalize cycles of the `finalize` check under valgrind (the parent counts a
/// loss record with this many blocks as a per-cycle leak).
pub(crate) const VALGRIND_CYCLES: usize = 20;

/// NCCL's MAXCHANNELS.
const MAX_CHANNELS: i32 = 64;

fn symbol(env: &Env) -> Checked {
    super::net::data_symbol(env, Family::Tuner)
}

fn load_tuner(env: &Env) -> Result<TunerPlugin, Stop> {
    step("dlopen and read the table");
    let lib = load::open(&env.library).map_err(Stop::Fail)?;
    load::tuner(&lib, env.version).map_err(Stop::Fail)
}

fn table(env: &Env) -> Checked {
    let t = load_tuner(env)?;
    let extra = if env.version >= 6 {
        if t.has_chunk_size() {
            "; getChunkSize present"
        } else {
            "; getChunkSize absent (optional)"
        }
    } else {
        ""
    };
    Ok(format!(
        "name \"{}\"; init, getCollInfo, {} present{extra}",
        t.name(),
        if env.version >= 5 {
            "finalize"
        } else {
            "destroy"
        }
    ))
}

/// Plausible NCCL model constants (latencies in µs, bandwidths in GB/s).
fn constants() -> TunerConstants {
    let mut c = TunerConstants::default();
    for (a, row) in c.baseLatencies.iter_mut().enumerate() {
        for (p, v) in row.iter_mut().enumerate() {
            *v = 4.0 + a as f64 + 2.0 * p as f64;
        }
    }
    for (h, hw) in c.hwLatencies.iter_mut().enumerate() {
        for row in hw.iter_mut() {
            for (p, v) in row.iter_mut().enumerate() {
                *v = 0.6 + h as f64 * 2.0 + p as f64;
            }
        }
    }
    for t in [
        &mut c.llMaxBws,
        &mut c.perChMaxRingLL128Bws,
        &mut c.perChMaxTreeLL128Bws,
        &mut c.perChMaxTreeBws,
        &mut c.perChMaxNVLSTreeBws,
    ] {
        for (i, row) in t.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = 20.0 + 5.0 * i as f64 - j as f64;
            }
        }
    }
    c
}

/// Every double of the constants.
fn doubles(c: &TunerConstants) -> Vec<f64> {
    let mut v: Vec<f64> = c.baseLatencies.iter().flatten().copied().collect();
    v.extend(c.hwLatencies.iter().flatten().flatten());
    for t in [
        &c.llMaxBws,
        &c.perChMaxRingLL128Bws,
        &c.perChMaxTreeLL128Bws,
        &c.perChMaxTreeBws,
        &c.perChMaxNVLSTreeBws,
    ] {
        v.extend(t.iter().flatten());
    }
    v
}

/// Communicator shapes the checks tune for: (nRanks, nNodes).
const SHAPES: [(usize, usize); 4] = [(2, 1), (8, 1), (16, 2), (64, 8)];

/// `init` for one communicator shape, with a step naming the argument order.
fn init_ctx(
    t: &TunerPlugin,
    env: &Env,
    (ranks, nodes): (usize, usize),
    id: u64,
) -> Result<(TunerContext, TunerConstants), Stop> {
    let shape = match env.version {
        1 => "init(nRanks, nNodes, logger)",
        2..=4 => "init(nRanks, nNodes, logger, &ctx): context last",
        _ => "init(&ctx, commId, nRanks, nNodes, logger, nvl, constants): context first",
    };
    step(format!(
        "tuner v{} {shape}, {ranks} ranks on {nodes} nodes (a crash here usually means the \
         functions have another version's shapes)",
        env.version
    ));
    let mut c = constants();
    let nvl = NvlDomainInfo {
        nNvlDomains: nodes as i32,
        minRanksPerNvlDomain: (ranks / nodes) as i32,
        maxRanksPerNvlDomain: (ranks / nodes) as i32,
    };
    let ctx = t.init(ranks, nodes, id, nvl, &mut c)?;
    Ok((ctx, c))
}

fn init(env: &Env) -> Checked {
    let t = load_tuner(env)?;
    let before = doubles(&constants());
    let mut ctxs = Vec::new();
    let mut changed = 0;
    let mut layout = None;
    for (i, &shape) in SHAPES.iter().enumerate() {
        let (ctx, c) = init_ctx(&t, env, shape, 0x7000 + i as u64)?;
        layout = Some(ctx.layout());
        let after = doubles(&c);
        if let Some((k, v)) = after
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite() || **v < 0.0)
        {
            return fail!(
                "after init the tuning constants hold {v} at double {k} of 144: NCCL reads them \
                 back into its model (latencies and bandwidths must be finite and >= 0)"
            );
        }
        changed = changed.max(before.iter().zip(&after).filter(|(a, b)| a != b).count());
        ctxs.push(Some(ctx));
    }
    step("finalize the contexts out of order");
    for i in [1usize, 3, 0, 2] {
        if let Some(ctx) = ctxs[i].take() {
            ctx.finalize()?;
        }
    }
    let constants = match layout.filter(|_| env.version >= 5) {
        Some(l) => format!(
            "; the constants stayed inside their canaries ({}), {changed} of NCCL's 144 \
             values changed, all finite",
            l.describe()
        ),
        None => String::new(),
    };
    Ok(format!(
        "{} contexts alive at once ({}), finalized out of order{constants}",
        SHAPES.len(),
        SHAPES
            .iter()
            .map(|(r, n)| format!("{r} ranks/{n} nodes"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// One `getCollInfo` call of a sweep.
struct Call {
    /// The table NCCL passed (-1 = unsupported).
    offered: CostTable,
    /// The table after the call.
    table: CostTable,
    n_channels: i32,
    micros: f64,
}

/// A realistic table: costs for what this call supports, -1 for the rest (CollNet
/// and NVLS always; PAT outside AllGather/ReduceScatter; a few more at random).
fn offered(rng: &mut Rng, func: Func, n_bytes: usize, nodes: usize) -> CostTable {
    let mut t = [NCCL_ALGO_PROTO_IGNORE; COST_TABLE_LEN];
    for a in 0..NCCL_NUM_ALGORITHMS {
        let algo = Algorithm(a as i32);
        let unsupported = matches!(
            algo,
            Algorithm::COLLNET_DIRECT
                | Algorithm::COLLNET_CHAIN
                | Algorithm::NVLS
                | Algorithm::NVLS_TREE
        ) || (algo == Algorithm::PAT
            && !matches!(func, Func::ALL_GATHER | Func::REDUCE_SCATTER))
            || (algo == Algorithm::TREE && func != Func::ALL_REDUCE);
        if unsupported {
            continue;
        }
        for p in 0..NCCL_NUM_PROTOCOLS {
            if rng.range(0, 9) == 0
                && !(algo == Algorithm::RING && p == Protocol::SIMPLE.0 as usize)
            {
                continue;
            }
            let bw = [4.0, 9.0, 20.0][p] * nodes as f64;
            t[a * NCCL_NUM_PROTOCOLS + p] =
                ((5.0 + 3.0 * p as f64) + n_bytes as f64 / (bw * 1000.0)) as f32;
        }
    }
    t
}

/// Calls getCollInfo for every collective, size, pipeline depth and regBuff on every
/// communicator shape; `each` sees every call (and stops the sweep with an error).
fn sweep(env: &Env, mut each: impl FnMut(&Call) -> Result<(), Stop>) -> Result<usize, Stop> {
    let t = load_tuner(env)?;
    let mut rng = Rng::new(env.seed, 3000);
    let mut calls = 0;
    for (i, &(ranks, nodes)) in SHAPES.iter().enumerate() {
        let (mut ctx, _) = init_ctx(&t, env, (ranks, nodes), 0x7100 + i as u64)?;
        step(format!("getCollInfo sweep, {ranks} ranks on {nodes} nodes"));
        for f in 0..Func::NUM_TUNED {
            let func = Func(f);
            for shift in [0u32, 8, 12, 16, 20, 24, 28, 32] {
                let n_bytes = (1usize << shift) + if shift > 4 { 3 } else { 0 };
                for (pipe, reg) in [(1, false), (4, true)] {
                    let offered = offered(&mut rng, func, n_bytes, nodes);
                    let mut table = offered;
                    let mut n_channels = 0;
                    let t0 = Instant::now();
                    let r =
                        ctx.get_coll_info(func, n_bytes, pipe, reg, &mut table, &mut n_channels);
                    let micros = t0.elapsed().as_secs_f64() * 1e6;
                    r.map_err(|e| Stop::Fail(format!("{func} {n_bytes} B, {ranks} ranks: {e}")))?;
                    calls += 1;
                    each(&Call {
                        offered,
                        table,
                        n_channels,
                        micros,
                    })
                    .map_err(|e| {
                        e.context(&format!("{func} {n_bytes} B, {ranks} ranks/{nodes} nodes"))
                    })?;
                }
            }
        }
        ctx.finalize()?;
    }
    Ok(calls)
}

/// "RING/SIMPLE" for a flat index.
fn entry(i: usize) -> String {
    format!(
        "{}/{}",
        Algorithm((i / NCCL_NUM_PROTOCOLS) as i32),
        Protocol((i % NCCL_NUM_PROTOCOLS) as i32)
    )
}

fn cost_table(env: &Env) -> Checked {
    let mut edited = 0;
    let calls = sweep(env, |c| {
        for i in 0..COST_TABLE_LEN {
            let v = c.table[i];
            if !v.is_finite() || (v < 0.0 && v != NCCL_ALGO_PROTO_IGNORE) {
                return fail!(
                    "{} holds {v}: a cost must be a time >= 0, or -1 to disable the entry",
                    entry(i)
                );
            }
        }
        if c.table != c.offered {
            edited += 1;
        }
        Ok(())
    })?;
    Ok(format!(
        "{calls} calls (5 collectives x 8 sizes x 2 pipeline/regBuff x {} shapes): no write \
         outside the table, no unsupported entry enabled, every value a time or -1; {edited} \
         calls changed the table",
        SHAPES.len()
    ))
}

fn channels(env: &Env) -> Checked {
    let mut set = std::collections::BTreeSet::new();
    let calls = sweep(env, |c| {
        if !(0..=MAX_CHANNELS).contains(&c.n_channels) {
            return fail!(
                "nChannels set to {}: 0 keeps NCCL's count, otherwise 1..{MAX_CHANNELS} \
                 (MAXCHANNELS)",
                c.n_channels
            );
        }
        set.insert(c.n_channels);
        Ok(())
    })?;
    Ok(format!(
        "{calls} calls; nChannels values used: {set:?} (0 = NCCL's own)"
    ))
}

fn chunk_size(env: &Env) -> Checked {
    if env.version < 6 {
        return Err(Stop::Skip(format!(
            "tuner v{} has no getChunkSize (added in v6)",
            env.version
        )));
    }
    let t = load_tuner(env)?;
    if !t.has_chunk_size() {
        return Err(Stop::Skip("getChunkSize is NULL (optional in v6)".into()));
    }
    let (mut ctx, _) = init_ctx(&t, env, (16, 2), 0x7200)?;
    step("getChunkSize for every collective, algorithm, protocol and size");
    let (mut calls, mut changed) = (0, 0);
    for f in 0..Func::NUM_TUNED {
        for a in 0..NCCL_NUM_ALGORITHMS as i32 {
            for p in 0..NCCL_NUM_PROTOCOLS as i32 {
                for n_bytes in [4096usize, 1 << 20, 1 << 30] {
                    let initial = [16_384usize, 65_536, 131_072][p as usize];
                    let mut chunk = initial;
                    let what = format!("{} {}/{} {n_bytes} B", Func(f), Algorithm(a), Protocol(p));
                    ctx.get_chunk_size(Func(f), n_bytes, Algorithm(a), Protocol(p), 8, &mut chunk)
                        .map_err(|e| Stop::Fail(format!("{what}: {e}")))?;
                    calls += 1;
                    if chunk == 0 || chunk > 1 << 30 {
                        return fail!(
                            "{what}: getChunkSize set the chunk to {chunk} bytes (NCCL proposed \
                             {initial}); it must be 1 byte .. 1 GiB"
                        );
                    }
                    changed += usize::from(chunk != initial);
                }
            }
        }
    }
    ctx.finalize()?;
    Ok(format!(
        "{calls} calls, {changed} changed the chunk size, all within 1 B .. 1 GiB"
    ))
}

fn latency(env: &Env) -> Checked {
    let mut us = Vec::new();
    sweep(env, |c| {
        us.push(c.micros);
        Ok(())
    })?;
    for _ in 0..3 {
        sweep(env, |c| {
            us.push(c.micros);
            Ok(())
        })?;
    }
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() - 1) as f64 * q) as usize];
    let (p50, p99, max) = (at(0.5), at(0.99), at(1.0));
    if p50 > 1000.0 {
        return fail!(
            "getCollInfo takes {p50:.0} µs per call (median of {}): it runs for every \
             collective, so it must not do I/O or heavy work per call",
            us.len()
        );
    }
    Ok(format!(
        "getCollInfo over {} calls: median {p50:.2} µs, p99 {p99:.2} µs, max {max:.1} µs",
        us.len()
    ))
}

fn finalize(env: &Env) -> Checked {
    let under_valgrind = std::env::var_os("CCLKIT_CHECK_UNDER_VALGRIND").is_some();
    let t = load_tuner(env)?;
    let (warmup, cycles) = if under_valgrind {
        (0, VALGRIND_CYCLES)
    } else {
        (10, 200)
    };
    let mut meter = None;
    let mut table = [0.0f32; COST_TABLE_LEN];
    step(format!(
        "{} init/getCollInfo/finalize cycles",
        warmup + cycles
    ));
    for i in 0..warmup + cycles {
        if i == warmup {
            meter = Some(LeakMeter::start(cycles / 4));
        }
        let (mut ctx, _) = init_ctx(&t, env, SHAPES[i % SHAPES.len()], 0x7300 + i as u64)?;
        table.fill(1.0);
        let mut nch = 0;
        ctx.get_coll_info(Func::ALL_REDUCE, 1 << 20, 1, false, &mut table, &mut nch)?;
        ctx.finalize()?;
        if let Some(m) = meter.as_mut() {
            m.tick(i + 1 - warmup);
        }
    }
    if under_valgrind {
        // Keep the library mapped (and reachable) until exit so valgrind can name
        // the frames of a leak.
        static KEEP: std::sync::Mutex<Option<cclkit_host::Library>> = std::sync::Mutex::new(None);
        if let (Some(lib), Ok(mut keep)) = (t.library(), KEEP.lock()) {
            *keep = Some(lib.clone());
        }
        return Ok(format!(
            "{cycles} init/getCollInfo/finalize cycles under valgrind"
        ));
    }
    let (grown, leak) = meter.map_or((0, None), |m| (m.total(), m.steady_leak(16)));
    if let Some(per) = leak {
        return fail!(
            "the heap grew by {grown} bytes over {cycles} init/finalize cycles (~{per} bytes each, \
             in every quarter): finalize does not free what init allocated"
        );
    }
    Ok(format!(
        "{} init/getCollInfo/finalize cycles; heap in use grew by {grown} bytes over the last \
         {cycles} (valgrind not used)",
        warmup + cycles
    ))
}

fn reload(env: &Env) -> Checked {
    let mut unloaded = 0;
    for round in 1..=3 {
        step(format!(
            "round {round}: dlopen, init, getCollInfo, finalize, dlclose"
        ));
        let t = load_tuner(env)?;
        let (mut ctx, _) = init_ctx(&t, env, (8, 1), 0x7400 + round)?;
        let mut table = [1.0f32; COST_TABLE_LEN];
        let mut nch = 0;
        ctx.get_coll_info(Func::ALL_REDUCE, 65_536, 1, false, &mut table, &mut nch)
            .map_err(|e| Stop::Fail(format!("round {round}: {e}")))?;
        ctx.finalize()?;
        drop(t);
        if !cclkit_host::library::is_loaded(&env.library) {
            unloaded += 1;
        }
    }
    Ok(format!(
        "3 rounds of dlopen/init/getCollInfo/finalize/dlclose; unloaded after {unloaded} of 3"
    ))
}
