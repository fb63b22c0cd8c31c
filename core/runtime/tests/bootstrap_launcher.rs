//! The local launcher (`--np`) on hostile ranks (issue 16): it returns as soon as a
//! rank fails, names the first failed rank and how, tells apart the ranks it stopped,
//! and never counts a rank that exited 0 without doing its job as a success.
//!
//! The ranks are small shell scripts: they speak the launcher's report protocol
//! (`ready`, `result N` on `$CCLKIT_REPORT_FD`) exactly as a cclkit rank does.

use std::path::Path;
use std::time::{Duration, Instant};

use cclkit_runtime::launch::{LocalOptions, RankExit, failures, run_local_with};

/// Runs `np` ranks of `sh -c script` (the script sees `$CCLKIT_RANK`).
fn run(
    np: usize,
    script: &str,
    timeout: Duration,
    require_result: bool,
) -> (Vec<RankExit>, Duration) {
    let o = LocalOptions {
        timeout,
        grace: Duration::from_millis(300),
        require_result,
    };
    let t = Instant::now();
    let args = vec!["-c".to_string(), script.to_string()];
    let exits = run_local_with(np, Path::new("/bin/sh"), &args, &o).unwrap();
    (exits, t.elapsed())
}

/// `/proc/self/fd/N`: dash cannot redirect to descriptors above 9.
const READY: &str = "echo ready > /proc/self/fd/$CCLKIT_REPORT_FD";

#[test]
fn the_first_failed_rank_is_named_and_the_others_are_stopped_at_once() {
    let script = format!(
        "{READY}; if [ $CCLKIT_RANK = 2 ]; then echo 'rank 2: bad thing happened' >&2; exit 3; fi; exec sleep 60"
    );
    let (exits, took) = run(4, &script, Duration::from_secs(30), true);
    assert!(took < Duration::from_secs(10), "{took:?}");
    let why = failures(&exits).unwrap();
    assert!(
        why.starts_with("rank 2 exited with 3 first; its last line: rank 2: bad thing happened"),
        "{why}"
    );
    assert!(why.contains("stopped rank(s) 0, 1, 3"), "{why}");
    assert!(exits.iter().filter(|e| e.rank != 2).all(|e| e.stopped));
}

#[test]
fn a_rank_killed_by_a_signal_is_told_apart_from_those_the_launcher_killed() {
    let script = format!("{READY}; if [ $CCLKIT_RANK = 1 ]; then kill -9 $$; fi; exec sleep 60");
    let (exits, took) = run(4, &script, Duration::from_secs(30), true);
    assert!(took < Duration::from_secs(10), "{took:?}");
    let why = failures(&exits).unwrap();
    assert!(
        why.starts_with("rank 1 was killed by signal 9 first"),
        "{why}"
    );
    assert!(why.contains("stopped rank(s) 0, 2, 3"), "{why}");
}

#[test]
fn exit_0_without_joining_or_without_a_result_is_a_failure() {
    // A plugin constructor calling _exit(0) looks like this: no `ready`, status 0.
    let (exits, _) = run(2, "exit 0", Duration::from_secs(30), false);
    let why = failures(&exits).unwrap();
    assert!(
        why.contains("exited with 0 (exited 0 without joining"),
        "{why}"
    );
    // Joined, but ended before its result.
    let (exits, _) = run(
        1,
        &format!("{READY}; exit 0"),
        Duration::from_secs(30),
        true,
    );
    let why = failures(&exits).unwrap();
    assert!(why.contains("without reporting a result"), "{why}");
    // Everything reported: success.
    let script = format!("{READY}; echo 'result 0' > /proc/self/fd/$CCLKIT_REPORT_FD; exit 0");
    let (exits, _) = run(3, &script, Duration::from_secs(30), true);
    assert_eq!(failures(&exits), None, "{exits:?}");
    assert!(exits.iter().all(|e| e.ready && e.result == Some(0)));
}

#[test]
fn a_rank_that_never_joins_is_killed_at_the_join_deadline() {
    // A constructor that never returns: the rank never says `ready`.
    let (exits, took) = run(2, "exec sleep 120", Duration::from_secs(1), true);
    assert!(took < Duration::from_secs(12), "{took:?}");
    let why = failures(&exits).unwrap();
    assert!(
        why.contains("did not join its communicator within"),
        "{why}"
    );
}

#[test]
fn a_rank_count_outside_the_limit_is_refused() {
    let o = LocalOptions {
        timeout: Duration::from_secs(1),
        grace: Duration::from_secs(1),
        require_result: false,
    };
    for np in [0, cclkit_runtime::launch::MAX_RANKS + 1] {
        let e = run_local_with(np, Path::new("/bin/true"), &[], &o).unwrap_err();
        assert!(e.message().contains("--np"), "{e}");
    }
}
