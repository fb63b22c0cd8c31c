//! cclkit-ib: an InfiniBand/RoCE verbs net plugin (in progress).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod nic;
pub mod proto;
pub mod verbs;

#[cfg(test)]
mod fake;
