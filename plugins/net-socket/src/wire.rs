//! Bytes on the wire: the listen handle, the connection hello, message headers,
//! clear-to-send records, and how a message is striped over the data streams.
//!
//! All integers are little-endian so mixed-endian peers agree.
//!
//! A comm is `1 + nstreams` TCP connections. Connection 0 is the control stream:
//! one [`Header`] per message, followed by the payload when the message is sent
//! inline; in grouped mode the receiver also sends [`Cts`] records back on it.
//! Larger payloads are cut by [`stripe`] into at most `nstreams` chunks that go, in
//! message order, over the data streams. Both sides compute the same striping from
//! the size in the header and a per-comm cursor, so data streams carry no framing.

use std::net::{IpAddr, SocketAddr, SocketAddrV6};

use cclkit_abi::net::NetHandle;
use cclkit_abi::{Error, Result};

/// Protocol version carried in the handle and in every hello.
pub const VERSION: u8 = 1;
/// Most data streams per comm (NCCL's own cap).
pub const MAX_STREAMS: usize = 64;
/// Most buffers in one grouped receive.
pub const MAX_RECVS: usize = 8;
/// Chunk lengths are multiples of this (page-aligned copies on both sides).
const CHUNK_ALIGN: usize = 4096;

/// What the listening side publishes in the 128-byte NCCL handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleInfo {
    /// Random per listen; every connection must present it.
    pub magic: u64,
    /// Where to connect.
    pub addr: SocketAddr,
    /// Data streams the receiver wants (0 = everything on the control stream).
    pub nstreams: usize,
    /// Receiver's `maxRecvs`; above 1 the comm runs in grouped (clear-to-send) mode.
    pub max_recvs: usize,
}

impl HandleInfo {
    /// Writes the handle payload: magic, version, family, port, ip, scope, streams, recvs.
    pub fn write(&self, handle: &mut NetHandle) {
        let p = handle.payload_mut();
        p[0..8].copy_from_slice(&self.magic.to_le_bytes());
        p[8] = VERSION;
        p[10..12].copy_from_slice(&self.addr.port().to_be_bytes());
        match self.addr {
            SocketAddr::V4(a) => {
                p[9] = 4;
                p[12..16].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                p[9] = 6;
                p[12..28].copy_from_slice(&a.ip().octets());
                p[28..32].copy_from_slice(&a.scope_id().to_le_bytes());
            }
        }
        // Both fit a byte: nstreams ≤ MAX_STREAMS, max_recvs ≤ MAX_RECVS (config checks).
        p[32] = self.nstreams.min(MAX_STREAMS) as u8;
        p[33] = self.max_recvs.clamp(1, MAX_RECVS) as u8;
    }

    /// Reads a handle written by [`HandleInfo::write`], rejecting anything else.
    pub fn read(handle: &NetHandle) -> Result<Self> {
        let p = handle.payload();
        if p[8] != VERSION {
            return Err(Error::invalid_argument(format!(
                "cclkit-socket handle has protocol version {} (expected {VERSION}); \
                 both sides must run the same plugin",
                p[8]
            )));
        }
        let magic = u64::from_le_bytes(take(&p[0..8])?);
        let port = u16::from_be_bytes([p[10], p[11]]);
        let addr = match p[9] {
            4 => SocketAddr::new(IpAddr::from(take::<4>(&p[12..16])?), port),
            6 => SocketAddr::V6(SocketAddrV6::new(
                take::<16>(&p[12..28])?.into(),
                port,
                0,
                u32::from_le_bytes(take(&p[28..32])?),
            )),
            f => {
                return Err(Error::invalid_argument(format!(
                    "cclkit-socket handle has address family byte {f}"
                )));
            }
        };
        let nstreams = usize::from(p[32]);
        let max_recvs = usize::from(p[33]);
        if nstreams > MAX_STREAMS || !(1..=MAX_RECVS).contains(&max_recvs) {
            return Err(Error::invalid_argument(format!(
                "cclkit-socket handle asks for {nstreams} streams / {max_recvs} receives"
            )));
        }
        Ok(Self {
            magic,
            addr,
            nstreams,
            max_recvs,
        })
    }
}

fn take<const N: usize>(bytes: &[u8]) -> Result<[u8; N]> {
    bytes
        .try_into()
        .map_err(|_| Error::internal("handle field has the wrong length"))
}

