//! How the engine's threads wait for the network without wasting the CPU that the
//! ranks sharing it need (part of [`proxy`](super)).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Passes that only spin before a waiting thread yields when ranks share cores:
/// few, because a pass polls its busy connections (system calls) and a peer sharing
/// this core cannot run until this thread yields.
const SHARED_SPINS: u32 = 4;
/// How long a waiting thread polls without yielding when every rank has a core of
/// its own (as MPI libraries do): yielding would only hand the core to unrelated
/// work and add its time slice to the operation's latency.
const OWN_CORE_SPIN_FOR: Duration = Duration::from_millis(2);
/// How long a waiting thread yields before it sleeps in short steps. Long enough
/// to cover the wait for one slice of a pipelined transfer on ranks that share
/// cores: a sleep step ends ~100 µs late (timer slack), and a rank that sleeps
/// while its slice arrives stalls the whole ring behind it. Measured on 4 ranks
/// over 2 CPUs (best of 3, 1–8 MiB AllReduce): 200 µs of yielding was 15–30 %
/// slower than 2 ms; sleeping never (yield only) was no faster than 2 ms.
const YIELD_FOR: Duration = Duration::from_millis(2);
/// One sleep step once yielding went on for [`YIELD_FOR`].
const SLEEP_STEP: Duration = Duration::from_micros(50);

/// Live engines in this process (ranks run as threads count here).
pub(super) static ENGINES: AtomicUsize = AtomicUsize::new(0);

/// Whether this host runs more ranks than there are CPUs for them: the launch's
/// local rank count (cclkit's launcher, mpirun, Slurm, torchrun) or the engines
/// of this process, whichever is larger, against the CPUs this process may use —
/// or, when a launcher pinned it to a single CPU (`--bind-to core`), the CPUs
/// online, among which the launcher spread the ranks.
pub(super) fn cores_shared() -> bool {
    static LAUNCH: OnceLock<(usize, usize)> = OnceLock::new();
    let &(local, cpus) = LAUNCH.get_or_init(|| {
        let local = super::super::launch::detect(&super::super::launch::ProcessEnv)
            .ok()
            .flatten()
            .map_or(1, |l| l.local_size);
        let mine = std::thread::available_parallelism().map_or(1, |n| n.get());
        // SAFETY: sysconf has no preconditions.
        let online = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) })
            .unwrap_or(1)
            .max(1);
        (local, if mine == 1 { online } else { mine })
    });
    local.max(ENGINES.load(Ordering::Relaxed)) > cpus
}

/// How a thread waits for the network. With a core per rank: poll (a reply may be
/// microseconds away), then yield, then sleep in short steps. When ranks share
/// cores: spin a few passes, then yield at once (the peer we wait for may need this
/// core), then sleep so that the ranks with work get the CPUs.
pub(super) struct Backoff {
    pub(super) idle: u32,
    since: Option<Instant>,
    shared: bool,
    /// Still in the polling phase (known at the last clock reading).
    phase_spin: bool,
}

impl Backoff {
    pub(super) fn new() -> Self {
        let shared = cores_shared();
        Self {
            idle: 0,
            since: None,
            shared,
            phase_spin: !shared,
        }
    }

    pub(super) fn reset(&mut self) {
        self.idle = 0;
        self.since = None;
        self.phase_spin = !self.shared;
    }

    pub(super) fn pause(&mut self) {
        self.idle = self.idle.saturating_add(1);
        if self.shared && self.idle <= SHARED_SPINS {
            std::hint::spin_loop();
            return;
        }
        if !self.shared && self.idle % 16 != 0 && self.phase_spin {
            // Polling on its own core: the clock is only read every 16 passes.
            std::hint::spin_loop();
            return;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        let spin_for = if self.shared {
            Duration::ZERO
        } else {
            OWN_CORE_SPIN_FOR
        };
        let waited = since.elapsed();
        self.phase_spin = waited < spin_for;
        if self.phase_spin {
            std::hint::spin_loop();
        } else if waited < spin_for + YIELD_FOR {
            std::thread::yield_now();
        } else {
            std::thread::park_timeout(SLEEP_STEP);
        }
    }
}
