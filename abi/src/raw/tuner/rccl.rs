//! RCCL's tuner constants (ROCm/rocm-systems `projects/rccl`,
//! `src/include/plugin/tuner/tuner_v5.h`): NCCL's v5 fields with every algorithm-indexed
//! array sized by RCCL's own algorithm count, followed by `bwRatio[2][algo][proto]`.
//!
//! RCCL hands this struct to both `ncclTunerPlugin_v5` and `_v6` (its loader tries v6
//! first and has no v7). Released RCCL builds use 7 algorithms (1488 bytes); RCCL's
//! development branch added `NCCL_ALGO_DIRECT_A2A` (8 algorithms, 1632 bytes) without
//! a new tuner version, so the same symbol gets either size.

use super::super::assert_layout;
use super::super::common::{NCCL_NUM_HW_LINKS, NCCL_NUM_PROTOCOLS};
use super::constants::{BwTable, ncclTunerConstants_v5_t};

/// `NCCL_ALGO_DIRECT_A2A`: RCCL's eighth algorithm (index 7), only in 8-algorithm builds.
pub const RCCL_ALGO_DIRECT_A2A: usize = 7;

/// `ncclTunerConstants_v5_t` as RCCL defines it, for an RCCL built with `A` algorithms.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct rcclTunerConstants_v5_t<const A: usize> {
    /// Base latency in µs per `[algo][proto]`.
    pub baseLatencies: [[f64; NCCL_NUM_PROTOCOLS]; A],
    /// Hardware latency in µs per `[hw link][algo][proto]` (RCCL: XGMI, PCI, NET).
    pub hwLatencies: [[[f64; NCCL_NUM_PROTOCOLS]; A]; NCCL_NUM_HW_LINKS],
    /// LL bandwidth ceiling per `[compcap][scale]`.
    pub llMaxBws: BwTable,
    /// Per-channel ring LL128 bandwidth ceiling.
    pub perChMaxRingLL128Bws: BwTable,
    /// Per-channel tree LL128 bandwidth ceiling.
    pub perChMaxTreeLL128Bws: BwTable,
    /// Per-channel tree bandwidth ceiling.
    pub perChMaxTreeBws: BwTable,
    /// Per-channel NVLS tree bandwidth ceiling (unused on AMD GPUs, kept for layout).
    pub perChMaxNVLSTreeBws: BwTable,
    /// RCCL-only bandwidth ratios per `[0 or 1][algo][proto]` (RCCL's model uses row 0
    /// within a node and row 1 across nodes).
    pub bwRatio: [[[f64; NCCL_NUM_PROTOCOLS]; A]; 2],
}

/// RCCL's constants with 7 algorithms (released RCCL): 1488 bytes.
pub type rcclTunerConstants_a7_t = rcclTunerConstants_v5_t<7>;
/// RCCL's constants with 8 algorithms (`DIRECT_A2A`): 1632 bytes.
pub type rcclTunerConstants_a8_t = rcclTunerConstants_v5_t<8>;

assert_layout!(
    rcclTunerConstants_a7_t,
    size = 1488,
    align = 8,
    baseLatencies = 0,
    hwLatencies = 168,
    llMaxBws = 672,
    perChMaxRingLL128Bws = 768,
    perChMaxTreeLL128Bws = 864,
    perChMaxTreeBws = 960,
    perChMaxNVLSTreeBws = 1056,
    bwRatio = 1152
);
assert_layout!(
    rcclTunerConstants_a8_t,
    size = 1632,
    align = 8,
    baseLatencies = 0,
    hwLatencies = 192,
    llMaxBws = 768,
    perChMaxRingLL128Bws = 864,
    perChMaxTreeLL128Bws = 960,
    perChMaxTreeBws = 1056,
    perChMaxNVLSTreeBws = 1152,
    bwRatio = 1248
);

