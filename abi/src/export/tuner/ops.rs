//! Operations behind the tuner tables; the only place the tuner export touches
//! NCCL's raw pointers.

use std::ffi::{c_int, c_void};

use super::TunerExport;
use super::view::Constants;
use crate::error::{Error, Result};
use crate::raw::common::{
    Algorithm, Func, NCCL_ALGO_PROTO_IGNORE, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, Protocol,
};
use crate::raw::tuner::ncclNvlDomainInfo_v5_t;
use crate::tuner::{CollInfo, CostTable, Tuner, TunerInit};

const TUNER_TAG: u64 = u64::from_be_bytes(*b"cclk-tun");
const DEAD_TAG: u64 = u64::from_be_bytes(*b"cclk-dea");

/// A tuner context as handed to NCCL: tag first so a bad pointer is reported.
#[repr(C)]
struct TunerBox<T> {
    tag: u64,
    tuner: T,
    /// Algorithms of the constants layout assumed at `init` (0: no constants), and
    /// whether a `getCollInfo` contradicting it was already reported.
    layout_algos: usize,
    layout_warned: std::sync::atomic::AtomicBool,
}

/// Largest table dimensions accepted (NCCL uses 7 × 3).
const MAX_ALGO: c_int = 32;
const MAX_PROTO: c_int = 8;

/// # Safety
/// `ctx` must be NULL or writable; `nvl` NULL or valid for the call.
pub(crate) unsafe fn init<T: TunerExport>(
    host_abi: u32,
    ctx: *mut *mut c_void,
    comm_id: Option<u64>,
    n_ranks: usize,
    n_nodes: usize,
    nvl: *mut ncclNvlDomainInfo_v5_t,
    constants: Option<Constants<'_>>,
) -> Result<()> {
    if ctx.is_null() {
        return Err(Error::invalid_argument(
            "tuner init: context out-pointer is NULL",
        ));
    }
    let args = TunerInit {
        host_abi,
        comm_id,
        n_ranks,
        n_nodes,
        // SAFETY: NCCL passes NULL or its comm's NVL info.
        nvl_domains: (!nvl.is_null()).then(|| unsafe { nvl.read() }),
        constants,
    };
    let layout_algos = args
        .constants
        .as_ref()
        .map(|c| c.layout())
        .filter(|l| *l != super::view::ConstantsLayout::RcclUnknown)
        .map_or(0, super::view::ConstantsLayout::num_algo);
    let tuner = T::init(args)?;
    // SAFETY: checked non-NULL.
    unsafe {
        ctx.write(
            Box::into_raw(Box::new(TunerBox {
                tag: TUNER_TAG,
                tuner,
                layout_algos,
                layout_warned: std::sync::atomic::AtomicBool::new(false),
            }))
            .cast(),
        )
    };
    Ok(())
}

/// # Safety
/// `ctx` must be NULL or a live context of this plugin.
unsafe fn tuner<'a, T>(ctx: *mut c_void) -> Result<&'a T> {
    // SAFETY: forwarded contract.
    Ok(&unsafe { tuner_box::<T>(ctx)? }.tuner)
}

/// # Safety
/// As [`tuner`].
unsafe fn tuner_box<'a, T>(ctx: *mut c_void) -> Result<&'a TunerBox<T>> {
    if ctx.is_null() {
        return Err(Error::invalid_argument("tuner context is NULL"));
    }
    // SAFETY: non-NULL; every context we hand out starts with the tag.
    if unsafe { ctx.cast::<u64>().read() } != TUNER_TAG {
        return Err(Error::invalid_argument(format!(
            "{ctx:p} is not a live context of this tuner"
        )));
    }
    // SAFETY: the tag identifies a TunerBox<T> from `init`.
    Ok(unsafe { &*ctx.cast::<TunerBox<T>>() })
}

/// # Safety
/// `ctx` must be a context from `init` (it is freed).
pub(crate) unsafe fn finalize<T: TunerExport>(ctx: *mut c_void) -> Result<()> {
    // SAFETY: forwarded contract; validated by the tag.
    unsafe { tuner::<T>(ctx)? };
    // SAFETY: validated above; mark dead so a double finalize is caught.
    let boxed = unsafe {
        ctx.cast::<u64>().write(DEAD_TAG);
        Box::from_raw(ctx.cast::<TunerBox<T>>())
    };
    boxed.tuner.finalize()
}

