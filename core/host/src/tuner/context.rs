//! One communicator's tuner: `init`, `getCollInfo`, `getChunkSize`, `finalize`.

use std::ffi::{c_int, c_void};

use cclkit_abi::raw::common::{
    Algorithm, Func, NCCL_ALGO_PROTO_IGNORE, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, Protocol,
};

use super::layout::{ConstantsLayout, with_rccl};
use super::table::TunerRef;
use super::{NvlDomainInfo, TunerConstants, TunerError, TunerPlugin};
use crate::guard::guarded;
use crate::logger;
use cclkit_abi::raw::tuner::ncclTunerConstants_v7_t;

/// Algorithms in current RCCL's cost table (`DIRECT_A2A` is the eighth).
const RCCL_ALGOS: usize = 8;

/// Entries in NCCL's cost table (`NCCL_NUM_ALGORITHMS × NCCL_NUM_PROTOCOLS`).
pub const COST_TABLE_LEN: usize = NCCL_NUM_ALGORITHMS * NCCL_NUM_PROTOCOLS;

/// NCCL's `float collCostTable[7][3]`, flat and row-major (entry `(a, p)` at `a*3 + p`),
/// in microseconds; -1.0 means "not supported / ignored".
pub type CostTable = [f32; COST_TABLE_LEN];

/// A tuner initialised for one communicator; `finalize`d (v5+) or `destroy`ed (v2–v4)
/// on drop. v1 tuners are process-global: destroyed with the last context.
pub struct TunerContext {
    plugin: TunerPlugin,
    ctx: *mut c_void,
    finalized: bool,
    layout: ConstantsLayout,
}

// SAFETY: `ctx` is an opaque plugin value; NCCL calls a tuner context from the thread
// that owns its communicator, which may change over time; `&mut self` methods keep
// calls on one context exclusive.
unsafe impl Send for TunerContext {}

impl TunerContext {
    pub(crate) fn init(
        plugin: TunerPlugin,
        n_ranks: usize,
        n_nodes: usize,
        comm_id: u64,
        nvl: NvlDomainInfo,
        constants: &mut TunerConstants,
        layout: ConstantsLayout,
    ) -> Result<Self, TunerError> {
        let s = &plugin.shared;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let log = logger::logger();
        let mark = logger::warn_mark();
        match s.raw.get() {
            TunerRef::V1(t) => {
                let f = t.init.ok_or_else(|| s.refuse("init", "NULL init"))?;
                let mut refs = s.v1_refs.lock().unwrap_or_else(|p| p.into_inner());
                if *refs == 0 {
                    // SAFETY: v1 `init(nRanks, nNodes, logger)`.
                    let rc = unsafe { f(n_ranks, n_nodes, log) };
                    s.check("init", mark, rc)?;
                }
                *refs += 1;
            }
            TunerRef::V2(t) => v2_init(s, t.init, n_ranks, n_nodes, &mut ctx, mark)?,
            TunerRef::V3(t) => v2_init(s, t.init, n_ranks, n_nodes, &mut ctx, mark)?,
            TunerRef::V4(t) => v2_init(s, t.init, n_ranks, n_nodes, &mut ctx, mark)?,
            TunerRef::V5(t) => v5_init(
                s,
                t.init,
                (n_ranks, n_nodes, comm_id),
                nvl,
                (constants, layout),
                &mut ctx,
                mark,
            )?,
            TunerRef::V6(t) => v5_init(
                s,
                t.init,
                (n_ranks, n_nodes, comm_id),
                nvl,
                (constants, layout),
                &mut ctx,
                mark,
            )?,
            TunerRef::V7(t) => v7_init(
                s,
                t.init,
                (n_ranks, n_nodes, comm_id),
                nvl,
                constants,
                &mut ctx,
                mark,
            )?,
        }
        // v7 is NCCL's: its constants and table are NCCL-shaped whatever the flavour.
        let layout = match s.raw.version() {
            7 => ConstantsLayout::NcclV7,
            _ => layout,
        };
        Ok(Self {
            plugin,
            ctx,
            finalized: false,
            layout,
        })
    }

