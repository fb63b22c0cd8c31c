//! Launchers: where a process learns its rank, the rank count, and how to reach the
//! bootstrap root — from the engine that started it (`mpirun`, Slurm, torchrun, PMI)
//! or from cclkit's own local launcher (`--np N`).
//!
//! The root is hosted by rank 0 at an address every rank can compute (or by the local
//! launcher's parent process). `CCLKIT_ROOT_ADDR` (or NCCL's `NCCL_COMM_ID`, `ip:port`)
//! overrides the address for any engine; multi-node `mpirun` needs it, because
//! OpenMPI tells a process nothing about rank 0's host.

use std::hash::{Hash, Hasher};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

pub use super::bootstrap::MAX_RANKS;
use super::bootstrap::{BootstrapRoot, UniqueId};
use super::error::{Error, Result};

/// How this process's bootstrap id is obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdSource {
    /// A complete id was handed over (`CCLKIT_UNIQUE_ID`): someone else hosts the root.
    Given(UniqueId),
    /// Rank 0 hosts the root at this address with this magic; the others connect to it.
    HostedByRank0(UniqueId),
}

/// Rank placement read from a launcher's environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Which engine started us (for logs): "cclkit", "torchrun", "openmpi", "slurm", "pmi".
    pub engine: &'static str,
    /// Global rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// Rank among the processes on this host.
    pub local_rank: usize,
    /// Processes on this host.
    pub local_size: usize,
    /// Where the bootstrap id comes from.
    pub id: IdSource,
}

/// Reads environment variables through a function, so detection is testable.
pub trait Env {
    /// The value of `name`, if set.
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl<F: Fn(&str) -> Option<String>> Env for F {
    fn get(&self, name: &str) -> Option<String> {
        self(name)
    }
}

fn num(env: &dyn Env, name: &str) -> Result<Option<usize>> {
    env.get(name)
        .map(|v| crate::config::parse_count(name, &v, 0, u32::MAX.into()).map(|n| n as usize))
        .transpose()
}

/// A rank and rank count pair, checked: `1 <= size <= MAX_RANKS` and `rank < size`.
fn placed(rank: usize, size: usize, names: (&str, &str)) -> Result<(usize, usize)> {
    if size == 0 || size > MAX_RANKS {
        return Err(Error::invalid_argument(format!(
            "{}={size}: the rank count must be in 1..={MAX_RANKS}",
            names.1
        )));
    }
    if rank >= size {
        return Err(Error::invalid_argument(format!(
            "{}={rank} is not below {}={size}",
            names.0, names.1
        )));
    }
    Ok((rank, size))
}

fn need(env: &dyn Env, name: &str, engine: &str) -> Result<usize> {
    num(env, name)?
        .ok_or_else(|| Error::invalid_argument(format!("{engine} launch: {name} is not set")))
}

/// A stable magic for ranks that cannot exchange one (all derive it from shared facts).
fn derived_magic(parts: &[&str]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    "cclkit-bootstrap".hash(&mut h);
    parts.hash(&mut h);
    h.finish()
}

fn resolve(host: &str, port: u16, what: &str) -> Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::system(format!("{what}: cannot resolve {host}: {e}")))?
        .collect();
    // IPv4 first (what the other ranks most likely reach), else whatever resolved.
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| Error::system(format!("{what}: {host} has no address")))
}

fn parse_root(value: &str, name: &str) -> Result<SocketAddr> {
    if let Ok(a) = value.parse() {
        return Ok(a);
    }
    let (host, port) = value
        .rsplit_once(':')
        .ok_or_else(|| Error::invalid_argument(format!("{name}={value}: expected host:port")))?;
    let port = port
        .parse()
        .map_err(|_| Error::invalid_argument(format!("{name}={value}: bad port")))?;
    resolve(host.trim_matches(['[', ']']), port, name)
}

/// The explicit root override, if any.
fn root_override(env: &dyn Env) -> Result<Option<SocketAddr>> {
    for name in ["CCLKIT_ROOT_ADDR", "NCCL_COMM_ID"] {
        if let Some(v) = env.get(name) {
            return parse_root(&v, name).map(Some);
        }
    }
    Ok(None)
}

