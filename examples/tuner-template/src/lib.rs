//! A small but real tuner: tree + LL below a size threshold, ring + Simple above.
//!
//! Copy this crate to start a tuner. `CCLKIT_TEMPLATE_THRESHOLD` sets the switch
//! point in bytes (default 65536) and `CCLKIT_TEMPLATE_CHANNELS` an optional channel
//! count. Entries NCCL did not offer are never enabled: the choice falls back to
//! NCCL's own when the preferred pair is unsupported for a call. `export_tuner!`
//! publishes it as `ncclTunerPlugin_v1` … `_v6`.

use std::ffi::CStr;

use cclkit_abi::raw::common::{Algorithm, Protocol, subsys};
use cclkit_abi::tuner::{CollInfo, CostTable, Tuner, TunerInit};
use cclkit_abi::{Error, Result, export_tuner, nccl_info};

/// One communicator's tuner.
pub struct TemplateTuner {
    threshold: usize,
    channels: i32,
}

fn env_number(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| Error::invalid_argument(format!("{name}={v} is not a number"))),
        Err(_) => Ok(default),
    }
}

impl Tuner for TemplateTuner {
    const NAME: &'static CStr = c"TemplateTuner";

    fn init(args: TunerInit<'_>) -> Result<Self> {
        let threshold = env_number("CCLKIT_TEMPLATE_THRESHOLD", 65536)?;
        let channels = i32::try_from(env_number("CCLKIT_TEMPLATE_CHANNELS", 0)?)
            .map_err(|_| Error::invalid_argument("CCLKIT_TEMPLATE_CHANNELS is too large"))?;
        nccl_info!(
            subsys::TUNING,
            "template tuner: {} ranks on {} nodes, tree/LL below {threshold} B, ring/Simple above",
            args.n_ranks,
            args.n_nodes
        );
        Ok(Self {
            threshold,
            channels,
        })
    }

    fn get_coll_info(
        &self,
        info: &CollInfo,
        table: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Result<()> {
        let (algo, proto) = if info.n_bytes < self.threshold {
            (Algorithm::TREE, Protocol::LL)
        } else {
            (Algorithm::RING, Protocol::SIMPLE)
        };
        if table.prefer(algo, proto) && self.channels > 0 {
            *n_channels = self.channels;
        }
        Ok(())
    }
}

export_tuner!(TemplateTuner);
