//! Bytes on the wire during connection setup: the listen handle NCCL carries to
//! the peer, the connect request and its reply. Little-endian, fixed offsets.

use cclkit_abi::net::NetHandle;
use cclkit_abi::{Error, Result};

use crate::liveness::{PROC_ID_LEN, ProcId};

const HANDLE_MAGIC: u64 = u64::from_le_bytes(*b"cclkOFIh");
const CONNECT_MAGIC: u64 = u64::from_le_bytes(*b"cclkOFIc");
const ACCEPT_MAGIC: u64 = u64::from_le_bytes(*b"cclkOFIa");

/// Largest endpoint address a handle carries (EFA 32 B, sockaddr_in6 28 B, shm names).
pub const HANDLE_ADDR_MAX: usize = NetHandle::PAYLOAD - 24;
/// Largest endpoint address a connect request carries.
pub const CONNECT_ADDR_MAX: usize = 156;
/// Size of a connect request buffer: the address area, then the write offer
/// (zero from a peer without writes, whose address area ran to the end).
pub const CONNECT_LEN: usize = 48 + CONNECT_ADDR_MAX + 4;
/// Where a connect request carries its write offer.
const CONNECT_WRITE_AT: usize = 48 + CONNECT_ADDR_MAX;
/// Size of a connect reply.
pub const ACCEPT_LEN: usize = 48;

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

fn proc_at(b: &[u8], i: usize) -> ProcId {
    let mut w = [0u8; PROC_ID_LEN];
    w.copy_from_slice(&b[i..i + PROC_ID_LEN]);
    ProcId::decode(&w)
}

/// What the listening side publishes in the 128-byte handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenHandle {
    /// Fingerprint of the provider name (both sides must use the same provider).
    pub provider: u32,
    /// Control id the listener receives connect requests on.
    pub listen_id: u16,
    /// Random value the connect request must echo.
    pub nonce: u64,
    /// The listener's endpoint address.
    pub addr: Vec<u8>,
}

impl ListenHandle {
    /// Writes the handle's plugin bytes.
    pub fn write(&self, handle: &mut NetHandle) -> Result<()> {
        if self.addr.len() > HANDLE_ADDR_MAX {
            return Err(Error::internal(format!(
                "endpoint address of {} bytes does not fit the {HANDLE_ADDR_MAX} bytes of the handle",
                self.addr.len()
            )));
        }
        let p = handle.payload_mut();
        p[0..8].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
        p[8..12].copy_from_slice(&self.provider.to_le_bytes());
        p[12..14].copy_from_slice(&self.listen_id.to_le_bytes());
        p[14..16].copy_from_slice(&(self.addr.len() as u16).to_le_bytes());
        p[16..24].copy_from_slice(&self.nonce.to_le_bytes());
        p[24..24 + self.addr.len()].copy_from_slice(&self.addr);
        Ok(())
    }

    /// Reads a handle produced by [`ListenHandle::write`] on the peer.
    pub fn read(handle: &NetHandle) -> Result<Self> {
        let p = handle.payload();
        if u64_at(p, 0) != HANDLE_MAGIC {
            return Err(Error::invalid_argument(
                "connect: the handle was not made by cclkit-ofi's listen (bad magic)",
            ));
        }
        let len = usize::from(u16_at(p, 14));
        if len == 0 || len > HANDLE_ADDR_MAX {
            return Err(Error::invalid_argument(format!(
                "connect: handle carries an address of {len} bytes"
            )));
        }
        Ok(Self {
            provider: u32_at(p, 8),
            listen_id: u16_at(p, 12),
            nonce: u64_at(p, 16),
            addr: p[24..24 + len].to_vec(),
        })
    }
}

/// Connect request: sent by `connect` to the listener's control id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectMsg {
    /// The handle's nonce, echoed.
    pub nonce: u64,
    /// Control id the connecting side waits for the reply on.
    pub reply_id: u16,
    /// The connecting process.
    pub proc_id: ProcId,
    /// The connecting side's endpoint address.
    pub addr: Vec<u8>,
    /// Smallest send the connecting side would write (`engine/write.rs`): the
    /// receiver offers receives of at least this size as write targets, to
    /// `reply_id`. 0 = no writes.
    pub write_min: u32,
    /// The connecting side takes bundle slots (`engine/slots.rs`) with its
    /// writes: the top bit of the write field.
    pub slots: bool,
}

/// Top bit of the connect request's write field: the sender takes bundle slots.
const CONNECT_SLOTS: u32 = 1 << 31;

