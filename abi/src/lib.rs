//! cclkit-abi: the NCCL/RCCL plugin C ABIs, byte for byte, and a safe SDK on top.
//!
//! * [`raw`]: `#[repr(C)]` tables and structs for net v6–v12, CollNet v6–v12 and
//!   tuner v1–v6, with compile-time size/offset assertions.
//! * [`net::Net`] and [`tuner::Tuner`]: the traits a plugin implements once.
//! * [`export_net!`] / [`export_tuner!`]: publish every ABI version from that one
//!   implementation, with panics contained at the C edge.
//! * [`env::Env`] and [`export_env!`]: env plugins (`ncclEnvPlugin_v1`/`_v2`), with
//!   every returned string kept valid until `finalize`.
//! * [`profiler::Profiler`] and [`export_profiler!`]: profilers (`ncclProfiler_v1` …
//!   `_v7`) with typed events and token handles; [`profiler::net::NetProfiler`] is the
//!   net-plugin side of NCCL's profiler callback.
//! * [`log`]: logging through NCCL's logger (preformatted `"%s"`) or `tracing`.
//! * [`sock`]: the socket helpers TCP-speaking plugins share (sockaddr, nonces,
//!   `NCCL_SOCKET_IFNAME`).
//!
//! ```ignore
//! struct MyNet { /* devices */ }
//! impl cclkit_abi::net::Net for MyNet { /* … */ }
//! cclkit_abi::export_net!(MyNet);
//! ```
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod env;
pub mod error;
pub mod export;
pub mod log;
pub mod net;
pub mod profiler;
pub mod raw;
pub mod sock;
pub mod tuner;

pub use error::{Error, Result};
