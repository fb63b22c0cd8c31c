//! Communicators: `ncclCommInitRank`, split, finalize/destroy/abort, and the
//! machinery every operation shares (connections, batches, the proxy engine).

use std::sync::Mutex;
use std::time::Duration;

use cclkit_abi::raw::common::{DataType, Protocol, RedOp};
use cclkit_kernels::Reduction;

use super::bootstrap::{Bootstrap, BootstrapRoot, UniqueId, random_u64};
use super::config::Config;
use super::connect::{Placed, connect_placed};
use super::device::{Device, Placement};
use super::error::{Error, Result};
use super::op::{OpRef, UserBufs};
use super::protocol::ProtoParams;
use super::proxy::{Batch, Proxy, Step};
use super::schedule::{Link, LinkClass, Plan, Shape};
use super::topo::{self, NetDevice, PeerInfo};
use super::tune::Tuning;
use cclkit_host::net::NetContext;

mod init;

/// Limits every rank agreed on at init (the minimum over ranks).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest point-to-point transfer the plugin takes.
    pub max_p2p_bytes: usize,
    /// Largest collective transfer the plugin takes.
    pub max_coll_bytes: usize,
    /// Most buffers in one grouped receive.
    pub max_recvs: usize,
}

/// What a collective's schedule depends on besides the communicator: the same
/// keys give the same steps, so a group repeating the last one's keys reruns its
/// steps instead of planning them again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepKey {
    /// The collective.
    pub func: cclkit_abi::raw::common::Func,
    /// Bytes per rank.
    pub bytes: usize,
    /// Data type (element size and reduction).
    pub dtype: DataType,
    /// Reduction op (AVG adds a second reduction to PAT).
    pub op: RedOp,
    /// Root rank.
    pub root: usize,
    /// Algorithm, protocol, channels and chunk it ran with.
    pub dec: super::tune::Decision,
}

/// The steps of one collective group that ran as one batch.
pub(crate) struct StepCache {
    /// Per collective of the group, in order.
    pub keys: Vec<StepKey>,
    /// The batch's steps per channel.
    pub channels: Vec<Vec<Step>>,
    /// The last run's operation list, emptied: the next run fills it without
    /// allocating.
    pub ops: Vec<OpRef>,
}

/// A communicator: one rank's view of a group of ranks.
pub struct Comm {
    rank: usize,
    nranks: usize,
    local_rank: usize,
    config: Config,
    boot: Bootstrap,
    _root: Option<BootstrapRoot>,
    peers: Vec<PeerInfo>,
    ring: topo::Ring,
    shape: Shape,
    channels: usize,
    params: [ProtoParams; 3],
    limits: Limits,
    devices: Vec<NetDevice>,
    /// Per peer, whether the point-to-point (send, receive) links are connected.
    p2p_links: Mutex<Vec<[bool; 2]>>,
    /// The steps of the last collective group, for the next identical one.
    step_cache: Mutex<Option<StepCache>>,
    tuning: Tuning,
    /// Every rank's buffers are host memory (slices and chunks sized for a CPU
    /// cache); false when any rank's are device memory.
    host_buffers: bool,
    /// Where user buffers live (`CCLKIT_DEVICE`).
    device: Device,
    /// The GPU's PCI path, and per NIC where (send, receive) FIFO slots live.
    gpu_pci: Option<String>,
    places: Vec<(Placement, Placement)>,
    // Dropped in this order: the engine (closing connections) before the plugin context.
    proxy: Proxy,
    net: NetContext,
    /// The profiler context; dropped (finalized) after the engine's last event.
    profile: crate::profile::Profile,
}

/// The plugin a communicator runs on, as every rank reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetReport {
    /// Table name.
    pub name: String,
    /// ABI version.
    pub version: u32,
}

impl Comm {
    /// `ncclCommInitRank`: joins the communicator `id` as `rank` of `nranks`.
    pub fn init_rank(nranks: usize, id: &UniqueId, rank: usize, config: &Config) -> Result<Self> {
        Self::init_inner(nranks, id, rank, config, None)
    }

    /// As [`init_rank`](Self::init_rank), keeping `root` (the bootstrap root this
    /// process hosts, if any) alive as long as the communicator.
    pub fn init_with_root(
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        config: &Config,
        root: Option<BootstrapRoot>,
    ) -> Result<Self> {
        Self::init_inner(nranks, id, rank, config, root)
    }