impl ConnectMsg {
    /// Encodes into a `CONNECT_LEN` buffer.
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.addr.len() > CONNECT_ADDR_MAX {
            return Err(Error::internal(format!(
                "endpoint address of {} bytes exceeds {CONNECT_ADDR_MAX}",
                self.addr.len()
            )));
        }
        let mut b = vec![0u8; CONNECT_LEN];
        b[0..8].copy_from_slice(&CONNECT_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..18].copy_from_slice(&self.reply_id.to_le_bytes());
        b[18..20].copy_from_slice(&(self.addr.len() as u16).to_le_bytes());
        b[20..48].copy_from_slice(&self.proc_id.encode());
        b[48..48 + self.addr.len()].copy_from_slice(&self.addr);
        b[CONNECT_WRITE_AT..CONNECT_WRITE_AT + 4].copy_from_slice(
            &(self.write_min & !CONNECT_SLOTS | if self.slots { CONNECT_SLOTS } else { 0 })
                .to_le_bytes(),
        );
        Ok(b)
    }

    /// Decodes `len` received bytes; `None` for anything malformed.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < 48 || u64_at(b, 0) != CONNECT_MAGIC {
            return None;
        }
        let len = usize::from(u16_at(b, 18));
        if len == 0 || len > CONNECT_ADDR_MAX || b.len() < 48 + len {
            return None;
        }
        let write = if b.len() >= CONNECT_LEN {
            u32_at(b, CONNECT_WRITE_AT)
        } else {
            0
        };
        Some(Self {
            nonce: u64_at(b, 8),
            reply_id: u16_at(b, 16),
            proc_id: proc_at(b, 20),
            addr: b[48..48 + len].to_vec(),
            write_min: write & !CONNECT_SLOTS,
            slots: write & CONNECT_SLOTS != 0,
        })
    }
}

/// Connect reply: the receive comm id data must be tagged with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptMsg {
    /// The handle's nonce, echoed.
    pub nonce: u64,
    /// The receive comm's id (data tag space).
    pub comm_id: u16,
    /// The accepting process.
    pub proc_id: ProcId,
    /// Largest bundle the receive comm takes (`bundle.rs`), a multiple of
    /// [`BUNDLE_UNIT`]; 0 = none (also what a peer without bundles sends).
    pub bundle_bytes: usize,
    /// The receive comm offers its receives as write targets (only ever set in
    /// reply to a connect request offering writes).
    pub writes: bool,
}

/// Top bit of the bundle-units field: the reply accepts writes.
const ACCEPT_WRITES: u16 = 0x8000;

/// Bundle sizes travel in units of this many bytes.
pub const BUNDLE_UNIT: usize = 256;

impl AcceptMsg {
    /// Encodes into `ACCEPT_LEN` bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; ACCEPT_LEN];
        b[0..8].copy_from_slice(&ACCEPT_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..18].copy_from_slice(&self.comm_id.to_le_bytes());
        let units = (self.bundle_bytes / BUNDLE_UNIT).min(usize::from(!ACCEPT_WRITES)) as u16;
        let units = units | if self.writes { ACCEPT_WRITES } else { 0 };
        b[18..20].copy_from_slice(&units.to_le_bytes());
        b[20..48].copy_from_slice(&self.proc_id.encode());
        b
    }

    /// Decodes received bytes; `None` for anything malformed.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < ACCEPT_LEN || u64_at(b, 0) != ACCEPT_MAGIC {
            return None;
        }
        Some(Self {
            nonce: u64_at(b, 8),
            comm_id: u16_at(b, 16),
            proc_id: proc_at(b, 20),
            bundle_bytes: usize::from(u16_at(b, 18) & !ACCEPT_WRITES) * BUNDLE_UNIT,
            writes: u16_at(b, 18) & ACCEPT_WRITES != 0,
        })
    }
}

/// Clear to write: a receive the peer may write into instead of sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cts {
    /// The receive comm's token for this receive, echoed in the write's CQ data.
    pub token: u16,
    /// The token's generation (a reused token never takes a stale write).
    pub generation: u8,
    /// The receive's sequence number for `tag` (all 32 bits).
    pub seq: u32,
    /// The receive's NCCL tag.
    pub tag: i32,
    /// Its size in bytes.
    pub cap: u32,
    /// The registration key and RMA address of its first byte.
    pub key: u64,
    /// RMA address of the buffer (see `mr::RmaTarget`).
    pub addr: u64,
    /// A standing bundle slot (`engine/slots.rs`), not one receive: `seq` and
    /// `tag` are unused.
    pub slot: bool,
}

const CTS_MAGIC: u16 = 0xc75a;
/// Size of a clear-to-write message.
pub const CTS_LEN: usize = 36;

