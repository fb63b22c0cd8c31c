//! Test and benchmark peer for cclkit-net-ofi.
//!
//! It links the plugin's rlib and drives the exported `ncclNetPlugin_v8` /
//! `ncclNetPlugin_v12` statics through `cclkit-host`'s adapters, as NCCL drives
//! them. The integration tests and the benchmark start two of these and relay their
//! listen handles (`HANDLE <hex>` on stdout → `PEER <hex>` on stdin). It is an
//! example, not a binary, so that it may use the host (a dev-dependency): `cargo
//! test -p cclkit-net-ofi` builds it into `target/<profile>/examples/`.
//!
//! ```text
//! cclkit-ofi-peer transfer <8|12> <send|recv> <seed> <rounds>
//! cclkit-ofi-peer death    <8|12> <victim|survivor>
//! cclkit-ofi-peer idle     <8|12> <idler|waiter> <idle_ms>
//! cclkit-ofi-peer loopback <8|12> <seed> [truncate] [bundles] [writes] [large]
//! cclkit-ofi-peer limits   <8|12> <seed> [nobundles]
//! cclkit-ofi-peer nodev
//! cclkit-ofi-peer stream   <8|12> <send|recv> <size> <iters> <window>
//! cclkit-ofi-peer mixed    <send|recv> <provider> <size> <count> <rounds>
//! cclkit-ofi-peer settled  <8|12> <send|recv> <seed>
//! ```
//! Exit status 0 = success; failures print `FAIL <reason>` and exit 1.

mod bundles;
mod flows;
mod limits;
mod mixed;
mod net;
mod pattern;
mod quiet;
mod scenarios;
mod settled;
mod slots;
mod stream;
mod tcp;
mod writes;

use net::{Abi, R};

fn abi(s: Option<&String>) -> R<Abi> {
    match s.map(String::as_str) {
        Some("8") => Ok(Abi::V8),
        Some("12") => Ok(Abi::V12),
        other => Err(format!("abi must be 8 or 12, got {other:?}")),
    }
}

fn num(s: Option<&String>, what: &str) -> R<u64> {
    s.ok_or(format!("missing {what}"))?
        .parse()
        .map_err(|e| format!("{what}: {e}"))
}

fn run(args: &[String]) -> R<()> {
    match args.first().map(String::as_str) {
        Some("transfer") => scenarios::transfer(
            abi(args.get(1))?,
            args.get(2).map(String::as_str) == Some("send"),
            num(args.get(3), "seed")?,
            num(args.get(4), "rounds")? as usize,
        ),
        Some("death") => scenarios::death(
            abi(args.get(1))?,
            args.get(2).map(String::as_str) == Some("victim"),
        ),
        Some("idle") => scenarios::idle(
            abi(args.get(1))?,
            args.get(2).map(String::as_str) == Some("idler"),
            num(args.get(3), "idle_ms")?,
        ),
        Some("loopback") => scenarios::loopback(
            abi(args.get(1))?,
            num(args.get(2), "seed")?,
            args[3..].iter().any(|a| a == "truncate"),
            args[3..].iter().any(|a| a == "bundles"),
            args[3..].iter().any(|a| a == "writes"),
            args[3..].iter().any(|a| a == "large"),
        ),
        Some("limits") => limits::check(
            abi(args.get(1))?,
            num(args.get(2), "seed")?,
            args.get(3).map(String::as_str) != Some("nobundles"),
        ),
        Some("nodev") => scenarios::nodev(),
        Some("stream") => scenarios::stream(
            abi(args.get(1))?,
            args.get(2).map(String::as_str) == Some("send"),
            num(args.get(3), "size")? as usize,
            num(args.get(4), "iters")? as usize,
            num(args.get(5), "window")? as usize,
        ),
        Some("mixed") => mixed::mixed_peer(&args[1..]),
        Some("settled") => settled::settled(
            abi(args.get(1))?,
            args.get(2).map(String::as_str) == Some("send"),
            num(args.get(3), "seed")?,
        ),
        other => Err(format!("unknown scenario {other:?}")),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => flows::say("OK"),
        Err(e) => {
            flows::say(&format!("FAIL {e}"));
            std::process::exit(1);
        }
    }
}