/// A port in 20000..32000 derived from a job identifier: below Linux's default
/// ephemeral range (32768 and up), so no outgoing connection on the host can be
/// holding it when rank 0 binds it (one did, under 20000..50000, in a test run).
fn derived_port(job: &str) -> u16 {
    (20_000 + derived_magic(&[job]) % 12_000) as u16
}

/// Detects the launcher from `env`. `Ok(None)` = not started by any known engine.
pub fn detect(env: &dyn Env) -> Result<Option<Launch>> {
    // cclkit's own launcher (and manual runs): a complete id is given.
    if let Some(id) = env.get("CCLKIT_UNIQUE_ID") {
        let id: UniqueId = id.parse()?;
        let (rank, nranks) = placed(
            need(env, "CCLKIT_RANK", "cclkit")?,
            need(env, "CCLKIT_NRANKS", "cclkit")?,
            ("CCLKIT_RANK", "CCLKIT_NRANKS"),
        )?;
        return Ok(Some(Launch {
            engine: "cclkit",
            rank,
            nranks,
            local_rank: num(env, "CCLKIT_LOCAL_RANK")?.unwrap_or(0),
            local_size: num(env, "CCLKIT_LOCAL_SIZE")?.unwrap_or(1),
            id: IdSource::Given(id),
        }));
    }
    let over = root_override(env)?;
    // torchrun / torch.distributed.elastic. Its agent's store owns MASTER_PORT, so the
    // root uses MASTER_PORT + 1 (or CCLKIT_ROOT_ADDR).
    if let (Some(rank), Some(size)) = (num(env, "RANK")?, num(env, "WORLD_SIZE")?) {
        let (rank, size) = placed(rank, size, ("RANK", "WORLD_SIZE"))?;
        let addr = match over {
            Some(a) => a,
            None => {
                let host = env.get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
                let port: u16 = need(env, "MASTER_PORT", "torchrun")?
                    .checked_add(1)
                    .and_then(|p| u16::try_from(p).ok())
                    .ok_or_else(|| {
                        Error::invalid_argument("torchrun launch: MASTER_PORT out of range")
                    })?;
                resolve(&host, port, "torchrun launch (MASTER_ADDR)")?
            }
        };
        let run = env.get("TORCHELASTIC_RUN_ID").unwrap_or_default();
        let magic = derived_magic(&["torchrun", &run, &addr.to_string(), &size.to_string()]);
        return Ok(Some(Launch {
            engine: "torchrun",
            rank,
            nranks: size,
            local_rank: num(env, "LOCAL_RANK")?.unwrap_or(0),
            local_size: num(env, "LOCAL_WORLD_SIZE")?.unwrap_or(1),
            id: IdSource::HostedByRank0(UniqueId { root: addr, magic }),
        }));
    }
    // Open MPI's mpirun.
    if let (Some(rank), Some(size)) = (
        num(env, "OMPI_COMM_WORLD_RANK")?,
        num(env, "OMPI_COMM_WORLD_SIZE")?,
    ) {
        let (rank, size) = placed(rank, size, ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))?;
        let local_size = num(env, "OMPI_COMM_WORLD_LOCAL_SIZE")?.unwrap_or(1);
        let job = [
            "PMIX_NAMESPACE",
            "OMPI_MCA_orte_ess_jobid",
            "OMPI_MCA_ess_base_jobid",
        ]
        .iter()
        .find_map(|n| env.get(n))
        .unwrap_or_default();
        let addr = match over {
            Some(a) => a,
            None if local_size == size => SocketAddr::from(([127, 0, 0, 1], derived_port(&job))),
            None => {
                return Err(Error::invalid_usage(
                    "mpirun across several hosts: set CCLKIT_ROOT_ADDR=<rank 0's host>:<free port> \
                     (Open MPI does not tell a process where rank 0 runs)",
                ));
            }
        };
        return Ok(Some(Launch {
            engine: "openmpi",
            rank,
            nranks: size,
            local_rank: num(env, "OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(0),
            local_size,
            id: IdSource::HostedByRank0(UniqueId {
                root: addr,
                magic: derived_magic(&["openmpi", &job, &size.to_string()]),
            }),
        }));
    }
    // Slurm (srun): rank 0 runs on the first host of the step.
    if let (Some(rank), Some(size)) = (num(env, "SLURM_PROCID")?, num(env, "SLURM_NTASKS")?) {
        let (rank, size) = placed(rank, size, ("SLURM_PROCID", "SLURM_NTASKS"))?;
        let job = format!(
            "{}.{}",
            env.get("SLURM_JOB_ID").unwrap_or_default(),
            env.get("SLURM_STEP_ID").unwrap_or_default()
        );
        let addr = match over {
            Some(a) => a,
            None => {
                let list = env
                    .get("SLURM_STEP_NODELIST")
                    .or_else(|| env.get("SLURM_JOB_NODELIST"))
                    .ok_or_else(|| {
                        Error::invalid_argument("slurm launch: SLURM_JOB_NODELIST is not set")
                    })?;
                let first = expand_hostlist(&list)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| Error::invalid_argument("slurm launch: empty node list"))?;
                let port = match num(env, "CCLKIT_ROOT_PORT")? {
                    Some(p) => u16::try_from(p)
                        .map_err(|_| Error::invalid_argument("CCLKIT_ROOT_PORT out of range"))?,
                    None => derived_port(&job),
                };
                resolve(&first, port, "slurm launch (first host of the job)")?
            }
        };
        return Ok(Some(Launch {
            engine: "slurm",
            rank,
            nranks: size,
            local_rank: num(env, "SLURM_LOCALID")?.unwrap_or(0),
            local_size: env
                .get("SLURM_NTASKS_PER_NODE")
                .and_then(|v| v.split(['(', ',']).next().and_then(|n| n.parse().ok()))
                .unwrap_or(1),
            id: IdSource::HostedByRank0(UniqueId {
                root: addr,
                magic: derived_magic(&["slurm", &job, &size.to_string()]),
            }),
        }));
    }
    // PMI (MPICH/Hydra and others).
    if let (Some(rank), Some(size)) = (num(env, "PMI_RANK")?, num(env, "PMI_SIZE")?) {
        let (rank, size) = placed(rank, size, ("PMI_RANK", "PMI_SIZE"))?;
        let local_size = num(env, "MPI_LOCALNRANKS")?.unwrap_or(1);
        let job = env
            .get("PMI_KVSNAME")
            .or_else(|| env.get("PMI_ID"))
            .unwrap_or_default();
        let addr = match over {
            Some(a) => a,
            None if local_size == size => SocketAddr::from(([127, 0, 0, 1], derived_port(&job))),
            None => {
                return Err(Error::invalid_usage(
                    "PMI launch across hosts: set CCLKIT_ROOT_ADDR=<rank 0's host>:<port>",
                ));
            }
        };
        return Ok(Some(Launch {
            engine: "pmi",
            rank,
            nranks: size,
            local_rank: num(env, "MPI_LOCALRANKID")?.unwrap_or(0),
            local_size,
            id: IdSource::HostedByRank0(UniqueId {
                root: addr,
                magic: derived_magic(&["pmi", &job, &size.to_string()]),
            }),
        }));
    }
    Ok(None)
}

