//! Property tests of what arrives from a peer, seeded random bytes: the listen
//! handle NCCL carries from the other rank, the connection hello, message headers
//! and clear-to-send records. Arbitrary bytes never panic, never make the parser
//! allocate more than a fixed bound, and are refused with a message naming what is
//! wrong; every valid value round-trips exactly.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use cclkit_abi::net::NetHandle;
use cclkit_net_socket::wire::{Cts, HandleInfo, Header, Hello, MAX_RECVS, MAX_STREAMS};
use cclkit_tests::props::{PeakAlloc, Rng, assert_probe_armed, handle_of, peak_alloc};

#[global_allocator]
static GLOBAL: PeakAlloc = PeakAlloc;

#[test]
fn the_allocation_probe_sees_allocations() {
    assert_probe_armed();
}

const CASES: u64 = 20_000;

fn random_info(rng: &mut Rng) -> HandleInfo {
    let port = rng.next() as u16;
    let addr = if rng.below(2) == 0 {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(rng.next() as u32), port))
    } else {
        let ip = Ipv6Addr::from(u128::from(rng.next()) << 64 | u128::from(rng.next()));
        SocketAddr::V6(SocketAddrV6::new(ip, port, 0, rng.next() as u32))
    };
    HandleInfo {
        magic: rng.next(),
        addr,
        nstreams: rng.below(MAX_STREAMS as u64 + 1) as usize,
        max_recvs: 1 + rng.below(MAX_RECVS as u64) as usize,
    }
}

#[test]
fn valid_handles_round_trip() {
    for case in 0..CASES {
        let mut rng = Rng(case);
        let info = random_info(&mut rng);
        let mut h = NetHandle::zeroed();
        info.write(&mut h);
        assert_eq!(HandleInfo::read(&h).ok(), Some(info), "case {case}");
    }
}

#[test]
fn arbitrary_handle_bytes_are_refused_clearly_or_read_consistently() {
    let mut accepted = 0;
    for case in 0..CASES {
        let mut rng = Rng(0x4a4d_0000 + case);
        let mut p = [0u8; NetHandle::PAYLOAD];
        rng.fill(&mut p);
        // Half the cases start from a valid handle with a few bytes changed: random
        // bytes alone almost never get past the version byte.
        if case % 2 == 0 {
            let mut h = NetHandle::zeroed();
            random_info(&mut rng).write(&mut h);
            p = *h.payload();
            for _ in 0..1 + rng.below(3) {
                p[rng.below(40) as usize] = rng.next() as u8;
            }
        }
        let (r, peak) = peak_alloc(|| HandleInfo::read(&handle_of(&p)));
        match r {
            Ok(info) => {
                accepted += 1;
                assert!(info.nstreams <= MAX_STREAMS && (1..=MAX_RECVS).contains(&info.max_recvs));
                // What was accepted is what the bytes say: writing it back reads the same.
                let mut h = NetHandle::zeroed();
                info.write(&mut h);
                assert_eq!(HandleInfo::read(&h).ok(), Some(info), "case {case}");
                assert_eq!(peak, 0, "case {case}: reading a valid handle allocates");
            }
            Err(e) => {
                let m = e.to_string();
                assert!(
                    m.contains("cclkit-socket handle"),
                    "case {case}: unclear error {m:?}"
                );
                assert!(m.len() < 300, "case {case}: {} bytes of error", m.len());
                assert!(
                    peak < 1024,
                    "case {case}: {peak}-byte allocation for an error"
                );
            }
        }
    }
    assert!(
        accepted > CASES / 10,
        "the mutations should keep some handles valid"
    );
}

#[test]
fn hello_and_header_decode_any_bytes_exactly() {
    for case in 0..CASES {
        let mut rng = Rng(0x4e11_0000 + case);
        let mut b = [0u8; Hello::LEN];
        rng.fill(&mut b);
        let (hello, peak) = peak_alloc(|| Hello::decode(&b));
        assert_eq!(peak, 0);
        // Every field comes from its bytes; the two padding bytes are ignored.
        let back = hello.encode();
        assert_eq!(back[..22], b[..22], "case {case}");
        assert_eq!(back[22..], [0, 0]);
        let mut h = [0u8; Header::LEN + 7];
        rng.fill(&mut h);
        let (header, peak) = peak_alloc(|| Header::decode(&h));
        assert_eq!(peak, 0);
        assert_eq!(header.encode()[..15], h[..15], "case {case}");
    }
}

#[test]
fn clear_to_send_records_of_any_length() {
    for case in 0..CASES {
        let mut rng = Rng(0xc75_0000 + case);
        let mut b = vec![0u8; rng.below(2 * Cts::MAX_LEN as u64) as usize];
        rng.fill(&mut b);
        if case % 2 == 0 && !b.is_empty() {
            // A plausible count byte, so that the length checks are exercised.
            b[0] = rng.below(MAX_RECVS as u64 + 2) as u8;
        }
        let (r, peak) = peak_alloc(|| Cts::decode(&b));
        let n = b.first().map(|&n| usize::from(n));
        match r {
            Ok(Some((cts, len))) => {
                assert_eq!(len, Cts::len_for(cts.n));
                assert!(len <= b.len() && (1..=MAX_RECVS).contains(&cts.n));
                let mut out = [0u8; Cts::MAX_LEN];
                assert_eq!(cts.encode(&mut out), len);
                assert_eq!(out[0], b[0]);
                assert_eq!(out[4..len], b[4..len], "case {case}");
                assert_eq!(peak, 0);
            }
            Ok(None) => {
                // Only a record that is valid so far but not complete waits for more.
                assert!(
                    n.is_none_or(|n| (1..=MAX_RECVS).contains(&n) && b.len() < Cts::len_for(n))
                );
            }
            Err(e) => {
                assert!(
                    n.is_some_and(|n| !(1..=MAX_RECVS).contains(&n)),
                    "case {case}"
                );
                assert!(e.to_string().contains("clear-to-send"), "case {case}: {e}");
                assert!(peak < 1024);
            }
        }
    }
}
