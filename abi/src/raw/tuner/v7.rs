//! Tuner ABI v7 (NCCL source after 2.31, `src/include/plugin/tuner/tuner_v7.h`): the
//! five slots of v6; only the constants change, with a fifth GPU-generation row in
//! every bandwidth table (`NCCL_NUM_COMPCAPS_V7 = 5`), 1272 bytes.

use core::ffi::{c_char, c_void};

use super::super::assert_layout;
use super::super::common::{
    NCCL_NUM_ALGORITHMS, NCCL_NUM_HW_LINKS, NCCL_NUM_PROTOCOLS, NCCL_NUM_TUNING_SCALES, NcclResult,
    ncclDebugLogger_t,
};
use super::constants::{ncclNvlDomainInfo_v5_t, ncclTunerConstants_v5_t};
use super::{GetChunkSize, GetCollInfoV4, TunerFinalize};

/// `NCCL_NUM_COMPCAPS_V7`: Volta, Ampere, Hopper, Blackwell and one newer generation.
pub const NCCL_NUM_COMPCAPS_V7: usize = 5;

/// A `[compcap][scale]` bandwidth table of v7 (five GPU generations), in GB/s.
pub type BwTableV7 = [[f64; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS_V7];

/// `ncclNvlDomainInfo_v7_t` is identical to v5.
pub type ncclNvlDomainInfo_v7_t = ncclNvlDomainInfo_v5_t;

/// `ncclTunerConstants_v7_t`: v5's fields with five-row bandwidth tables. 1272 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ncclTunerConstants_v7_t {
    /// Base latency in µs per `[algo][proto]`.
    pub baseLatencies: [[f64; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS],
    /// Hardware latency in µs per `[hw link][algo][proto]`.
    pub hwLatencies: [[[f64; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS]; NCCL_NUM_HW_LINKS],
    /// LL bandwidth ceiling per `[compcap][scale]`.
    pub llMaxBws: BwTableV7,
    /// Per-channel ring LL128 bandwidth ceiling.
    pub perChMaxRingLL128Bws: BwTableV7,
    /// Per-channel tree LL128 bandwidth ceiling.
    pub perChMaxTreeLL128Bws: BwTableV7,
    /// Per-channel tree bandwidth ceiling.
    pub perChMaxTreeBws: BwTableV7,
    /// Per-channel NVLS tree bandwidth ceiling.
    pub perChMaxNVLSTreeBws: BwTableV7,
}
assert_layout!(
    ncclTunerConstants_v7_t,
    size = 1272,
    align = 8,
    baseLatencies = 0,
    hwLatencies = 168,
    llMaxBws = 672,
    perChMaxRingLL128Bws = 792,
    perChMaxTreeLL128Bws = 912,
    perChMaxTreeBws = 1032,
    perChMaxNVLSTreeBws = 1152
);

/// Copies the first four generation rows of `src` into `dst` (`dst`'s fifth row is
/// left as it is).
fn widen(dst: &mut BwTableV7, src: &super::BwTable) {
    dst[..src.len()].copy_from_slice(src);
}

/// The first four generation rows of `src`.
fn narrow(src: &BwTableV7) -> super::BwTable {
    let mut out = super::BwTable::default();
    let n = out.len();
    out.copy_from_slice(&src[..n]);
    out
}

impl ncclTunerConstants_v7_t {
    /// The v5 view NCCL converts to for older plugins (`ncclTunerConstants_v7_to_v5`):
    /// the fifth generation row is dropped.
    pub fn to_v5(&self) -> ncclTunerConstants_v5_t {
        ncclTunerConstants_v5_t {
            baseLatencies: self.baseLatencies,
            hwLatencies: self.hwLatencies,
            llMaxBws: narrow(&self.llMaxBws),
            perChMaxRingLL128Bws: narrow(&self.perChMaxRingLL128Bws),
            perChMaxTreeLL128Bws: narrow(&self.perChMaxTreeLL128Bws),
            perChMaxTreeBws: narrow(&self.perChMaxTreeBws),
            perChMaxNVLSTreeBws: narrow(&self.perChMaxNVLSTreeBws),
        }
    }

    /// Writes `v5`'s values back (`ncclTunerConstants_v5_to_v7`); the fifth generation
    /// row keeps its value.
    pub fn update_from_v5(&mut self, v5: &ncclTunerConstants_v5_t) {
        self.baseLatencies = v5.baseLatencies;
        self.hwLatencies = v5.hwLatencies;
        widen(&mut self.llMaxBws, &v5.llMaxBws);
        widen(&mut self.perChMaxRingLL128Bws, &v5.perChMaxRingLL128Bws);
        widen(&mut self.perChMaxTreeLL128Bws, &v5.perChMaxTreeLL128Bws);
        widen(&mut self.perChMaxTreeBws, &v5.perChMaxTreeBws);
        widen(&mut self.perChMaxNVLSTreeBws, &v5.perChMaxNVLSTreeBws);
    }

    /// NCCL 2.30's defaults in the v7 shape. NCCL 2.30 knows no fifth generation, so
    /// its row is 0 in every table (the model reads 0 as "no ceiling").
    pub fn nccl_defaults() -> Self {
        let mut c = Self {
            baseLatencies: [[0.0; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS],
            hwLatencies: [[[0.0; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS]; NCCL_NUM_HW_LINKS],
            llMaxBws: BwTableV7::default(),
            perChMaxRingLL128Bws: BwTableV7::default(),
            perChMaxTreeLL128Bws: BwTableV7::default(),
            perChMaxTreeBws: BwTableV7::default(),
            perChMaxNVLSTreeBws: BwTableV7::default(),
        };
        c.update_from_v5(&super::NCCL_DEFAULT_CONSTANTS);
        c
    }
}

/// `init` of v7: as v5 with the v7 constants.
pub type InitV7 = Option<
    unsafe extern "C" fn(
        context: *mut *mut c_void,
        commId: u64,
        nRanks: usize,
        nNodes: usize,
        logFunction: ncclDebugLogger_t,
        nvlDomainInfo: *mut ncclNvlDomainInfo_v7_t,
        constants: *mut ncclTunerConstants_v7_t,
    ) -> NcclResult,
>;

/// `ncclTuner_v7_t`: v6's five slots, `init` taking the v7 constants. 40 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v7_t {
    /// Tuner name (data).
    pub name: *const c_char,
    /// `init(context, commId, nRanks, nNodes, logFunction, nvlDomainInfo, constants)`.
    pub init: InitV7,
    /// As v4–v6.
    pub getCollInfo: GetCollInfoV4,
    /// `finalize(context)`.
    pub finalize: TunerFinalize,
    /// `getChunkSize(…)`, optional (NULL allowed).
    pub getChunkSize: GetChunkSize,
}
assert_layout!(
    ncclTuner_v7_t,
    size = 40,
    align = 8,
    name = 0,
    init = 8,
    getCollInfo = 16,
    finalize = 24,
    getChunkSize = 32
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v5_round_trip_keeps_the_fifth_row() {
        let mut v7 = ncclTunerConstants_v7_t::nccl_defaults();
        assert_eq!(v7.to_v5(), super::super::NCCL_DEFAULT_CONSTANTS);
        assert_eq!(v7.llMaxBws[4], [0.0; 3]);
        v7.perChMaxTreeBws[4] = [7.0, 8.0, 9.0];
        let mut v5 = v7.to_v5();
        v5.perChMaxTreeBws[3][1] = 123.5;
        v5.baseLatencies[6][2] = 4.25;
        v7.update_from_v5(&v5);
        assert_eq!(v7.perChMaxTreeBws[3][1], 123.5);
        assert_eq!(v7.baseLatencies[6][2], 4.25);
        assert_eq!(v7.perChMaxTreeBws[4], [7.0, 8.0, 9.0]);
    }
}
