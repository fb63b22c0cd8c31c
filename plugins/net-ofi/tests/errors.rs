//! Failure paths: init with no usable provider, a peer that dies mid-transfer,
//! an idle peer, truncation, and one process connected to itself (two threads on
//! one connection, four comm pairs busy at once with the same NCCL tags on one
//! endpoint, closing comms with requests in flight; the engine at its limits), on
//! `tcp;ofi_rxm` and `shm`.

mod common;

use std::time::Duration;

use common::{Peer, pair, provider_env};

#[test]
fn no_provider_fails_init_and_names_the_providers_seen() {
    let mut p = Peer::spawn(
        "nodev",
        &["nodev"],
        &[("CCLKIT_OFI_PROVIDER", "no-such-provider".to_owned())],
    );
    let msg = p.expect("INIT-ERROR ", Duration::from_secs(30));
    assert!(msg.contains("no usable libfabric provider"), "{msg}");
    assert!(
        msg.contains("CCLKIT_OFI_PROVIDER=no-such-provider"),
        "{msg}"
    );
    // Debian's libfabric always offers these two here.
    assert!(msg.contains("tcp;ofi_rxm") && msg.contains("shm"), "{msg}");
    p.finish(Duration::from_secs(30));
}

#[test]
fn sockets_is_never_chosen_by_default() {
    // FI_PROVIDER (honoured by libfabric itself) leaves only `sockets`.
    let mut p = Peer::spawn(
        "nodev",
        &["nodev"],
        &[("FI_PROVIDER", "sockets".to_owned())],
    );
    let msg = p.expect("INIT-ERROR ", Duration::from_secs(30));
    assert!(msg.contains("[sockets]"), "{msg}");
    p.finish(Duration::from_secs(30));
}

/// Liveness intervals a ping may stay incomplete before the peer counts as gone
/// (the plugin's `PING_PATIENCE`, documented in its engine).
const PING_PATIENCE: u64 = 10;

/// How long a survivor may take to report its peer's death: the plugin's own checks
/// decide when (and the message says which one fired, checked below); this bound,
/// about 10 × the slowest detection configured here, only keeps a hang from lasting.
const DETECT_BOUND: Duration = Duration::from_secs(30);

fn peer_death(provider: &str, proc_check: bool) {
    let mut env = provider_env(provider);
    // Without the /proc check only pings can tell: lost after PING_PATIENCE intervals.
    let ping_ms = 300;
    if !proc_check {
        env.push(("CCLKIT_OFI_LIVENESS_PROC", "0".to_owned()));
        env.push(("CCLKIT_OFI_LIVENESS_MS", ping_ms.to_string()));
    }
    let (mut victim, mut survivor) = pair(
        ("victim", &["death", "12", "victim"]),
        ("survivor", &["death", "12", "survivor"]),
        &env,
    );
    let t = Duration::from_secs(30);
    victim.expect("READY", t);
    survivor.expect("WAITING", t);
    victim.kill();
    let first = survivor.expect("PEER-ERROR ", DETECT_BOUND);
    let second = survivor.expect("PEER-ERROR ", DETECT_BOUND);
    let log = survivor.finish(t);
    eprintln!("{provider}: {first} / {second}\n{log}");
    // The errors name the check that fired. Same host: the /proc check. Pings only:
    // the ping failed outright, or it stayed incomplete for the configured patience,
    // which the plugin measures and states (a send may also fail by itself, with the
    // provider's error).
    assert!(
        log.contains(if proc_check {
            "peer process"
        } else {
            "peer unreachable"
        }),
        "the errors do not say the peer died:\n{log}"
    );
    let patience = Duration::from_millis(ping_ms * PING_PATIENCE);
    let mut stated = 0;
    for line in log.lines() {
        if let Some(after) = ping_wait(line) {
            stated += 1;
            assert!(
                after >= patience,
                "declared dead after {after:?}, before the {patience:?} patience: {line}"
            );
        }
    }
    if !proc_check {
        eprintln!(
            "{provider}: {stated} incomplete-ping verdict(s), each after {patience:?} or more"
        );
    }
}

/// The wait an "incomplete ping" error states ("… not completed after 3.1s"), if any.
fn ping_wait(error: &str) -> Option<Duration> {
    let rest = error.split("not completed after ").nth(1)?;
    let num: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let value: f64 = num.parse().ok()?;
    let unit = &rest[num.len()..];
    let secs = if unit.starts_with("ms") {
        value / 1e3
    } else if unit.starts_with("µs") {
        value / 1e6
    } else if unit.starts_with('s') {
        value
    } else {
        return None;
    };
    Some(Duration::from_secs_f64(secs))
}

