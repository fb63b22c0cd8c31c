//! In-process smoke test of the runtime: ranks as threads over the built-in transport.

use std::sync::Arc;
use std::time::Duration;

use cclkit::plugin::LoaderConfig;
use cclkit::plugin::select::NetRegistry;
use cclkit::runtime::bootstrap::{BootstrapRoot, random_u64};
use cclkit::runtime::{Comm, Config};

fn config() -> Config {
    let mut c = Config::from_lookup(&|_| None).unwrap();
    c.registry = Some(Arc::new(NetRegistry::new(LoaderConfig::from_lookup(|k| {
        (k == "NCCL_NET_PLUGIN").then(|| "none".into())
    }))));
    c.bootstrap_timeout = Duration::from_secs(20);
    c.op_timeout = Duration::from_secs(30);
    c
}

#[test]
fn ring_send_recv_threads() {
    let n = 3;
    let (id, root) = BootstrapRoot::start(
        "127.0.0.1:0".parse().unwrap(),
        random_u64(),
        Duration::from_secs(20),
    )
    .unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || {
                let comm = Comm::init_rank(n, &id, r, &config()).unwrap();
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
                comm.destroy().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    root.join().unwrap();
}
