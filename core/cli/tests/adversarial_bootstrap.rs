//! Stray connections against a running `cclkit perf` job (issue 16): ranks started
//! torchrun-style (`RANK`, `WORLD_SIZE`, `MASTER_PORT`: rank 0 hosts the bootstrap
//! root on `MASTER_PORT + 1`, a port the test knows) while silent, short and
//! flooding connections hit the root. The job must still check clean, and the strays
//! may cost at most the header deadline (2 s), not the bootstrap timeout.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port nobody listens on right now (and the one below it, for MASTER_PORT).
fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p > 20_000 {
            return p;
        }
    }
}

fn rank(r: usize, n: usize, master_port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_cclkit"))
        .args([
            "perf", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-w", "1",
        ])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("NCCL_NET_PLUGIN", "none")
        .env("NCCL_TUNER_PLUGIN", "none")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("CCLKIT_BOOTSTRAP_TIMEOUT", "30")
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", master_port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cclkit")
}

/// Runs an `n`-rank job with `strays` opened against its root first; returns how
/// long the ranks took after the strays were in place.
/// `junk`: a stray sent bytes with a wrong magic, which is dropped (and logged) at
/// once; silent ones may outlive a fast job.
fn job_with_strays(
    n: usize,
    junk: bool,
    strays: impl FnOnce(SocketAddr) -> Vec<TcpStream>,
) -> Duration {
    let root_port = free_port();
    let root: SocketAddr = ([127, 0, 0, 1], root_port).into();
    let mut ranks = vec![rank(0, n, root_port - 1)];
    // Rank 0 hosts the root: wait until it listens (this probe is a stray too).
    let until = Instant::now() + Duration::from_secs(20);
    let probe = loop {
        match TcpStream::connect(root) {
            Ok(s) => break s,
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("rank 0 never listened on {root}: {e}"),
        }
    };
    let held = strays(root);
    let t = Instant::now();
    ranks.extend((1..n).map(|r| rank(r, n, root_port - 1)));
    for (r, mut c) in ranks.into_iter().enumerate() {
        let status = cclkit_tests::wait_timeout(&mut c, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("rank {r} hung"));
        let out = c.wait_with_output().expect("output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(status.success(), "rank {r}: {status}\n{stdout}\n{stderr}");
        if r == 0 {
            assert!(
                stdout.contains("Out of bounds values : 0 OK"),
                "{n} ranks: {stdout}\n{stderr}"
            );
            // A stray is one WARN naming its peer, never blamed on a rank.
            assert!(
                !junk || stderr.contains("dropped a stray connection from 127.0.0.1:"),
                "{stderr}"
            );
        }
    }
    drop((probe, held));
    t.elapsed()
}

/// What a clean job of this size may take here, plus the 2 s header deadline.
const BOUND: Duration = Duration::from_secs(12);

/// One test, so its jobs never run at once: each job's root port is picked free
/// just before use, and a second job's flood could take it.
#[test]
fn silent_short_and_flooding_connections_do_not_stall_jobs() {
    for n in [2, 4] {
        let took = job_with_strays(n, true, |root| {
            let silent = TcpStream::connect(root).unwrap();
            let mut short = TcpStream::connect(root).unwrap();
            short.write_all(&[1u8; 10]).unwrap();
            let mut junk = TcpStream::connect(root).unwrap();
            junk.write_all(&[0xffu8; 64]).unwrap();
            vec![silent, short, junk]
        });
        assert!(took < BOUND, "{n} ranks: {took:?}");
    }
    let took = job_with_strays(2, false, |root| {
        (0..400)
            .filter_map(|_| TcpStream::connect(root).ok())
            .collect()
    });
    assert!(took < BOUND, "flood: {took:?}");
}
