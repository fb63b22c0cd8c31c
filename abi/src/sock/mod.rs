//! Socket helpers every TCP-speaking plugin and host needs, in one place: libc only.
//!
//! * [`random_u64`]: nonces and listen magics from the kernel's CSPRNG (`getrandom`),
//!   so a peer cannot guess them (a hasher seeded by the clock could be guessed).
//! * [`to_sockaddr`] / [`from_sockaddr_bytes`]: `SocketAddr` ⇄ C `sockaddr_in{,6}`.
//! * [`IfList`]: an `NCCL_SOCKET_IFNAME` / `NCCL_IB_HCA` value with NCCL's semantics
//!   (prefix match, `^` excludes, `=` exact names, `:port`).
//! * [`interface_addresses`]: the IPv4/IPv6 addresses `getifaddrs` reports.

mod addr;
mod ifname;

pub use addr::{IfAddr, from_sockaddr_bytes, interface_addresses, to_sockaddr};
pub use ifname::IfList;

/// 8 random bytes from the kernel (`getrandom(2)`), for nonces and listen magics.
pub fn random_u64() -> std::io::Result<u64> {
    getrandom::u64().map_err(std::io::Error::from)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn random_values_differ() {
        // 64 draws from a CSPRNG repeat with probability ~2^-53: a repeat means the
        // source is broken (e.g. a constant or a clock).
        let mut v: Vec<u64> = (0..64).map(|_| random_u64().unwrap()).collect();
        v.sort_unstable();
        v.dedup();
        assert_eq!(v.len(), 64);
    }
}
