//! NCCL's own default model constants, the single copy every cclkit crate uses.
//!
//! The values are those of `ncclTunerConstantsDefaults` in NCCL 2.30
//! (`src/graph/tuning.cc`, checked against 2.30.7): NCCL copies that block into every
//! communicator (`ncclTopoInitTunerConstants`) before a v5/v6 tuner's `init` sees it.
//! A host that offers a tuner these constants, and a tuner that needs them because
//! its host (v2–v4) passes none, should both start from [`NCCL_DEFAULT_CONSTANTS`],
//! so a plugin tested under cclkit models the same machine it will meet under NCCL.
//!
//! Units: latencies in µs, bandwidths in GB/s. Indices: algorithms in NCCL order
//! (Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT), protocols
//! (LL, LL128, Simple), links ([`NCCL_HW_NVLINK`](super::constants::NCCL_HW_NVLINK),
//! PCI, NET), bandwidth rows by GPU generation (Volta, Ampere, Hopper, Blackwell) and
//! columns by scale (1 node, 2 nodes, more).

use super::constants::{BwTable, ncclTunerConstants_v5_t};

/// `[LL, LL128, Simple]` of an algorithm with no latency of that kind.
const NONE: [f64; 3] = [0.0, 0.0, 0.0];

/// NCCL 2.30's `ncclTunerConstantsDefaults`.
pub const NCCL_DEFAULT_CONSTANTS: ncclTunerConstants_v5_t = ncclTunerConstants_v5_t {
    // Only Tree, Ring and PAT have a base latency.
    baseLatencies: [
        [6.8, 14.0, 8.4],
        [6.6, 14.0, 8.4],
        NONE,
        NONE,
        NONE,
        NONE,
        [8.0, 8.0, 8.0],
    ],
    hwLatencies: [
        // NVLink: NVLS pays a large Simple latency; PAT only runs Simple.
        [
            [0.6, 1.25, 4.0],
            [0.6, 1.9, 3.4],
            [0.0, 0.0, 3.7],
            [0.0, 0.0, 2.8],
            [0.0, 0.0, 25.0],
            [0.0, 0.0, 25.0],
            [0.0, 0.0, 4.0],
        ],
        // PCI: no NVLS without NVLink.
        [
            [1.0, 1.9, 4.0],
            [1.0, 2.5, 5.7],
            [0.0, 0.0, 3.7],
            [0.0, 0.0, 2.8],
            NONE,
            NONE,
            [0.0, 0.0, 4.0],
        ],
        // Network, between nodes.
        [
            [5.0, 8.5, 14.0],
            [2.7, 4.0, 14.0],
            [0.0, 0.0, 31.0],
            [0.0, 0.0, 30.0],
            [0.0, 0.0, 18.0],
            [0.0, 0.0, 20.9],
            [0.0, 0.0, 14.0],
        ],
    ],
    // Rows 0/1 double as "Intel"/"AMD" CPU rows on several nodes (see the constants
    // module); NCCL writes the Blackwell row as twice Hopper's.
    llMaxBws: [
        [39.0, 39.0, 20.4],
        [87.7, 22.5, 19.0],
        [141.0, 45.0, 35.0],
        [282.0, 90.0, 70.0],
    ],
    perChMaxRingLL128Bws: [
        [20.0, 20.0, 20.0],
        [20.0, 20.0, 20.0],
        [36.7, 36.7, 36.7],
        [40.0, 40.0, 40.0],
    ],
    perChMaxTreeLL128Bws: [
        [20.0, 20.0, 20.0],
        [20.0, 20.0, 20.0],
        [36.7, 36.7, 29.0],
        [55.6, 31.67, 20.0],
    ],
    perChMaxTreeBws: TREE_BWS,
    // NCCL reuses the tree rows for Volta/Ampere (which have no NVLS) and leaves the
    // one-node NVLS-tree column at 0 (no NVLS tree inside one node).
    perChMaxNVLSTreeBws: [
        TREE_BWS[0],
        TREE_BWS[1],
        [0.0, 57.7, 45.5],
        [0.0, 96.0, 80.0],
    ],
};

/// `perChMaxTreeBws`.
const TREE_BWS: BwTable = [
    [26.5, 18.5, 10.0],
    [24.0, 23.6, 17.8],
    [38.7, 41.4, 36.0],
    [70.0, 42.8, 24.0],
];

#[cfg(test)]
mod tests {
    use super::super::constants::{
        NCCL_AMPERE_COMPCAP_IDX, NCCL_BLACKWELL_COMPCAP_IDX, NCCL_HOPPER_COMPCAP_IDX, NCCL_HW_NET,
        NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_VOLTA_COMPCAP_IDX,
    };
    use super::*;

    // Cells typed from NCCL 2.30.7's tuning.cc by hand, one per table and row kind,
    // so a slip in the table above (like the old 141/45/35 Blackwell LL row) fails.
    #[test]
    fn cells_match_nccl_2_30() {
        let c = NCCL_DEFAULT_CONSTANTS;
        assert_eq!(c.llMaxBws[NCCL_BLACKWELL_COMPCAP_IDX], [282.0, 90.0, 70.0]);
        assert_eq!(c.llMaxBws[NCCL_VOLTA_COMPCAP_IDX], [39.0, 39.0, 20.4]);
        assert_eq!(
            c.perChMaxRingLL128Bws[NCCL_BLACKWELL_COMPCAP_IDX],
            [40.0; 3]
        );
        assert_eq!(
            c.perChMaxTreeLL128Bws[NCCL_HOPPER_COMPCAP_IDX],
            [36.7, 36.7, 29.0]
        );
        assert_eq!(
            c.perChMaxTreeBws[NCCL_AMPERE_COMPCAP_IDX],
            [24.0, 23.6, 17.8]
        );
        assert_eq!(
            c.perChMaxNVLSTreeBws[NCCL_HOPPER_COMPCAP_IDX],
            [0.0, 57.7, 45.5]
        );
        assert_eq!(
            c.perChMaxNVLSTreeBws[NCCL_VOLTA_COMPCAP_IDX],
            [26.5, 18.5, 10.0]
        );
        assert_eq!(c.baseLatencies[6], [8.0; 3]);
        assert_eq!(c.hwLatencies[NCCL_HW_NVLINK][6], [0.0, 0.0, 4.0]);
        assert_eq!(c.hwLatencies[NCCL_HW_PCI][4], [0.0; 3]);
        assert_eq!(c.hwLatencies[NCCL_HW_NET][5], [0.0, 0.0, 20.9]);
    }

    // CollNet and NVLS have no LL/LL128 kernels, so NCCL gives them no such latency.
    #[test]
    fn collnet_and_nvls_only_have_simple_latency() {
        let c = NCCL_DEFAULT_CONSTANTS;
        for hw in c.hwLatencies {
            for (algo, lat) in hw.iter().enumerate().take(6).skip(2) {
                assert_eq!(lat[..2], [0.0, 0.0], "algo {algo}");
            }
        }
        for lat in &c.baseLatencies[2..=5] {
            assert_eq!(*lat, [0.0; 3]);
        }
    }
}
