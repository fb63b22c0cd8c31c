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
//! # Quick start
//!
//! `cclkit new net NAME` (or `tuner`) writes a standalone crate from cclkit's
//! templates. By hand: a `cdylib` crate depending on `cclkit-abi`, with
//! `panic = "unwind"` (see [Panics](#panics)), one trait impl and one macro line:
//!
//! ```ignore
//! use std::ffi::CStr;
//! use cclkit_abi::raw::common::{Algorithm, Protocol};
//! use cclkit_abi::tuner::{CollInfo, CostTable, Tuner, TunerInit};
//!
//! pub struct Small;
//!
//! impl Tuner for Small {
//!     const NAME: &'static CStr = c"small";
//!     fn init(_: TunerInit<'_>) -> cclkit_abi::Result<Self> {
//!         Ok(Small)
//!     }
//!     fn get_coll_info(
//!         &self,
//!         info: &CollInfo,
//!         table: &mut CostTable<'_>,
//!         _n_channels: &mut i32,
//!     ) -> cclkit_abi::Result<()> {
//!         if info.n_bytes < 65536 {
//!             table.prefer(Algorithm::TREE, Protocol::LL);
//!         }
//!         Ok(())
//!     }
//! }
//!
//! cclkit_abi::export_tuner!(Small);
//! ```
//!
//! Then `cargo build --release`, `cclkit package target/release/libsmall.so --name
//! small` (checks the exported tables, installs `libnccl-tuner-small.so`) and
//! `cclkit check libnccl-tuner-small.so`. A net plugin implements [`net::Net`] and
//! calls [`export_net!`] the same way.
//!
//! # Panics
//!
//! Every exported entry point runs inside a guard: a panic becomes an
//! `ncclResult_t` error, its message and location go to NCCL's log, and the instance
//! fails fast afterwards. That needs unwinding: building a plugin that uses the
//! export macros with `panic = "abort"` fails at compile time with an explanation.
//! The `allow-panic-abort` feature opts out deliberately (a panic then kills the job).
//!
//! # MSRV and versioning
//!
//! The minimum supported Rust is 1.85 (edition 2024); raising it is a minor release.
//! A new NCCL ABI version exported by the macros (or a new trait method with a
//! default) is a minor release — 0.1 → 0.2 before 1.0 — so rebuilding picks it up;
//! removing a version or breaking existing impls is a major release.
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
