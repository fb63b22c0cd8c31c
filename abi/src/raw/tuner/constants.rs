//! The constants block NCCL hands a v5/v6 tuner's `init`, and the NVLink-domain
//! summary passed next to it. Both layouts are identical in v5 and v6.

use core::ffi::c_int;

use super::super::assert_layout;
use super::super::common::{
    NCCL_NUM_ALGORITHMS, NCCL_NUM_COMPCAPS, NCCL_NUM_HW_LINKS, NCCL_NUM_PROTOCOLS,
    NCCL_NUM_TUNING_SCALES,
};

/// `NCCL_HW_NVLINK`: first index of [`ncclTunerConstants_v5_t::hwLatencies`].
pub const NCCL_HW_NVLINK: usize = 0;
/// `NCCL_HW_PCI`.
pub const NCCL_HW_PCI: usize = 1;
/// `NCCL_HW_NET`: latency of the hop between nodes.
pub const NCCL_HW_NET: usize = 2;

/// `NCCL_VOLTA_COMPCAP_IDX` (SM 7.x): first index of every [`BwTable`].
///
/// `llMaxBws` is the exception NCCL makes: on one node its row is the GPU generation,
/// on several nodes row 0 means Intel CPUs and row 1 AMD (or mixed) CPUs.
pub const NCCL_VOLTA_COMPCAP_IDX: usize = 0;
/// `NCCL_AMPERE_COMPCAP_IDX` (SM 8.x).
pub const NCCL_AMPERE_COMPCAP_IDX: usize = 1;
/// `NCCL_HOPPER_COMPCAP_IDX` (SM 9.x).
pub const NCCL_HOPPER_COMPCAP_IDX: usize = 2;
/// `NCCL_BLACKWELL_COMPCAP_IDX` (SM 10.x and later).
pub const NCCL_BLACKWELL_COMPCAP_IDX: usize = 3;

/// `ncclNvlDomainInfo_v5_t` (= v6), 12 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ncclNvlDomainInfo_v5_t {
    /// Number of NVLink domains in the communicator.
    pub nNvlDomains: c_int,
    /// Fewest ranks in one domain.
    pub minRanksPerNvlDomain: c_int,
    /// Most ranks in one domain.
    pub maxRanksPerNvlDomain: c_int,
}
assert_layout!(
    ncclNvlDomainInfo_v5_t,
    size = 12,
    align = 4,
    nNvlDomains = 0,
    minRanksPerNvlDomain = 4,
    maxRanksPerNvlDomain = 8
);

/// A `[compcap][scale]` table of bandwidths in GB/s.
pub type BwTable = [[f64; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS];

/// `ncclTunerConstants_v5_t` (= v6) as NCCL core defines it: 1152 bytes of doubles.
///
/// NVIDIA's example headers omit the last field (1056 bytes); a host must allocate
/// the full core size. NCCL fills it before `init` and re-reads it afterwards.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ncclTunerConstants_v5_t {
    /// Base latency in µs per `[algo][proto]`.
    pub baseLatencies: [[f64; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS],
    /// Hardware latency in µs per `[hw link][algo][proto]`.
    pub hwLatencies: [[[f64; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS]; NCCL_NUM_HW_LINKS],
    /// LL bandwidth ceiling per `[compcap][scale]`.
    pub llMaxBws: BwTable,
    /// Per-channel ring LL128 bandwidth ceiling.
    pub perChMaxRingLL128Bws: BwTable,
    /// Per-channel tree LL128 bandwidth ceiling.
    pub perChMaxTreeLL128Bws: BwTable,
    /// Per-channel tree bandwidth ceiling.
    pub perChMaxTreeBws: BwTable,
    /// Per-channel NVLS tree bandwidth ceiling (absent from NVIDIA's example header).
    pub perChMaxNVLSTreeBws: BwTable,
}
assert_layout!(
    ncclTunerConstants_v5_t,
    size = 1152,
    align = 8,
    baseLatencies = 0,
    hwLatencies = 168,
    llMaxBws = 672,
    perChMaxRingLL128Bws = 768,
    perChMaxTreeLL128Bws = 864,
    perChMaxTreeBws = 960,
    perChMaxNVLSTreeBws = 1056
);

impl Default for ncclTunerConstants_v5_t {
    fn default() -> Self {
        Self {
            baseLatencies: [[0.0; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS],
            hwLatencies: [[[0.0; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS]; NCCL_NUM_HW_LINKS],
            llMaxBws: [[0.0; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS],
            perChMaxRingLL128Bws: [[0.0; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS],
            perChMaxTreeLL128Bws: [[0.0; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS],
            perChMaxTreeBws: [[0.0; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS],
            perChMaxNVLSTreeBws: [[0.0; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS],
        }
    }
}

/// `ncclNvlDomainInfo_v6_t` is identical to v5.
pub type ncclNvlDomainInfo_v6_t = ncclNvlDomainInfo_v5_t;
/// `ncclTunerConstants_v6_t` is identical to v5.
pub type ncclTunerConstants_v6_t = ncclTunerConstants_v5_t;
