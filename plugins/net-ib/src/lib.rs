//! cclkit-ib: an InfiniBand/RoCE verbs net plugin for NCCL and RCCL.
//!
//! Packaged as `libnccl-net-cclkit-ib.so` (RCCL: `librccl-net-cclkit-ib.so`); select
//! it with `NCCL_NET_PLUGIN=cclkit-ib` (or the full path) and `NCCL_NET=cclkit-ib`.
//! It exports `ncclNetPlugin_v6` … `ncclNetPlugin_v12` through
//! [`cclkit_abi::export_net!`].
//!
//! # What it does
//! * **Devices**: every active port of every HCA passing `NCCL_IB_HCA`, with speed,
//!   port, guid, PCI path, `maxComms`, `regIsGlobal = 1`, `maxRecvs = 8`, and pointer
//!   support HOST (+ CUDA with a peer-memory module, + DMABUF when
//!   `ibv_reg_dmabuf_mr` works), as NCCL's `ncclIbGetPhysProperties`.
//! * **Connections**: RC QPs (`NCCL_IB_QPS_PER_CONNECTION`), GID choice as NCCL's
//!   `ncclIbGetGidIndex` ([`verbs::gid`]), address vectors with FLID routing across
//!   IB subnets ([`route`]), the sender's traffic class and SL on both sides, ECE
//!   negotiation; QP information exchanged over a TCP side channel whose address and
//!   magic are in the handle; connect/accept never block ([`conn`]).
//! * **Data path**: receiver-driven, CTS FIFO, one QP per message round-robin (or
//!   split), RDMA WRITE + WRITE_WITH_IMM shaped for adaptive routing, grouped
//!   receives, GPU flush by loopback RDMA READ, out-of-order receive queues matched
//!   by id, per-QP profiler events ([`proto`]).
//! * **NIC fusion**: virtual devices whose connections stripe QPs over several
//!   physical ports, each with its own keys ([`vdev`]).
//! * **Fatal events**: asynchronous device/CQ/QP errors fail the comms concerned on
//!   their next call ([`fatal`], [`verbs::events`]).
//! * **Memory**: `regMr`/`regMrDmaBuf` with a page-aligned, refcounted cache.
//!
//! # Layers
//! | level | module | role |
//! | --- | --- | --- |
//! | sys | [`verbs::sys`] | `#[repr(C)]` verbs types, layout-checked against verbs.h |
//! | loader | [`verbs::loader`] | `libibverbs.so.1` opened at run time (no link-time dependency) |
//! | safe | [`verbs::safe`] | RAII device/PD/CQ/QP/MR; errors name the call, keep errno |
//! | seam | [`nic::Nic`] | the few NIC operations the protocol needs |
//! | routing | [`route`], [`fatal`] | address vectors; async fatal-event state |
//! | devices | [`vdev`] | virtual devices fusing ports (`makeVDevice`) |
//! | protocol | [`proto`] | FIFO slots, tags, splitting, immediates, MR cache |
//! | plugin | [`plugin::IbNet`] | the [`cclkit_abi::net::Net`] implementation |
//!
//! The protocol is unit-tested against an in-memory fake NIC (a test double compiled
//! only for tests). See `README.md` for what is and is not verified without RDMA
//! hardware, and `HARDWARE.md` for the two-host test.
//!
//! # System libraries
//! Run time only: `libibverbs.so.1` and a provider (rdma-core). Without them, or
//! without an RDMA device, `init` fails with the reason and NCCL falls back.
//!
//! # Threads
//! One async-event monitor per opened device ([`verbs::events`]), stopped and
//! joined when the device is dropped (so the plugin can be dlclosed). All other work
//! happens in NCCL's calls; connect/accept progress on each call.
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod config;
pub mod conn;
pub mod fatal;
pub mod nic;
pub mod plugin;
pub mod proto;
pub mod route;
pub mod vdev;
pub mod verbs;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod plugin_fusion_tests;
#[cfg(test)]
mod plugin_item_tests;
#[cfg(test)]
mod plugin_prof_tests;
#[cfg(test)]
mod plugin_tests;

/// The exported plugin: [`plugin::IbNet`] over libibverbs.
pub type IbVerbsNet = plugin::IbNet<plugin::Verbs>;

cclkit_abi::export_net!(IbVerbsNet);
