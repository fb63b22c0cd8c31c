//! cclkit-abi: the NCCL/RCCL plugin C ABIs, byte for byte, and a safe SDK on top.
//!
//! * [`raw`]: `#[repr(C)]` tables and structs for net v6–v12, CollNet v6–v12 and
//!   tuner v1–v6, with compile-time size/offset assertions.
//! * [`net::Net`] and [`tuner::Tuner`]: the traits a plugin implements once.
//! * [`export_net!`] / [`export_tuner!`]: publish every ABI version from that one
//!   implementation, with panics contained at the C edge.
//! * [`log`]: logging through NCCL's logger (preformatted `"%s"`) or `tracing`.
//!
//! ```ignore
//! struct MyNet { /* devices */ }
//! impl cclkit_abi::net::Net for MyNet { /* … */ }
//! cclkit_abi::export_net!(MyNet);
//! ```
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod error;
pub mod export;
pub mod log;
pub mod net;
pub mod raw;
pub mod tuner;

pub use error::{Error, Result};
