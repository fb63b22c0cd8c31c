//! Two-process transfers: the test binary re-executes itself twice (one process per
//! side), relays the 128-byte handles between them, and checks both sides' bytes.
//! Also: a peer killed mid-transfer makes the survivor's request fail, promptly.

mod common;

use std::time::Duration;

use common::machine::ensure_ipv6_on_lo;
use common::roles::{exchange_pair, kill_mid_transfer};
use common::{Ver, child, roles, seed};

/// Runs the child role if this process is one; true means "return now".
fn as_child() -> bool {
    match child::role() {
        Some(role) => {
            roles::run(&role);
            true
        }
        None => false,
    }
}

/// How long a survivor may take to see its peer's death (it has no timeout to wait
/// for: the closed sockets tell it at once, so this only bounds a hang).
const KILL_BOUND: Duration = Duration::from_secs(60);

fn env(pairs: &[(&str, &str)]) -> Vec<(&'static str, String)> {
    pairs
        .iter()
        .map(|(k, v)| (String::leak(k.to_string()) as &str, v.to_string()))
        .collect()
}

#[test]
fn two_process_v12_with_v8_default_config() {
    if as_child() {
        return;
    }
    exchange_pair(
        "two_process_v12_with_v8_default_config",
        [Ver::V12, Ver::V8],
        [&[], &[]],
        [&[], &[]],
        seed(),
    );
}

#[test]
fn two_process_grouped_receives_v11_with_v12() {
    if as_child() {
        return;
    }
    let e = env(&[
        ("CCLKIT_SOCKET_MAX_RECVS", "8"),
        ("CCLKIT_TEST_GROUPED", "5"),
    ]);
    exchange_pair(
        "two_process_grouped_receives_v11_with_v12",
        [Ver::V11, Ver::V12],
        [&e, &e],
        [&[], &[]],
        seed(),
    );
}

#[test]
fn two_process_control_stream_only_ungrouped() {
    if as_child() {
        return;
    }
    // No helper threads: every payload rides on the control stream (NCCL's default
    // shape), and plain in-order receives without clear-to-send records.
    let e = env(&[
        ("NCCL_SOCKET_NTHREADS", "0"),
        ("CCLKIT_SOCKET_MAX_RECVS", "1"),
    ]);
    exchange_pair(
        "two_process_control_stream_only_ungrouped",
        [Ver::V11, Ver::V11],
        [&e, &e],
        [&[], &[]],
        seed(),
    );
}

#[test]
fn two_process_eight_streams_everything_striped() {
    if as_child() {
        return;
    }
    // 4 threads × 2 sockets, nothing inline, smallest chunks: every non-empty message
    // is striped, and one side runs ungrouped while the other is grouped.
    let striped = [
        ("NCCL_SOCKET_NTHREADS", "4"),
        ("NCCL_NSOCKS_PERTHREAD", "2"),
        ("NCCL_SOCKET_INLINE", "0"),
        ("NCCL_SOCKET_MIN_TASKSIZE", "4096"),
    ];
    let mut a = env(&striped);
    a.extend(env(&[("CCLKIT_SOCKET_MAX_RECVS", "8")]));
    let b = env(&striped);
    exchange_pair(
        "two_process_eight_streams_everything_striped",
        [Ver::V12, Ver::V12],
        [&a, &b],
        [&[], &[]],
        seed(),
    );
}

#[test]
fn peer_killed_while_receiving_fails_the_sender() {
    if as_child() {
        return;
    }
    kill_mid_transfer(
        "peer_killed_while_receiving_fails_the_sender",
        ["survivor-send", "victim-recv"],
        "SENT",
        seed(),
        KILL_BOUND,
    );
}

#[test]
fn peer_killed_while_sending_fails_the_receiver() {
    if as_child() {
        return;
    }
    kill_mid_transfer(
        "peer_killed_while_sending_fails_the_receiver",
        ["victim-send", "survivor-recv"],
        "GOT",
        seed(),
        KILL_BOUND,
    );
}

#[test]
fn two_process_ipv6_loopback() {
    if as_child() {
        return;
    }
    // No IPv6 on lo: enabled when root (CI), else the test fails saying how to fix it.
    if let Err(why) = ensure_ipv6_on_lo() {
        panic!("two_process_ipv6_loopback cannot run: {why}");
    }
    // Asked-for loopback, IPv6 only: also shows `lo` is used when requested.
    let e = env(&[
        ("NCCL_SOCKET_IFNAME", "=lo"),
        ("NCCL_SOCKET_FAMILY", "AF_INET6"),
    ]);
    let devs = exchange_pair(
        "two_process_ipv6_loopback",
        [Ver::V12, Ver::V11],
        [&e, &e],
        [&[], &[]],
        seed(),
    );
    assert_eq!(devs, ["lo".to_owned(), "lo".to_owned()]);
}
