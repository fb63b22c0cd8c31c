//! Bytes on the side channel: the listen handle and the connection metadata.
//!
//! Listen handle payload (inside NCCL's 128-byte handle):
//! `magic u64 LE | family u8 (4/6) | ip [16] | port u16 BE | version u8 | ndevs u8`
//! (`ndevs`: physical ports of the listening virtual device, so the connector opens
//! as many QPs as NCCL would, `NCCL_IB_QPS_PER_CONNECTION × max(ndevs, its own)`;
//! NCCL exchanges the same through its vProps).
//!
//! Side channel, connector first:
//! 1. connector → listener: `magic u64 LE | len u32 LE | ConnMeta` (the listener
//!    drops a connection whose magic is not its own, without reading further);
//! 2. listener → connector: `len u32 LE | ConnMeta`;
//! 3. connector → listener: one byte `READY` once its QPs are connected.
//!
//! `ConnMeta` (little-endian): `version u32 | nqps u32 | ndevs u32 | buf.addr u64 |
//! buf.rkeys [u32; 8] | tc u8 | sl u8 | flags u8 (bit 0: split data on QPs, bit 1:
//! out-of-order receive queues) | 0 u8 |
//! per device: lid u16, link_layer u8, mtu u8, gid [16] | per QP: qpn u32,
//! ece_supported u32 (0/1), ece vendor_id u32, options u32, comp_mask u32`.

use std::net::{IpAddr, SocketAddr};

use cclkit_abi::net::NetHandle;
use cclkit_abi::{Error, Result};

use crate::nic::{Ece, PortAddr};
use crate::proto::endpoint::ConnMeta;
use crate::proto::{MAX_CONN_QPS, MAX_DEVS, RemoteBuf};

/// Protocol version; both sides must run the same (3: virtual devices).
pub const VERSION: u32 = 3;
/// The byte that ends connection setup.
pub const READY: u8 = 0xa5;
/// Bytes of the connector's hello header (magic + length).
pub const HELLO_HEADER: usize = 12;
/// Bytes before the per-device records.
const HEADER: usize = 56;
/// Bytes per device record.
const PER_DEV: usize = 20;
/// Bytes per QP record.
const PER_QP: usize = 20;
/// Offset of the flags byte.
const FLAGS: usize = 54;
/// Largest metadata accepted.
pub const MAX_META: usize = HEADER + PER_DEV * MAX_DEVS + PER_QP * MAX_CONN_QPS;

/// Writes the listen handle of a virtual device of `ndevs` ports.
pub fn write_handle(handle: &mut NetHandle, magic: u64, addr: SocketAddr, ndevs: usize) {
    let p = handle.payload_mut();
    p[0..8].copy_from_slice(&magic.to_le_bytes());
    match addr.ip() {
        IpAddr::V4(v4) => {
            p[8] = 4;
            p[9..13].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            p[8] = 6;
            p[9..25].copy_from_slice(&v6.octets());
        }
    }
    p[25..27].copy_from_slice(&addr.port().to_be_bytes());
    p[27] = VERSION as u8;
    p[28] = ndevs.min(MAX_DEVS) as u8;
}

/// The listener's number of ports, from its handle (checked by [`read_handle`] for
/// the version first).
pub fn handle_devs(handle: &NetHandle) -> Result<usize> {
    let n = usize::from(handle.payload()[28]);
    if (1..=MAX_DEVS).contains(&n) {
        Ok(n)
    } else {
        Err(Error::invalid_argument(format!(
            "NET/cclkit-ib: bad handle: {n} devices (1..={MAX_DEVS})"
        )))
    }
}

/// Reads the listen handle: `(magic, address)`.
pub fn read_handle(handle: &NetHandle) -> Result<(u64, SocketAddr)> {
    let p = handle.payload();
    let bad = |what: String| Error::invalid_argument(format!("NET/cclkit-ib: bad handle: {what}"));
    if u32::from(p[27]) != VERSION {
        return Err(bad(format!(
            "protocol version {} (this plugin speaks {VERSION}); was it made by cclkit-ib?",
            p[27]
        )));
    }
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&p[0..8]);
    let ip = match p[8] {
        4 => {
            let mut a = [0u8; 4];
            a.copy_from_slice(&p[9..13]);
            IpAddr::from(a)
        }
        6 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&p[9..25]);
            IpAddr::from(a)
        }
        f => return Err(bad(format!("address family byte {f}"))),
    };
    Ok((
        u64::from_le_bytes(magic),
        SocketAddr::new(ip, u16::from_be_bytes([p[25], p[26]])),
    ))
}

/// Serialises connection metadata.
pub fn encode_meta(m: &ConnMeta) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + PER_DEV * m.ports.len() + PER_QP * m.qpns.len());
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&(m.qpns.len() as u32).to_le_bytes());
    v.extend_from_slice(&(m.ports.len() as u32).to_le_bytes());
    v.extend_from_slice(&m.buf.addr.to_le_bytes());
    for k in m.buf.rkeys {
        v.extend_from_slice(&k.to_le_bytes());
    }
    v.extend_from_slice(&[m.tc, m.sl, u8::from(m.split) | u8::from(m.ooo) << 1, 0]);
    for p in &m.ports {
        v.extend_from_slice(&p.lid.to_le_bytes());
        v.push(p.link_layer);
        v.push(p.mtu);
        v.extend_from_slice(&p.gid);
    }
    for (i, q) in m.qpns.iter().enumerate() {
        v.extend_from_slice(&q.to_le_bytes());
        let ece = m.ece.get(i).copied().flatten();
        v.extend_from_slice(&u32::from(ece.is_some()).to_le_bytes());
        let e = ece.unwrap_or_default();
        for w in [e.vendor_id, e.options, e.comp_mask] {
            v.extend_from_slice(&w.to_le_bytes());
        }
    }
    v
}

