//! The runtime's `--device cuda` path across processes, on the emulated GPU
//! (`CCLKIT_CUDA_EMULATE`: the device kernels' own source run on the CPU, host
//! memory standing in for GPU memory), so it runs on machines without a GPU:
//!
//! * collectives on device buffers (CUDA managed memory) give NCCL's results,
//!   with host staging (the built-in socket transport has no `NCCL_PTR_CUDA`);
//! * with a plugin that claims GPUDirect RDMA (`tests/fixtures/net_gdr.c`, wrapping
//!   the packaged socket plugin) and `NCCL_NET_GDR_LEVEL=SYS`, FIFO slots are
//!   registered with `regMr(NCCL_PTR_CUDA)` (or `regMrDmaBuf`) and every Simple
//!   receive is flushed with `iflush` (the emulated GPU is "pre-Hopper");
//! * without the level, the same plugin gets host staging and no flush;
//! * without a driver, `CCLKIT_DEVICE=cuda` fails on every rank with
//!   "no CUDA driver: libcuda.so.1 not found";
//! * a communicator mixing host and device ranks runs every rank with device
//!   sizes and the Simple protocol, so both ends of each connection agree.

#[macro_use]
mod common_rt;

use std::path::PathBuf;
use std::time::Duration;

use cclkit_abi::raw::common::{DataType, RedOp};
use common_rt::data::{Rng, check_reduction, input, size};
use common_rt::{Job, builtin_net, emit, join, packaged, param};

/// The rank program: AllReduce (every op on a few types, in and out of place),
/// AllGather and ReduceScatter on device buffers, checked against the inputs;
/// then the GDR plugin's counts when it is loaded (`CKT_GDR_LIB`).
fn device_collectives() {
    let comm = join();
    let (me, n) = (comm.rank(), comm.nranks());
    assert!(comm.device().is_cuda(), "CCLKIT_DEVICE=cuda");
    emit("device", comm.device().describe());
    let dev = comm.device();
    let count = 40_001; // odd; several slices per channel for 4-byte types
    for dt in [
        DataType::FLOAT32,
        DataType::FLOAT16,
        DataType::INT32,
        DataType::FLOAT8E5M2,
    ] {
        for op in [RedOp::SUM, RedOp::PROD, RedOp::MIN, RedOp::MAX, RedOp::AVG] {
            let inputs: Vec<Vec<u8>> = (0..n)
                .map(|r| {
                    input(
                        dt,
                        op,
                        count,
                        &mut Rng::new(&[r as u64, dt.0 as u64, op.0 as u64]),
                    )
                })
                .collect();
            let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let bytes = count * size(dt);
            let mut send = dev.alloc_user(bytes).expect("send buffer");
            let mut recv = dev.alloc_user(bytes).expect("recv buffer");
            send.copy_from_slice(&inputs[me]);
            comm.all_reduce(&send, &mut recv, dt, op)
                .unwrap_or_else(|e| panic!("all_reduce {dt:?} {op:?}: {e}"));
            check_reduction(dt, op, &refs, 0, &recv).unwrap_or_else(|e| panic!("all_reduce: {e}"));
            // In place on the same device buffer.
            recv.copy_from_slice(&inputs[me]);
            comm.all_reduce_in_place(&mut recv, dt, op)
                .unwrap_or_else(|e| panic!("in place {dt:?} {op:?}: {e}"));
            check_reduction(dt, op, &refs, 0, &recv).unwrap_or_else(|e| panic!("in place: {e}"));
        }
    }
    // AllGather and ReduceScatter of int32 (exact).
    let part = 33_333;
    all_gather_checked(&comm, 7, part * 4);
    let full: Vec<Vec<u8>> = (0..n)
        .map(|r| Rng::new(&[8, r as u64]).bytes(n * part * 4))
        .collect();
    let refs: Vec<&[u8]> = full.iter().map(Vec::as_slice).collect();
    let mut big = dev.alloc_user(n * part * 4).expect("send");
    let mut out = dev.alloc_user(part * 4).expect("recv");
    big.copy_from_slice(&full[me]);
    comm.reduce_scatter(&big, &mut out, DataType::INT32, RedOp::SUM)
        .expect("reduce_scatter");
    check_reduction(DataType::INT32, RedOp::SUM, &refs, me * part, &out)
        .unwrap_or_else(|e| panic!("reduce_scatter: {e}"));
    if let Some(lib) = param("GDR_LIB") {
        // SAFETY: the plugin is already loaded by the runtime; this only looks up
        // its statistics function, whose C signature is `void(long[5])`.
        let stats = unsafe {
            let l = libloading::Library::new(&lib).expect("the GDR plugin");
            let f: libloading::Symbol<unsafe extern "C" fn(*mut std::ffi::c_long)> =
                l.get(b"net_gdr_stats").expect("net_gdr_stats");
            let mut out = [0 as std::ffi::c_long; 5];
            f(out.as_mut_ptr());
            out
        };
        emit("gdr", stats.map(i64::from));
    }
    comm.destroy().expect("destroy");
}