impl<const A: usize> rcclTunerConstants_v5_t<A> {
    /// All zero (RCCL fills the struct before `init`; zero is "no value").
    pub const fn zeroed() -> Self {
        Self {
            baseLatencies: [[0.0; NCCL_NUM_PROTOCOLS]; A],
            hwLatencies: [[[0.0; NCCL_NUM_PROTOCOLS]; A]; NCCL_NUM_HW_LINKS],
            llMaxBws: [[0.0; 3]; 4],
            perChMaxRingLL128Bws: [[0.0; 3]; 4],
            perChMaxTreeLL128Bws: [[0.0; 3]; 4],
            perChMaxTreeBws: [[0.0; 3]; 4],
            perChMaxNVLSTreeBws: [[0.0; 3]; 4],
            bwRatio: [[[0.0; NCCL_NUM_PROTOCOLS]; A]; 2],
        }
    }

    /// NCCL's fields as the 7-algorithm NCCL struct (algorithms past NCCL's seven and
    /// `bwRatio` are dropped; with fewer than seven the missing rows are 0).
    pub fn to_nccl(&self) -> ncclTunerConstants_v5_t {
        let mut out = ncclTunerConstants_v5_t::default();
        let n = A.min(out.baseLatencies.len());
        out.baseLatencies[..n].copy_from_slice(&self.baseLatencies[..n]);
        for (dst, src) in out.hwLatencies.iter_mut().zip(&self.hwLatencies) {
            dst[..n].copy_from_slice(&src[..n]);
        }
        out.llMaxBws = self.llMaxBws;
        out.perChMaxRingLL128Bws = self.perChMaxRingLL128Bws;
        out.perChMaxTreeLL128Bws = self.perChMaxTreeLL128Bws;
        out.perChMaxTreeBws = self.perChMaxTreeBws;
        out.perChMaxNVLSTreeBws = self.perChMaxNVLSTreeBws;
        out
    }

    /// Writes NCCL's fields from `v5` (RCCL-only rows and `bwRatio` keep their values).
    pub fn update_from_nccl(&mut self, v5: &ncclTunerConstants_v5_t) {
        let n = A.min(v5.baseLatencies.len());
        self.baseLatencies[..n].copy_from_slice(&v5.baseLatencies[..n]);
        for (dst, src) in self.hwLatencies.iter_mut().zip(&v5.hwLatencies) {
            dst[..n].copy_from_slice(&src[..n]);
        }
        self.llMaxBws = v5.llMaxBws;
        self.perChMaxRingLL128Bws = v5.perChMaxRingLL128Bws;
        self.perChMaxTreeLL128Bws = v5.perChMaxTreeLL128Bws;
        self.perChMaxTreeBws = v5.perChMaxTreeBws;
        self.perChMaxNVLSTreeBws = v5.perChMaxNVLSTreeBws;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::tuner::NCCL_DEFAULT_CONSTANTS;

    #[test]
    fn nccl_fields_round_trip_and_rccl_rows_survive() {
        let mut r = rcclTunerConstants_a8_t::zeroed();
        r.baseLatencies[RCCL_ALGO_DIRECT_A2A] = [1.5, 2.5, 3.5];
        r.bwRatio[1][RCCL_ALGO_DIRECT_A2A][2] = 0.75;
        r.update_from_nccl(&NCCL_DEFAULT_CONSTANTS);
        assert_eq!(r.to_nccl(), NCCL_DEFAULT_CONSTANTS);
        assert_eq!(r.baseLatencies[7], [1.5, 2.5, 3.5]);
        assert_eq!(r.bwRatio[1][7][2], 0.75);
        assert_eq!(
            r.hwLatencies[2][5],
            NCCL_DEFAULT_CONSTANTS.hwLatencies[2][5]
        );
        let mut r7 = rcclTunerConstants_a7_t::zeroed();
        r7.update_from_nccl(&NCCL_DEFAULT_CONSTANTS);
        assert_eq!(r7.to_nccl(), NCCL_DEFAULT_CONSTANTS);
    }
}
