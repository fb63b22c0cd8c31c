//! Stream benchmark: cclkit-ofi (driven through `ncclNetPlugin_v12`) against a
//! raw libfabric tagged stream written here, in the same two processes, same
//! provider, sizes, window (8, NCCL_STEPS) and registration rule.
//!
//! ```text
//! cargo build --release -p cclkit-net-ofi --example cclkit-ofi-peer
//! cargo bench -p cclkit-net-ofi --bench ofi_stream \
//!     [-- --quick] [--provider 'tcp;ofi_rxm'] [--sizes-kib 4,64,1024] [--rounds 41]
//!     [--cc cubic]
//! ```
//! Default sizes: 4 KiB (bundled), 12 KiB (bundled, into the receiver's bundle
//! slots), 32 and 64 KiB (written), 512 KiB, 1 MiB, 4 MiB, 16 MiB.
//! The two processes are `cclkit-ofi-peer mixed` (its `mixed.rs`); this file only
//! starts them, relays their addresses and prints the table. Each process opens both a plugin connection and a raw endpoint, then runs
//! bursts of about 64 MiB alternately on each (41 rounds, alternating which goes
//! first). On a shared machine the load changes from second to second; bursts
//! this short and this interleaved see the same load on both sides. A burst ends
//! with the receiver's one-byte reply. Both sides yield the CPU after a pass
//! without progress, as NCCL's proxy thread does. The last column is the share of
//! the plugin's sends that travelled in bundles (`src/bundle.rs`) and how many a
//! bundle carried.
//!
//! The table also shows, from the same rounds, the kernel's one-way TCP stream
//! (one `write` per message): not a baseline, but what the machine's TCP stack
//! gives traffic of the shape of the plugin's RMA writes. The first line names the
//! TCP congestion control in effect. `--cc ALGO` (root) runs both processes in a
//! private network namespace whose congestion control is ALGO, leaving the
//! machine's setting alone: with BBR, this kernel's default, one-way loopback
//! streams fall into a slow state now and then (docs/PERFORMANCE.md, "Twelfth
//! pass"), which `--cc cubic` (Linux's usual default) shows apart.
//! A namespace left by a killed run (named after its PID) is deleted by the
//! next `--cc` run.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

