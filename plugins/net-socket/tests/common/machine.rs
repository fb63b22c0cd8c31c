//! What a test needs from the machine, and how it says so when the machine cannot give
//! it: a test that cannot run either fails with the reason or records a skip that
//! `make test` lists (tests/skips.sh), never a silent pass.

use std::io::Write;
use std::time::{Duration, Instant};

// Not every test file that includes this module records skips.
#[allow(unused_imports)]
pub use cclkit_tests::{is_root, skip};

/// Whether `lo` has an IPv6 address (`/proc/net/if_inet6` lists one).
fn lo_has_ipv6() -> bool {
    std::fs::read_to_string("/proc/net/if_inet6")
        .is_ok_and(|s| s.lines().any(|l| l.split_whitespace().last() == Some("lo")))
}

/// The sysctl that turns IPv6 off on `lo`.
const LO_DISABLE_IPV6: &str = "/proc/sys/net/ipv6/conf/lo/disable_ipv6";

/// Makes sure `lo` has an IPv6 address: when it has none and this process is root,
/// enables IPv6 on `lo` (`sysctl -w net.ipv6.conf.lo.disable_ipv6=0`, left on) and
/// waits for `::1` to appear. `Err` says why IPv6 on `lo` cannot be had.
pub fn ensure_ipv6_on_lo() -> Result<(), String> {
    if lo_has_ipv6() {
        return Ok(());
    }
    if !std::path::Path::new(LO_DISABLE_IPV6).exists() {
        return Err(format!(
            "no IPv6 address on lo and no {LO_DISABLE_IPV6}: the kernel runs without IPv6 \
             (ipv6.disable=1?)"
        ));
    }
    if !is_root() {
        return Err("no IPv6 address on lo, and enabling it needs root: run \
             `sysctl -w net.ipv6.conf.lo.disable_ipv6=0` as root"
            .to_owned());
    }
    std::fs::write(LO_DISABLE_IPV6, "0")
        .map_err(|e| format!("cannot enable IPv6 on lo ({LO_DISABLE_IPV6}): {e}"))?;
    let note = "cclkit-note: enabled IPv6 on lo (net.ipv6.conf.lo.disable_ipv6=0)\n";
    let _ = std::io::stderr().write_all(note.as_bytes());
    // The kernel adds ::1 when the sysctl flips; wait for it (bounded).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lo_has_ipv6() {
        if Instant::now() > deadline {
            let state = std::fs::read_to_string("/sys/class/net/lo/operstate")
                .unwrap_or_else(|e| e.to_string());
            return Err(format!(
                "IPv6 enabled on lo but no address appeared within 10 s (lo is {})",
                state.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
