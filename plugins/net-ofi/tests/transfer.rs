//! Two-process transfers through the exported v8 and v12 tables, on the
//! `tcp;ofi_rxm` (bound to loopback) and `shm` providers: random data at sizes
//! 0, 1, 7, 4095, 64 KiB + 3 and 4 MiB + 5, 32 requests in flight, then grouped
//! receives (distinct tags out of order, repeated tags); with bundles of small
//! sends (on by default over tcp) and without, with writes of mid sizes (on by
//! default over tcp) and without.

mod common;

use std::time::Duration;

use common::{pair, provider_env};

fn transfer(provider: &str, abi: &str) {
    transfer_with(provider, abi, &[], None);
}

fn transfer_with(
    provider: &str,
    abi: &str,
    extra: &[(&'static str, &str)],
    check: Option<fn(&[String; 2])>,
) {
    let seed = rand::random::<u32>().to_string();
    let mut env = provider_env(provider);
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let (s, r) = pair(
        ("sender", &["transfer", abi, "send", &seed, "3"]),
        ("receiver", &["transfer", abi, "recv", &seed, "3"]),
        &env,
    );
    let t = Duration::from_secs(120);
    eprintln!("seed {seed}");
    let mut r = r;
    let dev = r.expect("DEVICE ", t);
    assert!(
        dev.contains("maxRecvs 8"),
        "grouped receives were not exercised: {dev}"
    );
    // Bundles (src/bundle.rs): on by default over tcp, off on shm and when set to 0.
    let mut s = s;
    let sent = s.expect("BUNDLED ", t);
    let bundled: u64 = sent
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unreadable bundle count: {sent}"));
    let setting = extra.iter().find(|(k, _)| *k == "CCLKIT_OFI_BUNDLE_BYTES");
    // A receive comm's 8 bundle receives may take at most a quarter of the
    // provider's receive queue (FI_OFI_RXM_RX_SIZE): under 32 entries, no bundles.
    let rx_queue = extra
        .iter()
        .find(|(k, _)| *k == "FI_OFI_RXM_RX_SIZE")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    let small_queue = rx_queue.is_some_and(|n| n < 32);
    let off = match setting {
        Some((_, v)) => *v == "0",
        None => provider == "shm" || small_queue,
    };
    // With every size in the write range, sends whose offers came first are
    // written, not bundled: whether any bundle forms is up to timing.
    let all_written = extra
        .iter()
        .any(|(k, v)| *k == "CCLKIT_OFI_WRITE_BYTES" && v.starts_with("1-"));
    if off {
        assert_eq!(bundled, 0, "bundles were sent while off: {sent}");
    } else if !all_written {
        assert!(bundled > 0, "no send was bundled: {sent}");
    }
    // Bundle slots (src/engine/slots.rs) need bundles and writes; a sender
    // whose receiver offers none never waits for one (no sends alone).
    let slots = s.expect("SLOTS ", t);
    let slot_counts: Vec<u64> = slots
        .split_whitespace()
        .take(2)
        .map(|n| n.parse().unwrap_or_else(|_| panic!("unreadable: {slots}")))
        .collect();
    let writes_off = extra
        .iter()
        .any(|(k, v)| *k == "CCLKIT_OFI_WRITE_BYTES" && *v == "0");
    let slots_off = extra
        .iter()
        .any(|(k, v)| *k == "CCLKIT_OFI_BUNDLE_SLOTS" && *v == "0");
    if off || writes_off || slots_off || provider == "shm" {
        assert_eq!(slot_counts, [0, 0], "slots used while off: {slots}");
    }
    // Writes (src/engine/write.rs): on by default over tcp;ofi_rxm for sizes
    // between its eager and SAR limits (the 64 KiB + 3 messages), off on shm and
    // when set to 0. Every write the sender made landed in an offered receive.
    let counts = |line: String| -> Vec<u64> {
        line.split_whitespace()
            .take(4)
            .map(|n| n.parse().unwrap_or_else(|_| panic!("unreadable: {line}")))
            .collect()
    };
    let (sw, rw) = (
        counts(s.expect("WRITES ", t)),
        counts(r.expect("WRITES ", t)),
    );
    // Every receive here but the final handshake's is registered and offered;
    // a send goes as a write when its offer arrived before it was posted, which
    // the scenario's timing decides (writes.rs of the peer checks each case).
    let setting = extra
        .iter()
        .find(|(k, _)| *k == "CCLKIT_OFI_WRITE_BYTES")
        .map(|(_, v)| *v);
    assert_eq!(sw[0], rw[1], "writes sent {sw:?} and landed {rw:?} differ");
    assert!(rw[2] >= sw[0], "more writes than offers: {rw:?} {sw:?}");
    match setting {
        Some("0") => assert_eq!(rw[2] + sw[0] + sw[3], 0, "writes while off: {sw:?} {rw:?}"),
        // Offer receives take their entries from the same quarter of the receive
        // queue as bundle buffers, and leave room for one comm's bundle buffers:
        // none under 64 entries.
        None if provider == "shm" || rx_queue.is_some_and(|n| n < 64) => {
            assert_eq!(
                rw[2] + sw[0] + sw[3],
                0,
                "writes on shm or a tiny queue: {sw:?} {rw:?}"
            )
        }
        // Every 64 KiB + 3 send (3 rounds, and in the groups) counts one way.
        None => assert!(
            rw[2] > 0 && sw[0] + sw[3] > 0,
            "no offers or sends in range: {sw:?} {rw:?}"
        ),
        Some(_) => assert!(
            rw[2] > 0 && sw[0] + sw[3] > 0,
            "no offers or sends in range: {sw:?} {rw:?}"
        ),
    }
    let logs = [r.finish(t), s.finish(t)];
    if let Some(check) = check {
        check(&logs);
    }
}

#[test]
fn tcp_v12() {
    transfer("tcp;ofi_rxm", "12");
}

#[test]
fn tcp_v8() {
    transfer("tcp;ofi_rxm", "8");
}

/// Every send on its own (no bundles), as on providers without them.
#[test]
fn tcp_v12_without_bundles() {
    transfer_with(
        "tcp;ofi_rxm",
        "12",
        &[("CCLKIT_OFI_BUNDLE_BYTES", "0")],
        None,
    );
}

/// Every size a write (the range set to all of them): 1 and 7 bytes, 4 MiB + 5,
/// grouped receives with distinct and repeated tags, next to bundles.
#[test]
fn tcp_v12_every_size_written() {
    transfer_with(
        "tcp;ofi_rxm",
        "12",
        &[("CCLKIT_OFI_WRITE_BYTES", "1-16777215")],
        None,
    );
}

/// Writes off: every send is a tagged message, and no receive is offered.
/// Bundles stay within one eager message.
#[test]
fn tcp_v12_without_slots() {
    transfer_with(
        "tcp;ofi_rxm",
        "12",
        &[("CCLKIT_OFI_BUNDLE_SLOTS", "0")],
        None,
    );
}

#[test]
fn tcp_v8_without_writes() {
    transfer_with("tcp;ofi_rxm", "8", &[("CCLKIT_OFI_WRITE_BYTES", "0")], None);
}

/// Writes on shm when asked for (off by default there), through the v8 table.
#[test]
fn shm_v8_written() {
    transfer_with(
        "shm",
        "8",
        &[("CCLKIT_OFI_WRITE_BYTES", "1000-16777215")],
        None,
    );
}

/// Bundles on shm too, when asked for (off by default there).
#[test]
fn shm_v12_with_bundles() {
    transfer_with("shm", "12", &[("CCLKIT_OFI_BUNDLE_BYTES", "12288")], None);
}

#[test]
fn shm_v12() {
    transfer("shm", "12");
}

#[test]
fn shm_v8() {
    transfer("shm", "8");
}

// tcp;ofi_rxm and shm need no registration; these runs register every buffer
// anyway (with requested keys, as without FI_MR_PROV_KEY), the path EFA takes.
#[test]
fn tcp_v12_registered() {
    transfer_with(
        "tcp;ofi_rxm",
        "12",
        &[("CCLKIT_OFI_REGISTER_HOST", "1")],
        None,
    );
}

#[test]
fn shm_v8_registered_without_cache() {
    transfer_with(
        "shm",
        "8",
        &[
            ("CCLKIT_OFI_REGISTER_HOST", "1"),
            ("CCLKIT_OFI_MR_CACHE", "0"),
        ],
        None,
    );
}

/// A tiny send queue (4 entries under 32 requests in flight) makes sends and
/// bundles fail with -FI_EAGAIN; they must wait in the backlog and arrive intact.
#[test]
fn tcp_v12_full_send_queue_with_bundles() {
    transfer_with(
        "tcp;ofi_rxm",
        "12",
        &[("FI_OFI_RXM_TX_SIZE", "4"), ("NCCL_DEBUG", "INFO")],
        Some(some_post_waited),
    );
}

/// A receive queue just large enough for one comm's bundle receives (32: they
/// take 8) under 32 requests in flight, grouped ones of 4 buffers among them:
/// NCCL's receives wait for room next to the standing bundle receives, and
/// bundles still flow.
#[test]
fn tcp_v12_small_receive_queue_with_bundles() {
    transfer_with(
        "tcp;ofi_rxm",
        "12",
        &[("FI_OFI_RXM_RX_SIZE", "32"), ("NCCL_DEBUG", "INFO")],
        Some(some_post_waited),
    );
}

/// Fails unless a post waited for room in the provider's queues, as both
/// processes logged their counts when closing (`NCCL_DEBUG=INFO`).
fn some_post_waited(logs: &[String; 2]) {
    let waited: u64 = logs
        .iter()
        .flat_map(|l| l.lines())
        .filter_map(|l| {
            let head = &l[..l.find(" posts waited for room")?];
            head.rsplit(' ').next()?.parse::<u64>().ok()
        })
        .sum();
    assert!(
        waited > 0,
        "no post waited for room in the provider's queues:\n{}",
        logs.join("\n")
    );
}

/// Tiny provider queues (4 entries under 32 requests in flight) make posts fail
/// with -FI_EAGAIN; they must wait in the backlog and still arrive intact. (The
/// receive queue is too small for bundles, which then stay off.)
#[test]
fn tcp_v12_full_queues() {
    transfer_with(
        "tcp;ofi_rxm",
        "12",
        &[
            ("FI_OFI_RXM_TX_SIZE", "4"),
            ("FI_OFI_RXM_RX_SIZE", "4"),
            ("NCCL_DEBUG", "INFO"),
        ],
        Some(some_post_waited),
    );
}
