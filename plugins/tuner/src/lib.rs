//! cclkit's tuner plugin, packaged as `libnccl-tuner-cclkit.so`.
//!
//! * **Rules mode** reads NVIDIA's example CSV unchanged (`NCCL_TUNER_CONFIG_FILE`,
//!   default `nccl_tuner.conf`) or cclkit's richer TOML ([`config`]).
//! * **Model mode** ranks the cost table with an analytic latency/bandwidth model
//!   ([`model`]).
//! * **Auto** (default): rules first, the model for the rest.
//!
//! One context per communicator; `export_tuner!` publishes `ncclTunerPlugin_v1` …
//! `_v6`. A bad rule file never fails `init`: every bad line is logged as
//! `file:line: reason` and that communicator uses the model. See README.md for the
//! formats, modes, variables and model formulas.
//!
//! [`config`] is the public rule model that `cclkit tune` reuses: parse CSV/TOML,
//! match, write either format, and [`config::diff()`].

#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod config;
pub mod engine;
pub mod env;
pub mod hw;
pub mod model;
mod plugin;

pub use plugin::CclkitTuner;

cclkit_abi::export_tuner!(CclkitTuner);
