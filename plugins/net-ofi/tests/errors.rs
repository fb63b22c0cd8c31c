//! Failure paths: init with no usable provider, a peer that dies mid-transfer,
//! an idle peer, truncation, and one process connected to itself (two threads on
//! one connection, four comm pairs busy at once with the same NCCL tags on one
//! endpoint, closing comms with requests in flight), on `tcp;ofi_rxm` and `shm`.

mod common;

use std::time::{Duration, Instant};

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

fn peer_death(provider: &str, proc_check: bool) {
    let mut env = provider_env(provider);
    if !proc_check {
        env.push(("CCLKIT_OFI_LIVENESS_PROC", "0".to_owned()));
        // Pings count as lost after 10 intervals: 3 s here.
        env.push(("CCLKIT_OFI_LIVENESS_MS", "300".to_owned()));
    }
    let (mut victim, mut survivor) = pair(
        ("victim", &["death", "12", "victim"]),
        ("survivor", &["death", "12", "survivor"]),
        &env,
    );
    let t = Duration::from_secs(30);
    victim.expect("READY", t);
    survivor.expect("WAITING", t);
    let killed = Instant::now();
    victim.kill();
    let first = survivor.expect("PEER-ERROR ", t);
    let second = survivor.expect("PEER-ERROR ", t);
    let took = killed.elapsed();
    let log = survivor.finish(t);
    eprintln!("{provider}: {took:?}: {first} / {second}\n{log}");
    assert!(
        log.contains(if proc_check {
            "peer process"
        } else {
            "peer unreachable"
        }),
        "the errors do not say the peer died:\n{log}"
    );
    // Liveness checks start after 1 s without progress (CCLKIT_OFI_LIVENESS_MS).
    assert!(
        took < Duration::from_secs(10),
        "errors took {took:?}: {first} / {second}"
    );
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
    let mut env = provider_env(provider);
    env.push(("CCLKIT_OFI_LIVENESS_PROC", "0".to_owned()));
    env.push(("CCLKIT_OFI_LIVENESS_MS", "200".to_owned()));
    // 5 s idle = 25 liveness intervals, 2.5 × the ping patience.
    let (mut idler, mut waiter) = pair(
        ("idler", &["idle", "12", "idler", "0"]),
        ("waiter", &["idle", "12", "waiter", "5000"]),
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

fn loopback(provider: &str, abi: &str, truncate: bool) {
    let seed = rand::random::<u32>().to_string();
    let mut args = vec!["loopback", abi, &seed];
    if truncate {
        args.push("truncate");
    }
    let mut p = Peer::spawn("loopback", &args, &provider_env(provider));
    if truncate {
        p.expect("TRUNCATED", Duration::from_secs(60));
    }
    p.finish(Duration::from_secs(60));
}

#[test]
fn tcp_loopback_threads_truncation_and_close_in_flight() {
    loopback("tcp;ofi_rxm", "12", true);
}

#[test]
fn shm_loopback_threads_and_close_in_flight() {
    loopback("shm", "8", false);
}
