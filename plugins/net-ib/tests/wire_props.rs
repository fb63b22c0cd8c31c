//! Property tests of what arrives from a peer, seeded random bytes: the listen
//! handle NCCL carries from the other rank and the connection metadata of the side
//! channel. Arbitrary bytes never panic, never make the parser allocate more than
//! the largest metadata allows, and are refused with a message naming what is
//! wrong; every valid value round-trips exactly.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use cclkit_abi::net::NetHandle;
use cclkit_net_ib::conn::wire::{
    MAX_META, decode_meta, encode_meta, handle_devs, read_handle, write_handle,
};
use cclkit_net_ib::nic::{Ece, PortAddr};
use cclkit_net_ib::proto::endpoint::ConnMeta;
use cclkit_net_ib::proto::{MAX_CONN_QPS, MAX_DEVS, RemoteBuf};
use cclkit_tests::props::{PeakAlloc, Rng, assert_probe_armed, handle_of, peak_alloc};

#[global_allocator]
static GLOBAL: PeakAlloc = PeakAlloc;

#[test]
fn the_allocation_probe_sees_allocations() {
    assert_probe_armed();
}

const CASES: u64 = 20_000;

fn socket_addr(rng: &mut Rng) -> SocketAddr {
    let ip = if rng.below(2) == 0 {
        IpAddr::V4(Ipv4Addr::from(rng.next() as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(
            u128::from(rng.next()) << 64 | u128::from(rng.next()),
        ))
    };
    SocketAddr::new(ip, rng.next() as u16)
}

fn meta(rng: &mut Rng) -> ConnMeta {
    let ndevs = 1 + rng.below(MAX_DEVS as u64) as usize;
    let nqps = 1 + rng.below(MAX_CONN_QPS as u64) as usize;
    let ports = (0..ndevs)
        .map(|_| {
            let mut gid = [0u8; 16];
            rng.fill(&mut gid);
            PortAddr {
                lid: rng.next() as u16,
                link_layer: rng.next() as u8,
                mtu: rng.next() as u8,
                gid,
            }
        })
        .collect();
    let qpns = (0..nqps).map(|_| rng.next() as u32).collect();
    let ece = (0..nqps)
        .map(|_| {
            (rng.below(2) == 0).then(|| Ece {
                vendor_id: rng.next() as u32,
                options: rng.next() as u32,
                comp_mask: rng.next() as u32,
            })
        })
        .collect();
    let mut rkeys = [0u32; MAX_DEVS];
    for k in &mut rkeys {
        *k = rng.next() as u32;
    }
    ConnMeta {
        ports,
        qpns,
        ece,
        buf: RemoteBuf {
            addr: rng.next(),
            rkeys,
        },
        tc: rng.next() as u8,
        sl: rng.next() as u8,
        split: rng.below(2) == 0,
        ooo: rng.below(2) == 0,
    }
}

#[test]
fn valid_handles_and_metadata_round_trip() {
    for case in 0..CASES {
        let mut rng = Rng(case);
        let (magic, addr) = (rng.next(), socket_addr(&mut rng));
        let ndevs = 1 + rng.below(MAX_DEVS as u64) as usize;
        let mut h = NetHandle::zeroed();
        write_handle(&mut h, magic, addr, ndevs);
        assert_eq!(read_handle(&h).ok(), Some((magic, addr)), "case {case}");
        assert_eq!(handle_devs(&h).ok(), Some(ndevs), "case {case}");
        let m = meta(&mut rng);
        let bytes = encode_meta(&m);
        assert!(bytes.len() <= MAX_META);
        assert_eq!(decode_meta(&bytes).ok(), Some(m), "case {case}");
    }
}

#[test]
fn arbitrary_handle_bytes_are_refused_clearly_or_read_consistently() {
    let mut accepted = 0;
    for case in 0..CASES {
        let mut rng = Rng(0x1b_0000 + case);
        let mut p = [0u8; NetHandle::PAYLOAD];
        rng.fill(&mut p);
        if case % 2 == 0 {
            let mut h = NetHandle::zeroed();
            let (magic, addr) = (rng.next(), socket_addr(&mut rng));
            write_handle(&mut h, magic, addr, 1 + rng.below(MAX_DEVS as u64) as usize);
            p = *h.payload();
            for _ in 0..1 + rng.below(2) {
                p[rng.below(30) as usize] = rng.next() as u8;
            }
        }
        let h = handle_of(&p);
        let (r, peak) = peak_alloc(|| read_handle(&h));
        let devs = handle_devs(&h);
        match &r {
            Ok((magic, addr)) => {
                accepted += 1;
                // Written back, the handle reads the same (the bytes decide everything).
                let mut back = NetHandle::zeroed();
                write_handle(&mut back, *magic, *addr, devs.as_ref().map_or(1, |n| *n));
                assert_eq!(
                    read_handle(&back).ok(),
                    Some((*magic, *addr)),
                    "case {case}"
                );
                assert_eq!(peak, 0);
            }
            Err(e) => {
                let m = e.to_string();
                assert!(m.contains("bad handle"), "case {case}: unclear error {m:?}");
                assert!(m.len() < 300);
                assert!(
                    peak < 1024,
                    "case {case}: {peak}-byte allocation for an error"
                );
            }
        }
        match devs {
            Ok(n) => assert!((1..=MAX_DEVS).contains(&n)),
            Err(e) => assert!(e.to_string().contains("devices"), "case {case}: {e}"),
        }
    }
    assert!(
        accepted > CASES / 10,
        "the mutations should keep some handles valid"
    );
}

#[test]
fn arbitrary_metadata_is_refused_clearly_or_read_consistently() {
    let mut accepted = 0;
    for case in 0..CASES {
        let mut rng = Rng(0x3e7a_0000 + case);
        let mut b = if case % 2 == 0 {
            // Valid metadata cut, extended or with a few bytes changed.
            let mut b = encode_meta(&meta(&mut rng));
            match rng.below(3) {
                0 => b.truncate(rng.below(b.len() as u64) as usize),
                1 => b.extend((0..1 + rng.below(40)).map(|_| rng.next() as u8)),
                _ => {}
            }
            b
        } else {
            vec![0u8; rng.below(2 * MAX_META as u64) as usize]
        };
        let n = b.len();
        if case % 2 == 1 {
            rng.fill(&mut b);
        } else if n > 0 && rng.below(2) == 0 {
            b[rng.below(n as u64) as usize] = rng.next() as u8;
        }
        let (r, peak) = peak_alloc(|| decode_meta(&b));
        match r {
            Ok(m) => {
                accepted += 1;
                assert!((1..=MAX_DEVS).contains(&m.ports.len()));
                assert!((1..=MAX_CONN_QPS).contains(&m.qpns.len()) && m.ece.len() == m.qpns.len());
                // What was read is what the bytes say (the ECE words of a QP without
                // ECE and the pad byte are ignored, so compare after a round trip).
                let again = encode_meta(&m);
                assert_eq!(again.len(), b.len(), "case {case}");
                assert_eq!(decode_meta(&again).ok(), Some(m), "case {case}");
            }
            Err(e) => {
                let m = e.to_string();
                assert!(
                    m.contains("bad connection metadata"),
                    "case {case}: unclear error {m:?}"
                );
                assert!(m.len() < 300);
            }
        }
        assert!(peak <= MAX_META, "case {case}: {peak}-byte allocation");
    }
    assert!(
        accepted > CASES / 20,
        "the mutations should keep some metadata valid"
    );
}
