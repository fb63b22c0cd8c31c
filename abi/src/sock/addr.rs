//! `SocketAddr` ⇄ C socket addresses, and the interface list from `getifaddrs`.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A `sockaddr_storage` holding `addr`, and the length of the `sockaddr_in{,6}` in it,
/// ready for `connect`/`bind`.
pub fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is a valid (AF_UNSPEC) value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { (&raw mut storage).cast::<libc::sockaddr_in>().write(sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { (&raw mut storage).cast::<libc::sockaddr_in6>().write(sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    // Both sizes are small constants that fit socklen_t.
    (storage, len as libc::socklen_t)
}

/// Reads a `sockaddr_in` or `sockaddr_in6` from its bytes (as a C library hands them
/// over, e.g. libfabric's `src_addr`); `None` for other families or short input.
pub fn from_sockaddr_bytes(b: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes([*b.first()?, *b.get(1)?]);
    // sin_port / sin6_port follow the family, in network order.
    let port = || Some(u16::from_be_bytes([*b.get(2)?, *b.get(3)?]));
    let u32_at = |i: usize| -> Option<[u8; 4]> { b.get(i..i + 4)?.try_into().ok() };
    match i32::from(family) {
        libc::AF_INET if b.len() >= size_of::<libc::sockaddr_in>() => {
            let ip = Ipv4Addr::from(u32_at(4)?);
            Some(SocketAddr::V4(SocketAddrV4::new(ip, port()?)))
        }
        libc::AF_INET6 if b.len() >= size_of::<libc::sockaddr_in6>() => {
            let flowinfo = u32::from_ne_bytes(u32_at(4)?);
            let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            let scope = u32::from_ne_bytes(u32_at(24)?);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port()?,
                flowinfo,
                scope,
            )))
        }
        _ => None,
    }
}

/// One IPv4/IPv6 address of an interface, as `getifaddrs` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    /// Interface name (`eth0`).
    pub name: String,
    /// The address.
    pub addr: IpAddr,
    /// IPv6 scope id (interface index of a link-local address), else 0.
    pub scope_id: u32,
    /// `IFF_UP`.
    pub up: bool,
    /// `IFF_RUNNING` (NCCL's test for "physically attached").
    pub running: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
}

/// Every IPv4/IPv6 address of every interface, in `getifaddrs` order (NCCL's order:
/// an interface's IPv4 address usually comes before its IPv6 ones).
pub fn interface_addresses() -> io::Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; the list is freed below, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` walks the list getifaddrs returned, valid until freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-NULL and starts with the family field.
        let len = match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
            libc::AF_INET => size_of::<libc::sockaddr_in>(),
            libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
            _ => continue,
        };
        // SAFETY: the family says ifa_addr points to a sockaddr of `len` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(ifa.ifa_addr.cast::<u8>(), len) };
        let Some(sa) = from_sockaddr_bytes(bytes) else {
            continue;
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let flags = ifa.ifa_flags;
        out.push(IfAddr {
            name,
            addr: sa.ip(),
            scope_id: match sa {
                SocketAddr::V6(v6) => v6.scope_id(),
                SocketAddr::V4(_) => 0,
            },
            up: flags & libc::IFF_UP as u32 != 0,
            running: flags & libc::IFF_RUNNING as u32 != 0,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        });
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn bytes_of(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> &[u8] {
        // SAFETY: `len` ≤ size_of::<sockaddr_storage>() and the storage is initialised.
        unsafe {
            std::slice::from_raw_parts(
                (storage as *const libc::sockaddr_storage).cast(),
                len as usize,
            )
        }
    }

    #[test]
    fn round_trips_v4_and_v6() {
        let addrs: [SocketAddr; 3] = [
            "192.0.2.17:40961".parse().unwrap(),
            SocketAddr::V6(SocketAddrV6::new(
                "fe80::1:2".parse().unwrap(),
                5,
                0xabcde,
                7,
            )),
            "[2001:db8::9]:65535".parse().unwrap(),
        ];
        for a in addrs {
            let (s, len) = to_sockaddr(&a);
            assert_eq!(from_sockaddr_bytes(bytes_of(&s, len)), Some(a));
        }
    }

    #[test]
    fn layout_is_what_c_sees() {
        let (s, len) = to_sockaddr(&"10.1.2.3:258".parse().unwrap());
        let b = bytes_of(&s, len);
        assert_eq!(len as usize, 16);
        assert_eq!(u16::from_ne_bytes([b[0], b[1]]), libc::AF_INET as u16);
        assert_eq!(&b[2..8], &[1, 2, 10, 1, 2, 3]);
    }

    #[test]
    fn short_or_foreign_input_is_refused() {
        let (s, len) = to_sockaddr(&"[::1]:1".parse().unwrap());
        let b = bytes_of(&s, len);
        assert_eq!(from_sockaddr_bytes(&b[..b.len() - 1]), None);
        assert_eq!(from_sockaddr_bytes(&[]), None);
        let mut unix = b.to_vec();
        unix[..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(from_sockaddr_bytes(&unix), None);
    }

    #[test]
    fn loopback_is_listed() {
        let all = interface_addresses().unwrap();
        assert!(
            all.iter()
                .any(|a| a.loopback && a.addr == IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{all:?}"
        );
    }
}