/// First bytes of every connection, from the connecting side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The listen's magic, copied from the handle.
    pub magic: u64,
    /// Random per `connect`: groups the connections of one comm.
    pub nonce: u64,
    /// 0 = control stream, 1… = data streams.
    pub index: u16,
    /// Connections in the comm (1 + data streams).
    pub count: u16,
    /// Protocol version.
    pub version: u16,
}

impl Hello {
    /// Encoded size.
    pub const LEN: usize = 24;

    /// Encodes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..18].copy_from_slice(&self.index.to_le_bytes());
        b[18..20].copy_from_slice(&self.count.to_le_bytes());
        b[20..22].copy_from_slice(&self.version.to_le_bytes());
        b
    }

    /// Decodes.
    pub fn decode(b: &[u8; Self::LEN]) -> Self {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        Self {
            magic: u64_at(0),
            nonce: u64_at(8),
            index: u16_at(16),
            count: u16_at(18),
            version: u16_at(20),
        }
    }
}

/// Header flag: the sender found the message larger than the posted receive (grouped
/// mode, where it knows the receive size); no payload follows.
pub const FLAG_TRUNCATED: u8 = 1;
/// Header flag: the payload follows the header on the control stream.
pub const FLAG_INLINE: u8 = 2;

/// One message's header on the control stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Payload bytes.
    pub size: u64,
    /// The sender's tag (NCCL passes its rank).
    pub tag: i32,
    /// Which buffer of the grouped receive (0 outside grouped mode).
    pub index: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Chunks the payload is striped into (0 when inline or truncated).
    pub chunks: u8,
}

impl Header {
    /// Encoded size.
    pub const LEN: usize = 16;

    /// Encodes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..12].copy_from_slice(&self.tag.to_le_bytes());
        b[12] = self.index;
        b[13] = self.flags;
        b[14] = self.chunks;
        b
    }

    /// Decodes the first [`Header::LEN`] bytes of `b` (the caller checks the length).
    pub fn decode(b: &[u8]) -> Self {
        let mut size = [0u8; 8];
        size.copy_from_slice(&b[0..8]);
        let mut tag = [0u8; 4];
        tag.copy_from_slice(&b[8..12]);
        Self {
            size: u64::from_le_bytes(size),
            tag: i32::from_le_bytes(tag),
            index: b[12],
            flags: b[13],
            chunks: b[14],
        }
    }
}

/// A clear-to-send record (grouped mode): the receiver's posted buffers, in posting
/// order, so the sender can match each `isend` by tag as NCCL's IB transport does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cts {
    /// Buffers in the grouped receive.
    pub n: usize,
    /// Tag each buffer expects.
    pub tags: [i32; MAX_RECVS],
    /// Size of each buffer.
    pub sizes: [u64; MAX_RECVS],
}

impl Cts {
    /// Largest encoded size.
    pub const MAX_LEN: usize = 4 + 12 * MAX_RECVS;

    /// Encoded size of a record with `n` buffers.
    pub fn len_for(n: usize) -> usize {
        4 + 12 * n
    }

    /// Encodes into `out`, returning the length used.
    pub fn encode(&self, out: &mut [u8; Self::MAX_LEN]) -> usize {
        let n = self.n.min(MAX_RECVS);
        out[0] = n as u8;
        out[1..4].fill(0);
        for i in 0..n {
            let at = 4 + 12 * i;
            out[at..at + 4].copy_from_slice(&self.tags[i].to_le_bytes());
            out[at + 4..at + 12].copy_from_slice(&self.sizes[i].to_le_bytes());
        }
        Self::len_for(n)
    }

    /// Decodes a record from the front of `b`: `Ok(None)` if more bytes are needed,
    /// else the record and its encoded length.
    pub fn decode(b: &[u8]) -> Result<Option<(Self, usize)>> {
        let Some(&n) = b.first() else {
            return Ok(None);
        };
        let n = usize::from(n);
        if !(1..=MAX_RECVS).contains(&n) {
            return Err(Error::remote(format!(
                "protocol error: clear-to-send record for {n} buffers"
            )));
        }
        let len = Self::len_for(n);
        if b.len() < len {
            return Ok(None);
        }
        let mut cts = Self {
            n,
            ..Self::default()
        };
        for i in 0..n {
            let at = 4 + 12 * i;
            let mut tag = [0u8; 4];
            tag.copy_from_slice(&b[at..at + 4]);
            let mut size = [0u8; 8];
            size.copy_from_slice(&b[at + 4..at + 12]);
            cts.tags[i] = i32::from_le_bytes(tag);
            cts.sizes[i] = u64::from_le_bytes(size);
        }
        Ok(Some((cts, len)))
    }
}

