//! Two processes in two network namespaces joined by a veth pair (distinct IPs,
//! traffic through the kernel's routing, not loopback), set up here as root.
//! Not root: recorded as a skip (`make test` lists it). Root (CI): it must run, so a
//! missing `ip netns` or a failed setup fails the test with the reason.

mod common;

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use cclkit_abi::net::NetHandle;
use cclkit_net_socket::wire::HandleInfo;
use common::child::unhex;
use common::machine::{is_root, skip};
use common::roles::start_pair;
use common::{Ver, child, roles, seed};

/// Runs `ip <args>`; `Err` with its stderr on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces with a veth pair; deleted on drop (even when the test fails).
struct Netns {
    ns: [String; 2],
    dev: [String; 2],
    addr: [String; 2],
}

impl Netns {
    fn create() -> Result<Self, String> {
        let pid = std::process::id();
        let net = Netns {
            ns: [format!("cclkit-{pid}-a"), format!("cclkit-{pid}-b")],
            // IFNAMSIZ is 16: "ck" + pid (≤ 7 digits) + side.
            dev: [format!("ck{pid}a"), format!("ck{pid}b")],
            addr: [
                format!("10.{}.{}.1", 100 + (pid >> 8) % 100, pid % 256),
                format!("10.{}.{}.2", 100 + (pid >> 8) % 100, pid % 256),
            ],
        };
        for ns in &net.ns {
            ip(&["netns", "add", ns])?;
        }
        ip(&[
            "link",
            "add",
            &net.dev[0],
            "netns",
            &net.ns[0],
            "type",
            "veth",
            "peer",
            "name",
            &net.dev[1],
            "netns",
            &net.ns[1],
        ])?;
        for i in 0..2 {
            ip(&[
                "-n",
                &net.ns[i],
                "addr",
                "add",
                &format!("{}/24", net.addr[i]),
                "dev",
                &net.dev[i],
            ])?;
            ip(&["-n", &net.ns[i], "link", "set", &net.dev[i], "up"])?;
        }
        // Carrier comes up asynchronously; the plugin only uses running interfaces.
        let deadline = Instant::now() + Duration::from_secs(10);
        for i in 0..2 {
            loop {
                let out = Command::new("ip")
                    .args(["-n", &net.ns[i], "link", "show", &net.dev[i]])
                    .output()
                    .map_err(|e| e.to_string())?;
                if String::from_utf8_lossy(&out.stdout).contains("LOWER_UP") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("{} never got carrier", net.dev[i]));
                }
                // Each poll starts a process: pace them on a loaded machine.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(net)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in &self.ns {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

#[test]
fn two_namespaces_over_veth() {
    if let Some(role) = child::role() {
        roles::run(&role);
        return;
    }
    if !is_root() {
        skip(
            "two_namespaces_over_veth",
            "needs root to create network namespaces (CI runs it as root)",
        );
        return;
    }
    // As root nothing excuses a skip: no `ip netns` or a failed setup is a failure.
    if let Err(e) = ip(&["netns", "list"]) {
        panic!("running as root, but `ip netns` is unusable (install iproute2): {e}");
    }
    let net = Netns::create().unwrap_or_else(|e| panic!("namespace setup as root: {e}"));
    let env = |i: usize| -> Vec<(&str, String)> {
        vec![
            ("NCCL_SOCKET_IFNAME", format!("={}", net.dev[i])),
            ("CCLKIT_SOCKET_MAX_RECVS", "4".to_owned()),
            ("CCLKIT_TEST_GROUPED", "4".to_owned()),
        ]
    };
    let (e0, e1) = (env(0), env(1));
    let wrap0 = ["ip", "netns", "exec", net.ns[0].as_str()];
    let wrap1 = ["ip", "netns", "exec", net.ns[1].as_str()];
    let test = "two_namespaces_over_veth";
    let (mut kids, devs, handles) = start_pair(
        test,
        ["exchange", "exchange"],
        [Ver::V12, Ver::V11],
        [&e0, &e1],
        [&wrap0, &wrap1],
        seed(),
    );
    for i in 0..2 {
        assert_eq!(devs[i], net.dev[i], "side {i} picked the wrong interface");
        let mut raw = unhex(&handles[i]);
        let info = HandleInfo::read(NetHandle::from_bytes_mut(&mut raw)).unwrap();
        assert_eq!(info.addr.ip(), net.addr[i].parse::<IpAddr>().unwrap());
    }
    let run = Duration::from_secs(120);
    kids[0].expect("DONE", run);
    kids[1].expect("DONE", run);
    kids[0].send("CLOSE");
    kids[1].send("CLOSE");
    kids[0].wait_ok(Duration::from_secs(30));
    kids[1].wait_ok(Duration::from_secs(30));
}