/// Parses connection metadata, rejecting anything malformed.
pub fn decode_meta(b: &[u8]) -> Result<ConnMeta> {
    let bad = |what: &str| Error::remote(format!("NET/cclkit-ib: bad connection metadata: {what}"));
    let u32_at = |o: usize| -> Result<u32> {
        b.get(o..o + 4)
            .and_then(|s| s.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| bad("truncated"))
    };
    if u32_at(0)? != VERSION {
        return Err(bad("protocol version differs (mixed cclkit-ib versions?)"));
    }
    let nqps = u32_at(4)? as usize;
    let ndevs = u32_at(8)? as usize;
    if !(1..=MAX_CONN_QPS).contains(&nqps)
        || !(1..=MAX_DEVS).contains(&ndevs)
        || b.len() != HEADER + PER_DEV * ndevs + PER_QP * nqps
    {
        return Err(bad(&format!(
            "{nqps} QPs on {ndevs} devices in {} bytes",
            b.len()
        )));
    }
    if b[FLAGS] > 3 {
        return Err(bad(&format!("flags {:#x}", b[FLAGS])));
    }
    let mut addr = [0u8; 8];
    addr.copy_from_slice(&b[12..20]);
    let mut rkeys = [0u32; MAX_DEVS];
    for (i, k) in rkeys.iter_mut().enumerate() {
        *k = u32_at(20 + 4 * i)?;
    }
    let ports = (0..ndevs)
        .map(|d| {
            let o = HEADER + PER_DEV * d;
            let mut gid = [0u8; 16];
            gid.copy_from_slice(&b[o + 4..o + 20]);
            PortAddr {
                lid: u16::from_le_bytes([b[o], b[o + 1]]),
                link_layer: b[o + 2],
                mtu: b[o + 3],
                gid,
            }
        })
        .collect();
    let qp_base = HEADER + PER_DEV * ndevs;
    let mut qpns = Vec::with_capacity(nqps);
    let mut ece = Vec::with_capacity(nqps);
    for i in 0..nqps {
        let o = qp_base + PER_QP * i;
        qpns.push(u32_at(o)?);
        ece.push(match u32_at(o + 4)? {
            0 => None,
            1 => Some(Ece {
                vendor_id: u32_at(o + 8)?,
                options: u32_at(o + 12)?,
                comp_mask: u32_at(o + 16)?,
            }),
            other => return Err(bad(&format!("ECE flag {other}"))),
        });
    }
    Ok(ConnMeta {
        ports,
        buf: RemoteBuf {
            addr: u64::from_le_bytes(addr),
            rkeys,
        },
        tc: b[52],
        sl: b[53],
        split: b[FLAGS] & 1 != 0,
        ooo: b[FLAGS] & 2 != 0,
        qpns,
        ece,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trips_both_families() {
        for addr in ["10.1.2.3:45678", "[2001:db8::7]:1"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let mut h = NetHandle::zeroed();
            write_handle(&mut h, 0xdead_beef_cafe_f00d, addr, 3);
            assert_eq!(read_handle(&h).unwrap(), (0xdead_beef_cafe_f00d, addr));
            assert_eq!(handle_devs(&h).unwrap(), 3);
        }
        let mut h = NetHandle::zeroed();
        assert!(read_handle(&h).is_err(), "a zeroed handle is not ours");
        assert!(handle_devs(&h).is_err(), "0 devices");
        h.payload_mut()[27] = VERSION as u8;
        h.payload_mut()[8] = 5;
        assert!(read_handle(&h).unwrap_err().message().contains("family"));
    }

    #[test]
    fn meta_round_trips_and_malformed_input_is_rejected() {
        let m = ConnMeta {
            ports: vec![
                PortAddr {
                    lid: 0x1234,
                    gid: *b"0123456789abcdef",
                    link_layer: 2,
                    mtu: 5,
                },
                PortAddr {
                    lid: 0x4321,
                    gid: *b"fedcba9876543210",
                    link_layer: 2,
                    mtu: 3,
                },
            ],
            qpns: vec![0x11, 0x222, 0x3333],
            ece: vec![
                None,
                Some(Ece {
                    vendor_id: 0x02c9,
                    options: 0x3000_0007,
                    comp_mask: 1,
                }),
                None,
            ],
            buf: RemoteBuf {
                addr: 0x7fff_0000_1000,
                rkeys: [0xabcd, 0xbcde, 0, 0, 0, 0, 0, 0xffff_ffff],
            },
            tc: 106,
            sl: 5,
            split: true,
            ooo: true,
        };
        let b = encode_meta(&m);
        assert_eq!(b.len(), 56 + 2 * 20 + 3 * 20);
        assert_eq!(decode_meta(&b).unwrap(), m);
        assert!(decode_meta(&b[..b.len() - 1]).is_err());
        let mut flags = b.clone();
        flags[FLAGS] = 7;
        assert!(decode_meta(&flags).is_err());
        let mut wrong = b.clone();
        wrong[0] = 9;
        assert!(
            decode_meta(&wrong)
                .unwrap_err()
                .message()
                .contains("version")
        );
        let mut many = b.clone();
        many[4] = 200;
        assert!(decode_meta(&many).is_err());
        let mut devs = b.clone();
        devs[8] = 9;
        assert!(
            decode_meta(&devs).is_err(),
            "more devices than NCCL_IB_MAX_DEVS_PER_NIC"
        );
        devs[8] = 3;
        assert!(
            decode_meta(&devs).is_err(),
            "device count must match the length"
        );
        assert!(decode_meta(&[]).is_err());
    }
}