/// How many chunks the sender cuts a `size`-byte payload into for `streams` data
/// streams: chunks of at least `min_chunk` bytes (a short message has one), at most
/// one per stream. The count travels in the header; see [`chunks`].
pub fn stripe(size: usize, streams: usize, min_chunk: usize) -> usize {
    if size == 0 || streams == 0 {
        return 0;
    }
    let wanted = size.div_ceil(min_chunk.max(1)).clamp(1, streams);
    size.div_ceil(chunk_len(size, wanted))
}

fn chunk_len(size: usize, count: usize) -> usize {
    size.div_ceil(count.max(1)).next_multiple_of(CHUNK_ALIGN)
}

/// The `(offset, len)` of each chunk of a `size`-byte payload cut into `count`:
/// page-multiple lengths, the last one shorter. Both sides use this one function.
pub fn chunks(size: usize, count: usize) -> impl Iterator<Item = (usize, usize)> {
    let len = chunk_len(size, count);
    (0..count)
        .map(move |i| i * len)
        .take_while(move |&off| off < size)
        .map(move |off| (off, len.min(size - off)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripe_covers_every_byte_once() {
        for &(size, streams, min) in &[
            (1usize, 4usize, 65536usize),
            (65536 + 3, 4, 65536),
            (16 << 20, 4, 65536),
            (16 << 20, 3, 65536),
            (7 * 4096 + 1, 64, 4096),
            (100, 1, 1),
        ] {
            let count = stripe(size, streams, min);
            assert!(count >= 1 && count <= streams, "{size} {streams}: {count}");
            let parts: Vec<_> = chunks(size, count).collect();
            assert_eq!(parts.len(), count, "{size} {streams}");
            let mut next = 0;
            for (i, &(off, len)) in parts.iter().enumerate() {
                assert_eq!(off, next);
                assert!(len > 0);
                if i + 1 < parts.len() {
                    assert_eq!(len % 4096, 0);
                }
                next += len;
            }
            assert_eq!(next, size);
        }
        assert_eq!(stripe(0, 4, 65536), 0);
        assert_eq!(stripe(64 << 20, 4, 65536), 4);
        assert_eq!(chunks(64 << 20, 4).nth(3), Some((48 << 20, 16 << 20)));
    }

    #[test]
    fn records_round_trip() {
        let h = Header {
            size: (5 << 32) + 7,
            tag: -3,
            index: 6,
            flags: FLAG_TRUNCATED,
            chunks: 5,
        };
        assert_eq!(Header::decode(&h.encode()), h);
        let hello = Hello {
            magic: 0xdead_beef_0123_4567,
            nonce: 42,
            index: 3,
            count: 9,
            version: 1,
        };
        assert_eq!(Hello::decode(&hello.encode()), hello);
        let mut cts = Cts {
            n: 3,
            ..Cts::default()
        };
        cts.tags[..3].copy_from_slice(&[1, -2, 3]);
        cts.sizes[..3].copy_from_slice(&[0, 1 << 40, 9]);
        let mut buf = [0u8; Cts::MAX_LEN];
        let len = cts.encode(&mut buf);
        assert_eq!(Cts::decode(&buf[..len - 1]).unwrap(), None);
        assert_eq!(Cts::decode(&buf[..len]).unwrap(), Some((cts, len)));
        buf[0] = 9;
        assert!(Cts::decode(&buf).is_err());
    }

    #[test]
    fn handle_round_trip_and_rejects_garbage() {
        for addr in ["10.1.2.3:4567", "[fd00::2]:80"] {
            let info = HandleInfo {
                magic: 77,
                addr: addr.parse().unwrap(),
                nstreams: 4,
                max_recvs: 8,
            };
            let mut h = NetHandle::zeroed();
            info.write(&mut h);
            assert_eq!(HandleInfo::read(&h).unwrap(), info);
        }
        assert!(HandleInfo::read(&NetHandle::zeroed()).is_err());
    }
}