/// # Safety
/// `ctx` must be a live context; `table` NULL or `num_algo * num_proto` floats;
/// `n_channels` NULL or writable.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn get_coll_info<T: TunerExport>(
    ctx: *mut c_void,
    func: Func,
    n_bytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    reg_buff: Option<c_int>,
    n_channels: *mut c_int,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let b = unsafe { tuner_box::<T>(ctx)? };
    let t = &b.tuner;
    if b.layout_algos != 0
        && usize::try_from(num_algo).ok() != Some(b.layout_algos)
        && !b
            .layout_warned
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        // The host's table says how many algorithms it has; the constants layout
        // assumed at `init` had another count, so they were read at wrong offsets.
        crate::nccl_warn!(
            "cclkit tuner: the host passes {num_algo} algorithms but init assumed a \
             {}-algorithm constants layout; set CCLKIT_FLAVOR / CCLKIT_RCCL_NUM_ALGO",
            b.layout_algos
        );
    }
    if table.is_null() || n_channels.is_null() {
        return Err(Error::invalid_argument(
            "getCollInfo: cost table or nChannels is NULL",
        ));
    }
    if !(1..=MAX_ALGO).contains(&num_algo) || !(1..=MAX_PROTO).contains(&num_proto) {
        return Err(Error::invalid_argument(format!(
            "getCollInfo: table shape {num_algo}×{num_proto}"
        )));
    }
    let (na, np) = (num_algo as usize, num_proto as usize);
    // SAFETY: `float**` is really the address of a flat float[numAlgo][numProto].
    let costs = unsafe { std::slice::from_raw_parts_mut(table.cast::<f32>(), na * np) };
    let mut view =
        CostTable::new(costs, na, np).ok_or_else(|| Error::internal("cost table shape"))?;
    let info = CollInfo {
        func,
        n_bytes,
        num_pipe_ops,
        reg_buff: reg_buff.map(|r| r != 0),
    };
    // SAFETY: checked non-NULL.
    let nch = unsafe { &mut *n_channels };
    t.get_coll_info(&info, &mut view, nch)
}

/// Cost given to supported entries of a synthesised table: a tuner's own estimate
/// or `prefer` lowers it; an untouched table means "no opinion".
const LEGACY_PLACEHOLDER: f32 = 1.0e9;

/// v1/v2: builds the table NCCL would have built, asks the tuner, and turns its
/// preference back into `(algorithm, protocol)`.
///
/// # Safety
/// `ctx`-derived `t` must be live; out-pointers NULL or writable.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn choose_legacy<T: Tuner>(
    t: &T,
    func: Func,
    n_bytes: usize,
    coll_net: c_int,
    nvls: c_int,
    num_pipe_ops: c_int,
    algorithm: *mut c_int,
    protocol: *mut c_int,
    n_channels: *mut c_int,
) -> Result<()> {
    if algorithm.is_null() || protocol.is_null() || n_channels.is_null() {
        return Err(Error::invalid_argument(
            "getCollInfo: algorithm, protocol or nChannels is NULL",
        ));
    }
    let mut costs = [NCCL_ALGO_PROTO_IGNORE; NCCL_NUM_ALGORITHMS * NCCL_NUM_PROTOCOLS];
    let mut offer = |a: Algorithm, p: Protocol| {
        costs[a.0 as usize * NCCL_NUM_PROTOCOLS + p.0 as usize] = LEGACY_PLACEHOLDER
    };
    for a in [Algorithm::TREE, Algorithm::RING] {
        for p in [Protocol::LL, Protocol::LL128, Protocol::SIMPLE] {
            offer(a, p);
        }
    }
    if coll_net != 0 {
        offer(Algorithm::COLLNET_DIRECT, Protocol::SIMPLE);
        offer(Algorithm::COLLNET_CHAIN, Protocol::SIMPLE);
    }
    if nvls != 0 {
        offer(Algorithm::NVLS, Protocol::SIMPLE);
        offer(Algorithm::NVLS_TREE, Protocol::SIMPLE);
    }
    let mut view = CostTable::new(&mut costs, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS)
        .ok_or_else(|| Error::internal("cost table shape"))?;
    let info = CollInfo {
        func,
        n_bytes,
        num_pipe_ops,
        reg_buff: None,
    };
    // SAFETY: checked non-NULL.
    let nch = unsafe { &mut *n_channels };
    t.get_coll_info(&info, &mut view, nch)?;
    if let Some((a, p, c)) = view.cheapest().filter(|e| e.2 < LEGACY_PLACEHOLDER) {
        let _ = c;
        // SAFETY: checked non-NULL.
        unsafe {
            algorithm.write(a.0);
            protocol.write(p.0);
        }
    }
    Ok(())
}

