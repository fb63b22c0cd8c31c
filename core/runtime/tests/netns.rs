//! Ranks on two "hosts" (issue 5): two network namespaces joined by a veth pair, ranks
//! 0 and 2 in one, 1 and 3 in the other, launched the way `srun`/`mpirun` would (PMI
//! environment, `CCLKIT_ROOT_ADDR`, rank 0 hosting the bootstrap root). The ring must
//! keep each host's ranks adjacent (2 hosts, 2 crossings, stretch 1), and data must
//! cross between the namespaces intact.
//!
//! Needs root and `ip netns`. Not root: recorded as a skip that `make test` lists
//! (tests/skips.sh). Root (CI): it must run, so a missing `ip netns` or a failed setup
//! fails the test with the reason.

#[macro_use]
mod common_rt;

use std::process::Command;

use cclkit_abi::raw::common::{DataType, RedOp};
use common_rt::data::{Rng, assert_bytes, check_reduction};
use common_rt::{Job, builtin_net, emit, join};

/// Two namespaces and the veth pair between them; removed on drop, even on failure.
struct Hosts {
    ns: [String; 2],
    ip: [String; 2],
}

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

impl Hosts {
    /// Creates them (as root), or says why it cannot.
    fn create() -> Result<Self, String> {
        ip(&["netns", "list"])
            .map_err(|e| format!("no usable `ip netns` (install iproute2): {e}"))?;
        let pid = std::process::id();
        let subnet = format!("10.{}.{}", 100 + pid % 100, (pid / 100) % 250 + 1);
        let hosts = Self {
            ns: [format!("ckrt{pid}a"), format!("ckrt{pid}b")],
            ip: [format!("{subnet}.1"), format!("{subnet}.2")],
        };
        let veth = [
            format!("ckv{}a", pid % 100_000),
            format!("ckv{}b", pid % 100_000),
        ];
        for ns in &hosts.ns {
            ip(&["netns", "add", ns])?;
        }
        ip(&[
            "link", "add", &veth[0], "type", "veth", "peer", "name", &veth[1],
        ])?;
        for (i, dev) in veth.iter().enumerate() {
            let ns = &hosts.ns[i];
            ip(&["link", "set", dev, "netns", ns])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", hosts.ip[i]),
                "dev",
                dev,
            ])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace destroys the veth end inside it, and with it the pair.
        for ns in &self.ns {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// The rank program: report the ring and this rank's address, then move data
/// between the hosts (a ring exchange and an AllReduce).
fn two_hosts() {
    let comm = join();
    let (me, n) = (comm.rank(), comm.nranks());
    let ring = comm.ring();
    emit(
        "ring",
        serde_json::json!({
            "order": ring.order,
            "hosts": ring.hosts,
            "crossings": ring.crossings,
            "stretch": ring.stretch,
            "rank_order_stretch": ring.rank_order_stretch,
        }),
    );
    emit("ip", comm.peers()[me].ip.to_string());
    let size = (1 << 20) + 7;
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let out = Rng::new(&[7, me as u64]).bytes(size);
    let mut got = vec![0u8; size];
    let mut g = comm.group();
    g.send(&out, next).recv(&mut got, prev);
    g.run().expect("ring exchange across namespaces");
    assert_bytes(&got, &Rng::new(&[7, prev as u64]).bytes(size), "ring");
    let count = 300_007;
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|r| Rng::new(&[8, r as u64]).bytes(count * 4))
        .collect();
    let mut sum = vec![0u8; count * 4];
    comm.all_reduce(&inputs[me], &mut sum, DataType::INT32, RedOp::SUM)
        .expect("allreduce across namespaces");
    let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    check_reduction(DataType::INT32, RedOp::SUM, &refs, 0, &sum).expect("allreduce result");
    comm.destroy().expect("destroy");
}

#[test]
fn two_namespaces_ring_keeps_host_ranks_adjacent() {
    rank!(two_hosts);
    if !cclkit_tests::is_root() {
        cclkit_tests::skip(
            test_name!(),
            "needs root to create network namespaces (CI runs it as root)",
        );
        return;
    }
    // As root nothing excuses a skip: a failed setup is a failure, with its reason.
    let hosts = Hosts::create().unwrap_or_else(|why| panic!("namespace setup as root: {why}"));
    let np = 4;
    // Ranks alternate between the hosts, so rank order would cross four times.
    let host_of = |r: usize| r % 2;
    let mut job = Job::new(test_name!(), np)
        .no_root()
        .envs(builtin_net())
        .env("PMI_SIZE", np)
        .env("MPI_LOCALNRANKS", 2)
        .env("PMI_KVSNAME", format!("ckt-{}", std::process::id()))
        .env("CCLKIT_ROOT_ADDR", format!("{}:29511", hosts.ip[0]));
    for r in 0..np {
        job = job
            .rank_env(r, "PMI_RANK", r)
            .rank_env(r, "MPI_LOCALRANKID", r / 2)
            .wrap(r, &["ip", "netns", "exec", &hosts.ns[host_of(r)]]);
    }
    let run = job.run();
    run.assert_ok();
    let ring = run.value(0, "ring");
    for r in 0..np {
        assert_eq!(run.value(r, "ring"), ring, "rank {r} sees another ring");
        assert_eq!(
            run.value(r, "ip"),
            hosts.ip[host_of(r)],
            "rank {r}'s address"
        );
    }
    let order: Vec<usize> = ring["order"]
        .as_array()
        .expect("order")
        .iter()
        .map(|v| v.as_u64().expect("rank") as usize)
        .collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..np).collect::<Vec<_>>(), "ring {order:?}");
    // Host-local ranks adjacent: the host changes exactly twice around the ring.
    let changes = (0..np)
        .filter(|&i| host_of(order[i]) != host_of(order[(i + 1) % np]))
        .count();
    assert_eq!(changes, 2, "ring {order:?} splits a host");
    assert_eq!(ring["hosts"], 2, "{ring}");
    assert_eq!(ring["crossings"], 2, "{ring}");
    assert_eq!(ring["stretch"], 1.0, "{ring}");
    assert_eq!(ring["rank_order_stretch"], 2.0, "{ring}");
    eprintln!("two hosts: ring {order:?}, {ring}");
    drop(hosts);
}
