//! The GPU-free reference runtime: communicators, bootstrap, launchers, topology,
//! channels and proxy progress, point-to-point and collectives, driving net plugins
//! the way NCCL's proxy thread does, on host memory.

pub mod bootstrap;
pub mod coll;
pub mod comm;
pub mod config;
pub mod connect;
pub mod device;
pub mod error;
pub mod fifo;
pub mod launch;
pub mod p2p;
pub mod protocol;
pub mod proxy;
pub mod schedule;
pub mod topo;
pub mod tune;
pub mod world;

pub use bootstrap::{Bootstrap, BootstrapRoot, UniqueId};
pub use comm::Comm;
pub use config::Config;
pub use error::{Error, Result};
