//! The analytic latency/bandwidth model (formulas in the crate README, "Model mode").
//!
//! Everything that depends only on the communicator is computed at init into a
//! `[collective][algorithm][protocol]` table of latency (µs) and cost per byte
//! (µs/B), so a prediction on the hot path is one multiply-add.

use cclkit_abi::raw::common::{Algorithm, Func, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, Protocol};
use cclkit_abi::raw::tuner::{NCCL_HW_NET, ncclTunerConstants_v5_t};
use cclkit_abi::tuner::{CollInfo, CostTable, NCCL_DEFAULT_CONSTANTS};

use crate::config::ModelSettings;
pub use crate::hw::{Arch, IntraLink};

/// The model's link parameters (defaults describe an 8-GPU NVLink node).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkParams {
    /// Intra-node bus bandwidth per GPU, GB/s.
    pub intra_bw: f64,
    /// Network bandwidth per node (all NICs), GB/s.
    pub net_bw: f64,
    /// Extra latency added to every network step, µs.
    pub net_lat: f64,
    /// Intra-node link type.
    pub intra_link: IntraLink,
    /// GPU generation.
    pub arch: Arch,
    /// Channels assumed for the per-channel bandwidth ceilings.
    pub channels: u32,
}

impl Default for LinkParams {
    fn default() -> Self {
        Self {
            intra_bw: 240.0,
            net_bw: 100.0,
            net_lat: 0.0,
            intra_link: IntraLink::NvLink,
            arch: Arch::Hopper,
            channels: 16,
        }
    }
}

impl LinkParams {
    /// Defaults with every setting in `s` applied.
    pub fn with(s: &ModelSettings) -> Self {
        let d = Self::default();
        Self {
            intra_bw: s.intra_bw.unwrap_or(d.intra_bw),
            net_bw: s.net_bw.unwrap_or(d.net_bw),
            net_lat: s.net_lat.unwrap_or(d.net_lat),
            intra_link: s.intra_link.unwrap_or(d.intra_link),
            arch: s.arch.unwrap_or(d.arch),
            channels: s.channels.unwrap_or(d.channels),
        }
    }
}

const TREE: usize = 0;
const RING: usize = 1;
const COLLNET_DIRECT: usize = 2;
const COLLNET_CHAIN: usize = 3;
const NVLS: usize = 4;
const NVLS_TREE: usize = 5;
const PAT: usize = 6;
const LL: usize = 0;
const LL128: usize = 1;
const SIMPLE: usize = 2;

const NF: usize = 5;
const NA: usize = NCCL_NUM_ALGORITHMS;
const NP: usize = NCCL_NUM_PROTOCOLS;

/// The model of one communicator.
#[derive(Debug, Clone)]
pub struct Model {
    /// Latency per `[func][algo][proto]`, µs; NaN = not modelled.
    lat: [[[f32; NP]; NA]; NF],
    /// Cost per byte of `nBytes`, µs/B.
    per_byte: [[[f32; NP]; NA]; NF],
}

/// ⌈log2 n⌉ (0 for n ≤ 1).
fn log2_ceil(n: u64) -> f64 {
    if n <= 1 {
        0.0
    } else {
        f64::from(u64::BITS - (n - 1).leading_zeros())
    }
}

/// A ceiling from a constants table; 0 or less means "no ceiling".
fn cap(bw: f64, ceiling: f64) -> f64 {
    if ceiling > 0.0 { bw.min(ceiling) } else { bw }
}

