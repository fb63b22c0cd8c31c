//! `NCCL_IB_OOO_RQ`: whether a connection uses out-of-order receive queues, decided
//! as NCCL does (`ncclIbQueryOooRqSize`, `ncclIbSenderQpsCreate`,
//! `ncclIbReceiverQpsCreateToRts`).
//!
//! * Variable unset (default): off.
//! * Set, but the provider has no way to enable them (NCCL: a non-mlx5 provider;
//!   cclkit-ib's verbs NIC always, as it does not bind mlx5dv): off. NCCL says
//!   nothing; this plugin warns once per device at init
//!   ([`crate::verbs::device`]) and logs it per connection, so the setting is never
//!   silently ignored (and never silently on).
//! * Set on an mlx5-like device ("forced"): adaptive routing must be on, every port
//!   must have OOO receive queues, the peer must have them too, and the receiver's
//!   must hold its receive queue; otherwise the connection fails with NCCL's reason.
//!
//! With OOO receive queues an arriving WRITE_WITH_IMM may consume any posted
//! receive, so its completion's `wr_id` does not name the message: both sides then
//! match by id (NCCL's `BY_ID` scheme): every message's immediate is its sequence
//! number and the sizes travel in the size records ([`super::imm`]).

use std::sync::Arc;

use cclkit_abi::raw::common::subsys;
use cclkit_abi::{Error, Result, nccl_info};

use crate::nic::Nic;

/// This side's OOO RQ situation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ooo {
    /// Not requested, or the provider cannot do it: off, no requirement on the peer.
    Off,
    /// Requested on a capable provider: `supported` when every port has OOO
    /// receive queues. The connection then needs both sides supported.
    Forced {
        /// Every port of this side has OOO receive queues.
        supported: bool,
    },
}

impl Ooo {
    /// Decides for the ports `nics` with `NCCL_IB_OOO_RQ` = `requested`.
    pub fn local<N: Nic>(requested: bool, nics: &[Arc<N>]) -> Result<Self> {
        if !requested {
            return Ok(Ooo::Off);
        }
        if nics.iter().any(|n| n.ooo_rq_size().is_none()) {
            nccl_info!(
                subsys::NET,
                "NET/cclkit-ib: NCCL_IB_OOO_RQ=1 is set, but out-of-order receive queues need \
                 mlx5dv (mlx5dv_query_device, MLX5DV_QP_CREATE_OOO_DP), which this provider or \
                 cclkit-ib does not offer; they stay off"
            );
            return Ok(Ooo::Off);
        }
        if nics.iter().any(|n| !n.adaptive_routing()) {
            return Err(Error::internal(
                "NET/cclkit-ib: OOO RQ is force enabled but AR is not enabled, which is \
                 required for OOO RQ (NCCL_IB_ADAPTIVE_ROUTING)",
            ));
        }
        Ok(Ooo::Forced {
            supported: nics.iter().all(|n| n.ooo_rq_size().is_some_and(|s| s > 0)),
        })
    }

    /// Whether this side's QPs get OOO receive queues with a peer that announced
    /// `remote` (NCCL fails a forced connection unless both sides support it).
    pub fn with_peer(self, remote: bool) -> Result<bool> {
        match self {
            Ooo::Off => Ok(false),
            Ooo::Forced { supported } if supported && remote => Ok(true),
            Ooo::Forced { supported } => Err(Error::internal(format!(
                "NET/cclkit-ib: OOO RQ is force enabled but not supported on both sides of the \
                 connection (local {}, remote {})",
                u8::from(supported),
                u8::from(remote)
            ))),
        }
    }

    /// What this side announces to the peer.
    pub fn announce(self) -> bool {
        matches!(self, Ooo::Forced { supported: true })
    }
}

/// NCCL's receiver check: every port's OOO receive queue holds `need` receives.
pub fn check_size<N: Nic>(nics: &[Arc<N>], need: u32) -> Result<()> {
    for n in nics {
        let have = n.ooo_rq_size().unwrap_or(0);
        if have < need {
            return Err(Error::internal(format!(
                "NET/cclkit-ib: OOO RQ is force enabled but size {have} is less than the \
                 required recv work request size {need}"
            )));
        }
    }
    Ok(())
}
