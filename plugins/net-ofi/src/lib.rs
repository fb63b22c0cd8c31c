//! cclkit-net-ofi: a libfabric net plugin for NCCL/RCCL (AWS EFA, `tcp;ofi_rxm`,
//! `shm`, …), built on the cclkit SDK and exported as `ncclNetPlugin_v6` … `_v12`
//! under the name `cclkit-ofi`.
//!
//! It speaks aws-ofi-nccl's "sendrecv" protocol: every NCCL `isend`/`irecv` is one
//! libfabric tagged send/receive on a reliable-datagram (`FI_EP_RDM`) endpoint.
//! One endpoint per device is shared by all comms; each receive comm owns a slice
//! of the 64-bit tag space ([`tags`]). Connection setup travels over the same
//! endpoint ([`comm`]); progress happens in `test` ([`engine`]).
//!
//! | level | modules |
//! | --- | --- |
//! | raw libfabric | [`sys`] (bindgen + C wrappers for `static inline` calls) |
//! | safe libfabric | [`fabric`] (RAII objects, `FiError` naming the `fi_` call) |
//! | transport | [`discover`], [`device`], [`engine`], [`mr`], [`tags`], [`proto`], [`liveness`] |
//! | NCCL protocol | [`comm`], [`data`], [`net`] |
//!
//! Settings: see [`config`]. Threads: none of its own; NCCL's proxy threads drive
//! everything through `test`. Cleanup: endpoints close when the last communicator
//! finalizes (v11+) or when the library is unloaded.
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod bundle;
pub mod comm;
pub mod config;
pub mod cuda;
pub mod data;
pub mod device;
pub mod discover;
pub mod engine;
pub mod fabric;
pub mod liveness;
pub mod mr;
pub mod net;
pub mod prof;
pub mod proto;
#[doc(hidden)]
pub mod sys;
pub mod tags;

pub use engine::{BundleCounts, WriteCounts, bundle_counts, write_counts};
pub use net::OfiNet;

cclkit_abi::export_net!(OfiNet);
