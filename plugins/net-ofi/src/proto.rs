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
const CONNECT_ADDR_MAX: usize = 160;
/// Size of a connect request buffer.
pub const CONNECT_LEN: usize = 48 + CONNECT_ADDR_MAX;
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
}

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
        Some(Self {
            nonce: u64_at(b, 8),
            reply_id: u16_at(b, 16),
            proc_id: proc_at(b, 20),
            addr: b[48..48 + len].to_vec(),
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
}

/// Bundle sizes travel in units of this many bytes.
pub const BUNDLE_UNIT: usize = 256;

impl AcceptMsg {
    /// Encodes into `ACCEPT_LEN` bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; ACCEPT_LEN];
        b[0..8].copy_from_slice(&ACCEPT_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..18].copy_from_slice(&self.comm_id.to_le_bytes());
        let units = (self.bundle_bytes / BUNDLE_UNIT).min(usize::from(u16::MAX)) as u16;
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
            bundle_bytes: usize::from(u16_at(b, 18)) * BUNDLE_UNIT,
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
        };
        let b = c.encode().unwrap();
        assert_eq!(b.len(), CONNECT_LEN);
        assert_eq!(ConnectMsg::decode(&b), Some(c));
        assert_eq!(ConnectMsg::decode(&b[..40]), None);
        let a = AcceptMsg {
            nonce: 7,
            comm_id: 42,
            proc_id: ProcId::current(),
            bundle_bytes: 63 * BUNDLE_UNIT,
        };
        assert_eq!(AcceptMsg::decode(&a.encode()), Some(a));
        // A reply from a peer without bundles (zero bytes there) offers none.
        let mut old = a.encode();
        old[18..20].fill(0);
        assert_eq!(AcceptMsg::decode(&old).map(|m| m.bundle_bytes), Some(0));
        assert_eq!(AcceptMsg::decode(&b), None, "a connect is not an accept");
    }

    #[test]
    fn fingerprints_differ() {
        assert_ne!(
            provider_fingerprint("shm"),
            provider_fingerprint("tcp;ofi_rxm")
        );
    }
}
