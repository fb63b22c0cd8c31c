//! Point-to-point across processes (issue 5): 2, 3, 5 and 8 ranks exchange random
//! data in rings (grouped and blocking), all-pairs groups and self-sends, sizes from 0
//! to 64 MiB + odd, through the built-in socket transport and through the packaged
//! socket plugin loaded by name.

#[macro_use]
mod common_rt;

use common_rt::data::{Rng, assert_bytes};
use common_rt::{Job, builtin_net, emit, join, mapped, param, param_u64, plugin_net};

/// Bytes `from` sends `to` in case `case` of kind `kind` (odd per pair, 0 stays 0).
fn pair_len(size: usize, from: usize, to: usize) -> usize {
    if size == 0 {
        0
    } else {
        size + (from * 3 + to) % 5
    }
}

fn payload(seed: u64, case: usize, kind: u64, from: usize, to: usize, len: usize) -> Vec<u8> {
    Rng::new(&[seed, case as u64, kind, from as u64, to as u64]).bytes(len)
}

/// The rank program: every pattern for every size of `CKT_SIZES`.
fn exchange() {
    let comm = join();
    let (me, n) = (comm.rank(), comm.nranks());
    let seed = param_u64("SEED", 1);
    let sizes: Vec<usize> = param("SIZES")
        .expect("CKT_SIZES")
        .split(',')
        .map(|s| s.parse().expect("size"))
        .collect();
    let net = comm.net();
    emit("net", format!("{} v{}", net.name, net.version));
    if let Some(lib) = param("EXPECT_LIB") {
        assert!(mapped(&lib), "{lib} is not loaded: the plugin was not used");
    }
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let all_pairs_limit = param_u64("ALL_PAIRS_MAX", 8 << 20) as usize;
    let started = std::time::Instant::now();
    for (case, &size) in sizes.iter().enumerate() {
        let what = |k: &str| format!("rank {me}/{n} {k} of {size} bytes");
        // 1. Ring in one group: send to next, receive from prev.
        let out = payload(seed, case, 1, me, next, size);
        let mut got = vec![0u8; size];
        let mut g = comm.group();
        g.send(&out, next).recv(&mut got, prev);
        g.run()
            .unwrap_or_else(|e| panic!("{}: {e}", what("ring group")));
        assert_bytes(&got, &payload(seed, case, 1, prev, me, size), &what("ring"));
        drop(out);

        // 2. The reverse ring with blocking calls, ordered so that it cannot deadlock.
        let out = payload(seed, case, 2, me, prev, size);
        let mut got = vec![0u8; size];
        let send = || comm.send(&out, prev);
        if me % 2 == 0 {
            send().unwrap_or_else(|e| panic!("{}: {e}", what("blocking send")));
            comm.recv(&mut got, next)
                .unwrap_or_else(|e| panic!("{}: {e}", what("blocking recv")));
        } else {
            comm.recv(&mut got, next)
                .unwrap_or_else(|e| panic!("{}: {e}", what("blocking recv")));
            send().unwrap_or_else(|e| panic!("{}: {e}", what("blocking send")));
        }
        assert_bytes(
            &got,
            &payload(seed, case, 2, next, me, size),
            &what("reverse ring"),
        );
        drop(out);

        // 3. All pairs, self included, in one group; every pair has its own odd length.
        if size * n <= all_pairs_limit {
            let outs: Vec<Vec<u8>> = (0..n)
                .map(|p| payload(seed, case, 3, me, p, pair_len(size, me, p)))
                .collect();
            let mut gots: Vec<Vec<u8>> = (0..n).map(|p| vec![0u8; pair_len(size, p, me)]).collect();
            let mut g = comm.group();
            for (p, (o, r)) in outs.iter().zip(gots.iter_mut()).enumerate() {
                g.send(o, p).recv(r, p);
            }
            g.run()
                .unwrap_or_else(|e| panic!("{}: {e}", what("all-pairs group")));
            for (p, r) in gots.iter().enumerate() {
                let want = payload(seed, case, 3, p, me, pair_len(size, p, me));
                assert_bytes(r, &want, &format!("{} from rank {p}", what("all-pairs")));
            }
        }

        // 4. AllToAll (grouped p2p inside the runtime), blocks of `size` bytes.
        if size * n <= all_pairs_limit {
            let out: Vec<u8> = (0..n)
                .flat_map(|p| payload(seed, case, 6, me, p, size))
                .collect();
            let mut got = vec![0u8; n * size];
            comm.all_to_all(&out, &mut got)
                .unwrap_or_else(|e| panic!("{}: {e}", what("all-to-all")));
            let want: Vec<u8> = (0..n)
                .flat_map(|p| payload(seed, case, 6, p, me, size))
                .collect();
            assert_bytes(&got, &want, &what("all-to-all"));
        }

        // 5. Self only: two sends to self matched in order by two receives.
        let a = payload(seed, case, 4, me, me, size);
        let b = payload(seed, case, 5, me, me, size / 2 + 1);
        let (mut ga, mut gb) = (vec![0u8; a.len()], vec![0u8; b.len()]);
        let mut g = comm.group();
        g.send(&a, me)
            .send(&b, me)
            .recv(&mut ga, me)
            .recv(&mut gb, me);
        g.run()
            .unwrap_or_else(|e| panic!("{}: {e}", what("self group")));
        assert_bytes(&ga, &a, &what("first self-send"));
        assert_bytes(&gb, &b, &what("second self-send"));
    }
    emit("seconds", started.elapsed().as_secs_f64());
    comm.destroy().expect("destroy");
}

