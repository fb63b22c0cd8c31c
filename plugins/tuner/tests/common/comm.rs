//! One communicator's tuner context opened through the v4, v5 or v6 table, called
//! exactly as NCCL calls it, with canaries checked after every call.

use std::ffi::c_void;
use std::ptr;

use cclkit_abi::raw::common::{Func, NcclResult};
use cclkit_abi::raw::tuner::{ncclNvlDomainInfo_v5_t, ncclTunerConstants_v5_t};
use cclkit_abi::tuner::NCCL_DEFAULT_CONSTANTS;
use cclkit_tuner::{ncclTunerPlugin_v4, ncclTunerPlugin_v5, ncclTunerPlugin_v6};

use super::{Channels, Constants, NA, NP, Table};

/// A table version that opens a per-communicator context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ver {
    /// `ncclTunerPlugin_v4`.
    V4,
    /// `ncclTunerPlugin_v5`.
    V5,
    /// `ncclTunerPlugin_v6`.
    V6,
}

/// One communicator's tuner context, opened through a table version.
pub struct Comm {
    ver: Ver,
    /// The context the tuner returned from init.
    pub ctx: *mut c_void,
    consts: Option<Box<Constants>>,
    /// The constants as passed to init.
    orig: ncclTunerConstants_v5_t,
}

impl Comm {
    /// Opens with NCCL's default constants.
    pub fn open(ver: Ver, n_ranks: usize, n_nodes: usize) -> Self {
        Self::open_with(ver, n_ranks, n_nodes, NCCL_DEFAULT_CONSTANTS)
    }

    /// Opens with constants `c` (v5/v6 see them; v4 has none).
    pub fn open_with(ver: Ver, n_ranks: usize, n_nodes: usize, c: ncclTunerConstants_v5_t) -> Self {
        let mut ctx: *mut c_void = ptr::null_mut();
        let mut nvl = ncclNvlDomainInfo_v5_t {
            nNvlDomains: n_nodes as i32,
            minRanksPerNvlDomain: 1,
            maxRanksPerNvlDomain: 8,
        };
        let mut consts = None;
        // SAFETY: valid out-pointer, NVL info and constants for the duration of the call.
        let rc = unsafe {
            match ver {
                Ver::V4 => ncclTunerPlugin_v4.init.unwrap()(n_ranks, n_nodes, None, &mut ctx),
                Ver::V5 | Ver::V6 => {
                    let mut k = Constants::new(c);
                    let init = if ver == Ver::V5 {
                        ncclTunerPlugin_v5.init.unwrap()
                    } else {
                        ncclTunerPlugin_v6.init.unwrap()
                    };
                    let rc = init(
                        &mut ctx, 0xc0ffee, n_ranks, n_nodes, None, &mut nvl, &mut k.c,
                    );
                    consts = Some(k);
                    rc
                }
            }
        };
        assert_eq!(rc, NcclResult::SUCCESS, "init via {ver:?}");
        assert!(!ctx.is_null());
        Self {
            ver,
            ctx,
            consts,
            orig: c,
        }
    }

    /// One getCollInfo call; returns the decision visible to NCCL.
    pub fn coll(&self, func: Func, n: usize, pipe: i32, reg: i32, t: &mut Table) -> i32 {
        let before = t.costs();
        let mut ch = Channels::new();
        let get = match self.ver {
            Ver::V4 => ncclTunerPlugin_v4.getCollInfo.unwrap(),
            Ver::V5 => ncclTunerPlugin_v5.getCollInfo.unwrap(),
            Ver::V6 => ncclTunerPlugin_v6.getCollInfo.unwrap(),
        };
        // SAFETY: live context; flat 7×3 table; writable nChannels.
        let rc = unsafe {
            get(
                self.ctx,
                func,
                n,
                pipe,
                t.ptr(),
                NA as i32,
                NP as i32,
                reg,
                ch.ptr(),
            )
        };
        assert_eq!(rc, NcclResult::SUCCESS);
        t.assert_only_lowered(&before);
        if let Some(k) = &self.consts {
            assert!(k.canaries_intact());
        }
        ch.get()
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let fin = match self.ver {
            Ver::V4 => ncclTunerPlugin_v4.destroy.unwrap(),
            Ver::V5 => ncclTunerPlugin_v5.finalize.unwrap(),
            Ver::V6 => ncclTunerPlugin_v6.finalize.unwrap(),
        };
        // SAFETY: the context came from init and is finalized once.
        let rc = unsafe { fin(self.ctx) };
        if !std::thread::panicking() {
            assert_eq!(rc, NcclResult::SUCCESS);
            if let Some(k) = &self.consts {
                assert!(k.canaries_intact());
                // The tuner reads NCCL's constants and never rewrites them.
                assert_eq!(k.c, self.orig);
            }
        }
    }
}
