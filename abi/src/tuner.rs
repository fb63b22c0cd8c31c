//! The `Tuner` trait plugin authors implement, and a safe view of NCCL's cost table.
//!
//! One `impl Tuner` plus [`export_tuner!`](crate::export_tuner) publishes
//! `ncclTunerPlugin_v1` … `_v7`. One tuner value exists per communicator (v5+ pass
//! the communicator id), never a process-wide singleton; v1 hosts get one global
//! instance because that ABI has no context.

use std::ffi::CStr;

use crate::error::Result;
use crate::raw::common::{Algorithm, Func, NCCL_ALGO_PROTO_IGNORE, Protocol};
use crate::raw::tuner::ncclNvlDomainInfo_v5_t;

pub use crate::export::tuner::view::{BwTableKind, Constants, ConstantsLayout};

/// NCCL 2.30's default model constants (see [`crate::raw::tuner::defaults`]): what a
/// host passes a v5/v6 `init`, and what a tuner should assume when its host passes none.
pub use crate::raw::tuner::defaults::NCCL_DEFAULT_CONSTANTS;

/// What `init` receives; fields an older ABI lacks are `None`.
pub struct TunerInit<'a> {
    /// Tuner ABI version the host called through (6 for NCCL 2.30).
    pub host_abi: u32,
    /// Communicator id (hash), v5+.
    pub comm_id: Option<u64>,
    /// Ranks in the communicator.
    pub n_ranks: usize,
    /// Nodes in the communicator.
    pub n_nodes: usize,
    /// NVLink-domain layout, v5+.
    pub nvl_domains: Option<ncclNvlDomainInfo_v5_t>,
    /// The host's model constants, v5+, in the host's own layout (NCCL, NCCL v7 or
    /// RCCL): the tuner may rewrite them through the view; the host re-reads them.
    pub constants: Option<Constants<'a>>,
}

/// One `getCollInfo` question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollInfo {
    /// The collective (0…4).
    pub func: Func,
    /// Bytes (count × element size; × nRanks for AllGather/ReduceScatter).
    pub n_bytes: usize,
    /// Operations pipelined in the group.
    pub num_pipe_ops: i32,
    /// Both user buffers registered (v4+; `None` before).
    pub reg_buff: Option<bool>,
}

/// NCCL's `float[numAlgo][numProto]` cost table, in microseconds.
///
/// A tuner can only make a supported entry cheaper ([`lower`](Self::lower),
/// [`prefer`](Self::prefer)) or rule it out ([`ignore`](Self::ignore)); entries
/// NCCL left at -1 (unsupported for this call) cannot be enabled.
pub struct CostTable<'a> {
    costs: &'a mut [f32],
    num_algo: usize,
    num_proto: usize,
}

impl<'a> CostTable<'a> {
    /// Views a flat row-major table.
    ///
    /// Returns `None` unless `costs.len() == num_algo * num_proto`.
    #[inline]
    pub fn new(costs: &'a mut [f32], num_algo: usize, num_proto: usize) -> Option<Self> {
        (costs.len() == num_algo.checked_mul(num_proto)?).then_some(Self {
            costs,
            num_algo,
            num_proto,
        })
    }

    /// Algorithms in the table (7 today, 6 in NCCL 2.19–2.22, 8 in current RCCL).
    #[inline]
    pub fn num_algo(&self) -> usize {
        self.num_algo
    }

    /// Protocols in the table (3).
    #[inline]
    pub fn num_proto(&self) -> usize {
        self.num_proto
    }

    #[inline]
    fn index(&self, algo: Algorithm, proto: Protocol) -> Option<usize> {
        let a = usize::try_from(algo.0)
            .ok()
            .filter(|a| *a < self.num_algo)?;
        let p = usize::try_from(proto.0)
            .ok()
            .filter(|p| *p < self.num_proto)?;
        Some(a * self.num_proto + p)
    }

    /// The cost of `(algo, proto)`, `None` if unsupported or outside the table.
    #[inline]
    pub fn get(&self, algo: Algorithm, proto: Protocol) -> Option<f32> {
        let c = self.costs[self.index(algo, proto)?];
        (c >= 0.0).then_some(c)
    }

    /// True if NCCL offers `(algo, proto)` for this call.
    #[inline]
    pub fn is_supported(&self, algo: Algorithm, proto: Protocol) -> bool {
        self.get(algo, proto).is_some()
    }

    /// Sets a supported entry to `cost` if that is cheaper; returns whether it did.
    #[inline]
    pub fn lower(&mut self, algo: Algorithm, proto: Protocol, cost: f32) -> bool {
        match self.index(algo, proto) {
            Some(i) if self.costs[i] >= 0.0 && cost >= 0.0 && cost < self.costs[i] => {
                self.costs[i] = cost;
                true
            }
            _ => false,
        }
    }

    /// Selects `(algo, proto)` (cost 0.0, NCCL's convention) if supported.
    #[inline]
    pub fn prefer(&mut self, algo: Algorithm, proto: Protocol) -> bool {
        self.is_supported(algo, proto) && {
            if let Some(i) = self.index(algo, proto) {
                self.costs[i] = 0.0;
            }
            true
        }
    }

    /// Rules `(algo, proto)` out for this call.
    #[inline]
    pub fn ignore(&mut self, algo: Algorithm, proto: Protocol) {
        if let Some(i) = self.index(algo, proto) {
            self.costs[i] = NCCL_ALGO_PROTO_IGNORE;
        }
    }

    /// Supported entries with their costs, algorithm-major.
    pub fn supported(&self) -> impl Iterator<Item = (Algorithm, Protocol, f32)> + '_ {
        (0..self.num_algo).flat_map(move |a| {
            (0..self.num_proto).filter_map(move |p| {
                let c = self.costs[a * self.num_proto + p];
                (c >= 0.0).then_some((Algorithm(a as i32), Protocol(p as i32), c))
            })
        })
    }

    /// The entry NCCL would pick: smallest non-negative cost, first in algo-major order.
    pub fn cheapest(&self) -> Option<(Algorithm, Protocol, f32)> {
        self.supported().fold(None, |best, e| match best {
            Some((_, _, c)) if c <= e.2 => best,
            _ => Some(e),
        })
    }
}

/// An algorithm/protocol tuner, written once and exported as every tuner ABI version.
pub trait Tuner: Sized + Send + Sync + 'static {
    /// The tuner's name.
    const NAME: &'static CStr;
    /// Publish `getChunkSize` in the v6 table.
    const HAS_CHUNK_SIZE: bool = false;

    /// Creates the tuner of one communicator. An error fails communicator creation in
    /// NCCL, so prefer falling back to a built-in model and logging why.
    fn init(args: TunerInit<'_>) -> Result<Self>;

    /// Adjusts the cost table for one collective; may set `n_channels` (0 = keep NCCL's).
    fn get_coll_info(
        &self,
        info: &CollInfo,
        table: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Result<()>;

    /// Rewrites the chunk size NCCL computed for the chosen algorithm/protocol (v6).
    fn get_chunk_size(
        &self,
        info: &CollInfo,
        algo: Algorithm,
        proto: Protocol,
        n_channels: i32,
        chunk_size: &mut usize,
    ) -> Result<()> {
        let _ = (info, algo, proto, n_channels, chunk_size);
        Ok(())
    }

    /// Releases the communicator's tuner.
    fn finalize(self) -> Result<()> {
        Ok(())
    }
}
