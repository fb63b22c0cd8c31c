//! Profiler checks (`ncclProfiler_v1` … `_v7`, NCCL_ABI.md §3.4): the table, `init`
//! and `finalize` per communicator, every event type NCCL emits started and stopped
//! in pairs under valid parents with its states in NCCL's order, children of
//! declined (NULL) parents, an exhausted event pool, and events from several
//! threads at once. Each check runs in its own child process, so a profiler that
//! crashes or hangs fails that check (with the signal or the call that did not
//! return) and the suite goes on, as for net plugins.
//!
//! The checks call the profiler only as NCCL does, so they are contract checks: a
//! NULL handle from `startEvent` is a profiler's right (declined, masked, pool
//! full) and never a failure; an error return, a crash or a hang is. Events only go
//! to types in the mask `init` returned; the child asks for every type the way
//! NCCL's example profiler reads it (`NCCL_PROFILE_EVENT_MASK`, and cclkit's trace
//! plugin's `CCLKIT_PROFILE_MASK`), and points profile output at a scratch
//! directory removed afterwards.

use std::path::PathBuf;

use cclkit_abi::raw::profiler::event as bit;
use cclkit_host::kinds::{Found, Kind};
use cclkit_host::profiler::{InitArgs, ProfilerContext, ProfilerPlugin};

use super::child::{Env, step};
use super::{CheckDef, Checked, Class, Family, Stop, load};

mod stress;
mod tree;

use tree::{Driver, summary};

/// Every profiler check, in report order.
pub(crate) const CHECKS: &[CheckDef] = &[
    def(
        "symbol",
        "NCCL dlsym()s ncclProfiler_vN and reads the table struct at that address",
        "the table is an exported data object of the version's size",
        symbol,
    ),
    def(
        "table",
        "NCCL calls init, startEvent, stopEvent, recordEventState and finalize without a NULL check",
        "name non-NULL, every slot present",
        table,
    ),
    def(
        "init",
        "NCCL calls init once per communicator and finalize when it is destroyed",
        "init/finalize of two communicators succeed; the mask is sane",
        init,
    ),
    def(
        "events",
        "NCCL starts each event under its parent, records its states in order, stops it once",
        "every event type in NCCL's tree accepted, states in order, no error",
        events,
    ),
    def(
        "null-parents",
        "NCCL passes a NULL parentObj when the parent event was declined or masked out",
        "children of declined parents handled (no dereference of NULL)",
        null_parents,
    ),
    def(
        "pool",
        "NCCL keeps thousands of events open with deep pipelines and graphs",
        "many open events: NULL when the pool is full, never a crash",
        stress::pool,
    ),
    def(
        "threads",
        "NCCL calls the profiler from user threads and proxy threads at once",
        "event trees from 4 threads concurrently",
        stress::threads,
    ),
];

/// Every profiler check is a contract check: each calls the profiler as NCCL does.
const fn def(
    name: &'static str,
    nccl: &'static str,
    about: &'static str,
    run: fn(&Env) -> Checked,
) -> CheckDef {
    CheckDef {
        name,
        family: Family::Profiler,
        class: Class::Contract,
        about,
        nccl,
        run,
    }
}

/// Profiler versions among the kinds a library exports, newest first.
pub(crate) fn exported(kinds: &[Found]) -> Vec<u32> {
    let mut v: Vec<u32> = kinds
        .iter()
        .filter(|f| f.kind == Kind::Profiler)
        .map(|f| f.version)
        .collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v.dedup();
    v
}

fn symbol(env: &Env) -> Checked {
    super::net::data_symbol(env, Family::Profiler)
}

