//! The TUNER section's sample decisions: AllReduce at a few sizes, asked the way the
//! runtime asks a tuner (the built-in model's cost table, NCCL's default constants).

use cclkit_host::tuner::{CostTable, TunerConstants, TunerContext};
use cclkit_runtime::tune::{ModelInputs, Tuning, cheapest, default_channels};

use super::Decision;
use crate::commands::report::DeviceReport;

/// The built-in model's inputs for the doctor's communicator shape, from the chosen
/// net plugin's devices as a communicator derives them.
pub(super) fn model_inputs(ranks: usize, nodes: usize, devices: &[DeviceReport]) -> ModelInputs {
    ModelInputs::from_devices(
        ranks.max(1),
        nodes.clamp(1, ranks.max(1)),
        devices.iter().map(|d| (d.speed_mbps, d.latency_us)),
    )
}

/// The cheapest usable entry of a cost table, as "ALGO/PROTO".
fn cheapest_name(table: &CostTable) -> Option<String> {
    cheapest(table).map(|(a, p)| format!("{a}/{p}"))
}

/// AllReduce at a few sizes, asked the way the runtime asks: the tuner gets the
/// built-in model's cost table for this shape (what NCCL hands it: its own model's
/// times, unsupported entries at -1), so an entry it leaves alone keeps the model's
/// cost, and the model's own pick is shown next to the result.
pub(super) fn sample_decisions(
    ctx: &mut TunerContext,
    model: ModelInputs,
    max_channels: usize,
    constants: &TunerConstants,
) -> Vec<Decision> {
    use cclkit_abi::raw::common::{Func, Protocol};
    let tuning = Tuning::new(None, *constants, model, false);
    let env = |k: &str| std::env::var(k).ok();
    let slice =
        cclkit_runtime::ProtoParams::new(Protocol::SIMPLE, &env).map_or(1, |p| p.slice_data());
    let mut out = Vec::new();
    for bytes in [4096usize, 1 << 20, 256 << 20] {
        let channels = default_channels(bytes, max_channels, slice);
        let base = tuning.table(Func::ALL_REDUCE, bytes, channels);
        let mut table = base;
        let mut nch = 0;
        let choice = ctx
            .get_coll_info(Func::ALL_REDUCE, bytes, 1, false, &mut table, &mut nch)
            .map_err(|e| e.to_string())
            .map(|()| {
                cheapest_name(&table).unwrap_or_else(|| "nothing (every entry ignored)".into())
            });
        let model = cheapest_name(&base).filter(|m| choice.as_ref().is_ok_and(|c| c != m));
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
