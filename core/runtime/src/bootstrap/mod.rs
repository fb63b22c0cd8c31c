//! Bootstrap: how ranks find each other before any plugin connection exists.
//!
//! Like NCCL's `ncclGetUniqueId` / bootstrap: a [`UniqueId`] names a root (address +
//! random magic). Every rank opens its own listener, tells the root where it is, and
//! gets back the address table of all ranks. Afterwards ranks exchange small messages
//! (net handles, peer info) directly: [`Bootstrap::send`] / [`Bootstrap::recv`], and
//! [`Bootstrap::allgather`] / [`Bootstrap::barrier`] on top.
//!
//! Every connection starts with the magic; a connection with another magic (another
//! job, a stale id) is closed and logged, never matched. Every wait has a deadline
//! (`CCLKIT_BOOTSTRAP_TIMEOUT`), so a rank that never shows up or a wrong id is a
//! clear error, not a hang. Listeners read connections concurrently, each under a short
//! header deadline ([`HEADER_DEADLINE`]), so a stray connection costs a WARN, not a
//! stalled job.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::str::FromStr;
use std::time::Duration;

use super::error::{Error, Result};

/// Default for `CCLKIT_BOOTSTRAP_TIMEOUT` (seconds).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Most ranks one communicator may have: a rank count read from the environment or
/// from a Hello above it is refused before anything is sized from it.
pub const MAX_RANKS: usize = 1 << 16;
/// Largest bootstrap message accepted (guards against garbage length fields).
const MAX_MESSAGE: usize = 64 << 20;

/// Identifies one communicator's bootstrap root: where it listens and the magic every
/// connection must present. Printable and parseable (`cclkit1:10.0.0.1:40123:9f…`),
/// so launchers pass it through the environment.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct UniqueId {
    /// The root's listening address.
    pub root: SocketAddr,
    /// Random per-communicator magic.
    pub magic: u64,
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cclkit1:{}:{:016x}", self.root, self.magic)
    }
}

impl FromStr for UniqueId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid_argument(format!(
                "'{s}' is not a cclkit unique id (cclkit1:ADDR:PORT:MAGIC)"
            ))
        };
        let rest = s.trim().strip_prefix("cclkit1:").ok_or_else(bad)?;
        let (addr, magic) = rest.rsplit_once(':').ok_or_else(bad)?;
        Ok(Self {
            root: addr.parse().map_err(|_| bad())?,
            magic: u64::from_str_radix(magic, 16).map_err(|_| bad())?,
        })
    }
}

/// A random 64-bit value for unique ids and magics, from the OS (`getrandom` through
/// `cclkit_abi::sock`, the one source every cclkit component uses). Should the OS
/// refuse, std's per-process random hasher keys mixed with time and pid stand in, so a
/// launcher still gets distinct values.
pub fn random_u64() -> u64 {
    cclkit_abi::sock::random_u64().unwrap_or_else(|_| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.finish()
    })
}

/// The local address used to reach `peer` (no packet is sent: a UDP `connect` only
/// asks the kernel for the route). Falls back to loopback when there is no route.
pub fn local_ip_towards(peer: IpAddr) -> IpAddr {
    let any = SocketAddr::new(
        if peer.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        },
        0,
    );
    UdpSocket::bind(any)
        .and_then(|s| s.connect((peer, 9)).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .unwrap_or(if peer.is_ipv4() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            peer
        })
}

mod listen;
mod rank;
mod root;
#[cfg(test)]
mod tests;
mod wire;

pub use rank::Bootstrap;
pub use root::BootstrapRoot;
use wire::*;
