//! Thin wrappers over the socket system calls the transport needs and `std` lacks.
//!
//! Why not `std` alone: a non-blocking `connect`, `sendmsg` with `MSG_NOSIGNAL`
//! (`std`'s vectored write is `writev`, which raises SIGPIPE in a C host that did
//! not ignore it), `poll` over several sockets, and `eventfd` wake-ups.

use std::io::{self, IoSlice};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Converts a `-1` return into the thread's `errno`.
fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Like [`cvt`] for `ssize_t` returns.
fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    usize::try_from(ret).map_err(|_| io::Error::last_os_error())
}

/// Creates a non-blocking, close-on-exec TCP socket and starts connecting it to
/// `addr`. The connection completes in the background; see [`take_socket_error`].
pub fn start_connect(addr: &SocketAddr) -> io::Result<TcpStream> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain system call with constant arguments.
    let fd = cvt(unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: `fd` was just created and is owned by nobody else.
    let stream = TcpStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let (storage, len) = cclkit_abi::sock::to_sockaddr(addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    let ret = unsafe { libc::connect(fd, (&raw const storage).cast(), len) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(err);
        }
    }
    Ok(stream)
}

/// Reads and clears `SO_ERROR`: `Ok(())` once a non-blocking connect succeeded.
pub fn take_socket_error(stream: &TcpStream) -> io::Result<()> {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `err`/`len` are valid out-pointers of the sizes given.
    cvt(unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&raw mut err).cast(),
            &mut len,
        )
    })?;
    if err == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(err))
    }
}

/// Sends as much of `bufs` as the socket takes now (`MSG_NOSIGNAL | MSG_DONTWAIT`).
pub fn send_vectored(fd: RawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec; sendmsg only reads through the pointer.
    msg.msg_iov = bufs.as_ptr().cast_mut().cast();
    msg.msg_iovlen = bufs.len();
    loop {
        // SAFETY: `msg` points to `bufs`, valid for the call.
        let ret = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        match cvt_size(ret) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Sends as much of `buf` as the socket takes now (`MSG_NOSIGNAL | MSG_DONTWAIT`).
pub fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for reads of its length.
        let ret = unsafe {
            libc::send(
                fd,
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        match cvt_size(ret) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Receives what is available now into `ptr[..len]` (`MSG_DONTWAIT`); 0 = EOF.
///
/// # Safety
/// `ptr` must be valid for writes of `len` bytes.
pub unsafe fn recv_raw(fd: RawFd, ptr: *mut u8, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: forwarded contract.
        let ret = unsafe { libc::recv(fd, ptr.cast(), len, libc::MSG_DONTWAIT) };
        match cvt_size(ret) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Receives what is available now into `buf` (`MSG_DONTWAIT`); 0 = EOF.
pub fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length.
    unsafe { recv_raw(fd, buf.as_mut_ptr(), buf.len()) }
}

/// `poll(2)`; `timeout_ms` < 0 waits forever. EINTR counts as "nothing ready".
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a valid array of its length.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    match cvt(ret) {
        Ok(n) => Ok(n as usize),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// A `pollfd` entry for `fd` waiting for `events`.
pub fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// A non-blocking eventfd: the doorbell a helper thread sleeps on.
pub struct EventFd(OwnedFd);

impl EventFd {
    /// Creates the eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain system call with constant arguments.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Rings the bell. A full counter (impossible in practice) still leaves it readable.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64. The result is ignored on purpose:
        // the only failure, EAGAIN on a saturated counter, means it is already set.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Clears the bell.
    pub fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; EAGAIN (already clear) is fine.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&raw mut value).cast(), 8) };
    }

    /// The descriptor to poll for readability.
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a valid int of the size given.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// Turns on TCP keepalive: an idle connection whose peer host vanished (no FIN,
/// no RST: power loss, cable, a deleted namespace) fails after about
/// `idle + interval × count` seconds instead of never. Probes are answered by the
/// peer's kernel, so a live peer that is merely quiet is never cut.
pub fn set_keepalive(
    stream: &TcpStream,
    idle_s: i32,
    interval_s: i32,
    count: i32,
) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    set_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle_s)?;
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, interval_s)?;
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, count)
}

/// Asks the kernel to delay this socket's ACKs (`TCP_QUICKACK` off) instead of
/// answering every segment with a pure ACK at once. On a one-way stream (a
/// receive comm's control socket carries nothing back outside grouped mode)
/// those ACKs can never ride on reply data, and each one costs a segment's
/// send and receive path on both sides: measured over loopback with 8-byte
/// exchanges on two one-way sockets, 7.1 → 5.9 µs per exchange, the same as one
/// bidirectional socket, with ~25 % fewer segments. The kernel still ACKs every
/// second small segment the application has read and every full-sized one, so
/// the sender's window never waits on the delayed-ACK timer; it may drop back to
/// quick ACKs by itself (when that timer fires), so callers re-arm it now and then.
/// Only for small messages: bulk transfers slow down without quick ACKs.
pub fn delay_acks(fd: RawFd) -> io::Result<()> {
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 0)
}

/// Undoes [`delay_acks`]: every segment is ACKed at once again.
pub fn quick_acks(fd: RawFd) -> io::Result<()> {
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1)
}

/// True for errors that mean "try again later" on a non-blocking socket.
pub fn would_block(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::WouldBlock
}
