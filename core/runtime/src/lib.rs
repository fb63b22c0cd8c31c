//! cclkit's GPU-free reference runtime: communicators, bootstrap, launchers, topology,
//! channels and proxy progress, point-to-point and collectives, driving NCCL net plugins
//! on host memory (or a CUDA device) exactly the way NCCL's proxy thread does, so that a
//! plugin can be run, checked and benchmarked on any Linux machine.
//!
//! # The public surface
//!
//! | item | what it is |
//! | --- | --- |
//! | [`Comm`] | a communicator: `ncclCommInitRank`, split, destroy/abort, send/recv |
//! | [`coll`] | the collectives on a [`Comm`] (AllReduce … Barrier), alone or grouped |
//! | [`p2p`] | point-to-point groups (`ncclGroupStart`/`End`) |
//! | [`Config`] | every knob, read from the environment once per communicator |
//! | [`launch`], [`world`] | how a process learns its rank and joins (`--np`, mpirun, Slurm, torchrun, PMI) |
//! | [`UniqueId`], [`BootstrapRoot`] | naming and hosting one communicator's bootstrap root |
//! | [`device`] | where buffers live (host or CUDA) and the GPUDirect RDMA decision |
//! | [`tune`] | algorithm × protocol × channels choice: built-in cost model and tuner plugins |
//! | [`Error`], [`Result`] | an `ncclResult_t` code with a message naming rank, peer and step |
//!
//! Everything else is internal (`pub(crate)`):
//!
//! | module | job |
//! | --- | --- |
//! | `bootstrap` | root and per-rank endpoints, framed messages, allgather/barrier |
//! | `topo` | hosts, ring order, double binary trees, NIC per channel |
//! | `schedule` | every operation as per-channel NCCL primitives, before a byte moves |
//! | `connect` | listen/connect/accept through the bootstrap, as NCCL's transport setup |
//! | `fifo` | one net connection's `NCCL_STEPS` FIFO: `isend`/`irecv`/`test`, oldest first |
//! | `protocol` | buffer → chunk → slice → step, and the LL/LL128/Simple wire formats |
//! | `op` | one operation's user buffers and reduction, as the engine sees them |
//! | `proxy` | the progress engine: slices through FIFOs, reductions via `cclkit-kernels` |
//! | `profile` | profiler events (GroupApi … ProxyStep) with NCCL's nesting; one branch without a profiler |
//!
//! # One collective, from `cclkit perf` to a plugin's `isend`
//!
//! ```text
//! cclkit perf (core/cli) ─ world::init_from_env ─► Comm::init_rank
//!   comm/init: bootstrap ─► NetRegistry::select (cclkit-host; the built-in socket
//!              transport installed last) ─► peer exchange ─► ring + trees ─► tuning
//!              ─► FIFO placement ─► Proxy ─► ring/tree connections (connect)
//! comm.all_reduce(...)                                    coll
//!   ├─ tune: tuner plugin / cost model picks algo × proto × channels   tune
//!   ├─ schedule: ring or tree prims per channel                        schedule
//!   └─ proxy: each pass, per connection (fifo)                         proxy, fifo
//!        irecv posted ahead ─ slice: recv ⊕ src ─► kernels ─► send slot
//!        (direct prims, Simple protocol on host memory: irecv straight into the
//!         user's output and isend straight from it, the user buffer registered
//!         with regMr for the batch; `CCLKIT_DIRECT=0` stages through the slots)
//!        └─ NetContext comms (cclkit-host adapter, any ABI version v6–v12)
//!             └─ ncclNetPlugin_vN.isend / irecv / test ─► the wire
//! ```
//!
//! The runtime never calls a plugin directly: every call goes through the host
//! adapters of `cclkit-host`, which drive built-in and foreign plugins alike through
//! their exported C tables (oldest request first, registered memory always).

pub(crate) mod bootstrap;
pub mod coll;
pub mod comm;
pub mod config;
pub(crate) mod connect;
pub mod device;
pub mod error;
pub(crate) mod fifo;
pub mod launch;
pub(crate) mod op;
pub mod p2p;
pub(crate) mod profile;
pub(crate) mod protocol;
pub(crate) mod proxy;
pub(crate) mod schedule;
pub(crate) mod topo;
pub mod tune;
pub mod world;

pub use bootstrap::{Bootstrap, BootstrapRoot, UniqueId, random_u64};
pub use comm::Comm;
pub use config::Config;
pub use error::{Error, Result};
pub use protocol::ProtoParams;
pub use topo::{NetDevice, PeerInfo, Ring, select_nic};

/// Hands cclkit's built-in fallback transport (the socket plugin's exported v12 table)
/// to the host, so that every net registry made afterwards ends its walk with it, as
/// NCCL ends its walk with its internal socket transport. Idempotent; the runtime calls
/// it before it builds or uses a registry, and tools that build registries of their own
/// (`cclkit doctor`) call it first.
pub fn install_builtin_net() {
    cclkit_host::net::NetPlugin::install_builtin(&cclkit_net_socket::ncclNetPlugin_v12);
}