    /// The constants layout and cost-table shape this context was given.
    pub fn layout(&self) -> ConstantsLayout {
        self.layout
    }

    /// The plugin this context belongs to.
    pub fn plugin(&self) -> &TunerPlugin {
        &self.plugin
    }

    /// `getCollInfo` for one collective: the tuner edits `table` and may set
    /// `n_channels` (0 = keep NCCL's).
    ///
    /// Errors (the table is then what the tuner wrote, with illegally enabled entries
    /// put back to -1): the tuner's own error code; writing outside the table; setting
    /// an entry that was -1 (unsupported for this call) to anything else.
    pub fn get_coll_info(
        &mut self,
        func: Func,
        n_bytes: usize,
        num_pipe_ops: i32,
        reg_buff: bool,
        table: &mut CostTable,
        n_channels: &mut i32,
    ) -> Result<(), TunerError> {
        let s = &self.plugin.shared;
        let (ctx, np) = (self.ctx, NCCL_NUM_PROTOCOLS as c_int);
        let before = *table;
        let mut nch: c_int = *n_channels;
        let mark = logger::warn_mark();
        // Each arm calls the table's `getCollInfo` with NCCL's argument shapes: the flat
        // table's address cast to `float**` (as NCCL passes it), valid out-pointers,
        // this context; `na` is the host's algorithm count.
        let mut call = |flat: *mut f32, na: c_int| {
            let as_pp = flat.cast::<*mut f32>();
            // SAFETY: `flat` holds `na * 3` floats (see the callers below).
            unsafe {
                match s.raw.get() {
                    TunerRef::V1(t) => t.getCollInfo.map(|f| {
                        legacy_choice(flat, |coll, nvls, a, p| {
                            f(func, n_bytes, coll, nvls, num_pipe_ops, a, p, &mut nch)
                        })
                    }),
                    TunerRef::V2(t) => t.getCollInfo.map(|f| {
                        legacy_choice(flat, |coll, nvls, a, p| {
                            f(ctx, func, n_bytes, coll, nvls, num_pipe_ops, a, p, &mut nch)
                        })
                    }),
                    TunerRef::V3(t) => t
                        .getCollInfo
                        .map(|f| f(ctx, func, n_bytes, num_pipe_ops, as_pp, na, np, &mut nch)),
                    TunerRef::V4(t) => t.getCollInfo.map(|f| {
                        f(
                            ctx,
                            func,
                            n_bytes,
                            num_pipe_ops,
                            as_pp,
                            na,
                            np,
                            reg_buff as c_int,
                            &mut nch,
                        )
                    }),
                    TunerRef::V5(t) => t.getCollInfo.map(|f| {
                        f(
                            ctx,
                            func,
                            n_bytes,
                            num_pipe_ops,
                            as_pp,
                            na,
                            np,
                            reg_buff as c_int,
                            &mut nch,
                        )
                    }),
                    TunerRef::V6(t) => t.getCollInfo.map(|f| {
                        f(
                            ctx,
                            func,
                            n_bytes,
                            num_pipe_ops,
                            as_pp,
                            na,
                            np,
                            reg_buff as c_int,
                            &mut nch,
                        )
                    }),
                    TunerRef::V7(t) => t.getCollInfo.map(|f| {
                        f(
                            ctx,
                            func,
                            n_bytes,
                            num_pipe_ops,
                            as_pp,
                            na,
                            np,
                            reg_buff as c_int,
                            &mut nch,
                        )
                    }),
                }
            }
        };
        let na = self.layout.num_algo();
        let (after, rc, overrun) = if na == RCCL_ALGOS {
            // RCCL's float[8][3]: cclkit has no DIRECT_A2A, so its row is unsupported.
            let mut wide = [NCCL_ALGO_PROTO_IGNORE; RCCL_ALGOS * NCCL_NUM_PROTOCOLS];
            wide[..COST_TABLE_LEN].copy_from_slice(table);
            // SAFETY: `[f32; 24]` accepts any bit pattern.
            let (w, rc, o) =
                unsafe { guarded(&wide, |tp: *mut [f32; 24]| call(tp.cast(), na as c_int)) };
            if w[COST_TABLE_LEN..]
                .iter()
                .any(|c| *c != NCCL_ALGO_PROTO_IGNORE)
            {
                return Err(s.refuse(
                    "getCollInfo",
                    "the tuner enabled DIRECT_A2A, which the host left at -1 (unsupported)",
                ));
            }
            let mut narrow = [0.0; COST_TABLE_LEN];
            narrow.copy_from_slice(&w[..COST_TABLE_LEN]);
            (narrow, rc, o)
        } else {
            // SAFETY: `[f32; 21]` accepts any bit pattern.
            unsafe { guarded(table, |tp: *mut CostTable| call(tp.cast(), na as c_int)) }
        };
        let rc = rc.ok_or_else(|| s.refuse("getCollInfo", "NULL getCollInfo"))?;
        if let Some(o) = overrun {
            return Err(s.refuse(
                "getCollInfo",
                format!("the tuner {o} (the cost table is float[{na}][{NCCL_NUM_PROTOCOLS}])"),
            ));
        }
        *table = after;
        let mut enabled = Vec::new();
        for i in 0..COST_TABLE_LEN {
            if before[i] == NCCL_ALGO_PROTO_IGNORE && table[i] != NCCL_ALGO_PROTO_IGNORE {
                table[i] = NCCL_ALGO_PROTO_IGNORE;
                enabled.push(entry_name(i));
            }
        }
        s.check("getCollInfo", mark, rc)?;
        if !enabled.is_empty() {
            return Err(s.refuse(
                "getCollInfo",
                format!(
                    "the tuner enabled {} that NCCL left at -1 (unsupported for this call)",
                    enabled.join(", ")
                ),
            ));
        }
        *n_channels = nch;
        Ok(())
    }

