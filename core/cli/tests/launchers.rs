//! The real launchers, end to end: `cclkit perf` started by Open MPI's `mpirun` and by a
//! torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) joins one
//! communicator per job, rank 0 hosting the bootstrap root, and checks its data.
//! `make test` installs `openmpi-bin`; a missing `mpirun` is a failure, not a skip.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ARGS: [&str; 11] = [
    "perf", "-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1",
];

fn base(cmd: &mut Command) -> &mut Command {
    cmd.env("NCCL_NET_PLUGIN", "none")
        .env("NCCL_TUNER_PLUGIN", "none")
        .env("CCLKIT_OP_TIMEOUT", "60")
        .env("CCLKIT_BOOTSTRAP_TIMEOUT", "60")
        .env_remove("CCLKIT_UNIQUE_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
}

/// Waits for every child, killing all process groups after `limit`.
fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<Output> {
    let deadline = Instant::now() + limit;
    let pids: Vec<i32> = children.iter().map(|c| c.id() as i32).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, c) in children.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send((i, c.wait_with_output()));
        });
    }
    let mut out: Vec<Option<Output>> = pids.iter().map(|_| None).collect();
    for _ in 0..pids.len() {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, o)) => out[i] = Some(o.expect("wait")),
            Err(_) => {
                for p in &pids {
                    // SAFETY: kill(2) of process groups this test created.
                    unsafe { libc::kill(-p, libc::SIGKILL) };
                }
                panic!("launch did not finish within {limit:?}");
            }
        }
    }
    out.into_iter().flatten().collect()
}

/// Rank 0's table: every row checked and nothing wrong, and `n` device lines.
fn check_table(stdout: &str, n: usize) {
    let devices = stdout.lines().filter(|l| l.starts_with("#  Rank ")).count();
    assert_eq!(devices, n, "one device line per rank:\n{stdout}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    assert_eq!(rows.len(), 5, "8 B, 64 B, 512 B, 4 KiB, 32 KiB:\n{stdout}");
    for r in rows {
        let f: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(
            (f[8], f[12]),
            ("0", "0"),
            "#wrong out of place and in place: {r}"
        );
    }
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
}

#[test]
fn mpirun_starts_a_job() {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        "3",
        "-x",
        "NCCL_NET_PLUGIN",
        "-x",
        "NCCL_TUNER_PLUGIN",
    ])
    .arg(env!("CARGO_BIN_EXE_cclkit"))
    .args(ARGS);
    let child = base(&mut cmd)
        .spawn()
        .expect("mpirun (package openmpi-bin) must be installed: make test installs it");
    let out = wait_all(vec![child], Duration::from_secs(180)).remove(0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_table(&stdout, 3);
}

/// A MASTER_PORT whose successor (where rank 0 hosts the root, on every address) is
/// free now. Taken below the kernel's ephemeral range (32768 and up by default): in
/// this network namespace the other tests bind only ephemeral ports, so neither
/// their listeners nor outgoing connections can take it before rank 0 binds it.
fn master_port() -> u16 {
    let offset = (std::process::id() % 10000) as u16;
    (0..10000u16)
        .map(|i| 20000 + (offset + i) % 10000)
        .find(|p| std::net::TcpListener::bind(("0.0.0.0", p + 1)).is_ok())
        .expect("a free port between 20001 and 30000")
}

#[test]
fn torchrun_environment_starts_a_job() {
    let port = master_port();
    let world = 2;
    let children: Vec<Child> = (0..world)
        .map(|rank| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_cclkit"));
            cmd.args(ARGS)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string());
            base(&mut cmd).spawn().expect("spawn cclkit")
        })
        .collect();
    let outs = wait_all(children, Duration::from_secs(120));
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {r}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    check_table(&String::from_utf8_lossy(&outs[0].stdout), world);
    assert!(outs[1].stdout.is_empty(), "only rank 0 prints");
}
