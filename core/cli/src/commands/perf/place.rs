//! Where `cclkit perf --np N` puts its ranks: the loopback interface for the socket
//! transports (every rank is on this host); like `mpirun`, one core per rank when
//! there are at most two ranks; and, when ranks outnumber the CPUs evenly, rank i
//! on CPU i mod n.

/// `--bind`: how local ranks are pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Bind {
    /// `mpirun`'s default for up to two ranks (one core each, when there are
    /// enough cores); a multiple of the CPU count as [`Core`](Self::Core), which
    /// puts the same number of ranks on every CPU and ring neighbours on
    /// different ones; otherwise not pinned. Unpinned, 4 ranks on 2 CPUs flip
    /// between a fast and a slow placement from run to run: 22 or 37-41 us for
    /// an 8-byte all-reduce and 6.2-6.4 ms for 4 MiB, pinned 22-25 us and
    /// 3.8-4.1 ms. 3 ranks on 2 CPUs have no such placement: pinned, their 8-byte
    /// all-reduce took 21-31 us, unpinned 20-26 (docs/PERFORMANCE.md).
    Auto,
    /// Rank i on the i-th allowed CPU (wrapping around).
    Core,
    /// Not pinned.
    None,
}

/// The environment `--np` adds for its ranks, as `(name, value, why)`: nothing the
/// user already set is overridden.
pub fn local_env(
    get: &dyn Fn(&str) -> Option<String>,
) -> Vec<(&'static str, String, &'static str)> {
    let mut out = Vec::new();
    if get("NCCL_SOCKET_IFNAME").is_none() {
        // Traffic between ranks of one host takes the kernel's loopback path whatever
        // address it is sent to; naming `lo` also tells socket transports that there
        // is no NIC to spread over helper threads, which on a small machine only
        // compete with the ranks for the CPUs.
        out.push((
            "NCCL_SOCKET_IFNAME",
            "lo".to_string(),
            "every rank is on this host",
        ));
    }
    out
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `set` is a plain bit mask the kernel fills; its size is passed along.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The CPU this thread is pinned to, if its affinity is a single CPU.
pub fn pinned_cpu() -> Option<usize> {
    match allowed_cpus()[..] {
        [cpu] => Some(cpu),
        _ => None,
    }
}

/// Whether `mode` pins `local_size` ranks on `cpus` allowed CPUs.
fn pins(mode: Bind, local_size: usize, cpus: usize) -> bool {
    match mode {
        Bind::None => false,
        Bind::Core => cpus > 0,
        Bind::Auto => {
            cpus > 0 && (local_size <= 2.min(cpus) || (local_size > cpus && local_size % cpus == 0))
        }
    }
}

/// Pins this process (all its threads, present and future) for local rank
/// `local_rank` of `local_size`; returns the CPU when it did.
pub fn bind(mode: Bind, local_rank: usize, local_size: usize) -> Option<usize> {
    let cpus = allowed_cpus();
    if !pins(mode, local_size, cpus.len()) {
        return None;
    }
    let cpu = cpus[local_rank % cpus.len()];
    // SAFETY: as above; pid 0 is this thread, and threads started later inherit it
    // (the communicator's threads start after this).
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    ok.then_some(cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_only_when_unset() {
        let unset = |_: &str| None;
        let env = local_env(&unset);
        assert_eq!(env.len(), 1);
        assert_eq!((env[0].0, env[0].1.as_str()), ("NCCL_SOCKET_IFNAME", "lo"));
        let set = |k: &str| (k == "NCCL_SOCKET_IFNAME").then(|| "eth0".to_string());
        assert!(local_env(&set).is_empty());
    }

    #[test]
    fn auto_binding_follows_mpirun_until_ranks_outnumber_cpus_evenly() {
        assert_eq!(bind(Bind::None, 0, 1), None);
        // Up to two ranks with a core each, as mpirun.
        assert!(pins(Bind::Auto, 1, 2) && pins(Bind::Auto, 2, 2) && pins(Bind::Auto, 2, 16));
        // Between two and the CPU count: free, as mpirun's socket binding.
        assert!(!pins(Bind::Auto, 3, 16) && !pins(Bind::Auto, 16, 16));
        // A multiple of the CPUs: round robin; more, unevenly: free.
        assert!(pins(Bind::Auto, 4, 2) && pins(Bind::Auto, 6, 2) && pins(Bind::Auto, 32, 16));
        assert!(!pins(Bind::Auto, 3, 2) && !pins(Bind::Auto, 17, 16) && pins(Bind::Auto, 2, 1));
        assert!(!pins(Bind::Auto, 4, 0) && !pins(Bind::None, 4, 2) && pins(Bind::Core, 3, 16));
    }
}