/// AllGather of `part` random bytes per rank (seeded by `seed` and the rank) on the
/// communicator's device buffers, checked exactly.
fn all_gather_checked(comm: &cclkit_runtime::Comm, seed: u64, part: usize) {
    let (me, n, dev) = (comm.rank(), comm.nranks(), comm.device());
    let mut send = dev.alloc_user(part).expect("send");
    let mut all = dev.alloc_user(n * part).expect("recv");
    send.copy_from_slice(&Rng::new(&[seed, me as u64]).bytes(part));
    comm.all_gather(&send, &mut all).expect("all_gather");
    for r in 0..n {
        let want = Rng::new(&[seed, r as u64]).bytes(part);
        assert!(
            all[r * part..(r + 1) * part] == want[..],
            "all_gather part {r}"
        );
    }
}

/// The rank program of a mixed communicator: AllReduce at sizes below one slice
/// (where only the protocol could differ: the host ranks ask for LL) and above
/// (where host slices would be smaller), AllGather, each checked exactly against
/// every rank's input.
fn mixed_collectives() {
    // NCCL_DEBUG (INFO in the test below) through the host's NCCL-style logger.
    cclkit_host::log::init_from_env();
    let comm = join();
    let (me, n) = (comm.rank(), comm.nranks());
    emit("cuda", comm.device().is_cuda());
    let dev = comm.device();
    for (i, count) in [3usize, 1_000, 300_007, 1_100_003].into_iter().enumerate() {
        let dt = DataType::INT32;
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|r| input(dt, RedOp::SUM, count, &mut Rng::new(&[r as u64, i as u64])))
            .collect();
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut send = dev.alloc_user(count * 4).expect("send buffer");
        let mut recv = dev.alloc_user(count * 4).expect("recv buffer");
        send.copy_from_slice(&inputs[me]);
        comm.all_reduce(&send, &mut recv, dt, RedOp::SUM)
            .unwrap_or_else(|e| panic!("all_reduce of {count}: {e}"));
        check_reduction(dt, RedOp::SUM, &refs, 0, &recv)
            .unwrap_or_else(|e| panic!("all_reduce of {count}: {e}"));
    }
    all_gather_checked(&comm, 9, 200_003 * 4);
    comm.destroy().expect("destroy");
}

#[test]
fn a_comm_mixing_host_and_device_ranks_agrees_on_slices_and_protocol() {
    rank!(mixed_collectives);
    // Rank 1 of 3 on the emulated GPU, the others on host memory and asking for
    // LL, which a device communicator does not run.
    let run = Job::new(test_name!(), 3)
        .envs(builtin_net())
        .env("CCLKIT_OP_TIMEOUT", 30)
        .env("NCCL_PROTO", "LL")
        .env("NCCL_DEBUG", "INFO")
        .rank_env(1, "CCLKIT_DEVICE", "cuda")
        .rank_env(1, "CCLKIT_CUDA_EMULATE", 1)
        .timeout(Duration::from_secs(180))
        .run();
    run.assert_ok();
    let kinds: Vec<bool> = (0..3)
        .map(|r| run.value(r, "cuda").as_bool().unwrap_or_default())
        .collect();
    assert_eq!(kinds, [false, true, false], "{}", run.describe());
    // The host ranks say why they run device sizes and Simple; the device rank has
    // nothing to explain.
    let says = |r: usize| {
        run.ranks[r]
            .stderr
            .contains("ranks [1] use device memory: running as a device communicator")
    };
    assert_eq!(
        [says(0), says(1), says(2)],
        [true, false, true],
        "the INFO line of a host rank in a mixed communicator:\n{}",
        run.describe()
    );
}

/// The GDR test plugin, compiled for this test.
fn gdr_plugin(dir: &tempfile::TempDir) -> PathBuf {
    common_rt::compile_plugin(dir, "nccl-net-gdr", "net_gdr.c")
}

fn emulated_job(test: &str, np: usize) -> Job {
    Job::new(test, np)
        .env("CCLKIT_DEVICE", "cuda")
        .env("CCLKIT_CUDA_EMULATE", 1)
        .env("CCLKIT_OP_TIMEOUT", 60)
        .timeout(Duration::from_secs(240))
}

