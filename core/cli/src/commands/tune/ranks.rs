//! Running as ranks: joining (or spawning) the world, communicators with their own
//! settings, and one collective of a given size.

use std::process::ExitCode;
use std::time::Duration;

use cclkit_abi::raw::common::{DataType, Func, RedOp};

use cclkit_runtime::tune::Decision;
use cclkit_runtime::{BootstrapRoot, UniqueId, random_u64};
use cclkit_runtime::{Comm, Config, world};

/// Time the other ranks get to notice a failed rank before they are killed.
const GRACE: Duration = Duration::from_secs(10);

/// How this process takes part.
pub(crate) enum Joined {
    /// It launched `--np` local ranks and they have all ended: exit with this.
    Launched(ExitCode),
    /// It is a rank.
    Rank(Box<Comm>),
}

/// Joins the launch this process belongs to; when there is none and `np > 1`,
/// re-runs this command as `np` local ranks and waits for them.
///
/// The launcher's exit status is 0 when every rank exited 0, otherwise the largest
/// rank status (so "1: mismatch" from rank 0 comes through), 2 for a killed rank.
pub(crate) fn join(np: usize, config: &Config, timeout: Duration) -> Result<Joined, String> {
    match world::detect().map_err(|e| e.to_string())? {
        None if np > 1 => {
            let args: Vec<String> = std::env::args_os()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let exits = world::spawn_self(np, &args, timeout, GRACE).map_err(|e| e.to_string())?;
            let Some(why) = world::failures(&exits) else {
                return Ok(Joined::Launched(ExitCode::SUCCESS));
            };
            let code = exits
                .iter()
                .map(|e| match e.code {
                    Some(c) => u8::try_from(c.clamp(0, 255)).unwrap_or(2),
                    None => 2,
                })
                .max()
                .unwrap_or(2);
            // Rank 0 explains a mismatch itself; anything else is worth a line.
            if code != 1 {
                eprintln!("cclkit tune: {why}");
            }
            Ok(Joined::Launched(ExitCode::from(code.max(1))))
        }
        None => world::single(config)
            .map(|c| Joined::Rank(Box::new(c)))
            .map_err(|e| e.to_string()),
        Some(_) => match world::init_from_env(config).map_err(|e| e.to_string())? {
            Some(c) => Ok(Joined::Rank(Box::new(c))),
            None => Err("the launcher environment disappeared".to_owned()),
        },
    }
}

/// A new communicator of the same ranks as `base`, with `config` (rank 0 hosts its
/// bootstrap root and sends the id over `base`'s bootstrap). Every rank must call it.
pub(crate) fn sub_comm(base: &Comm, config: &Config) -> Result<Comm, String> {
    let rank = base.rank();
    let (mine, root) = if rank == 0 {
        let bind = std::net::SocketAddr::new(base.peers()[0].ip, 0);
        let (id, root) = BootstrapRoot::start(bind, random_u64(), config.bootstrap_timeout)
            .map_err(|e| format!("bootstrap root: {e}"))?;
        (id.to_string().into_bytes(), Some(root))
    } else {
        (Vec::new(), None)
    };
    let all = base
        .bootstrap()
        .allgather(&mine)
        .map_err(|e| format!("sharing the communicator id: {e}"))?;
    let first = all
        .first()
        .ok_or_else(|| "sharing the communicator id: no answer from rank 0".to_owned())?;
    let id: UniqueId = String::from_utf8_lossy(first)
        .parse()
        .map_err(|e| format!("communicator id from rank 0: {e}"))?;
    Comm::init_with_root(base.nranks(), &id, rank, config, root).map_err(|e| e.to_string())
}

/// Rounds `size` up to a size every collective takes on `n` ranks (a whole number
/// of `float` per rank for ReduceScatter).
pub(crate) fn valid_size(size: u64, n: usize) -> u64 {
    let unit = 4 * n.max(1) as u64;
    size.div_ceil(unit).max(1) * unit
}

/// The buffers one rank runs collectives on.
pub(crate) struct Buffers {
    send: Vec<u8>,
    recv: Vec<u8>,
}

impl Buffers {
    /// Buffers for sizes up to `max` bytes, filled with small floats (any data would
    /// do; these stay finite under repeated sums).
    pub(crate) fn new(max: u64) -> Result<Self, String> {
        let len = usize::try_from(max).map_err(|_| format!("{max} bytes is too large"))?;
        let send: Vec<u8> = (0..len / 4)
            .flat_map(|i| ((i % 7) as f32 * 0.25).to_le_bytes())
            .chain(std::iter::repeat_n(0, len % 4))
            .collect();
        Ok(Self {
            send,
            recv: vec![0; len],
        })
    }

    /// Runs `func` on `size` bytes as nccl-tests counts them (the `nBytes` a tuner is
    /// asked about: the whole output of AllGather, the whole input of ReduceScatter).
    /// `size` must be a [`valid_size`] no larger than the buffers.
    pub(crate) fn run(&mut self, comm: &Comm, func: Func, size: u64) -> Result<Decision, String> {
        let n = comm.nranks();
        let s = usize::try_from(size)
            .ok()
            .filter(|s| *s <= self.send.len())
            .ok_or_else(|| format!("{size} bytes is larger than the buffers"))?;
        let (send, recv) = (&self.send[..s], &mut self.recv[..s]);
        let (f32, sum) = (DataType::FLOAT32, RedOp::SUM);
        let r = match func {
            Func::ALL_REDUCE => comm.all_reduce(send, recv, f32, sum),
            Func::BROADCAST => comm.broadcast(send, recv, 0),
            Func::REDUCE => comm.reduce(send, recv, f32, sum, 0),
            Func::ALL_GATHER => comm.all_gather(&send[..s / n], recv),
            Func::REDUCE_SCATTER => comm.reduce_scatter(send, &mut recv[..s / n], f32, sum),
            f => return Err(format!("{f:?} is not a tuned collective")),
        };
        r.map_err(|e| format!("{func:?} of {size} bytes: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_sizes_are_whole_floats_per_rank() {
        assert_eq!(valid_size(8, 2), 8);
        assert_eq!(valid_size(9, 2), 16);
        assert_eq!(valid_size(1, 3), 12);
        assert_eq!(valid_size(1 << 20, 3), (1u64 << 20).div_ceil(12) * 12);
    }
}