/// The peer, the package's `cclkit-ofi-peer` example; its `mixed` scenario is one
/// side of this benchmark. `cargo bench` does not build examples, so a missing peer
/// panics with the command that builds it (with the bench's release profile).
fn peer_path() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("path of the benchmark");
    let path = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("benchmark binary inside target/<profile>/deps")
        .join("examples/cclkit-ofi-peer");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --release -p cclkit-net-ofi --example \
         cclkit-ofi-peer` first",
        path.display()
    );
    path
}
const BURST_BYTES: usize = 64 << 20;
const ROUNDS: usize = 41;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let listed = opt("--sizes-kib").map(|v| {
        v.split(',')
            .map(|k| match k.trim().parse::<usize>() {
                Ok(k) if k > 0 => k << 10,
                _ => panic!("--sizes-kib: {k:?} is not a positive number of KiB"),
            })
            .collect::<Vec<_>>()
    });
    let sizes: Vec<usize> = match listed {
        Some(l) => l,
        None if quick => vec![1 << 20],
        None => vec![
            4 << 10,
            12 << 10,
            32 << 10,
            64 << 10,
            512 << 10,
            1 << 20,
            4 << 20,
            16 << 20,
        ],
    };
    let rounds = opt("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 3 } else { ROUNDS });
    let providers: Vec<String> = match opt("--provider") {
        Some(p) => vec![p],
        None => vec!["tcp;ofi_rxm".into(), "shm".into()],
    };
    let netns = opt("--cc").map(|cc| Netns::new(&cc));
    match &netns {
        Some(ns) => println!(
            "TCP congestion control: {} (private network namespace {})\n",
            ns.cc, ns.name
        ),
        None => println!(
            "TCP congestion control: {} (this machine's)\n",
            std::fs::read_to_string(CC_PATH).map_or("unknown".into(), |s| s.trim().to_owned())
        ),
    }
    println!(
        "| provider | size | raw libfabric MB/s | cclkit-ofi MB/s | ratio | median round ratio (range) | sends bundled (per bundle) | sends written | one-way TCP MB/s |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for provider in providers.iter().map(String::as_str) {
        for &size in &sizes {
            let r = run(provider, size, rounds, netns.as_ref());
            println!(
                "| {provider} | {} | {:.0} | {:.0} | {:.2} | {:.2} ({:.2}–{:.2}) | {:.0} % ({:.1}) | {:.0} % | {:.0} |",
                show_size(size),
                r[0],
                r[1],
                r[1] / r[0],
                r[2],
                r[3],
                r[4],
                r[5] * 100.0,
                r[6],
                r[7] * 100.0,
                r[8]
            );
        }
    }
}

/// A size as the table shows it.
fn show_size(size: usize) -> String {
    match size {
        s if s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s => format!("{} KiB", s >> 10),
    }
}

fn env_for(provider: &str) -> Vec<(&'static str, String)> {
    let mut env = vec![("CCLKIT_OFI_PROVIDER", provider.to_owned())];
    if provider.starts_with("tcp") {
        env.push(("CCLKIT_OFI_IFACE", "lo".to_owned()));
    }
    env
}

/// Where the kernel keeps the TCP congestion control (per network namespace).
const CC_PATH: &str = "/proc/sys/net/ipv4/tcp_congestion_control";

/// A private network namespace (loopback up) with its own TCP congestion
/// control; removed on drop.
struct Netns {
    name: String,
    cc: String,
}

impl Netns {
    fn new(cc: &str) -> Netns {
        let available = std::fs::read_to_string(
            CC_PATH.replace("congestion_control", "available_congestion_control"),
        )
        .unwrap_or_default();
        assert!(
            available.split_whitespace().any(|a| a == cc),
            "--cc {cc}: this kernel offers {:?}",
            available.trim()
        );
        remove_stale_namespaces();
        let ns = Netns {
            name: format!("{NETNS_PREFIX}{}", std::process::id()),
            cc: cc.to_owned(),
        };
        ip(&["netns", "add", &ns.name]);
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        let set = format!("echo {cc} > {CC_PATH} && cat {CC_PATH}");
        let out = Command::new("ip")
            .args(["netns", "exec", &ns.name, "sh", "-c", &set])
            .output()
            .expect("run ip netns exec");
        let now = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && now.trim() == cc,
            "--cc {cc}: setting it in {} failed: {}{}",
            ns.name,
            now,
            String::from_utf8_lossy(&out.stderr)
        );
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Name prefix of the benchmark's namespaces; the rest is the owning PID.
const NETNS_PREFIX: &str = "cclkit-bench-";

/// Deletes namespaces a killed earlier run left behind (its `Drop` never ran):
/// those whose owning process is gone.
fn remove_stale_namespaces() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(NETNS_PREFIX) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
            eprintln!("removing network namespace {name}, left by a killed run");
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}

/// Runs `ip ARGS`, panicking with its message when it fails (`--cc` needs root).
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("--cc needs iproute2's `ip`: {e}"));
    assert!(
        out.status.success(),
        "ip {}: {} (--cc needs root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

struct Proc {
    child: Child,
    lines: Receiver<String>,
}

impl Proc {
    /// Starts the peer with `args`, inside `netns` when given.
    fn spawn(args: &[String], env: &[(&str, String)], netns: Option<&Netns>) -> Proc {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.name]).arg(peer_path());
                c
            }
            None => Command::new(peer_path()),
        };
        let mut child = cmd
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn benchmark peer");
        let (tx, lines) = channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Proc { child, lines }
    }

    fn expect(&mut self, prefix: &str) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(300))
                .unwrap_or_else(|e| panic!("benchmark peer: no {prefix:?}: {e}"));
            if let Some(rest) = l.strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
            assert!(!l.starts_with("FAIL"), "benchmark peer failed: {l}");
        }
    }

    fn tell(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write");
        stdin.flush().expect("flush");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One sender/receiver pair; returns [raw MB/s, plugin MB/s, median round
/// ratio, lowest, highest, share of the plugin's sends bundled, sends per bundle,
/// share written, one-way TCP MB/s].
fn run(provider: &str, size: usize, rounds: usize, netns: Option<&Netns>) -> [f64; 9] {
    let count = (BURST_BYTES / size).max(4);
    let args = |side: &str| -> Vec<String> {
        ["mixed", side, provider]
            .iter()
            .map(|s| s.to_string())
            .chain([size, count, rounds].iter().map(|n| n.to_string()))
            .collect()
    };
    let env = env_for(provider);
    let mut s = Proc::spawn(&args("send"), &env, netns);
    let mut r = Proc::spawn(&args("recv"), &env, netns);
    let (rs, rr) = (s.expect("RAWADDR "), r.expect("RAWADDR "));
    let port = r.expect("TCPPORT ");
    let (hs, hr) = (s.expect("HANDLE "), r.expect("HANDLE "));
    s.tell(&format!("PEER {hr}"));
    r.tell(&format!("PEER {hs}"));
    s.tell(&format!("RAWPEER {rr}"));
    r.tell(&format!("RAWPEER {rs}"));
    s.tell(&format!("TCPPEER {port}"));
    let result = s.expect("RESULT ");
    s.expect("OK");
    r.expect("OK");
    let field = |k: &str| -> f64 {
        result
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {result:?}"))
    };
    [
        field("raw"),
        field("plugin"),
        field("median"),
        field("low"),
        field("high"),
        field("bundled"),
        field("per_bundle"),
        field("written"),
        field("tcp"),
    ]
}