    /// `getChunkSize` (v6, optional): `Ok(false)` when the tuner has none.
    pub fn get_chunk_size(
        &mut self,
        func: Func,
        n_bytes: usize,
        algo: Algorithm,
        proto: Protocol,
        n_channels: i32,
        chunk_size: &mut usize,
    ) -> Result<bool, TunerError> {
        let s = &self.plugin.shared;
        let f = match s.raw.get() {
            TunerRef::V6(t) => t.getChunkSize,
            TunerRef::V7(t) => t.getChunkSize,
            _ => None,
        };
        let Some(f) = f else { return Ok(false) };
        let mut chunk = *chunk_size;
        let mark = logger::warn_mark();
        // SAFETY: v6 `getChunkSize(ctx, …, size_t*)` with this context and a valid pointer.
        let rc = unsafe {
            f(
                self.ctx, func, n_bytes, algo.0, proto.0, n_channels, &mut chunk,
            )
        };
        s.check("getChunkSize", mark, rc)?;
        *chunk_size = chunk;
        Ok(true)
    }

    /// Finalizes now, returning the tuner's error if any (dropping also finalizes).
    pub fn finalize(mut self) -> Result<(), TunerError> {
        self.do_finalize()
    }

    fn do_finalize(&mut self) -> Result<(), TunerError> {
        if std::mem::replace(&mut self.finalized, true) {
            return Ok(());
        }
        let s = &self.plugin.shared;
        let mark = logger::warn_mark();
        let (call, f) = match s.raw.get() {
            TunerRef::V1(t) => {
                let mut refs = s.v1_refs.lock().unwrap_or_else(|p| p.into_inner());
                *refs = refs.saturating_sub(1);
                if *refs > 0 {
                    return Ok(());
                }
                let Some(f) = t.destroy else { return Ok(()) };
                // SAFETY: v1 `destroy()` after the last context.
                let rc = unsafe { f() };
                return s.check("destroy", mark, rc);
            }
            TunerRef::V2(t) => ("destroy", t.destroy),
            TunerRef::V3(t) => ("destroy", t.destroy),
            TunerRef::V4(t) => ("destroy", t.destroy),
            TunerRef::V5(t) => ("finalize", t.finalize),
            TunerRef::V6(t) => ("finalize", t.finalize),
            TunerRef::V7(t) => ("finalize", t.finalize),
        };
        let f = f.ok_or_else(|| s.refuse(call, "NULL finalize"))?;
        // SAFETY: `destroy(ctx)`/`finalize(ctx)` once, with the context `init` returned.
        let rc = unsafe { f(self.ctx) };
        s.check(call, mark, rc)
    }
}

