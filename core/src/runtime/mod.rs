//! The GPU-free reference runtime: communicators, bootstrap, launchers, topology,
//! channels and proxy progress, point-to-point and collectives, driving net plugins
//! the way NCCL's proxy thread does, on host memory.

pub mod bootstrap;
pub mod error;
pub mod launch;
pub mod protocol;
pub mod schedule;
pub mod topo;

pub use bootstrap::{Bootstrap, BootstrapRoot, UniqueId};
pub use error::{Error, Result};