/// Sizes per rank count: 0, 1, odd small, around the LL/Simple slices, past the
/// 4 MiB FIFO of a connection; 64 MiB + odd once, for 2 ranks.
fn sizes(np: usize, big: bool) -> String {
    let mut s = vec![0usize, 1, 7, 4099, 65537, (1 << 20) + 3];
    if np <= 3 {
        s.push((5 << 20) + 3);
    }
    if big {
        s.push((64 << 20) + 13);
    }
    s.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn p2p_builtin_transport_2_3_5_8_ranks() {
    rank!(exchange);
    for np in [2, 3, 5, 8] {
        let run = Job::new(test_name!(), np)
            .envs(builtin_net())
            .env("CKT_SIZES", sizes(np, np == 2))
            .env("CKT_SEED", 100 + np)
            .run();
        run.assert_ok();
        for r in 0..np {
            assert_eq!(
                run.value(r, "net"),
                "cclkit-socket v12",
                "{}",
                run.describe()
            );
        }
        eprintln!(
            "{np} ranks, built-in: {:.1} s (rank 0 exchanges {:.2} s)",
            run.wall.as_secs_f64(),
            run.value(0, "seconds")
        );
    }
}

#[test]
fn p2p_packaged_plugin_by_name_2_3_5_8_ranks() {
    rank!(exchange);
    for np in [2, 3, 5, 8] {
        let run = Job::new(test_name!(), np)
            .envs(plugin_net())
            .env("CKT_EXPECT_LIB", "libnccl-net-cclkit-socket.so")
            .env("CKT_SIZES", sizes(np, false))
            .env("CKT_SEED", 200 + np)
            .run();
        run.assert_ok();
        eprintln!("{np} ranks, plugin: {:.1} s", run.wall.as_secs_f64());
    }
}

#[test]
fn p2p_packaged_plugin_grouped_receives() {
    rank!(exchange);
    // The plugin's grouped receives (maxRecvs > 1) on every p2p link.
    let run = Job::new(test_name!(), 3)
        .envs(plugin_net())
        .env("CCLKIT_SOCKET_MAX_RECVS", 4)
        .env("CKT_EXPECT_LIB", "libnccl-net-cclkit-socket.so")
        .env("CKT_SIZES", sizes(3, false))
        .env("CKT_SEED", 300)
        .run();
    run.assert_ok();
}

#[test]
fn unmatched_self_send_or_receive_is_an_error() {
    use std::sync::Arc;

    use cclkit_host::LoaderConfig;
    use cclkit_host::select::NetRegistry;
    use cclkit_runtime::{Config, world};

    let mut config = Config::from_lookup(&|_| None).expect("config");
    config.registry = Some(Arc::new(NetRegistry::new(LoaderConfig::from_lookup(|k| {
        (k == "NCCL_NET_PLUGIN").then(|| "none".to_owned())
    }))));
    let comm = world::single(&config).expect("one-rank communicator");
    let mut buf = [7u8; 9];
    let mut g = comm.group();
    g.recv(&mut buf, 0);
    let e = g.run().expect_err("a receive from self with no send");
    assert!(
        e.message().contains("0 send(s) to self but 1 receive(s)"),
        "{e}"
    );
    assert_eq!(buf, [7u8; 9], "nothing was written");
    let mut g = comm.group();
    g.send(&[1u8; 9], 0);
    let e = g.run().expect_err("a send to self with no receive");
    assert!(
        e.message().contains("1 send(s) to self but 0 receive(s)"),
        "{e}"
    );
    // Matched, the communicator still works.
    let mut got = [0u8; 9];
    let mut g = comm.group();
    g.send(&[3u8; 9], 0).recv(&mut got, 0);
    g.run().expect("matched self-send");
    assert_eq!(got, [3u8; 9]);
    comm.destroy().expect("destroy");
}