#[test]
fn tcp_peer_death_is_an_error() {
    peer_death("tcp;ofi_rxm", true);
}

#[test]
fn tcp_peer_death_without_proc_check_is_an_error() {
    // What a peer on another host gets: provider errors and the liveness ping.
    peer_death("tcp;ofi_rxm", false);
}

#[test]
fn shm_peer_death_is_an_error() {
    peer_death("shm", true);
}

fn idle_peer(provider: &str) {
    // The property: a live peer that sends nothing for longer than the ping patience
    // is not declared dead. The waiter measures its own idle time and idles 2.5 ×
    // the patience, so pings are due many times over; what a ping needs from a live
    // peer's host (a socket or shared-memory write) takes nowhere near the patience.
    let interval_ms: u64 = 200;
    let idle_ms = interval_ms * PING_PATIENCE * 5 / 2;
    let mut env = provider_env(provider);
    env.push(("CCLKIT_OFI_LIVENESS_PROC", "0".to_owned()));
    env.push(("CCLKIT_OFI_LIVENESS_MS", interval_ms.to_string()));
    let idle = idle_ms.to_string();
    let (mut idler, mut waiter) = pair(
        ("idler", &["idle", "12", "idler", "0"]),
        ("waiter", &["idle", "12", "waiter", &idle]),
        &env,
    );
    let t = Duration::from_secs(30);
    idler.expect("READY", t);
    waiter.expect("IDLED", t);
    idler.tell("GO");
    let log = waiter.finish(t);
    assert!(
        !log.contains("LOG 2"),
        "warnings while the peer idled:\n{log}"
    );
    idler.finish(t);
}

#[test]
fn tcp_idle_peer_is_not_declared_dead() {
    idle_peer("tcp;ofi_rxm");
}

#[test]
fn shm_idle_peer_is_not_declared_dead() {
    idle_peer("shm");
}