    /// The device and FIFO placements for connecting (`None` on the host).
    fn placed(&self) -> Option<Placed<'_>> {
        self.device
            .is_cuda()
            .then_some((self.gpu_pci.as_deref(), self.places.as_slice()))
    }

    /// Where this communicator's buffers live.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The profiler state (one branch when no profiler is loaded).
    pub(crate) fn profile(&self) -> &crate::profile::Profile {
        &self.profile
    }

    /// The profiler plugin this communicator reports to, as "name vN" (`None`: no
    /// profiler loaded, or its `init` failed for this communicator).
    pub fn profiler_name(&self) -> Option<String> {
        self.profile()
            .ctx()
            .map(|c| format!("{} v{}", c.plugin().name(), c.plugin().version()))
    }

    /// The tuning state (decisions, the tuner in use, the report).
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// Ring and tree connections of every channel.
    fn connect_collective_links(&self) -> Result<()> {
        if self.nranks == 1 {
            return Ok(());
        }
        let (mut sends, mut recvs) = (Vec::new(), Vec::new());
        for ch in 0..self.channels {
            let l = |peer, class| Link {
                peer,
                channel: ch,
                class,
            };
            sends.push(l(self.ring.next(self.rank), LinkClass::Ring));
            recvs.push(l(self.ring.prev(self.rank), LinkClass::Ring));
            let t = &self.shape.trees[ch % 2];
            for &peer in t.up.iter().chain(&t.down) {
                sends.push(l(peer, LinkClass::Tree));
                recvs.push(l(peer, LinkClass::Tree));
            }
        }
        let (s, r) = connect_placed(
            &self.boot,
            &self.net,
            &self.devices,
            self.placed(),
            self.local_rank,
            &sends,
            &recvs,
        )?;
        self.proxy.install(s, r)
    }

    /// Connects point-to-point links not connected yet (both peers call this in their
    /// matching group).
    pub(crate) fn ensure_p2p(&self, peers_send: &[usize], peers_recv: &[usize]) -> Result<()> {
        let mut have = self.p2p_links.lock().unwrap_or_else(|p| p.into_inner());
        // Every call after the first finds its links (AllReduce PAT asks on every
        // operation): answer that without sorting or allocating.
        let has = |have: &[[bool; 2]], p: usize, send: bool| {
            have.get(p).is_some_and(|l| l[usize::from(send)])
        };
        let missing = |peers: &[usize], send: bool| {
            peers
                .iter()
                .any(|&p| p != self.rank && !has(&have, p, send))
        };
        if !missing(peers_send, true) && !missing(peers_recv, false) {
            return Ok(());
        }
        let l = |peer| Link {
            peer,
            channel: 0,
            class: LinkClass::P2p,
        };
        let sends: Vec<Link> = dedup(peers_send)
            .into_iter()
            .filter(|&p| p != self.rank && !has(&have, p, true))
            .map(l)
            .collect();
        let recvs: Vec<Link> = dedup(peers_recv)
            .into_iter()
            .filter(|&p| p != self.rank && !has(&have, p, false))
            .map(l)
            .collect();
        if sends.is_empty() && recvs.is_empty() {
            return Ok(());
        }
        let (s, r) = connect_placed(
            &self.boot,
            &self.net,
            &self.devices,
            self.placed(),
            self.local_rank,
            &sends,
            &recvs,
        )?;
        self.proxy.install(s, r)?;
        for (peer, send) in sends
            .iter()
            .map(|x| (x.peer, true))
            .chain(recvs.iter().map(|x| (x.peer, false)))
        {
            // The table has a row per rank; connect_placed refused any other peer.
            if let Some(l) = have.get_mut(peer) {
                l[usize::from(send)] = true;
            }
        }
        Ok(())
    }

    /// Runs per-operation plans as one batch with protocol `proto`; `tasks[i]` is the
    /// profiler's Coll/P2p event of plan `i` (empty without a profiler). Returns the
    /// batch's steps, which [`run_steps`](Self::run_steps) can run again, and its
    /// emptied operation list.
    pub(crate) fn run_profiled(
        &self,
        plans: Vec<(Plan, OpRef)>,
        proto: Protocol,
        p2p: bool,
        tasks: &[cclkit_host::profiler::EventHandle],
    ) -> Result<(Vec<Vec<Step>>, Vec<OpRef>)> {
        let nch = plans.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        let mut channels: Vec<Vec<Step>> = vec![Vec::new(); nch];
        let mut ops = Vec::with_capacity(plans.len());
        // Point-to-point: one lane per link (and one for local copies), so a group's
        // sends and receives progress side by side as NCCL's send/recv warps do. On one
        // lane, a send bigger than the FIFO would wait for a peer that is itself
        // blocked in its own send. Each link keeps its operations in order.
        let mut lanes: Vec<(Option<Link>, bool)> = Vec::new();
        for (i, (plan, op)) in plans.into_iter().enumerate() {
            for (ch, prims) in plan.into_iter().enumerate() {
                for prim in prims {
                    let lane = if p2p {
                        let key = match (prim.send.first(), prim.recv.first()) {
                            (Some(l), _) => (Some(*l), true),
                            (None, l) => (l.copied(), false),
                        };
                        lanes.iter().position(|l| *l == key).unwrap_or_else(|| {
                            lanes.push(key);
                            lanes.len() - 1
                        })
                    } else {
                        ch
                    };
                    if channels.len() <= lane {
                        channels.resize_with(lane + 1, Vec::new);
                    }
                    channels[lane].push(Step { prim, op: i });
                }
            }
            ops.push(op);
        }
        self.run_steps(channels, ops, proto, p2p, tasks)
    }

    /// Runs `channels` (steps whose `op` indexes `ops`) as one batch with protocol
    /// `proto`, and hands the steps and the emptied `ops` back.
    pub(crate) fn run_steps(
        &self,
        channels: Vec<Vec<Step>>,
        ops: Vec<OpRef>,
        proto: Protocol,
        p2p: bool,
        tasks: &[cclkit_host::profiler::EventHandle],
    ) -> Result<(Vec<Vec<Step>>, Vec<OpRef>)> {
        let params = self.params[super::fifo::proto_index(proto)];
        let mut elem = 1;
        for op in &ops {
            if self.device.is_cuda() {
                let b = &op.bufs;
                self.device
                    .check_buffer(b.send, b.send_len, "the send buffer")
                    .and_then(|()| {
                        self.device
                            .check_buffer(b.recv, b.recv_len, "the receive buffer")
                    })
                    .map_err(|e| e.context(format!("rank {}", self.rank)))?;
            }
            elem = lcm(elem, op.red.elem_size());
        }
        if channels.iter().all(Vec::is_empty) {
            let mut ops = ops;
            ops.clear();
            return Ok((channels, ops));
        }
        let cap = if p2p {
            self.limits.max_p2p_bytes
        } else {
            self.limits.max_coll_bytes
        };
        let slice = (params.slice_on(self.host_buffers).min(cap) / elem * elem).max(elem);
        let group = if p2p && self.config.grouped_recv {
            self.limits.max_recvs.min(params.slots() / 2).max(1)
        } else {
            1
        };
        let prof = self
            .profile
            .ctx()
            .map(|c| crate::profile::BatchEvents::new(c, self.rank, &channels, tasks, slice));
        self.proxy.run(
            Batch {
                prof,
                channels,
                ops,
                params,
                slice,
                group,
            },
            self.config.op_timeout,
        )
    }

    /// The steps of the last collective group kept for reuse, if any (the slot is
    /// left empty until [`keep_steps`](Self::keep_steps)).
    pub(crate) fn take_steps(&self) -> Option<StepCache> {
        self.step_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Keeps `cache` for the next group.
    pub(crate) fn keep_steps(&self, cache: StepCache) {
        *self.step_cache.lock().unwrap_or_else(|p| p.into_inner()) = Some(cache);
    }

    /// Point-to-point send of `buf` to `peer` (a group of one).
    pub fn send(&self, buf: &[u8], peer: usize) -> Result<()> {
        let mut g = self.group();
        g.send(buf, peer);
        g.run()
    }

    /// Point-to-point receive into `buf` from `peer` (a group of one).
    pub fn recv(&self, buf: &mut [u8], peer: usize) -> Result<()> {
        let mut g = self.group();
        g.recv(buf, peer);
        g.run()
    }

    /// Starts a group (`ncclGroupStart`); `Group::run` is `ncclGroupEnd`.
    pub fn group<'a>(&'a self) -> super::p2p::Group<'a> {
        super::p2p::Group::new(self)
    }

    /// `ncclCommSplit`: ranks with the same `color` form a new communicator, ordered by
    /// `key` then rank; `color < 0` (NCCL_SPLIT_NOCOLOR) joins none (`Ok(None)`).
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Comm>> {
        let all = self
            .boot
            .allgather(&[color.to_le_bytes(), key.to_le_bytes()].concat())?;
        let parse = |b: &[u8]| -> (i32, i32) {
            (
                i32::from_le_bytes(b[0..4].try_into().unwrap_or([0; 4])),
                i32::from_le_bytes(b[4..8].try_into().unwrap_or([0; 4])),
            )
        };
        if color < 0 {
            return Ok(None);
        }
        let mut members: Vec<(i32, usize)> = all
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() == 8 && parse(b).0 == color)
            .map(|(r, b)| (parse(b).1, r))
            .collect();
        members.sort_unstable();
        let new_rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .ok_or_else(|| Error::internal("split: self missing"))?;
        let leader = members[0].1;
        let tag = (1 << 60) | (self.boot.allgather_seq() << 8);
        let (id, root) = if self.rank == leader {
            let bind = std::net::SocketAddr::new(self.peers[self.rank].ip, 0);
            let (id, root) =
                BootstrapRoot::start(bind, random_u64(), self.config.bootstrap_timeout)?;
            for &(_, r) in &members[1..] {
                self.boot.send(r, tag, id.to_string().as_bytes())?;
            }
            (id, Some(root))
        } else {
            let b = self.boot.recv(leader, tag)?;
            (String::from_utf8_lossy(&b).parse::<UniqueId>()?, None)
        };
        Self::init_inner(members.len(), &id, new_rank, &self.config, root).map(Some)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    /// Rank among this host's ranks.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }
    /// Every rank's reported info.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }
    /// The ring.
    pub fn ring(&self) -> &topo::Ring {
        &self.ring
    }
    /// The schedule shape (ring and trees as this rank sees them).
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// Channels connected for collectives.
    pub fn channels(&self) -> usize {
        self.channels
    }
    /// Protocol parameters (indexed by protocol id).
    pub fn params(&self, p: Protocol) -> ProtoParams {
        self.params[super::fifo::proto_index(p)]
    }
    /// Agreed plugin limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }
    /// The net plugin in use.
    pub fn net(&self) -> NetReport {
        NetReport {
            name: self.net.plugin().name().to_owned(),
            version: self.net.plugin().version(),
        }
    }
    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }
    /// The bootstrap (for out-of-band exchanges of the tools).
    pub fn bootstrap(&self) -> &Bootstrap {
        &self.boot
    }

    /// `ncclCommFinalize` + `ncclCommDestroy`: waits for every rank (so no peer is
    /// still sending), then releases connections and the plugin context.
    pub fn destroy(self) -> Result<()> {
        if self.rank == 0 && self.config.tuner_report {
            eprint!("{}", self.tuning.report_text());
        }
        let r = self.boot.barrier();
        drop(self);
        r
    }

    /// `ncclCommAbort`: stops now; peers see the connections close.
    pub fn abort(self) {
        self.proxy.abort();
        drop(self);
    }

    /// The reduction object for `count` elements of `dtype` with `op`.
    pub(crate) fn reduction(&self, dtype: DataType, op: RedOp) -> Result<Reduction> {
        Reduction::new(dtype, op, self.nranks as u32)
            .map_err(|e| Error::invalid_argument(format!("{e}")))
    }

    /// User buffers as the engine sees them.
    pub(crate) fn bufs(send: &[u8], recv: &mut [u8]) -> UserBufs {
        UserBufs {
            send: send.as_ptr(),
            send_len: send.len(),
            recv: recv.as_mut_ptr(),
            recv_len: recv.len(),
        }
    }

    /// Operation timeout in force.
    pub fn op_timeout(&self) -> Duration {
        self.config.op_timeout
    }
}

fn dedup(v: &[usize]) -> Vec<usize> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}