/// Expands a Slurm host list: `node[01-03,7],gpu5` → node01 node02 node03 node7 gpu5.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>> {
    let bad = || Error::invalid_argument(format!("cannot parse host list '{list}'"));
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let bytes = list.as_bytes();
    let mut items = Vec::new();
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    for item in items.into_iter().filter(|s| !s.is_empty()) {
        match item.split_once('[') {
            None => out.push(item.to_string()),
            Some((prefix, rest)) => {
                let (ranges, suffix) = rest.split_once(']').ok_or_else(bad)?;
                for r in ranges.split(',') {
                    match r.split_once('-') {
                        None => out.push(format!("{prefix}{r}{suffix}")),
                        Some((a, b)) => {
                            let (lo, hi): (usize, usize) =
                                (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                            if hi < lo || hi - lo > 100_000 {
                                return Err(bad());
                            }
                            for n in lo..=hi {
                                out.push(format!("{prefix}{n:0width$}{suffix}", width = a.len()));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Makes or joins the bootstrap id for `launch`: rank 0 hosts the root when asked to.
pub fn establish(launch: &Launch, timeout: Duration) -> Result<(UniqueId, Option<BootstrapRoot>)> {
    match launch.id {
        IdSource::Given(id) => Ok((id, None)),
        IdSource::HostedByRank0(id) if launch.rank == 0 => {
            let bind = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), id.root.port());
            let (_, root) = BootstrapRoot::start(bind, id.magic, timeout).map_err(|e| {
                e.context(format!("{} launch: rank 0 cannot host the bootstrap root on port {} (set CCLKIT_ROOT_ADDR)", launch.engine, id.root.port()))
            })?;
            Ok((id, Some(root)))
        }
        IdSource::HostedByRank0(id) => Ok((id, None)),
    }
}

mod local;

pub use local::{
    LocalOptions, REPORT_FD_ENV, RankExit, failures, report, run_local, run_local_with,
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| m.get(k).cloned()
    }

    #[test]
    fn derived_root_ports_stay_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..5000)
            .map(|j| derived_port(&format!("job{j}")))
            .collect();
        assert!(
            ports.iter().all(|p| (20_000..32_000).contains(p)),
            "{ports:?}"
        );
        // Spread over the range, not piled on a few values.
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert!(distinct.len() > 3000, "{} distinct ports", distinct.len());
    }

    #[test]
    fn hostlists_expand_like_slurm() {
        assert_eq!(
            expand_hostlist("node[01-03,7],gpu5").unwrap(),
            ["node01", "node02", "node03", "node7", "gpu5"]
        );
        assert_eq!(expand_hostlist("a").unwrap(), ["a"]);
        assert_eq!(
            expand_hostlist("r[9-11]x").unwrap(),
            ["r9x", "r10x", "r11x"]
        );
        assert!(expand_hostlist("n[3-1]").is_err());
    }

    #[test]
    fn engines_are_recognised() {
        assert_eq!(detect(&env(&[])).unwrap(), None);
        let t = detect(&env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("LOCAL_RANK", "1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (t.engine, t.rank, t.nranks, t.local_rank),
            ("torchrun", 3, 8, 1)
        );
        let IdSource::HostedByRank0(id) = t.id else {
            panic!()
        };
        assert_eq!(id.root, "127.0.0.1:29501".parse().unwrap());
        let o = detect(&env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("PMIX_NAMESPACE", "job42"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (o.engine, o.rank, o.nranks, o.local_size),
            ("openmpi", 1, 4, 4)
        );
        // Every rank of the job derives the same root and magic.
        let o2 = detect(&env(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("PMIX_NAMESPACE", "job42"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(o.id, o2.id);
        let multi = detect(&env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]));
        assert!(multi.unwrap_err().message().contains("CCLKIT_ROOT_ADDR"));
        let s = detect(&env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "6"),
            ("SLURM_JOB_NODELIST", "localhost"),
            ("SLURM_JOB_ID", "77"),
            ("SLURM_LOCALID", "2"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (s.engine, s.rank, s.nranks, s.local_rank),
            ("slurm", 5, 6, 2)
        );
        let forced = detect(&env(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("CCLKIT_ROOT_ADDR", "10.9.8.7:1234"),
        ]))
        .unwrap()
        .unwrap();
        let IdSource::HostedByRank0(id) = forced.id else {
            panic!()
        };
        assert_eq!(id.root, "10.9.8.7:1234".parse().unwrap());
        let given = detect(&env(&[
            ("CCLKIT_UNIQUE_ID", "cclkit1:127.0.0.1:5:ab"),
            ("CCLKIT_RANK", "1"),
            ("CCLKIT_NRANKS", "2"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            given.id,
            IdSource::Given("cclkit1:127.0.0.1:5:ab".parse().unwrap())
        );
        for (rank, size, want) in [
            ("0", "0", "WORLD_SIZE=0"),
            ("0", "4294967295", "WORLD_SIZE=4294967295"),
            ("0", "4294967296", "WORLD_SIZE=4294967296"),
            ("4", "4", "RANK=4 is not below"),
            ("0", "", "WORLD_SIZE="),
        ] {
            let e = detect(&env(&[
                ("RANK", rank),
                ("WORLD_SIZE", size),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29411"),
            ]))
            .unwrap_err();
            assert!(e.message().contains(want), "{want}: {e}");
        }
        assert!(
            detect(&env(&[("RANK", "x"), ("WORLD_SIZE", "2")]))
                .unwrap_err()
                .message()
                .contains("RANK=x")
        );
    }
}