/// A send `test` reported done needs no later call: NCCL's proxy makes none
/// once its requests are done. The sender goes silent after a burst whose sends
/// each queued behind the one before (`settled.rs` of the peer); the receiver,
/// which starts reading only then, must still get every byte.
fn settled(provider: &str, extra: &[(&'static str, &str)]) {
    let seed = rand::random::<u32>().to_string();
    let mut env = provider_env(provider);
    env.extend(extra.iter().map(|&(k, v)| (k, v.to_owned())));
    let (mut sender, mut receiver) = pair(
        ("sender", &["settled", "12", "send", &seed]),
        ("receiver", &["settled", "12", "recv", &seed]),
        &env,
    );
    let t = Duration::from_secs(30);
    sender.expect("SENT", t);
    // The receiver posts on `GO` or after its own delay; it may be done already.
    receiver.hint("GO");
    receiver.expect("RECEIVED", t);
    receiver.finish(t);
    sender.finish(t);
}

#[test]
fn tcp_sends_done_need_no_later_call() {
    settled("tcp;ofi_rxm", &[]);
}

/// The same on shm, with bundles and writes (so bundle slots) forced on.
#[test]
fn shm_sends_done_need_no_later_call() {
    settled(
        "shm",
        &[
            ("CCLKIT_OFI_WRITE_BYTES", "16385-131071"),
            ("CCLKIT_OFI_BUNDLE_BYTES", "16128"),
        ],
    );
}

fn loopback(provider: &str, abi: &str, truncate: bool) {
    let seed = rand::random::<u32>().to_string();
    let mut args = vec!["loopback", abi, &seed];
    if truncate {
        // tcp: also the bundles and the writes, on by default there
        // (bundles.rs and writes.rs of the peer).
        args.extend(["truncate", "bundles", "writes"]);
    }
    let mut env = provider_env(provider);
    if truncate {
        env.push(("CCLKIT_OFI_OFFER_WAIT_US", OFFER_WAIT_US.to_owned()));
    }
    let mut p = Peer::spawn("loopback", &args, &env);
    // `test` of an already completed request makes no CQ read (quiet.rs).
    p.expect("QUIET ok", Duration::from_secs(60));
    if truncate {
        p.expect("BUNDLE TRUNCATED", Duration::from_secs(60));
        p.expect("BUNDLES ok", Duration::from_secs(60));
        p.expect("SLOTS ok", Duration::from_secs(60));
        p.expect("WRITES ok", Duration::from_secs(60));
        p.expect("TRUNCATED", Duration::from_secs(60));
    }
    p.finish(Duration::from_secs(60));
}

/// The `loopback` scenario on `provider` with `extra` settings and `flags`,
/// expecting `checks` (each check's `... ok` line) in order.
fn loopback_checks(
    provider: &str,
    extra: &[(&'static str, &str)],
    flags: &[&str],
    checks: &[&str],
) {
    let seed = rand::random::<u32>().to_string();
    let mut env = provider_env(provider);
    env.extend(extra.iter().map(|&(k, v)| (k, v.to_owned())));
    if flags.contains(&"writes") {
        env.push(("CCLKIT_OFI_OFFER_WAIT_US", OFFER_WAIT_US.to_owned()));
    }
    let mut args = vec!["loopback", "12", &seed];
    args.extend_from_slice(flags);
    let mut p = Peer::spawn("loopback", &args, &env);
    for check in checks {
        p.expect(&format!("{check} ok"), Duration::from_secs(60));
    }
    p.finish(Duration::from_secs(60));
}

/// The writes check's longest wait for an offer (every run of writes.rs of the
/// peer sets it): long enough that a wait for an
/// offer that comes never runs out on a slow or busy machine (a debug build's
/// waits ran past the default bound and made the check fail now and then),
/// short enough that the never-offered sends, which wait it out until the
/// connection stops waiting (about 6 of them), take about a second.
const OFFER_WAIT_US: &str = "200000";

/// The write path on shm, forced on with tcp's default range: its addresses are
/// virtual addresses (`FI_MR_VIRT_ADDR`), where tcp's are offsets.
#[test]
fn shm_loopback_writes() {
    let range = [("CCLKIT_OFI_WRITE_BYTES", "16385-131071")];
    loopback_checks("shm", &range, &["writes"], &["WRITES"]);
}

/// Writes past what the old 24-bit length field could say, the range set to
/// reach them (by default only where the TCP congestion control is not BBR):
/// a send of 16 MiB + 4,099 bytes lands as one write of its exact size.
#[test]
fn tcp_loopback_large_writes() {
    let range = [("CCLKIT_OFI_WRITE_BYTES", "16385-268435455")];
    loopback_checks("tcp;ofi_rxm", &range, &["writes", "large"], &["WRITES"]);
}

/// Bundle slots on shm, with bundles and writes forced on (both are off there
/// by default): slot addresses are virtual addresses, as on the write path.
#[test]
fn shm_loopback_slots() {
    let forced = [
        ("CCLKIT_OFI_WRITE_BYTES", "16385-131071"),
        ("CCLKIT_OFI_BUNDLE_BYTES", "16128"),
    ];
    let flags = ["bundles", "writes"];
    loopback_checks("shm", &forced, &flags, &["BUNDLES", "SLOTS", "WRITES"]);
}

#[test]
fn tcp_loopback_threads_truncation_and_close_in_flight() {
    loopback("tcp;ofi_rxm", "12", true);
}

#[test]
fn shm_loopback_threads_and_close_in_flight() {
    loopback("shm", "8", false);
}

/// The engine at its limits (limits.rs of the peer), in one process connected
/// to itself: an open bundle goes out on its time bound while a rendezvous it
/// waited for cannot complete; NCCL's receives leave the bundle buffers room in
/// a full receive queue; a comm accepted into a full queue posts its bundle
/// receives once there is room; sends go out while receives wait for room (they
/// once waited behind them for good).
#[test]
fn tcp_limits_bundle_time_bound_and_full_receive_queue() {
    // Writes off: the scenario's arithmetic gives the standing-receive budget
    // to two comms' bundle buffers, and a writing send comm's offer receives
    // would take a share of it. The SAR limit makes the 40 KB send a rendezvous
    // on every libfabric (2.x's `ofi_rxm` completes a segmented send of that
    // size before its receive is posted).
    limits(
        &[
            ("CCLKIT_OFI_BUNDLE_BYTES", "65536"),
            ("CCLKIT_OFI_WRITE_BYTES", "0"),
            ("FI_OFI_RXM_SAR_LIMIT", "16384"),
        ],
        false,
    );
}

/// Sends go out while receives wait for room, without bundles (writes on, as
/// by default: their offer receives stand in the full queue too).
#[test]
fn tcp_limits_full_receive_queue_without_bundles() {
    limits(&[("CCLKIT_OFI_BUNDLE_BYTES", "0")], true);
}

fn limits(extra: &[(&'static str, &str)], nobundles: bool) {
    let seed = rand::random::<u32>().to_string();
    let mut env = provider_env("tcp;ofi_rxm");
    env.push(("FI_OFI_RXM_RX_SIZE", "64".to_owned()));
    env.extend(extra.iter().map(|&(k, v)| (k, v.to_owned())));
    let mut args = vec!["limits", "12", &seed];
    if nobundles {
        args.push("nobundles");
    }
    let mut p = Peer::spawn("limits", &args, &env);
    p.expect("LIMITS ok", Duration::from_secs(60));
    p.finish(Duration::from_secs(60));
}
