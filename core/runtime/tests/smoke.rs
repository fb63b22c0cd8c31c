//! In-process smoke test of the runtime: ranks as threads over the built-in transport.

use std::sync::Arc;
use std::time::Duration;

use cclkit_host::LoaderConfig;
use cclkit_host::select::NetRegistry;
use cclkit_runtime::{BootstrapRoot, random_u64};
use cclkit_runtime::{Comm, Config};

fn config() -> Config {
    let mut c = Config::from_lookup(&|_| None).unwrap();
    c.registry = Some(Arc::new(NetRegistry::new(LoaderConfig::from_lookup(|k| {
        (k == "NCCL_NET_PLUGIN").then(|| "none".into())
    }))));
    c.bootstrap_timeout = Duration::from_secs(20);
    c.op_timeout = Duration::from_secs(30);
    c
}

/// Runs `body(comm, rank)` on `n` ranks as threads of this process, each joining
/// with `config`, then destroys the communicators and waits for every thread and
/// the bootstrap root.
fn on_threads<F>(n: usize, config: &Config, body: F)
where
    F: Fn(&Comm, usize) + Send + Clone + 'static,
{
    let (id, root) = BootstrapRoot::start(
        "127.0.0.1:0".parse().unwrap(),
        random_u64(),
        Duration::from_secs(20),
    )
    .unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (config, body) = (config.clone(), body.clone());
            std::thread::spawn(move || {
                let comm = Comm::init_rank(n, &id, r, &config).unwrap();
                body(&comm, r);
                comm.destroy().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    root.join().unwrap();
}

#[test]
fn ring_send_recv_threads() {
    let n = 3;
    on_threads(n, &config(), move |comm, r| {
        for size in [0usize, 1, 7, 4095, 65539, 3 << 20 | 5] {
            let data: Vec<u8> = (0..size).map(|i| (i * 31 + r * 7) as u8).collect();
            let mut got = vec![0u8; size];
            let mut g = comm.group();
            g.send(&data, (r + 1) % n).recv(&mut got, (r + n - 1) % n);
            g.run().unwrap();
            let p = (r + n - 1) % n;
            let want: Vec<u8> = (0..size).map(|i| (i * 31 + p * 7) as u8).collect();
            assert_eq!(got, want, "size {size}");
        }
    });
}

fn ints(seed: usize, n: usize) -> Vec<i32> {
    (0..n)
        .map(|i| ((i * 2654435761 + seed * 97) % 1999) as i32 - 999)
        .collect()
}

fn b(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn collectives_threads_every_algo_proto() {
    use cclkit_abi::raw::common::{DataType, RedOp};
    let n = 3;
    for (algo, proto) in [
        ("ring", "simple"),
        ("allreduce:tree", "simple"),
        ("ring", "ll"),
        ("allreduce:tree;ring", "ll128"),
        ("ring", "ll128"),
    ] {
        let mut c = config();
        c.algo = Some(algo.into());
        c.proto = Some(proto.into());
        on_threads(n, &c, move |comm, r| {
            for count in [0usize, 1, 5, 1000, 70001] {
                let mine = ints(r, count);
                let inputs: Vec<Vec<i32>> = (0..n).map(|q| ints(q, count)).collect();
                let want: Vec<i32> = (0..count)
                    .map(|i| inputs.iter().map(|v| v[i]).sum())
                    .collect();
                let mut out = vec![0u8; count * 4];
                let d = comm
                    .all_reduce(&b(&mine), &mut out, DataType::INT32, RedOp::SUM)
                    .unwrap();
                assert_eq!(out, b(&want), "allreduce {algo}/{proto} count {count}");
                if count > 0 {
                    assert_eq!(d.proto.name().unwrap().to_ascii_lowercase(), proto);
                }
                // In place, and the other collectives.
                let mut inplace = b(&mine);
                comm.all_reduce_in_place(&mut inplace, DataType::INT32, RedOp::SUM)
                    .unwrap();
                assert_eq!(inplace, b(&want));
                let mut g = vec![0u8; n * count * 4];
                comm.all_gather(&b(&mine), &mut g).unwrap();
                let all: Vec<i32> = (0..n).flat_map(|q| ints(q, count)).collect();
                assert_eq!(g, b(&all));
                let mut bc = vec![0u8; count * 4];
                comm.broadcast(&b(&mine), &mut bc, 1).unwrap();
                assert_eq!(bc, b(&ints(1, count)));
                let big = ints(r + 10, n * count);
                let mut rs = vec![0u8; count * 4];
                comm.reduce_scatter(&b(&big), &mut rs, DataType::INT32, RedOp::SUM)
                    .unwrap();
                let bigs: Vec<Vec<i32>> = (0..n).map(|q| ints(q + 10, n * count)).collect();
                let want_rs: Vec<i32> = (0..count)
                    .map(|i| bigs.iter().map(|v| v[r * count + i]).sum())
                    .collect();
                assert_eq!(rs, b(&want_rs));
            }
            comm.barrier().unwrap();
        });
    }
}
