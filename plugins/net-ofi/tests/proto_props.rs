//! Property tests of what arrives from a peer, seeded random bytes: the listen
//! handle NCCL carries from the other rank, the connect request and its reply.
//! Arbitrary bytes never panic, never make the parser allocate more than the
//! largest address a message may carry, and a refused handle says why; every valid
//! value round-trips exactly.

use cclkit_abi::net::NetHandle;
use cclkit_net_ofi::liveness::{PROC_ID_LEN, ProcId};
use cclkit_net_ofi::proto::{
    ACCEPT_LEN, AcceptMsg, BUNDLE_UNIT, CONNECT_ADDR_MAX, CONNECT_LEN, CTS_LEN, ConnectMsg, Cts,
    HANDLE_ADDR_MAX, ListenHandle,
};
use cclkit_tests::props::{PeakAlloc, Rng, assert_probe_armed, handle_of, peak_alloc};

#[global_allocator]
static GLOBAL: PeakAlloc = PeakAlloc;

#[test]
fn the_allocation_probe_sees_allocations() {
    assert_probe_armed();
}

const CASES: u64 = 20_000;

fn proc_id(rng: &mut Rng) -> ProcId {
    let mut b = [0u8; PROC_ID_LEN];
    rng.fill(&mut b);
    ProcId::decode(&b)
}

fn addr(rng: &mut Rng, max: usize) -> Vec<u8> {
    let mut a = vec![0u8; 1 + rng.below(max as u64) as usize];
    rng.fill(&mut a);
    a
}

#[test]
fn valid_messages_round_trip() {
    for case in 0..CASES {
        let mut rng = Rng(case);
        let l = ListenHandle {
            provider: rng.next() as u32,
            listen_id: rng.next() as u16,
            nonce: rng.next(),
            addr: addr(&mut rng, HANDLE_ADDR_MAX),
        };
        let mut h = NetHandle::zeroed();
        assert!(l.write(&mut h).is_ok());
        assert_eq!(ListenHandle::read(&h).ok(), Some(l), "case {case}");
        let c = ConnectMsg {
            nonce: rng.next(),
            reply_id: rng.next() as u16,
            proc_id: proc_id(&mut rng),
            addr: addr(&mut rng, CONNECT_ADDR_MAX),
            write_min: rng.next() as u32 & 0x7fff_ffff,
            slots: rng.next() & 1 == 1,
        };
        let bytes = c.encode().unwrap_or_default();
        assert_eq!(bytes.len(), CONNECT_LEN);
        assert_eq!(ConnectMsg::decode(&bytes), Some(c), "case {case}");
        let a = AcceptMsg {
            nonce: rng.next(),
            comm_id: rng.next() as u16,
            proc_id: proc_id(&mut rng),
            bundle_bytes: ((rng.next() as u16 & 0x7fff) as usize) * BUNDLE_UNIT,
            writes: rng.next() & 1 == 1,
        };
        assert_eq!(AcceptMsg::decode(&a.encode()), Some(a), "case {case}");
        let w = Cts {
            token: rng.next() as u16,
            generation: rng.next() as u8,
            seq: rng.next() as u32,
            tag: rng.next() as i32,
            cap: rng.next() as u32,
            key: rng.next(),
            addr: rng.next(),
            slot: rng.next() & 1 == 1,
        };
        assert_eq!(Cts::decode(&w.encode()), Some(w), "case {case}");
    }
}

#[test]
fn oversized_addresses_are_refused_on_the_way_out() {
    let mut h = NetHandle::zeroed();
    let big = ListenHandle {
        provider: 1,
        listen_id: 2,
        nonce: 3,
        addr: vec![1; HANDLE_ADDR_MAX + 1],
    };
    assert!(big.write(&mut h).is_err());
    let c = ConnectMsg {
        nonce: 1,
        reply_id: 2,
        proc_id: ProcId::decode(&[0; PROC_ID_LEN]),
        addr: vec![1; CONNECT_ADDR_MAX + 1],
        write_min: 0,
        slots: false,
    };
    assert!(c.encode().is_err());
}