/// `np` emulated-GPU ranks on the GDR test plugin (`lib`, from [`gdr_plugin`]),
/// which wraps the packaged socket plugin and counts what the runtime asks of it.
fn gdr_job(test: &str, np: usize, lib: &std::path::Path) -> Job {
    emulated_job(test, np)
        .env("NCCL_NET_PLUGIN", lib.display())
        .env("CCLKIT_STRICT", 1)
        .env(
            "NET_GDR_INNER",
            packaged("libnccl-net-cclkit-socket.so").display(),
        )
        .env("CKT_GDR_LIB", lib.display())
}

/// GDR plugin counts per rank: [regMr host, regMr CUDA, regMrDmaBuf, iflush, bytes].
fn gdr_counts(run: &common_rt::Run, rank: usize) -> Vec<i64> {
    let v = run.value(rank, "gdr");
    v.as_array()
        .unwrap_or_else(|| panic!("rank {rank} reported no GDR counts: {}", run.describe()))
        .iter()
        .map(|x| x.as_i64().unwrap_or(-1))
        .collect()
}

#[test]
fn device_collectives_with_host_staging() {
    rank!(device_collectives);
    let run = emulated_job(test_name!(), 3).envs(builtin_net()).run();
    run.assert_ok();
    assert!(
        run.value(0, "device")
            .as_str()
            .is_some_and(|d| d.contains("[emulated]"))
    );
}

#[test]
fn device_collectives_with_gdr_register_cuda_memory_and_flush() {
    rank!(device_collectives);
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = gdr_plugin(&dir);
    let run = gdr_job(test_name!(), 2, &lib)
        .env("NCCL_NET_GDR_LEVEL", "SYS")
        .run();
    run.assert_ok();
    for r in 0..2 {
        let c = gdr_counts(&run, r);
        assert_eq!(c[0], 0, "rank {r}: every FIFO is GPU memory: {c:?}");
        assert!(
            c[1] > 0 && c[2] == 0,
            "rank {r}: regMr(NCCL_PTR_CUDA): {c:?}"
        );
        assert!(
            c[3] > 0 && c[4] > 0,
            "rank {r}: GPU receives are flushed: {c:?}"
        );
    }
}

#[test]
fn device_collectives_with_gdr_and_dmabuf_use_reg_mr_dma_buf() {
    rank!(device_collectives);
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = gdr_plugin(&dir);
    let run = gdr_job(test_name!(), 2, &lib)
        .env("CCLKIT_CUDA_EMULATE", "dmabuf")
        .env("NET_GDR_DMABUF", 1)
        .env("NCCL_NET_GDR_LEVEL", "SYS")
        .run();
    run.assert_ok();
    for r in 0..2 {
        let c = gdr_counts(&run, r);
        assert!(
            c[0] == 0 && c[1] == 0 && c[2] > 0,
            "rank {r}: regMrDmaBuf only: {c:?}"
        );
        assert!(c[3] > 0, "rank {r}: flushed: {c:?}");
    }
}

#[test]
fn device_collectives_beyond_the_gdr_level_stage_through_host_memory() {
    rank!(device_collectives);
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = gdr_plugin(&dir);
    // The emulated GPU has no PCI path: distance SYS, beyond the default PXB.
    let run = gdr_job(test_name!(), 2, &lib).run();
    run.assert_ok();
    for r in 0..2 {
        let c = gdr_counts(&run, r);
        assert!(
            c[0] > 0 && c[1] == 0 && c[2] == 0,
            "rank {r}: host staging: {c:?}"
        );
        assert_eq!(c[3], 0, "rank {r}: nothing to flush: {c:?}");
    }
}

/// Joins with `CCLKIT_DEVICE=cuda` and reports the error.
fn expect_no_driver() {
    let config = cclkit_runtime::Config::from_env().expect("config");
    match cclkit_runtime::world::init_from_env(&config) {
        Ok(_) => emit("error", "none"),
        Err(e) => emit("error", e.to_string()),
    }
}

#[test]
fn cuda_without_a_driver_fails_on_every_rank_with_a_clear_error() {
    rank!(expect_no_driver);
    if cclkit_tests::cuda_driver_present() {
        cclkit_tests::skip(
            test_name!(),
            "a CUDA driver is installed, so its absence cannot be tested here (the GPU \
             path is kernels/cuda/gpu-check.sh)",
        );
        return;
    }
    let run = Job::new(test_name!(), 2)
        .envs(builtin_net())
        .env("CCLKIT_DEVICE", "cuda")
        .timeout(Duration::from_secs(60))
        // The ranks fail before joining: the root need not wait long for them.
        .root_timeout(Duration::from_secs(3))
        .run();
    run.assert_ok();
    for r in 0..2 {
        let e = run.value(r, "error");
        let e = e.as_str().unwrap_or_default();
        assert!(
            e.contains("--device cuda:0: no CUDA driver: libcuda.so.1 not found"),
            "rank {r}: {e}"
        );
    }
}
