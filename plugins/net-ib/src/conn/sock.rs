//! The TCP side channel's plumbing: a non-blocking connect, partial reads and writes
//! that resume on the next call, and the choice of the address to listen on.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cclkit_abi::sock::{interface_addresses, to_sockaddr};

use crate::config::{Family, IfList};

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
    let (storage, len) = to_sockaddr(&addr);
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
/// A failing `getifaddrs` leaves no candidates, which `pick_address` reports.
pub fn interfaces() -> Vec<(String, IpAddr)> {
    interface_addresses()
        .unwrap_or_default()
        .into_iter()
        .filter(|i| i.up)
        .filter(|i| !matches!(i.addr, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
        .map(|i| (i.name, i.addr))
        .collect()
}

/// The side-channel address, chosen as NCCL chooses its IB interface address:
/// `NCCL_SOCKET_IFNAME` when set, else an `ib*` interface, else any but
/// `lo`/`docker*`/`virbr*`, else loopback; IPv4 first unless `NCCL_SOCKET_FAMILY`.
pub fn pick_address(
    ifs: &[(String, IpAddr)],
    filter: &IfList,
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
        return cands.into_iter().find(|(n, _)| filter.selects(n)).cloned();
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
        let none = IfList::parse("");
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
        let only = IfList::parse("docker");
        assert_eq!(pick_address(&ifs, &only, None).unwrap().1, v4(1));
        assert!(pick_address(&ifs, &IfList::parse("=eth"), None).is_none());
        assert_eq!(
            pick_address(&ifs, &IfList::parse("^docker,ib,lo"), None)
                .unwrap()
                .1,
            v4(2),
            "an exclusion list picks among the rest"
        );
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
