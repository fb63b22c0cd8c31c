//! The kernel's own one-way TCP stream over the same loopback, the third stream
//! of `mixed`: one `write` per message, nothing flowing back until the burst's
//! one-byte reply. It is not a baseline the plugin is judged against (the raw
//! libfabric loop is); it shows what the machine's TCP stack gives a stream that
//! only moves one way, which is the shape of the plugin's RMA writes. Under a
//! congestion control that throttles such streams on loopback (BBR on this
//! kernel: docs/PERFORMANCE.md, "Twelfth pass"), this column drops with them.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::net::R;

/// How long one blocking read or write may take.
const IO_WAIT: Duration = Duration::from_secs(60);

/// One side of the stream.
pub struct TcpOneWay {
    sock: TcpStream,
    sender: bool,
    buf: Vec<u8>,
}

/// The receiving side listens on loopback before the sender knows its port.
pub struct TcpListen(TcpListener);

impl TcpListen {
    /// Listens on an ephemeral loopback port.
    pub fn open() -> R<Self> {
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map(Self)
            .map_err(|e| format!("TCP listen: {e}"))
    }

    /// The port the sender connects to.
    pub fn port(&self) -> R<u16> {
        self.0
            .local_addr()
            .map(|a| a.port())
            .map_err(|e| format!("TCP listen address: {e}"))
    }

    /// Takes the sender's connection, waiting at most [`IO_WAIT`].
    pub fn accept(self, size: usize) -> R<TcpOneWay> {
        let e = |x: std::io::Error| format!("TCP accept: {x}");
        self.0.set_nonblocking(true).map_err(e)?;
        let deadline = Instant::now() + IO_WAIT;
        loop {
            match self.0.accept() {
                Ok((sock, _)) => {
                    sock.set_nonblocking(false).map_err(e)?;
                    return TcpOneWay::new(sock, false, size);
                }
                Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err("TCP accept: the sender never connected".into());
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(x) => return Err(e(x)),
            }
        }
    }
}

impl TcpOneWay {
    /// Connects the sending side to `port` on loopback.
    pub fn connect(port: u16, size: usize) -> R<Self> {
        let sock = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .map_err(|e| format!("TCP connect to port {port}: {e}"))?;
        Self::new(sock, true, size)
    }

    fn new(sock: TcpStream, sender: bool, size: usize) -> R<Self> {
        let e = |e: std::io::Error| format!("TCP socket options: {e}");
        // As libfabric's tcp provider sets it: each message leaves at once.
        sock.set_nodelay(true).map_err(e)?;
        sock.set_read_timeout(Some(IO_WAIT)).map_err(e)?;
        sock.set_write_timeout(Some(IO_WAIT)).map_err(e)?;
        Ok(Self {
            sock,
            sender,
            buf: vec![3u8; size],
        })
    }

    /// `count` messages one way, then the receiver's one-byte reply.
    pub fn phase(&mut self, count: usize) -> R<Duration> {
        let e = |what: &'static str| move |x: std::io::Error| format!("TCP stream {what}: {x}");
        let start = Instant::now();
        let mut reply = [0u8; 1];
        if self.sender {
            for _ in 0..count {
                self.sock.write_all(&self.buf).map_err(e("write"))?;
            }
            self.sock.read_exact(&mut reply).map_err(e("reply"))?;
        } else {
            for _ in 0..count {
                self.sock.read_exact(&mut self.buf).map_err(e("read"))?;
            }
            self.sock.write_all(&reply).map_err(e("reply"))?;
        }
        Ok(start.elapsed())
    }
}
