//! Runtime configuration, read from the environment once per communicator.

use std::sync::Arc;
use std::time::Duration;

use super::bootstrap;
use super::device::DeviceKind;
use super::error::{Error, Result};
use crate::plugin::select::NetRegistry;
use crate::plugin::select::TunerRegistry;

/// Default for `CCLKIT_OP_TIMEOUT` (seconds).
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(300);
/// NCCL's channel limit.
pub const MAX_CHANNELS: usize = 32;

/// How a communicator is set up and run.
#[derive(Clone)]
pub struct Config {
    /// The plugin registry to select from (`None` = the process-wide one, configured
    /// from `NCCL_NET_PLUGIN`, `NCCL_NET`, …).
    pub registry: Option<Arc<NetRegistry>>,
    /// The tuner registry (`None` = the process-wide one, from `NCCL_TUNER_PLUGIN`).
    pub tuner_registry: Option<Arc<TunerRegistry>>,
    /// `CCLKIT_TUNER_REPORT=1`: rank 0 prints what every collective ran with at destroy.
    pub tuner_report: bool,
    /// Traffic class passed to the plugin (`NCCL_IB_TC`-like; -1 = unset).
    pub traffic_class: Option<i32>,
    /// `CCLKIT_BOOTSTRAP_TIMEOUT`: joining and connection setup.
    pub bootstrap_timeout: Duration,
    /// `CCLKIT_OP_TIMEOUT`: one operation; past it the communicator is aborted.
    pub op_timeout: Duration,
    /// `NCCL_MIN_NCHANNELS`.
    pub min_channels: usize,
    /// `NCCL_MAX_NCHANNELS`.
    pub max_channels: usize,
    /// `NCCL_ALGO` (e.g. `ring`, `tree`, `^tree`).
    pub algo: Option<String>,
    /// `NCCL_PROTO` (e.g. `LL,Simple`, `^LL128`).
    pub proto: Option<String>,
    /// `CCLKIT_GROUPED_RECV` (default on): grouped receives on p2p links when the
    /// plugin's `maxRecvs > 1`.
    pub grouped_recv: bool,
    /// `CCLKIT_DEVICE` (`host`, `cuda`, `cuda:N`; `CCLKIT_CUDA_EMULATE=1` for the
    /// emulated GPU): where user buffers live (see [`super::device`]).
    pub device: DeviceKind,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("traffic_class", &self.traffic_class)
            .field("bootstrap_timeout", &self.bootstrap_timeout)
            .field("op_timeout", &self.op_timeout)
            .field("channels", &(self.min_channels, self.max_channels))
            .field("grouped_recv", &self.grouped_recv)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

fn parse<T: std::str::FromStr>(
    get: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<T>> {
    get(name)
        .map(|v| {
            v.trim()
                .parse::<T>()
                .map_err(|_| Error::invalid_argument(format!("{name}={v} is not valid")))
        })
        .transpose()
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Reads configuration through `get` (`None` = unset).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let secs = |name: &str, default: Duration| -> Result<Duration> {
            Ok(parse::<f64>(get, name)?
                .filter(|s| *s > 0.0 && s.is_finite())
                .map_or(default, Duration::from_secs_f64))
        };
        let min_channels = parse::<usize>(get, "NCCL_MIN_NCHANNELS")?
            .unwrap_or(1)
            .clamp(1, MAX_CHANNELS);
        let max_channels = parse::<usize>(get, "NCCL_MAX_NCHANNELS")?
            .unwrap_or(MAX_CHANNELS)
            .clamp(1, MAX_CHANNELS);
        Ok(Self {
            registry: None,
            tuner_registry: None,
            tuner_report: parse::<u8>(get, "CCLKIT_TUNER_REPORT")?.is_some_and(|v| v != 0),
            traffic_class: parse::<i32>(get, "NCCL_IB_TC")?
                .or(parse::<i32>(get, "CCLKIT_TRAFFIC_CLASS")?),
            bootstrap_timeout: secs("CCLKIT_BOOTSTRAP_TIMEOUT", bootstrap::DEFAULT_TIMEOUT)?,
            op_timeout: secs("CCLKIT_OP_TIMEOUT", DEFAULT_OP_TIMEOUT)?,
            min_channels,
            max_channels: max_channels.max(min_channels),
            algo: get("NCCL_ALGO"),
            proto: get("NCCL_PROTO"),
            grouped_recv: parse::<u8>(get, "CCLKIT_GROUPED_RECV")?.is_none_or(|v| v != 0),
            device: DeviceKind::from_lookup(get)?,
        })
    }

    /// Channels to connect: two by default (one per tree), at least one per device when
    /// there are several, within `NCCL_MIN_NCHANNELS..=NCCL_MAX_NCHANNELS`.
    pub fn channels(&self, devices: usize) -> usize {
        devices.max(2).clamp(self.min_channels, self.max_channels)
    }
}