impl Model {
    /// Builds the model of a communicator of `n_ranks` ranks on `n_nodes` nodes.
    /// `constants` are the host's (v5+); `None` (v2–v4 hosts pass none) uses NCCL's
    /// defaults, [`NCCL_DEFAULT_CONSTANTS`].
    pub fn new(
        n_ranks: usize,
        n_nodes: usize,
        params: &LinkParams,
        constants: Option<&ncclTunerConstants_v5_t>,
    ) -> Self {
        let c = constants.unwrap_or(&NCCL_DEFAULT_CONSTANTS);
        let n = n_ranks.max(1) as u64;
        let nodes = (n_nodes.max(1) as u64).min(n);
        let ppn = n.div_ceil(nodes);
        let (nf, nn, ppnf) = (n as f64, nodes as f64, ppn as f64);
        let cc = params.arch.compcap_index();
        let scale = match nodes {
            1 => 0,
            2 => 1,
            _ => 2,
        };
        let ch = f64::from(params.channels.max(1));
        let intra_hw = params.intra_link.hw_index();
        let log_nodes = log2_ceil(nodes);

        let mut lat = [[[f32::NAN; NP]; NA]; NF];
        let mut per_byte = [[[f32::NAN; NP]; NA]; NF];
        for f in 0..NF {
            let allreduce = f == Func::ALL_REDUCE.0 as usize;
            let gather_like =
                f == Func::ALL_GATHER.0 as usize || f == Func::REDUCE_SCATTER.0 as usize;
            for a in 0..NA {
                // Bottleneck bandwidth of the algorithm's path, GB/s per GPU.
                let link = if nodes == 1 {
                    params.intra_bw
                } else {
                    match a {
                        NVLS_TREE if nodes > 2 => params.intra_bw.min(params.net_bw / 2.0),
                        _ => params.intra_bw.min(params.net_bw),
                    }
                };
                // Bytes each GPU moves per byte of nBytes.
                // NCCL runs tree only for allreduce and PAT only for allgather and
                // reducescatter; other pairings are not modelled (left to NCCL).
                if (a == TREE && !allreduce) || (a == PAT && !gather_like) {
                    continue;
                }
                let factor = match a {
                    RING | PAT if allreduce => 2.0 * (nf - 1.0) / nf,
                    RING | PAT if gather_like => (nf - 1.0) / nf,
                    RING => 1.0,
                    TREE | COLLNET_DIRECT | COLLNET_CHAIN if allreduce => 2.0,
                    NVLS | NVLS_TREE => 6.0 / 5.0,
                    _ => 1.0,
                };
                for p in 0..NP {
                    // NCCL 2.30 runs PAT, NVLS and NVLS tree with Simple only (its
                    // constants give them no LL/LL128 latency either).
                    if matches!(a, PAT | NVLS | NVLS_TREE) && p != SIMPLE {
                        continue;
                    }
                    let mut bw = match (a, p) {
                        (_, SIMPLE) => link,
                        (TREE, LL) => link / 3.8,
                        (_, LL) if nodes > 1 || allreduce || f == Func::REDUCE.0 as usize => {
                            link / 4.0
                        }
                        (_, LL) => link / 3.0,
                        (TREE, LL128) if nodes == 1 => link * 7.0 / 9.0,
                        (TREE, LL128) => link * 120.0 / 128.0,
                        (_, LL128) if ppn < 2 => link * 0.7,
                        (_, LL128) => link * 0.92,
                        _ => link,
                    };
                    match (a, p) {
                        (_, LL) => bw = cap(bw, c.llMaxBws[cc][scale]),
                        (RING | PAT, LL128) => bw = cap(bw, ch * c.perChMaxRingLL128Bws[cc][scale]),
                        (TREE, LL128) => bw = cap(bw, ch * c.perChMaxTreeLL128Bws[cc][scale]),
                        (TREE, SIMPLE) if allreduce => {
                            bw = cap(bw * 0.92, ch * c.perChMaxTreeBws[cc][scale])
                        }
                        (NVLS_TREE, _) => bw = cap(bw, ch * c.perChMaxNVLSTreeBws[cc][scale]),
                        _ => {}
                    }
                    if a == PAT {
                        bw *= 0.75;
                    }

                    let base = c.baseLatencies[a][p];
                    let inter = c.hwLatencies[NCCL_HW_NET][a][p] + params.net_lat;
                    // With one GPU per node every hop is a network hop.
                    let intra = if ppn == 1 {
                        inter
                    } else {
                        c.hwLatencies[intra_hw][a][p]
                    };
                    let l = match a {
                        RING => {
                            let steps = if allreduce {
                                2.0 * (nf - 1.0)
                            } else {
                                nf - 1.0
                            };
                            let inter_steps = match nodes {
                                1 => 0.0,
                                _ if allreduce => 2.0 * (nn - 1.0),
                                _ => nn - 1.0,
                            };
                            base + (steps - inter_steps) * intra + inter_steps * inter
                        }
                        TREE => {
                            let k = if allreduce { 2.0 } else { 1.0 };
                            base + k * ((ppnf - 1.0) * intra + log_nodes * inter)
                        }
                        PAT => {
                            let hop = if nodes > 1 { inter } else { intra };
                            base + log2_ceil(n) * hop
                        }
                        NVLS => base + intra + if nodes > 1 { inter } else { 0.0 },
                        NVLS_TREE => base + intra + 2.0 * log_nodes * inter,
                        COLLNET_DIRECT => base + 2.0 * intra + inter,
                        _ => base + 2.0 * (ppnf - 1.0) * intra + inter,
                    };
                    if bw > 0.0 && bw.is_finite() && l.is_finite() {
                        lat[f][a][p] = l.max(0.0) as f32;
                        // GB/s = 1000 B/µs.
                        per_byte[f][a][p] = (factor / (bw * 1000.0)) as f32;
                    }
                }
            }
        }
        Self { lat, per_byte }
    }

