//! The TUNER section's sample decisions: AllReduce at a few sizes, asked the way the
//! runtime asks a tuner (the built-in model's cost table, NCCL's default constants).

use cclkit_host::tuner::{CostTable, TunerConstants, TunerContext};

use super::Decision;
use crate::commands::report::DeviceReport;

/// The built-in model's inputs for the doctor's communicator shape, from the chosen
/// net plugin's first device as a communicator derives them (10 Gb/s and 20 µs
/// when it reports none).
pub(super) fn model_inputs(
    ranks: usize,
    nodes: usize,
    devices: &[DeviceReport],
) -> cclkit_runtime::tune::ModelInputs {
    let dev = devices.first();
    let speed = dev.map_or(0, |d| d.speed_mbps);
    let lat = dev.map_or(0.0, |d| f64::from(d.latency_us));
    cclkit_runtime::tune::ModelInputs {
        n_ranks: ranks.max(1),
        n_nodes: nodes.clamp(1, ranks.max(1)),
        net_gbps: f64::from(if speed > 0 { speed } else { 10_000 }) / 8000.0,
        net_lat_us: if lat > 0.0 { lat } else { 20.0 },
    }
}

/// The cheapest usable entry of a cost table, as "ALGO/PROTO".
fn cheapest(table: &CostTable) -> Option<String> {
    use cclkit_abi::raw::common::{Algorithm, NCCL_NUM_PROTOCOLS, Protocol};
    let best = table.iter().enumerate().filter(|(_, c)| **c >= 0.0).fold(
        None,
        |b: Option<(usize, f32)>, (i, c)| match b {
            Some((_, bc)) if bc <= *c => b,
            _ => Some((i, *c)),
        },
    );
    best.map(|(i, _)| {
        format!(
            "{}/{}",
            Algorithm((i / NCCL_NUM_PROTOCOLS) as i32),
            Protocol((i % NCCL_NUM_PROTOCOLS) as i32)
        )
    })
}

/// AllReduce at a few sizes, asked the way the runtime asks: the tuner gets the
/// built-in model's cost table for this shape (what NCCL hands it: its own model's
/// times, unsupported entries at -1), so an entry it leaves alone keeps the model's
/// cost, and the model's own pick is shown next to the result.
pub(super) fn sample_decisions(
    ctx: &mut TunerContext,
    model: cclkit_runtime::tune::ModelInputs,
    max_channels: usize,
    constants: &TunerConstants,
) -> Vec<Decision> {
    use cclkit_abi::raw::common::{Func, Protocol};
    let tuning = cclkit_runtime::tune::Tuning::new(None, *constants, model, false);
    let env = |k: &str| std::env::var(k).ok();
    let slice = cclkit_runtime::ProtoParams::new(Protocol::SIMPLE, &env)
        .map_or(1, |p| p.slice_data().max(1));
    let mut out = Vec::new();
    for bytes in [4096usize, 1 << 20, 256 << 20] {
        // The runtime's channel rule: one per Simple slice, up to the connected ones.
        let channels = bytes.div_ceil(slice).clamp(1, max_channels.max(1));
        let base = tuning.table(Func::ALL_REDUCE, bytes, channels);
        let mut table = base;
        let mut nch = 0;
        let choice = ctx
            .get_coll_info(Func::ALL_REDUCE, bytes, 1, false, &mut table, &mut nch)
            .map_err(|e| e.to_string())
            .map(|()| cheapest(&table).unwrap_or_else(|| "nothing (every entry ignored)".into()));
        let model = cheapest(&base).filter(|m| choice.as_ref().is_ok_and(|c| c != m));
        out.push(Decision {
            collective: "AllReduce".into(),
            bytes,
            choice,
            channels: nch,
            model,
        });
    }
    out
}