#[test]
fn arbitrary_handle_bytes_are_refused_clearly_or_read_consistently() {
    let mut accepted = 0;
    for case in 0..CASES {
        let mut rng = Rng(0x0f1_0000 + case);
        let mut p = [0u8; NetHandle::PAYLOAD];
        rng.fill(&mut p);
        if case % 2 == 0 {
            // A valid handle with its length or a few other bytes changed.
            let l = ListenHandle {
                provider: rng.next() as u32,
                listen_id: rng.next() as u16,
                nonce: rng.next(),
                addr: addr(&mut rng, HANDLE_ADDR_MAX),
            };
            let mut h = NetHandle::zeroed();
            let _ = l.write(&mut h);
            p = *h.payload();
            for _ in 0..1 + rng.below(3) {
                p[rng.below(24) as usize] = rng.next() as u8;
            }
        }
        let (r, peak) = peak_alloc(|| ListenHandle::read(&handle_of(&p)));
        match r {
            Ok(l) => {
                accepted += 1;
                assert!(!l.addr.is_empty() && l.addr.len() <= HANDLE_ADDR_MAX);
                assert_eq!(l.addr[..], p[24..24 + l.addr.len()], "case {case}");
                assert!(
                    peak <= HANDLE_ADDR_MAX,
                    "case {case}: {peak}-byte allocation"
                );
            }
            Err(e) => {
                let m = e.to_string();
                assert!(m.contains("handle"), "case {case}: unclear error {m:?}");
                assert!(m.len() < 300, "case {case}");
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
fn arbitrary_connect_and_accept_bytes_never_panic() {
    for case in 0..CASES {
        let mut rng = Rng(0xacc_0000 + case);
        let mut b = vec![0u8; rng.below(2 * CONNECT_LEN as u64) as usize];
        rng.fill(&mut b);
        if case % 2 == 0 && b.len() >= 20 {
            // Right magic, random rest: the length fields get exercised.
            let c = ConnectMsg {
                nonce: 0,
                reply_id: 0,
                proc_id: ProcId::decode(&[0; PROC_ID_LEN]),
                addr: vec![0],
                write_min: 0,
                slots: false,
            };
            let valid = c.encode().unwrap_or_default();
            b[..8].copy_from_slice(&valid[..8]);
        }
        let (r, peak) = peak_alloc(|| ConnectMsg::decode(&b));
        if let Some(c) = r {
            assert!(!c.addr.is_empty() && 48 + c.addr.len() <= b.len().min(CONNECT_LEN));
            assert_eq!(c.addr[..], b[48..48 + c.addr.len()]);
        }
        assert!(peak <= CONNECT_LEN, "case {case}: {peak}-byte allocation");
        let (r, peak) = peak_alloc(|| AcceptMsg::decode(&b));
        assert_eq!(peak, 0);
        if let Some(a) = r {
            assert!(b.len() >= ACCEPT_LEN);
            assert_eq!(a.encode()[..18], b[..18], "case {case}");
        }
        // A clear-to-write message from a peer: only exactly CTS_LEN bytes with
        // its magic decode, and re-encode to the same bytes but the padding.
        let mut c = b.clone();
        if case % 3 == 0 {
            c.resize(CTS_LEN, 0);
            c[..2].copy_from_slice(&0xc75a_u16.to_le_bytes());
        }
        let (r, peak) = peak_alloc(|| Cts::decode(&c));
        assert_eq!(peak, 0);
        if let Some(w) = r {
            assert_eq!(c.len(), CTS_LEN);
            let again = w.encode();
            assert_eq!(again[..5], c[..5], "case {case}");
            assert_eq!(again[8..], c[8..], "case {case}");
        }
    }
}