impl Drop for TunerContext {
    fn drop(&mut self) {
        if let Err(e) = self.do_finalize() {
            tracing::warn!(subsys = cclkit_abi::raw::common::subsys::TUNING, "{e}");
        }
    }
}

type InitV2Fn = crate::FnOf<cclkit_abi::raw::tuner::InitV2>;
type InitV5Fn = crate::FnOf<cclkit_abi::raw::tuner::InitV5>;
type InitV7Fn = crate::FnOf<cclkit_abi::raw::tuner::InitV7>;

fn v2_init(
    s: &super::TunerShared,
    init: Option<InitV2Fn>,
    n_ranks: usize,
    n_nodes: usize,
    ctx: &mut *mut c_void,
    mark: u64,
) -> Result<(), TunerError> {
    let f = init.ok_or_else(|| s.refuse("init", "NULL init"))?;
    // SAFETY: v2–v4 `init(nRanks, nNodes, logger, &ctx)` (context out-pointer last).
    let rc = unsafe { f(n_ranks, n_nodes, logger::logger(), ctx) };
    s.check("init", mark, rc)
}

fn v5_init(
    s: &super::TunerShared,
    init: Option<InitV5Fn>,
    (n_ranks, n_nodes, comm_id): (usize, usize, u64),
    nvl: NvlDomainInfo,
    (constants, layout): (&mut TunerConstants, ConstantsLayout),
    ctx: &mut *mut c_void,
    mark: u64,
) -> Result<(), TunerError> {
    let f = init.ok_or_else(|| s.refuse("init", "NULL init"))?;
    let mut nvl = nvl;
    let log = logger::logger();
    // v5/v6 `init(&ctx, commId, nRanks, nNodes, logger, &nvl, constants)` (context
    // out-pointer first) with valid pointers for the duration of the call; the
    // constants struct is the emulated host's, canary-guarded.
    let mut call = |c: *mut c_void| {
        // SAFETY: see above; `c` points to the host layout's struct.
        unsafe { f(ctx, comm_id, n_ranks, n_nodes, log, &mut nvl, c.cast()) }
    };
    let (rc, overrun) = match layout {
        // SAFETY: `call` only hands the pointer to `init`.
        ConstantsLayout::Rccl7 => unsafe { with_rccl::<7, _>(constants, &mut call) },
        // SAFETY: as above.
        ConstantsLayout::Rccl8 => unsafe { with_rccl::<8, _>(constants, &mut call) },
        _ => {
            // SAFETY: the constants struct is 1152 bytes of f64 (any bit pattern is valid).
            let (value, rc, overrun) = unsafe { guarded(constants, |c| call(c.cast())) };
            if overrun.is_none() {
                *constants = value;
            }
            (rc, overrun)
        }
    };
    if let Some(o) = overrun {
        return Err(s.refuse(
            "init",
            format!(
                "the tuner {o} (ncclTunerConstants_v{}_t is {} bytes for this host: {})",
                s.raw.version(),
                layout.size(),
                layout.describe()
            ),
        ));
    }
    s.check("init", mark, rc)
}