    /// Predicted time in µs of `(algo, proto)` for `n_bytes` of collective `func`
    /// with `num_pipe_ops` operations; `None` when not modelled.
    #[inline]
    pub fn predict(
        &self,
        func: Func,
        algo: Algorithm,
        proto: Protocol,
        n_bytes: usize,
        num_pipe_ops: i32,
    ) -> Option<f32> {
        let (f, a, p) = (
            usize::try_from(func.0).ok()?,
            usize::try_from(algo.0).ok()?,
            usize::try_from(proto.0).ok()?,
        );
        let l = *self.lat.get(f)?.get(a)?.get(p)?;
        let b = self.per_byte[f][a][p];
        let t = l * num_pipe_ops.max(1) as f32 + n_bytes as f32 * b;
        t.is_finite().then_some(t)
    }

    /// Writes the model's ranking into `table`: each supported entry it models gets
    /// its predicted time, all scaled by one factor `k ≤ 1` chosen so every value is
    /// at most NCCL's (the SDK only lets a tuner lower entries). NCCL then picks
    /// the model's cheapest. Entries NCCL marked unsupported stay so; a table in
    /// which an entry already costs 0 (already chosen) is left alone. Returns
    /// whether anything was written.
    pub fn apply(&self, info: &CollInfo, table: &mut CostTable<'_>) -> bool {
        let Some(f) = usize::try_from(info.func.0).ok().filter(|f| *f < NF) else {
            return false;
        };
        let (lat, per_byte) = (&self.lat[f], &self.per_byte[f]);
        let na = table.num_algo().min(NA);
        let np = table.num_proto().min(NP);
        let pipes = info.num_pipe_ops.max(1) as f32;
        let bytes = info.n_bytes as f32;
        let mut pred = [[f32::NAN; NP]; NA];
        let mut k = 1.0f32;
        let mut any = false;
        // `supported()` visits only the entries NCCL offers (a handful of 21).
        for (algo, proto, cur) in table.supported() {
            let (a, p) = (algo.0 as usize, proto.0 as usize);
            if a >= na || p >= np {
                continue;
            }
            let t = lat[a][p] * pipes + bytes * per_byte[a][p];
            // NaN (not modelled) and inf fail this test.
            if !(0.0..f32::INFINITY).contains(&t) {
                continue;
            }
            if cur <= 0.0 {
                return false;
            }
            if t > 0.0 {
                k = k.min(cur / t);
            }
            pred[a][p] = t;
            any = true;
        }
        if !any {
            return false;
        }
        for (a, row) in pred.iter().enumerate().take(na) {
            for (p, t) in row.iter().enumerate().take(np) {
                if !t.is_nan() {
                    table.lower(Algorithm(a as i32), Protocol(p as i32), t * k);
                }
            }
        }
        true
    }
}
