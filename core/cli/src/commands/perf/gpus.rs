//! Which GPU each rank of `cclkit perf --device cuda` uses, and the header's note
//! when ranks share one.
//!
//! nccl-tests gives local rank `i` GPU `i` (modulo the GPUs present); a plain
//! `--device cuda` (or `CCLKIT_DEVICE=cuda`) does the same here, and `cuda:N`
//! pins every rank to GPU `N`. Ranks that share a GPU without CUDA MPS run their
//! kernels in separate contexts that the GPU time-slices: on one H200 (docs/cuda.md)
//! an 8-byte AllReduce on 2 ranks took ~550 µs that way and ~40 µs under MPS, so
//! the header says so rather than let such numbers pass for the device path's.

use cclkit_runtime::{Comm, Result};

/// The GPU of local rank `local_rank` when the device names none (`cuda`):
/// `local_rank` modulo the GPUs present, 0 without any.
pub fn ordinal_of(local_rank: usize) -> usize {
    local_rank % count().max(1)
}

/// The CUDA devices present (0 without the driver or the `cuda` feature).
fn count() -> usize {
    #[cfg(feature = "cuda")]
    {
        cclkit_kernels::cuda::CudaDevice::count().unwrap_or(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// The header's warning for this communicator, when ranks share a real GPU
/// without MPS (the ranks exchange their [`key`]s: every rank must call it).
///
/// # Errors
/// The exchange failing.
pub fn sharing_note_of(comm: &Comm) -> Result<Option<String>> {
    // Only a real GPU time-slices (not the emulator, not the host-memory stand-in).
    let real_gpu = !comm.device().is_emulated()
        && crate::standin::active_in(&|k| std::env::var_os(k)).is_none();
    // Every rank takes part, GPU or not: ranks of one communicator may differ
    // (`CCLKIT_DEVICE` per rank), and an exchange some skipped would stall.
    let me = &comm.peers()[comm.rank()];
    let key = match comm.device().gpu_label().filter(|_| real_gpu) {
        Some(gpu) => key(
            me.host_hash,
            &me.hostname,
            &gpu,
            mps_found(&|k| std::env::var(k).ok()),
        ),
        None => String::new(),
    };
    let keys: Vec<String> = comm
        .bootstrap()
        .allgather(key.as_bytes())?
        .into_iter()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect();
    Ok(sharing_note(&keys))
}

/// Whether an MPS control daemon is reachable: its pipe directory
/// (`CUDA_MPS_PIPE_DIRECTORY`, default `/tmp/nvidia-mps`) holds its `control`
/// socket. A client started then runs its kernels through the MPS server.
pub fn mps_found(get: &dyn Fn(&str) -> Option<String>) -> bool {
    let dir = get("CUDA_MPS_PIPE_DIRECTORY")
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "/tmp/nvidia-mps".to_owned());
    std::path::Path::new(&dir).join("control").exists()
}

/// One rank's GPU as the ranks exchange it, tab-separated: its host (the
/// runtime's host hash, which also decides local ranks, then the name shown),
/// its GPU (ordinal, name and PCI bus id) and whether it found MPS.
pub fn key(host_hash: u64, host: &str, gpu: &str, mps: bool) -> String {
    format!("{host_hash:x}\t{host}\t{gpu}\t{}", u8::from(mps))
}

/// The header's note for ranks that share a GPU while some of them found no MPS
/// (`keys[r]` is rank `r`'s [`key`], empty for a rank on no real GPU); `None`
/// when no GPU is shared that way.
pub fn sharing_note(keys: &[String]) -> Option<String> {
    // (host hash, host name, GPU, ranks, all under MPS)
    let mut groups: Vec<(&str, &str, &str, Vec<usize>, bool)> = Vec::new();
    for (rank, k) in keys.iter().enumerate().filter(|(_, k)| !k.is_empty()) {
        let mut f = k.splitn(4, '\t');
        let mut next = || f.next().unwrap_or("");
        let (hash, host, gpu, mps) = (next(), next(), next(), next() == "1");
        match groups.iter_mut().find(|g| g.0 == hash && g.2 == gpu) {
            Some(g) => {
                g.3.push(rank);
                g.4 &= mps;
            }
            None => groups.push((hash, host, gpu, vec![rank], mps)),
        }
    }
    let shared: Vec<String> = groups
        .iter()
        .filter(|g| g.3.len() > 1 && !g.4)
        .map(|g| format!("ranks {} share GPU {} on {}", list(&g.3), g.2, g.1))
        .collect();
    (!shared.is_empty()).then(|| {
        format!(
            "# WARNING: {} without CUDA MPS: the GPU time-slices between their \
             contexts, which dominates small sizes (start `nvidia-cuda-mps-control -d`, \
             or give each rank its own GPU; docs/cuda.md)\n",
            shared.join("; ")
        )
    })
}

/// `0,1,2`, shortened to `0-2` for a run.
fn list(ranks: &[usize]) -> String {
    match ranks {
        [first, .., last] if last - first + 1 == ranks.len() => format!("{first}-{last}"),
        _ => ranks
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mps_is_found_by_its_control_socket() {
        let dir = std::env::temp_dir().join(format!("cclkit-mps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.to_string_lossy().into_owned();
        let get = |k: &str| (k == "CUDA_MPS_PIPE_DIRECTORY").then(|| path.clone());
        assert!(!mps_found(&get), "no control socket yet");
        std::fs::write(dir.join("control"), b"").expect("stand-in socket");
        assert!(mps_found(&get));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_note_only_for_a_gpu_shared_without_mps() {
        // Host `h` gets the hash of its first letter, so names and hashes agree here.
        let k = |h: &str, g: &str, m: bool| key(u64::from(h.as_bytes()[0]), h, g, m);
        // One GPU per rank: nothing to say.
        assert_eq!(
            sharing_note(&[k("a", "0", false), k("a", "1", false)]),
            None
        );
        // Shared, every rank under MPS: nothing either.
        assert_eq!(sharing_note(&[k("a", "0", true), k("a", "0", true)]), None);
        // The same bus id on two hosts is two GPUs.
        assert_eq!(
            sharing_note(&[k("a", "0", false), k("b", "0", false)]),
            None
        );
        // Two hosts with one name (containers, say) are still two hosts: the
        // runtime's host hash decides, as it does for local ranks.
        assert_eq!(
            sharing_note(&[key(1, "node", "0", false), key(2, "node", "0", false)]),
            None
        );
        // Ranks on host memory (empty keys) share nothing, and do not split a run.
        assert_eq!(sharing_note(&[String::new(), String::new()]), None);
        let mixed = sharing_note(&[k("h", "g", false), String::new(), k("h", "g", false)]);
        assert!(mixed.is_some_and(|n| n.contains("ranks 0,2 share GPU g on h")));
        let note = sharing_note(&[
            k("a", "00:06.0", false),
            k("a", "00:06.0", true),
            k("a", "00:07.0", false),
            k("a", "00:06.0", true),
            k("b", "00:07.0", false),
            k("a", "00:07.0", false),
        ])
        .expect("two shared GPUs");
        assert!(note.starts_with("# WARNING: ranks 0,1,3 share GPU 00:06.0 on a; "));
        assert!(note.contains("; ranks 2,5 share GPU 00:07.0 on a without CUDA MPS"));
        assert!(note.ends_with("docs/cuda.md)\n"));
        let run = sharing_note(&[k("h", "g", false), k("h", "g", false), k("h", "g", false)]);
        assert!(run.is_some_and(|n| n.contains("ranks 0-2 share GPU g on h")));
    }
}