/// v7 `init`: the host's (v5-shaped) constants widened to NCCL's v7 struct (1272
/// bytes, a fifth GPU-generation row NCCL 2.30 has no values for: 0), canary-guarded
/// like v5; what the tuner writes to the first four rows comes back to `constants`.
fn v7_init(
    s: &super::TunerShared,
    init: Option<InitV7Fn>,
    (n_ranks, n_nodes, comm_id): (usize, usize, u64),
    nvl: NvlDomainInfo,
    constants: &mut TunerConstants,
    ctx: &mut *mut c_void,
    mark: u64,
) -> Result<(), TunerError> {
    let f = init.ok_or_else(|| s.refuse("init", "NULL init"))?;
    let mut nvl = nvl;
    let log = logger::logger();
    let mut wide = ncclTunerConstants_v7_t::nccl_defaults();
    wide.update_from_v5(constants);
    // SAFETY: the v7 constants struct is 1272 bytes of f64 (any bit pattern is valid);
    // v7 `init(&ctx, commId, nRanks, nNodes, logger, &nvl, constants)` with valid
    // pointers for the duration of the call.
    let (value, rc, overrun) = unsafe {
        guarded(&wide, |c| {
            f(ctx, comm_id, n_ranks, n_nodes, log, &mut nvl, c)
        })
    };
    if let Some(o) = overrun {
        return Err(s.refuse(
            "init",
            format!("the tuner {o} (ncclTunerConstants_v7_t is 1272 bytes)"),
        ));
    }
    s.check("init", mark, rc)?;
    *constants = value.to_v5();
    Ok(())
}

/// NCCL's v2 shim (tuner_v2.cc): derive CollNet/NVLS support from the table, ask for
/// an algorithm/protocol, and select it (cost 0.0) if the table does not ignore it.
fn legacy_choice(
    table: *mut f32,
    call: impl FnOnce(c_int, c_int, *mut c_int, *mut c_int) -> cclkit_abi::raw::common::NcclResult,
) -> cclkit_abi::raw::common::NcclResult {
    let at = |a: i32, p: i32| (a as usize) * NCCL_NUM_PROTOCOLS + p as usize;
    let simple = Protocol::SIMPLE.0;
    // SAFETY: `table` points to `COST_TABLE_LEN` floats and every index is in range.
    let get = |i: usize| unsafe { table.add(i).read() };
    let nvls = get(at(Algorithm::NVLS.0, simple)) != NCCL_ALGO_PROTO_IGNORE
        || get(at(Algorithm::NVLS_TREE.0, simple)) != NCCL_ALGO_PROTO_IGNORE;
    let collnet = get(at(Algorithm::COLLNET_CHAIN.0, simple)) != NCCL_ALGO_PROTO_IGNORE;
    let (mut algo, mut proto) = (Algorithm::UNDEF.0, Protocol::UNDEF.0);
    let rc = call(collnet as c_int, nvls as c_int, &mut algo, &mut proto);
    if rc.is_ok()
        && (0..NCCL_NUM_ALGORITHMS as i32).contains(&algo)
        && (0..NCCL_NUM_PROTOCOLS as i32).contains(&proto)
        && get(at(algo, proto)) != NCCL_ALGO_PROTO_IGNORE
    {
        // SAFETY: in range, as checked just above.
        unsafe { table.add(at(algo, proto)).write(0.0) };
    }
    rc
}

/// "RING/SIMPLE" for a flat index.
fn entry_name(i: usize) -> String {
    let a = Algorithm((i / NCCL_NUM_PROTOCOLS) as i32);
    let p = Protocol((i % NCCL_NUM_PROTOCOLS) as i32);
    format!("{a}/{p}")
}
