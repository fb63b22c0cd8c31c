//! The TCP side channel's plumbing: a non-blocking connect, partial reads and writes
//! that resume on the next call, and the choice of the address to listen on.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::config::{Family, NameFilter};

/// Starts a connect to `addr` without blocking; finish with [`connect_done`].
pub fn connect_start(addr: SocketAddr) -> io::Result<TcpStream> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain socket(2) call.
    let fd = unsafe {
        libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let (storage, len) = sockaddr(addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    let r = unsafe { libc::connect(fd, (&raw const storage).cast(), len) };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    let stream = TcpStream::from(owned);
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Whether a connect started by [`connect_start`] has finished (error if it failed).
pub fn connect_done(stream: &TcpStream) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let r = unsafe { libc::poll(&mut pfd, 1, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r == 0 {
        return Ok(false);
    }
    match stream.take_error()? {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
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
            std::mem::size_of::<libc::sockaddr_in>()
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
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Bytes still to write on a non-blocking socket.
pub struct Outgoing {
    buf: Vec<u8>,
    done: usize,
}

impl Outgoing {
    /// Queues `buf`.
    pub fn new(buf: Vec<u8>) -> Self {
        Self { buf, done: 0 }
    }

    /// Writes what the socket takes; `Ok(true)` once everything is written.
    pub fn progress(&mut self, stream: &mut TcpStream) -> io::Result<bool> {
        while self.done < self.buf.len() {
            match stream.write(&self.buf[self.done..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// Reads into `buf` until it holds `want` bytes; `Ok(true)` when it does. The peer
/// closing first is `UnexpectedEof`.
pub fn read_until(stream: &mut TcpStream, buf: &mut Vec<u8>, want: usize) -> io::Result<bool> {
    let mut chunk = [0u8; 512];
    while buf.len() < want {
        let room = (want - buf.len()).min(chunk.len());
        match stream.read(&mut chunk[..room]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Up interfaces with their addresses (IPv6 link-local skipped: they need a scope).
pub fn interfaces() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` walks the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: non-NULL interface names are C strings.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `ifa_addr` is non-NULL; its family says which struct it is.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    Some(IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()))
                }
                libc::AF_INET6 => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            }
        };
        match ip {
            Some(IpAddr::V6(v6)) if v6.segments()[0] & 0xffc0 == 0xfe80 => {}
            Some(ip) => out.push((name, ip)),
            None => {}
        }
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The side-channel address, chosen as NCCL chooses its IB interface address:
/// `NCCL_SOCKET_IFNAME` when set, else an `ib*` interface, else any but
/// `lo`/`docker*`/`virbr*`, else loopback; IPv4 first unless `NCCL_SOCKET_FAMILY`.
pub fn pick_address(
    ifs: &[(String, IpAddr)],
    filter: &NameFilter,
    family: Option<Family>,
) -> Option<(String, IpAddr)> {
    let fam_ok = |ip: &IpAddr| match family {
        Some(Family::V4) => ip.is_ipv4(),
        Some(Family::V6) => ip.is_ipv6(),
        None => true,
    };
    let mut cands: Vec<&(String, IpAddr)> = ifs.iter().filter(|(_, ip)| fam_ok(ip)).collect();
    // IPv4 before IPv6, stable otherwise.
    cands.sort_by_key(|(_, ip)| ip.is_ipv6());
    if !filter.is_empty() {
        return cands
            .into_iter()
            .find(|(n, _)| filter.matches(n, None))
            .cloned();
    }
    let virtual_if = |n: &str| n == "lo" || n.starts_with("docker") || n.starts_with("virbr");
    cands
        .iter()
        .find(|(n, _)| n.starts_with("ib"))
        .or_else(|| cands.iter().find(|(n, _)| !virtual_if(n)))
        .or_else(|| cands.iter().find(|(n, _)| n == "lo"))
        .map(|c| (*c).clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, TcpListener};

    #[test]
    fn address_choice_follows_nccl_preferences() {
        let v4 = |a: u8| IpAddr::V4(Ipv4Addr::new(10, 0, 0, a));
        let ifs = vec![
            ("lo".to_owned(), IpAddr::V4(Ipv4Addr::LOCALHOST)),
            ("docker0".to_owned(), v4(1)),
            (
                "eth0".to_owned(),
                IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
            ),
            ("eth0".to_owned(), v4(2)),
            ("ib0".to_owned(), v4(3)),
        ];
        let none = NameFilter::parse(None);
        assert_eq!(pick_address(&ifs, &none, None).unwrap().1, v4(3));
        assert_eq!(
            pick_address(&ifs[..4], &none, None).unwrap().1,
            v4(2),
            "IPv4 first"
        );
        assert!(
            pick_address(&ifs[..4], &none, Some(Family::V6))
                .unwrap()
                .1
                .is_ipv6()
        );
        assert_eq!(pick_address(&ifs[..2], &none, None).unwrap().0, "lo");
        let only = NameFilter::parse(Some("docker"));
        assert_eq!(pick_address(&ifs, &only, None).unwrap().1, v4(1));
        assert!(pick_address(&ifs, &NameFilter::parse(Some("=eth")), None).is_none());
        // This machine has at least loopback.
        assert!(!interfaces().is_empty());
    }

    #[test]
    fn nonblocking_connect_completes_and_partial_io_resumes() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = connect_start(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let start = std::time::Instant::now();
        while !connect_done(&c).unwrap() {
            assert!(start.elapsed().as_secs() < 10);
        }
        let mut out = Outgoing::new((0..=255u8).cycle().take(3 * 1024 * 1024).collect());
        s.set_nonblocking(true).unwrap();
        let mut got = Vec::new();
        let mut done = false;
        while !done || got.len() < 3 * 1024 * 1024 {
            done = done || out.progress(&mut c).unwrap();
            read_until(&mut s, &mut got, 3 * 1024 * 1024).unwrap();
            assert!(start.elapsed().as_secs() < 20);
        }
        assert!(got.iter().enumerate().all(|(i, &b)| b == i as u8));
        drop(c);
        let mut more = Vec::new();
        let e = loop {
            match read_until(&mut s, &mut more, 1) {
                Ok(false) => assert!(start.elapsed().as_secs() < 20),
                Ok(true) => panic!("no data was sent"),
                Err(e) => break e,
            }
        };
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // A refused connect reports its error.
        let port = {
            let t = TcpListener::bind("127.0.0.1:0").unwrap();
            t.local_addr().unwrap()
        };
        let r = connect_start(port).and_then(|c| {
            loop {
                if connect_done(&c)? {
                    return Ok(());
                }
                assert!(start.elapsed().as_secs() < 20);
            }
        });
        assert!(r.is_err());
    }
}