/// A scratch directory for what a profiler writes; removed when dropped.
pub(super) struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Loads the version under test with every event type asked for and profile output
/// in a scratch directory.
pub(super) fn load_profiler(env: &Env) -> Result<(ProfilerPlugin, Scratch), Stop> {
    let dir = std::env::temp_dir().join(format!("cclkit-check-profiler-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Stop::Skip(format!("scratch directory {}: {e}", dir.display())))?;
    // Decimal: NCCL's example profiler reads the mask with `atoi`, which stops at
    // the `x` of a hex number and would ask for no events at all.
    let all = bit::known(env.version).to_string();
    for (k, v) in [
        ("NCCL_PROFILE_EVENT_MASK", all.as_str()),
        ("CCLKIT_PROFILE_MASK", all.as_str()),
        ("CCLKIT_PROFILE_SUMMARY", "0"),
        ("CCLKIT_PROFILERS", ""),
    ] {
        // SAFETY: the child's only other thread is the watchdog, which never reads
        // the environment; the profiler is not loaded yet.
        unsafe { std::env::set_var(k, v) };
    }
    for k in ["CCLKIT_PROFILE_DIR", "NCCL_PROFILE_DIR"] {
        // SAFETY: as above.
        unsafe { std::env::set_var(k, &dir) };
    }
    step("dlopen and read the table");
    let lib = load::open(&env.library).map_err(Stop::Fail)?;
    let p = ProfilerPlugin::from_library_version(lib, Some(env.version))
        .map_err(|e| Stop::Fail(e.to_string()))?;
    Ok((p, Scratch(dir)))
}

/// `init` for rank `rank` of a 2-rank communicator.
pub(super) fn init_ctx(
    p: &ProfilerPlugin,
    comm_id: u64,
    rank: i32,
) -> Result<ProfilerContext, Stop> {
    step(format!("init (communicator {comm_id:#x}, rank {rank})"));
    let args = InitArgs {
        comm_id,
        comm_name: Some("cclkit-check"),
        n_nodes: 1,
        n_ranks: 2,
        rank,
    };
    ProfilerContext::init(p, &args).map_err(|e| Stop::Fail(e.to_string()))
}

/// `finalize`, which must succeed.
pub(super) fn finalize(ctx: &ProfilerContext) -> Result<(), Stop> {
    step("finalize");
    ctx.finalize().map_err(|e| Stop::Fail(e.to_string()))
}

fn table(env: &Env) -> Checked {
    let (p, _dir) = load_profiler(env)?;
    Ok(format!(
        "name \"{}\"; init, startEvent, stopEvent, recordEventState, finalize present",
        p.name()
    ))
}

fn init(env: &Env) -> Checked {
    let (p, _dir) = load_profiler(env)?;
    let a = init_ctx(&p, 0xc0ff_ee00_0000_0001, 0)?;
    let b = init_ctx(&p, 0xc0ff_ee00_0000_0002, 1)?;
    let mask = a.mask();
    let unknown = mask & !bit::known(env.version);
    finalize(&b)?;
    finalize(&a)?;
    let note = if unknown != 0 {
        format!(
            "; the mask also sets {unknown:#x}, bits v{} does not define (NCCL ignores them)",
            env.version
        )
    } else {
        String::new()
    };
    Ok(format!(
        "two communicators initialised and finalized; mask {mask:#x}{note}"
    ))
}

fn events(env: &Env) -> Checked {
    let (p, _dir) = load_profiler(env)?;
    let ctx = init_ctx(&p, 0xc0ff_ee00_0000_0003, 0)?;
    if ctx.mask() == 0 {
        finalize(&ctx)?;
        return Ok("init returned an empty mask: NCCL sends no events (nothing to check)".into());
    }
    let mut d = Driver::new(&ctx, false);
    // Small, medium and large: profilers may track only some sizes (NVIDIA's
    // inspector profiler skips collectives under 8 KiB by default).
    for (seq, bytes) in [(0, 4096), (1, (1 << 20) + 512), (2, 64 << 20)] {
        d.collective(env.version, seq, bytes)?;
    }
    if ctx.wants(bit::PROXY_CTRL) {
        d.proxy_ctrl()?;
    }
    finalize(&ctx)?;
    let accepted: usize = d.tally.values().map(|(ok, _)| ok).sum();
    if accepted == 0 {
        // Declining is the profiler's right (NCCL carries on with NULL handles), so
        // this is not a failure; but nothing below the calls themselves was checked.
        return Err(Stop::Skip(format!(
            "init asked for events (mask {:#x}) but declined every one (NULL from every \
             startEvent, which NCCL allows): the event tree was not exercised; {}",
            ctx.mask(),
            summary(&d.tally)
        )));
    }
    Ok(format!("mask {:#x}; {}", ctx.mask(), summary(&d.tally)))
}

fn null_parents(env: &Env) -> Checked {
    let (p, _dir) = load_profiler(env)?;
    let ctx = init_ctx(&p, 0xc0ff_ee00_0000_0004, 0)?;
    let mut d = Driver::new(&ctx, true);
    d.collective(env.version, 0, 2048)?;
    finalize(&ctx)?;
    Ok(format!(
        "every event with a NULL parent: {}",
        summary(&d.tally)
    ))
}
