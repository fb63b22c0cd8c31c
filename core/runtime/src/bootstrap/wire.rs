//! Framing of bootstrap connections and the deadline-bounded connect.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::*;
use crate::error::{Error, Result};

/// Message kinds on bootstrap connections.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(super) enum Kind {
    Hello = 1,
    Table = 2,
    Abort = 3,
    Data = 4,
}

/// `[magic u64][kind u8][from u32][tag u64][len u32][payload]`, little-endian.
pub(super) struct Frame {
    pub(super) kind: Kind,
    pub(super) from: u32,
    pub(super) tag: u64,
    pub(super) payload: Vec<u8>,
}

pub(super) const HEADER: usize = 8 + 1 + 4 + 8 + 4;

pub(super) fn write_frame(s: &mut TcpStream, magic: u64, f: &Frame) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(HEADER + f.payload.len());
    buf.extend_from_slice(&magic.to_le_bytes());
    buf.push(f.kind as u8);
    buf.extend_from_slice(&f.from.to_le_bytes());
    buf.extend_from_slice(&f.tag.to_le_bytes());
    buf.extend_from_slice(&(f.payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&f.payload);
    s.write_all(&buf)
}

/// Why an incoming header was refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Another job's magic, or a stale or mismatched unique id.
    Magic,
    /// A message kind that is not one of ours.
    Kind(u8),
    /// A length field above [`MAX_MESSAGE`].
    Length(usize),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Magic => write!(f, "wrong magic (another job, or a mismatched unique id)"),
            Self::Kind(k) => write!(f, "unknown message kind {k}"),
            Self::Length(n) => write!(f, "message of {n} bytes exceeds {MAX_MESSAGE}"),
        }
    }
}

/// A checked header: the frame without its payload, and the payload's length.
pub(super) struct Header {
    pub(super) kind: Kind,
    pub(super) from: u32,
    pub(super) tag: u64,
    pub(super) len: usize,
}

/// Checks a header's magic, kind and length before anything is allocated for it.
pub(super) fn parse_header(h: &[u8; HEADER], magic: u64) -> std::result::Result<Header, Refused> {
    let le64 = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    let le32 = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap_or([0; 4]));
    if le64(&h[0..8]) != magic {
        return Err(Refused::Magic);
    }
    let kind = match h[8] {
        1 => Kind::Hello,
        2 => Kind::Table,
        3 => Kind::Abort,
        4 => Kind::Data,
        k => return Err(Refused::Kind(k)),
    };
    let len = le32(&h[21..25]) as usize;
    if len > MAX_MESSAGE {
        return Err(Refused::Length(len));
    }
    Ok(Header {
        kind,
        from: le32(&h[9..13]),
        tag: le64(&h[13..21]),
        len,
    })
}

/// Reads one frame; `Ok(None)` when the magic does not match (the caller drops the
/// connection and logs it).
pub(super) fn read_frame(s: &mut TcpStream, magic: u64) -> Result<Option<Frame>> {
    let mut h = [0u8; HEADER];
    s.read_exact(&mut h)
        .map_err(|e| Error::from_io("bootstrap read", e))?;
    let h = match parse_header(&h, magic) {
        Ok(h) => h,
        Err(Refused::Magic) => return Ok(None),
        Err(r) => return Err(Error::internal(format!("bootstrap: {r}"))),
    };
    let mut payload = vec![0u8; h.len];
    s.read_exact(&mut payload)
        .map_err(|e| Error::from_io("bootstrap read", e))?;
    Ok(Some(Frame {
        kind: h.kind,
        from: h.from,
        tag: h.tag,
        payload,
    }))
}

pub(super) fn connect_until(addr: SocketAddr, deadline: Instant, what: &str) -> Result<TcpStream> {
    let mut last = None;
    while Instant::now() < deadline {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(50));
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => {
                s.set_read_timeout(Some(left))
                    .map_err(|e| Error::from_io(what, e))?;
                s.set_write_timeout(Some(left))
                    .map_err(|e| Error::from_io(what, e))?;
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            // The peer may not listen yet (it starts later): retry until the deadline.
            Err(e) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    Err(Error::timeout(format!(
        "{what}: could not connect to {addr} before the bootstrap timeout ({})",
        last.map_or("no attempt".into(), |e| e.to_string())
    )))
}