/// v2: the context's tuner.
///
/// # Safety
/// As [`choose_legacy`]; `ctx` a live context.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn get_coll_info_v2<T: TunerExport>(
    ctx: *mut c_void,
    func: Func,
    n_bytes: usize,
    coll_net: c_int,
    nvls: c_int,
    num_pipe_ops: c_int,
    algorithm: *mut c_int,
    protocol: *mut c_int,
    n_channels: *mut c_int,
) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe {
        let t = tuner::<T>(ctx)?;
        choose_legacy(
            t,
            func,
            n_bytes,
            coll_net,
            nvls,
            num_pipe_ops,
            algorithm,
            protocol,
            n_channels,
        )
    }
}

/// v1: the process-global tuner.
pub(crate) fn init_v1<T: TunerExport>(n_ranks: usize, n_nodes: usize) -> Result<()> {
    let tuner = T::init(TunerInit {
        host_abi: 1,
        comm_id: None,
        n_ranks,
        n_nodes,
        nvl_domains: None,
        constants: None,
    })?;
    let mut g = T::state()
        .global
        .lock()
        .map_err(|_| Error::internal("tuner state poisoned"))?;
    *g = Some(tuner);
    Ok(())
}

/// # Safety
/// Out-pointers NULL or writable.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn get_coll_info_v1<T: TunerExport>(
    func: Func,
    n_bytes: usize,
    coll_net: c_int,
    nvls: c_int,
    num_pipe_ops: c_int,
    algorithm: *mut c_int,
    protocol: *mut c_int,
    n_channels: *mut c_int,
) -> Result<()> {
    let g = T::state()
        .global
        .lock()
        .map_err(|_| Error::internal("tuner state poisoned"))?;
    let t = g
        .as_ref()
        .ok_or_else(|| Error::invalid_usage("getCollInfo called before init"))?;
    // SAFETY: forwarded contract.
    unsafe {
        choose_legacy(
            t,
            func,
            n_bytes,
            coll_net,
            nvls,
            num_pipe_ops,
            algorithm,
            protocol,
            n_channels,
        )
    }
}

pub(crate) fn destroy_v1<T: TunerExport>() -> Result<()> {
    let taken = T::state()
        .global
        .lock()
        .map_err(|_| Error::internal("tuner state poisoned"))?
        .take();
    taken.map_or(Ok(()), Tuner::finalize)
}

/// # Safety
/// `ctx` a live context; `chunk_size` NULL or writable.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn get_chunk_size<T: TunerExport>(
    ctx: *mut c_void,
    func: Func,
    n_bytes: usize,
    algo: c_int,
    proto: c_int,
    n_channels: c_int,
    chunk_size: *mut usize,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let t = unsafe { tuner::<T>(ctx)? };
    // SAFETY: NCCL passes NULL or its chunk size variable.
    let chunk = unsafe { chunk_size.as_mut() }
        .ok_or_else(|| Error::invalid_argument("getChunkSize: chunkSize is NULL"))?;
    let info = CollInfo {
        func,
        n_bytes,
        num_pipe_ops: 1,
        reg_buff: None,
    };
    t.get_chunk_size(&info, Algorithm(algo), Protocol(proto), n_channels, chunk)
}