impl Cts {
    /// Encodes into `CTS_LEN` bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CTS_LEN];
        b[0..2].copy_from_slice(&CTS_MAGIC.to_le_bytes());
        b[2..4].copy_from_slice(&self.token.to_le_bytes());
        b[4] = self.generation;
        b[5] = u8::from(self.slot);
        b[8..12].copy_from_slice(&self.seq.to_le_bytes());
        b[12..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..20].copy_from_slice(&self.cap.to_le_bytes());
        b[20..28].copy_from_slice(&self.key.to_le_bytes());
        b[28..36].copy_from_slice(&self.addr.to_le_bytes());
        b
    }

    /// Decodes received bytes; `None` for anything malformed.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != CTS_LEN || u16_at(b, 0) != CTS_MAGIC {
            return None;
        }
        Some(Self {
            token: u16_at(b, 2),
            generation: b[4],
            seq: u32_at(b, 8),
            tag: u32_at(b, 12) as i32,
            cap: u32_at(b, 16),
            key: u64_at(b, 20),
            addr: u64_at(b, 28),
            slot: b[5] & 1 != 0,
        })
    }
}

/// FNV-1a of a provider name: both sides of a connection must agree on it.
pub fn provider_fingerprint(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trip_and_limits() {
        let h = ListenHandle {
            provider: provider_fingerprint("shm"),
            listen_id: 513,
            nonce: 0x1122_3344_5566_7788,
            addr: (0..HANDLE_ADDR_MAX as u8).collect(),
        };
        let mut nh = NetHandle::zeroed();
        h.write(&mut nh).unwrap();
        assert_eq!(ListenHandle::read(&nh).unwrap(), h);
        let too_big = ListenHandle {
            addr: vec![1; HANDLE_ADDR_MAX + 1],
            ..h
        };
        assert!(too_big.write(&mut nh).is_err());
        assert!(ListenHandle::read(&NetHandle::zeroed()).is_err());
    }

    #[test]
    fn messages_round_trip() {
        let c = ConnectMsg {
            nonce: 7,
            reply_id: 65535,
            proc_id: ProcId::current(),
            addr: vec![9; 100],
            write_min: 16385,
            slots: false,
        };
        let b = c.encode().unwrap();
        assert_eq!(b.len(), CONNECT_LEN);
        assert_eq!(ConnectMsg::decode(&b), Some(c.clone()));
        let s = ConnectMsg {
            slots: true,
            ..c.clone()
        };
        let sb = s.encode().unwrap();
        assert_eq!(ConnectMsg::decode(&sb), Some(s));
        assert_eq!(
            u32::from_le_bytes(
                sb[CONNECT_WRITE_AT..CONNECT_WRITE_AT + 4]
                    .try_into()
                    .unwrap()
            ),
            16385 | 1 << 31,
            "the slots flag is the write field's top bit"
        );
        // A request from a peer without writes (zeros after the address) offers none.
        let mut old = b.clone();
        old[CONNECT_WRITE_AT..].fill(0);
        assert_eq!(ConnectMsg::decode(&old).map(|m| m.write_min), Some(0));
        let long = ConnectMsg {
            addr: vec![1; CONNECT_ADDR_MAX + 1],
            ..c
        };
        assert!(
            long.encode().is_err(),
            "the address never runs into the offer"
        );
        assert_eq!(ConnectMsg::decode(&b[..40]), None);
        let a = AcceptMsg {
            nonce: 7,
            comm_id: 42,
            proc_id: ProcId::current(),
            bundle_bytes: 63 * BUNDLE_UNIT,
            writes: false,
        };
        assert_eq!(AcceptMsg::decode(&a.encode()), Some(a));
        let w = AcceptMsg { writes: true, ..a };
        assert_eq!(AcceptMsg::decode(&w.encode()), Some(w));
        // A reply from a peer without bundles (zero bytes there) offers none.
        let mut old = a.encode();
        old[18..20].fill(0);
        assert_eq!(AcceptMsg::decode(&old).map(|m| m.bundle_bytes), Some(0));
        assert_eq!(AcceptMsg::decode(&b), None, "a connect is not an accept");
    }

    #[test]
    fn clear_to_write_round_trips_and_rejects_garbage() {
        let c = Cts {
            token: 513,
            generation: 200,
            seq: u32::MAX - 3,
            tag: -7,
            cap: 131_071,
            key: 0xdead_beef_0000_0042,
            addr: 0x7fff_1234_5678,
            slot: false,
        };
        let b = c.encode();
        assert_eq!(b.len(), CTS_LEN);
        assert_eq!(Cts::decode(&b), Some(c));
        let s = Cts { slot: true, ..c };
        assert_eq!(Cts::decode(&s.encode()), Some(s));
        assert_eq!(s.encode()[5], 1, "the slot flag's byte");
        assert_eq!(Cts::decode(&b[..CTS_LEN - 1]), None);
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert_eq!(Cts::decode(&bad), None);
        assert_eq!(Cts::decode(&[0u8; CTS_LEN]), None);
    }

    #[test]
    fn fingerprints_differ() {
        assert_ne!(
            provider_fingerprint("shm"),
            provider_fingerprint("tcp;ofi_rxm")
        );
    }
}
