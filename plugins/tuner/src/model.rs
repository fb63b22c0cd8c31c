//! The analytic latency/bandwidth model (formulas in the crate README, "Model mode").
//!
//! Everything that depends only on the communicator is computed at init into a
//! `[collective][algorithm][protocol]` table of latency (µs) and cost per byte
//! (µs/B), so a prediction on the hot path is one multiply-add.

use cclkit_abi::raw::common::{Algorithm, Func, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, Protocol};
use cclkit_abi::raw::tuner::ncclTunerConstants_v5_t;
use cclkit_abi::tuner::{CollInfo, CostTable};

use crate::config::ModelSettings;

/// Intra-node link type: picks the row of the hardware-latency table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntraLink {
    /// NVLink (`NCCL_HW_NVLINK`).
    NvLink,
    /// PCIe (`NCCL_HW_PCI`).
    Pci,
}

impl IntraLink {
    /// Parses `nvlink` or `pci` (any case).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nvlink" => Ok(Self::NvLink),
            "pci" | "pcie" => Ok(Self::Pci),
            _ => Err(format!(
                "unknown intra-node link \"{s}\" (expected nvlink or pci)"
            )),
        }
    }

    /// `nvlink` or `pci`.
    pub fn name(self) -> &'static str {
        match self {
            Self::NvLink => "nvlink",
            Self::Pci => "pci",
        }
    }

    fn hw_index(self) -> usize {
        match self {
            Self::NvLink => HW_NVLINK,
            Self::Pci => HW_PCI,
        }
    }
}

/// GPU generation: picks the column of the bandwidth-ceiling tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `NCCL_VOLTA_COMPCAP_IDX`.
    Volta,
    /// `NCCL_AMPERE_COMPCAP_IDX`.
    Ampere,
    /// `NCCL_HOPPER_COMPCAP_IDX`.
    Hopper,
    /// `NCCL_BLACKWELL_COMPCAP_IDX`.
    Blackwell,
}

impl Arch {
    /// Parses `volta`, `ampere`, `hopper` or `blackwell` (any case).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "volta" => Ok(Self::Volta),
            "ampere" => Ok(Self::Ampere),
            "hopper" => Ok(Self::Hopper),
            "blackwell" => Ok(Self::Blackwell),
            _ => Err(format!(
                "unknown architecture \"{s}\" (expected volta, ampere, hopper or blackwell)"
            )),
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Volta => "volta",
            Self::Ampere => "ampere",
            Self::Hopper => "hopper",
            Self::Blackwell => "blackwell",
        }
    }
}

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

const HW_NVLINK: usize = 0;
const HW_PCI: usize = 1;
const HW_NET: usize = 2;
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

/// cclkit's default constants, used when the host passes none (tuner v2–v4). The
/// values follow the shape and magnitude of NCCL's own defaults (µs, GB/s).
pub fn default_constants() -> ncclTunerConstants_v5_t {
    let mut c = ncclTunerConstants_v5_t::default();
    c.baseLatencies[TREE] = [6.8, 14.0, 8.4];
    c.baseLatencies[RING] = [6.6, 14.0, 8.4];
    c.baseLatencies[PAT] = [8.0, 8.0, 8.0];
    c.hwLatencies[HW_NVLINK][TREE] = [0.6, 1.25, 4.0];
    c.hwLatencies[HW_NVLINK][RING] = [0.6, 1.9, 3.4];
    c.hwLatencies[HW_NVLINK][COLLNET_DIRECT] = [0.0, 0.0, 3.7];
    c.hwLatencies[HW_NVLINK][COLLNET_CHAIN] = [0.0, 0.0, 2.8];
    c.hwLatencies[HW_NVLINK][NVLS] = [0.0, 0.0, 25.0];
    c.hwLatencies[HW_NVLINK][NVLS_TREE] = [0.0, 0.0, 25.0];
    c.hwLatencies[HW_NVLINK][PAT] = [0.6, 1.9, 3.4];
    c.hwLatencies[HW_PCI][TREE] = [1.0, 1.9, 4.0];
    c.hwLatencies[HW_PCI][RING] = [1.0, 2.5, 5.7];
    c.hwLatencies[HW_PCI][COLLNET_DIRECT] = [0.0, 0.0, 3.7];
    c.hwLatencies[HW_PCI][COLLNET_CHAIN] = [0.0, 0.0, 2.8];
    c.hwLatencies[HW_PCI][PAT] = [1.0, 2.5, 5.7];
    c.hwLatencies[HW_NET][TREE] = [5.0, 8.5, 14.0];
    c.hwLatencies[HW_NET][RING] = [2.7, 4.0, 14.0];
    c.hwLatencies[HW_NET][COLLNET_DIRECT] = [0.0, 0.0, 31.0];
    c.hwLatencies[HW_NET][COLLNET_CHAIN] = [0.0, 0.0, 30.0];
    c.hwLatencies[HW_NET][NVLS] = [0.0, 0.0, 18.0];
    c.hwLatencies[HW_NET][NVLS_TREE] = [0.0, 0.0, 20.9];
    c.hwLatencies[HW_NET][PAT] = [2.7, 4.0, 14.0];
    c.llMaxBws = [
        [39.0, 39.0, 20.4],
        [87.7, 22.5, 19.0],
        [141.0, 45.0, 35.0],
        [282.0, 90.0, 70.0],
    ];
    c.perChMaxRingLL128Bws = [
        [20.0, 20.0, 20.0],
        [20.0, 20.0, 20.0],
        [36.7, 36.7, 36.7],
        [73.4, 73.4, 73.4],
    ];
    c.perChMaxTreeLL128Bws = [
        [20.0, 20.0, 20.0],
        [20.0, 20.0, 20.0],
        [36.7, 36.7, 29.0],
        [73.4, 73.4, 58.0],
    ];
    c.perChMaxTreeBws = [
        [26.5, 18.5, 10.0],
        [24.0, 23.6, 17.8],
        [38.7, 41.4, 36.0],
        [77.4, 82.8, 72.0],
    ];
    c.perChMaxNVLSTreeBws = [
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [36.0, 36.0, 36.0],
        [72.0, 72.0, 72.0],
    ];
    c
}

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
    /// `constants` are NCCL's (v5+); `None` uses [`default_constants`].
    pub fn new(
        n_ranks: usize,
        n_nodes: usize,
        params: &LinkParams,
        constants: Option<&ncclTunerConstants_v5_t>,
    ) -> Self {
        let defaults;
        let c = match constants {
            Some(c) => c,
            None => {
                defaults = default_constants();
                &defaults
            }
        };
        let n = n_ranks.max(1) as u64;
        let nodes = (n_nodes.max(1) as u64).min(n);
        let ppn = n.div_ceil(nodes);
        let (nf, nn, ppnf) = (n as f64, nodes as f64, ppn as f64);
        let cc = params.arch as usize;
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
                    let inter = c.hwLatencies[HW_NET][a][p] + params.net_lat;
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
