//! Grouped receives (`CCLKIT_SOCKET_MAX_RECVS=8`) in-process through every table:
//! clear-to-send records, matching by tag, and truncation seen by both sides.

mod common;

use std::sync::Once;
use std::time::Duration;

use cclkit_abi::raw::common::NcclResult;
use common::script::{exchange, grouped, singles};
use common::{Plugin, SIZES, Ver, seed, truncate};

const LONG: Duration = Duration::from_secs(60);

/// Every test calls this before the plugin's first `init` in this process.
fn setup() {
    static ONCE: Once = Once::new();
    // SAFETY: runs once, before any test thread of this binary reads the environment
    // (they all wait here first).
    ONCE.call_once(|| unsafe { std::env::set_var("CCLKIT_SOCKET_MAX_RECVS", "8") });
}

#[test]
fn properties_report_eight_receives() {
    setup();
    for ver in Ver::ALL {
        assert_eq!(Plugin::open(ver).properties(0).unwrap().max_recvs, 8);
    }
}

#[test]
fn grouped_receives_match_by_tag() {
    setup();
    let s = seed();
    for (ver, n) in [(Ver::V12, 8), (Ver::V11, 3), (Ver::V8, 4)] {
        let p = Plugin::open(ver);
        let (send, recv) = p.pair(0);
        exchange(&p, send, recv, &grouped(24, n, s), s, 0, 0, 32, LONG);
        // Single receives still work on a grouped comm.
        exchange(&p, send, recv, &singles(&SIZES), s, 0, 0, 32, LONG);
        p.close_send(send);
        p.close_recv(recv);
    }
}

#[test]
fn truncation_fails_both_sides_and_the_stream_stays_in_sync() {
    setup();
    let s = seed();
    for ver in Ver::ALL {
        let p = Plugin::open(ver);
        let (send, recv) = p.pair(0);
        for (cap, len) in [(10, 100), (64 << 10, 3 << 20), (0, 1)] {
            let (r, snd) = truncate(&p, send, recv, cap, len);
            assert_eq!(
                r,
                NcclResult::INVALID_USAGE,
                "{len} bytes into {cap}: receive"
            );
            // The sender learns the receive size from the clear-to-send record.
            assert_eq!(
                snd,
                NcclResult::INVALID_USAGE,
                "{len} bytes into {cap}: send"
            );
            exchange(&p, send, recv, &singles(&[7, 1 << 20]), s, 0, 0, 4, LONG);
        }
        p.close_send(send);
        p.close_recv(recv);
    }
}
