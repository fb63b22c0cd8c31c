//! The `extern "C"` entry points of the tuner tables and the const fns building them.

use std::ffi::{c_int, c_void};

use super::view::{Constants, ConstantsLayout};
use super::{TunerExport, host, ops};
use crate::export::guard::guard;
use crate::log::set_logger;
use crate::raw::common::{Func, NcclResult, ncclDebugLogger_t};
use crate::raw::tuner::*;

unsafe extern "C" fn init_v1<T: TunerExport>(
    n_ranks: usize,
    n_nodes: usize,
    log: ncclDebugLogger_t,
) -> NcclResult {
    set_logger(log);
    guard("ncclTuner.init", || ops::init_v1::<T>(n_ranks, n_nodes))
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info_v1<T: TunerExport>(
    func: Func,
    n_bytes: usize,
    coll_net: c_int,
    nvls: c_int,
    pipe: c_int,
    algo: *mut c_int,
    proto: *mut c_int,
    nch: *mut c_int,
) -> NcclResult {
    // SAFETY: NCCL passes writable out-pointers.
    guard("ncclTuner.getCollInfo", || unsafe {
        ops::get_coll_info_v1::<T>(func, n_bytes, coll_net, nvls, pipe, algo, proto, nch)
    })
}

unsafe extern "C" fn destroy_v1<T: TunerExport>() -> NcclResult {
    guard("ncclTuner.destroy", ops::destroy_v1::<T>)
}

/// v2–v4 `init`: context out-pointer last.
unsafe extern "C" fn init_v2<T: TunerExport, const V: u32>(
    n_ranks: usize,
    n_nodes: usize,
    log: ncclDebugLogger_t,
    ctx: *mut *mut c_void,
) -> NcclResult {
    set_logger(log);
    // SAFETY: NCCL passes a writable context out-pointer.
    guard("ncclTuner.init", || unsafe {
        ops::init::<T>(V, ctx, None, n_ranks, n_nodes, std::ptr::null_mut(), None)
    })
}

/// v5/v6 `init`: context out-pointer first. NCCL passes its 1152-byte constants,
/// RCCL its wider struct (see [`host`] for how the two are told apart).
unsafe extern "C" fn init_v5<T: TunerExport, const V: u32>(
    ctx: *mut *mut c_void,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: ncclDebugLogger_t,
    nvl: *mut ncclNvlDomainInfo_v5_t,
    constants: *mut ncclTunerConstants_v5_t,
) -> NcclResult {
    set_logger(log);
    guard("ncclTuner.init", || {
        let layout = host::v5_layout();
        if layout == ConstantsLayout::RcclUnknown && !constants.is_null() {
            crate::nccl_warn!(
                "cclkit tuner: RCCL host of unknown algorithm count; only base latencies of \
                 the tuning constants are reachable (set CCLKIT_RCCL_NUM_ALGO=7 or 8)"
            );
        }
        // SAFETY: the host passes NULL or its comm's constants in `layout`, live and
        // exclusively ours for the call; a writable context out-pointer and NVL info.
        unsafe {
            let view = Constants::from_raw(constants.cast(), layout);
            ops::init::<T>(V, ctx, Some(comm_id), n_ranks, n_nodes, nvl, view)
        }
    })
}

/// v7 `init`: as v5 with NCCL's v7 constants (1272 bytes; RCCL has no v7).
unsafe extern "C" fn init_v7<T: TunerExport>(
    ctx: *mut *mut c_void,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: ncclDebugLogger_t,
    nvl: *mut ncclNvlDomainInfo_v7_t,
    constants: *mut ncclTunerConstants_v7_t,
) -> NcclResult {
    set_logger(log);
    // SAFETY: NCCL passes a writable context out-pointer, and NULL or its comm's
    // 1272-byte v7 constants, live and exclusively ours for the call.
    guard("ncclTuner.init", || unsafe {
        let view = Constants::from_raw(constants.cast(), ConstantsLayout::NcclV7);
        ops::init::<T>(7, ctx, Some(comm_id), n_ranks, n_nodes, nvl, view)
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info_v2<T: TunerExport>(
    ctx: *mut c_void,
    func: Func,
    n_bytes: usize,
    coll_net: c_int,
    nvls: c_int,
    pipe: c_int,
    algo: *mut c_int,
    proto: *mut c_int,
    nch: *mut c_int,
) -> NcclResult {
    // SAFETY: NCCL passes its context and writable out-pointers.
    guard("ncclTuner.getCollInfo", || unsafe {
        ops::get_coll_info_v2::<T>(ctx, func, n_bytes, coll_net, nvls, pipe, algo, proto, nch)
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info_v3<T: TunerExport>(
    ctx: *mut c_void,
    func: Func,
    n_bytes: usize,
    pipe: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    nch: *mut c_int,
) -> NcclResult {
    // SAFETY: NCCL passes its context, its flat cost table and a writable nChannels.
    guard("ncclTuner.getCollInfo", || unsafe {
        ops::get_coll_info::<T>(
            ctx, func, n_bytes, pipe, table, num_algo, num_proto, None, nch,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info_v4<T: TunerExport>(
    ctx: *mut c_void,
    func: Func,
    n_bytes: usize,
    pipe: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    reg_buff: c_int,
    nch: *mut c_int,
) -> NcclResult {
    // SAFETY: as above.
    guard("ncclTuner.getCollInfo", || unsafe {
        ops::get_coll_info::<T>(
            ctx,
            func,
            n_bytes,
            pipe,
            table,
            num_algo,
            num_proto,
            Some(reg_buff),
            nch,
        )
    })
}

unsafe extern "C" fn finalize<T: TunerExport>(ctx: *mut c_void) -> NcclResult {
    // SAFETY: NCCL passes the context from init and never uses it again.
    guard("ncclTuner.finalize", || unsafe { ops::finalize::<T>(ctx) })
}

unsafe extern "C" fn get_chunk_size<T: TunerExport>(
    ctx: *mut c_void,
    func: Func,
    n_bytes: usize,
    algo: c_int,
    proto: c_int,
    nch: c_int,
    chunk: *mut usize,
) -> NcclResult {
    // SAFETY: NCCL passes its context and a writable chunk size.
    guard("ncclTuner.getChunkSize", || unsafe {
        ops::get_chunk_size::<T>(ctx, func, n_bytes, algo, proto, nch, chunk)
    })
}

/// `ncclTunerPlugin_v1` for `T` (one global instance).
pub const fn v1<T: TunerExport>() -> ncclTuner_v1_t {
    ncclTuner_v1_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v1::<T>),
        getCollInfo: Some(get_coll_info_v1::<T>),
        destroy: Some(destroy_v1::<T>),
    }
}

/// `ncclTunerPlugin_v2` for `T`.
pub const fn v2<T: TunerExport>() -> ncclTuner_v2_t {
    ncclTuner_v2_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v2::<T, 2>),
        getCollInfo: Some(get_coll_info_v2::<T>),
        destroy: Some(finalize::<T>),
    }
}

/// `ncclTunerPlugin_v3` for `T`.
pub const fn v3<T: TunerExport>() -> ncclTuner_v3_t {
    ncclTuner_v3_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v2::<T, 3>),
        getCollInfo: Some(get_coll_info_v3::<T>),
        destroy: Some(finalize::<T>),
    }
}

/// `ncclTunerPlugin_v4` for `T`.
pub const fn v4<T: TunerExport>() -> ncclTuner_v4_t {
    ncclTuner_v4_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v2::<T, 4>),
        getCollInfo: Some(get_coll_info_v4::<T>),
        destroy: Some(finalize::<T>),
    }
}

/// `ncclTunerPlugin_v5` for `T`.
pub const fn v5<T: TunerExport>() -> ncclTuner_v5_t {
    ncclTuner_v5_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v5::<T, 5>),
        getCollInfo: Some(get_coll_info_v4::<T>),
        finalize: Some(finalize::<T>),
    }
}

/// `ncclTunerPlugin_v6` for `T`.
pub const fn v6<T: TunerExport>() -> ncclTuner_v6_t {
    ncclTuner_v6_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v5::<T, 6>),
        getCollInfo: Some(get_coll_info_v4::<T>),
        finalize: Some(finalize::<T>),
        getChunkSize: if T::HAS_CHUNK_SIZE {
            Some(get_chunk_size::<T>)
        } else {
            None
        },
    }
}

/// `ncclTunerPlugin_v7` for `T`.
pub const fn v7<T: TunerExport>() -> ncclTuner_v7_t {
    ncclTuner_v7_t {
        name: T::NAME.as_ptr(),
        init: Some(init_v7::<T>),
        getCollInfo: Some(get_coll_info_v4::<T>),
        finalize: Some(finalize::<T>),
        getChunkSize: if T::HAS_CHUNK_SIZE {
            Some(get_chunk_size::<T>)
        } else {
            None
        },
    }
}
