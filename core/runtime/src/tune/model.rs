//! The built-in model's inputs from a communicator's net devices, the pick of the
//! cheapest cost-table entry, and the default channel rule: one home for the
//! runtime's decisions, `cclkit doctor` and tuner `init`.

use cclkit_abi::raw::common::{Algorithm, NCCL_NUM_PROTOCOLS, Protocol};
use cclkit_host::tuner::CostTable;

/// Inputs of the built-in model.
#[derive(Clone, Copy, Debug)]
pub struct ModelInputs {
    /// Ranks.
    pub n_ranks: usize,
    /// Nodes (hosts).
    pub n_nodes: usize,
    /// Network bandwidth per channel in GB/s.
    pub net_gbps: f64,
    /// Network latency in µs.
    pub net_lat_us: f64,
}

impl ModelInputs {
    /// The inputs a communicator of `n_ranks` on `n_nodes` derives from its net
    /// devices' `(speed Mb/s, latency µs)`: the slowest positive speed (NCCL reads 0
    /// or less as 10000 Mb/s) and the largest latency (20 µs when none reports one).
    pub fn from_devices(
        n_ranks: usize,
        n_nodes: usize,
        devices: impl IntoIterator<Item = (i32, f32)>,
    ) -> Self {
        let (mut speed, mut lat) = (None::<i32>, 0.0f64);
        for (s, l) in devices {
            if s > 0 {
                speed = Some(speed.map_or(s, |m| m.min(s)));
            }
            lat = lat.max(f64::from(l));
        }
        Self {
            n_ranks,
            n_nodes,
            net_gbps: f64::from(speed.unwrap_or(10_000)) / 8000.0,
            net_lat_us: if lat > 0.0 { lat } else { 20.0 },
        }
    }
}

/// The cheapest usable entry of a cost table (the first of equal ones; entries below
/// 0 are NCCL's "ignore"), as NCCL picks after the tuner.
pub fn cheapest(t: &CostTable) -> Option<(Algorithm, Protocol)> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &c) in t.iter().enumerate() {
        if c >= 0.0 && best.is_none_or(|(_, b)| c < b) {
            best = Some((i, c));
        }
    }
    best.map(|(i, _)| {
        (
            Algorithm((i / NCCL_NUM_PROTOCOLS) as i32),
            Protocol((i % NCCL_NUM_PROTOCOLS) as i32),
        )
    })
}

/// The channels a call of `bytes` runs on without a tuner's say: one per Simple
/// slice of `simple_slice` data bytes, up to the `max_channels` connected. A channel
/// is worth its connections once it carries a whole Simple slice: below that, a
/// second channel only splits the same CPU time between two connections (measured:
/// 256 KiB–1 MiB AllReduce on 2–4 ranks is 10–40 % faster on one channel than on
/// two).
pub fn default_channels(bytes: usize, max_channels: usize, simple_slice: usize) -> usize {
    bytes
        .div_ceil(simple_slice.max(1))
        .clamp(1, max_channels.max(1))
}
