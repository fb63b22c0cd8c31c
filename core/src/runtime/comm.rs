//! Communicators: `ncclCommInitRank`, split, finalize/destroy/abort, and the
//! machinery every operation shares (connections, batches, the proxy engine).

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use cclkit_abi::raw::common::{DataType, Protocol, RedOp};
use cclkit_kernels::Reduction;

use super::bootstrap::{Bootstrap, BootstrapRoot, UniqueId, random_u64};
use super::config::Config;
use super::connect::{Placed, connect_placed};
use super::device::{Device, GdrEnv, Placement};
use super::error::{Error, Result};
use super::fifo::net_err;
use super::protocol::ProtoParams;
use super::proxy::{Batch, OpRef, Proxy, Step, UserBufs};
use super::schedule::{Link, LinkClass, Plan, RingView, Shape, TreeView};
use super::topo::{self, NetDevice, PeerInfo};
use super::tune::{self, ModelInputs, Tuning};
use crate::plugin::net::{CommConfig as NetCommConfig, NetContext};
use crate::plugin::select::NetRegistry;
use crate::plugin::select::{TunerArgs, TunerRegistry};
use crate::plugin::tuner::NvlDomainInfo;

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
    p2p_links: Mutex<HashSet<(usize, bool)>>,
    tuning: Tuning,
    /// Where user buffers live (`CCLKIT_DEVICE`).
    device: Device,
    /// The GPU's PCI path, and per NIC where (send, receive) FIFO slots live.
    gpu_pci: Option<String>,
    places: Vec<(Placement, Placement)>,
    // Dropped in this order: the engine (closing connections) before the plugin context.
    proxy: Proxy,
    net: NetContext,
}

/// The plugin a communicator runs on, as every rank reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetReport {
    /// Table name.
    pub name: String,
    /// ABI version.
    pub version: u32,
}

fn comm_id(id: &UniqueId) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
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

    fn init_inner(
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        config: &Config,
        root: Option<BootstrapRoot>,
    ) -> Result<Self> {
        if nranks == 0 || rank >= nranks {
            return Err(Error::invalid_argument(format!(
                "rank {rank} of {nranks} ranks"
            )));
        }
        let device = Device::open(config.device).map_err(|e| e.context(format!("rank {rank}")))?;
        let device_config = Self::config_for_device(config, &device);
        let config = &device_config;
        let boot = Bootstrap::init(id, rank, nranks, config.bootstrap_timeout)?;
        let registry: &NetRegistry = match config.registry.as_deref() {
            Some(r) => r,
            None => NetRegistry::global(),
        };
        let selection = registry
            .select(
                comm_id(id),
                NetCommConfig {
                    traffic_class: config.traffic_class,
                },
            )
            .map_err(|e| Error::system(format!("rank {rank}: no usable net plugin: {e}")))?;
        let net = selection.context;
        let mut devices = Vec::with_capacity(selection.devices);
        let mut limits = Limits {
            max_p2p_bytes: usize::MAX,
            max_coll_bytes: usize::MAX,
            max_recvs: usize::MAX,
        };
        let mut nic_caps = Vec::with_capacity(selection.devices);
        for d in 0..selection.devices {
            let p = net
                .properties(d)
                .map_err(|e| net_err(e, &format!("rank {rank}: getProperties({d})")))?;
            nic_caps.push((p.ptr_support, p.force_flush));
            limits.max_p2p_bytes = limits.max_p2p_bytes.min(p.max_p2p_bytes);
            limits.max_coll_bytes = limits.max_coll_bytes.min(p.max_coll_bytes);
            limits.max_recvs = limits.max_recvs.min(p.max_recvs.max(1) as usize);
            devices.push(NetDevice {
                name: p.name,
                pci_path: p.pci_path,
                guid: p.guid,
                speed_mbps: p.speed_mbps,
                latency_us: p.latency_us,
                rail_id: p.rail_id,
                plane_id: p.plane_id,
            });
        }
        let me = PeerInfo {
            rank,
            host_hash: topo::host_hash(),
            hostname: topo::hostname(),
            ip: boot
                .peer_addr(rank)
                .map_or(std::net::Ipv4Addr::LOCALHOST.into(), |a| a.ip()),
            pid: std::process::id(),
            plugin: net.plugin().name().to_owned(),
            plugin_version: net.plugin().version(),
            devices: devices.clone(),
        };
        let mine = serde_json::to_vec(&(
            me,
            limits.max_p2p_bytes,
            limits.max_coll_bytes,
            limits.max_recvs,
        ))
        .map_err(|e| Error::internal(format!("encode peer info: {e}")))?;
        let mut peers = Vec::with_capacity(nranks);
        for (r, blob) in boot.allgather(&mine)?.into_iter().enumerate() {
            let (p, a, b, c): (PeerInfo, usize, usize, usize) = serde_json::from_slice(&blob)
                .map_err(|e| Error::internal(format!("peer info of rank {r}: {e}")))?;
            limits = Limits {
                max_p2p_bytes: limits.max_p2p_bytes.min(a),
                max_coll_bytes: limits.max_coll_bytes.min(b),
                max_recvs: limits.max_recvs.min(c),
            };
            peers.push(p);
        }
        check_same_plugin(&peers, rank)?;
        let ring = topo::ring(&peers);
        let trees = [topo::tree(&peers, &ring, 0), topo::tree(&peers, &ring, 1)];
        let shape = Shape {
            rank,
            nranks,
            ring: RingView {
                order: ring.order.clone(),
                index: ring.index_of(rank),
            },
            trees: [0, 1].map(|t| TreeView {
                up: trees[t][rank].up,
                down: trees[t][rank].down.clone(),
            }),
        };
        let local_rank = peers
            .iter()
            .filter(|p| p.host_hash == peers[rank].host_hash && p.rank < rank)
            .count();
        let channels = config.channels(devices.len());
        let env = |k: &str| std::env::var(k).ok();
        let params = [
            ProtoParams::new(Protocol::LL, &env)?,
            ProtoParams::new(Protocol::LL128, &env)?,
            ProtoParams::new(Protocol::SIMPLE, &env)?,
        ];
        let tuning =
            Self::tuning_for(config, registry, &net, &peers, &ring, comm_id(id), &devices)?;
        let gpu_pci = device.gpu_pci_path();
        let places = Self::placements(&device, &devices, &nic_caps, config, rank)?;
        let proxy = Proxy::start_on(rank, device.compute()?)?;
        let comm = Self {
            rank,
            nranks,
            local_rank,
            config: config.clone(),
            boot,
            _root: root,
            peers,
            ring,
            shape,
            channels,
            params,
            limits,
            devices,
            p2p_links: Mutex::new(HashSet::new()),
            tuning,
            device,
            gpu_pci,
            places,
            proxy,
            net,
        };
        comm.connect_collective_links()?;
        if rank == 0 {
            tracing::info!(
                target: "cclkit::init",
                "comm {:#x}: {nranks} ranks on {} host(s), net '{}' v{}, {} channel(s), ring {:?} (stretch {:.2}, rank order {:.2})",
                comm_id(id),
                comm.ring.hosts,
                comm.net.plugin().name(),
                comm.net.plugin().version(),
                channels,
                comm.ring.order,
                comm.ring.stretch,
                comm.ring.rank_order_stretch
            );
        }
        Ok(comm)
    }

    /// The configuration a communicator on `device` runs with: device
    /// communicators use the Simple protocol only (LL/LL128 are flag protocols
    /// GPU threads poll; cclkit's proxy decodes them on the host).
    fn config_for_device(config: &Config, device: &Device) -> Config {
        let mut c = config.clone();
        if device.is_cuda() {
            if c.proto
                .as_deref()
                .is_some_and(|p| !p.trim().eq_ignore_ascii_case("simple"))
            {
                tracing::warn!(
                    target: "cclkit::init",
                    "NCCL_PROTO={} ignored: device communicators run the Simple protocol",
                    c.proto.as_deref().unwrap_or_default()
                );
            }
            c.proto = Some("Simple".to_owned());
        }
        c
    }

    /// Per NIC, where send and receive FIFO slots live (the GDR decision of
    /// [`super::device`]); empty on the host.
    fn placements(
        device: &Device,
        devices: &[NetDevice],
        caps: &[(i32, bool)],
        config: &Config,
        rank: usize,
    ) -> Result<Vec<(Placement, Placement)>> {
        if !device.is_cuda() {
            return Ok(Vec::new());
        }
        let env = GdrEnv::from_env()?;
        let mut out = Vec::with_capacity(devices.len());
        for (d, &(ptr_support, force_flush)) in devices.iter().zip(caps) {
            let (s, r, dec) = device.plans(d.pci_path.as_deref(), ptr_support, force_flush, &env);
            if let Some(dec) = dec {
                tracing::info!(
                    target: "cclkit::init",
                    "rank {rank}: {} <-> net '{}': {} (send slots {:?}/{:?}, receive slots {:?}/{:?}{})",
                    device.describe(),
                    d.name,
                    dec.reason,
                    s.slots,
                    s.reg,
                    r.slots,
                    r.reg,
                    if r.flush { ", iflush" } else { "" }
                );
            }
            let place = |plan| Placement {
                device: device.clone(),
                plan,
                flush_timeout: config.op_timeout,
            };
            out.push((place(s), place(r)));
        }
        Ok(out)
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

    /// Loads the tuner (if any) for this communicator and sets up the cost model.
    fn tuning_for(
        config: &Config,
        net_registry: &NetRegistry,
        net: &NetContext,
        peers: &[PeerInfo],
        ring: &topo::Ring,
        comm_id: u64,
        devices: &[NetDevice],
    ) -> Result<Tuning> {
        let registry: &TunerRegistry = match config.tuner_registry.as_deref() {
            Some(r) => r,
            None => TunerRegistry::global(),
        };
        let mut per_host = std::collections::HashMap::new();
        for p in peers {
            *per_host.entry(p.host_hash).or_insert(0i32) += 1;
        }
        let nvl = NvlDomainInfo {
            nNvlDomains: per_host.len() as i32,
            minRanksPerNvlDomain: per_host.values().copied().min().unwrap_or(1),
            maxRanksPerNvlDomain: per_host.values().copied().max().unwrap_or(1),
        };
        let mut constants = tune::default_constants();
        let args = TunerArgs {
            n_ranks: peers.len(),
            n_nodes: ring.hosts,
            comm_id,
            nvl,
        };
        let sel = registry
            .select(Some(net.plugin()), args, &mut constants)
            .map_err(|e| Error::invalid_usage(format!("tuner: {e}")))?;
        let speed = devices
            .iter()
            .map(|d| d.speed_mbps)
            .filter(|&s| s > 0)
            .min()
            .unwrap_or(10_000);
        let lat = devices
            .iter()
            .map(|d| f64::from(d.latency_us))
            .fold(0.0, f64::max);
        let model = ModelInputs {
            n_ranks: peers.len(),
            n_nodes: ring.hosts,
            net_gbps: f64::from(speed) / 8000.0,
            net_lat_us: if lat > 0.0 { lat } else { 20.0 },
        };
        let mut tuning = Tuning::new(sel.tuner, constants, model, net_registry.config().strict);
        tuning.force(config.algo.clone(), config.proto.clone());
        Ok(tuning)
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
        let l = |peer| Link {
            peer,
            channel: 0,
            class: LinkClass::P2p,
        };
        let sends: Vec<Link> = dedup(peers_send)
            .into_iter()
            .filter(|&p| p != self.rank && !have.contains(&(p, true)))
            .map(l)
            .collect();
        let recvs: Vec<Link> = dedup(peers_recv)
            .into_iter()
            .filter(|&p| p != self.rank && !have.contains(&(p, false)))
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
        have.extend(
            sends
                .iter()
                .map(|x| (x.peer, true))
                .chain(recvs.iter().map(|x| (x.peer, false))),
        );
        Ok(())
    }

    /// Runs per-operation plans as one batch with protocol `proto`.
    pub(crate) fn run(&self, plans: Vec<(Plan, OpRef)>, proto: Protocol, p2p: bool) -> Result<()> {
        let params = self.params[super::fifo::proto_index(proto)];
        let nch = plans.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        let mut channels: Vec<Vec<Step>> = vec![Vec::new(); nch];
        let mut ops = Vec::with_capacity(plans.len());
        let mut elem = 1;
        // Point-to-point: one lane per link (and one for local copies), so a group's
        // sends and receives progress side by side as NCCL's send/recv warps do. On one
        // lane, a send bigger than the FIFO would wait for a peer that is itself
        // blocked in its own send. Each link keeps its operations in order.
        let mut lanes: Vec<(Option<Link>, bool)> = Vec::new();
        for (i, (plan, op)) in plans.into_iter().enumerate() {
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
        if channels.iter().all(Vec::is_empty) {
            return Ok(());
        }
        let cap = if p2p {
            self.limits.max_p2p_bytes
        } else {
            self.limits.max_coll_bytes
        };
        let slice = (params.slice_data().min(cap) / elem * elem).max(elem);
        let group = if p2p && self.config.grouped_recv {
            self.limits.max_recvs.min(params.slots() / 2).max(1)
        } else {
            1
        };
        self.proxy.run(
            Batch {
                channels,
                ops,
                params,
                slice,
                group,
            },
            self.config.op_timeout,
        )
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

    /// Starts a group (`ncclGroupStart`); [`Group::run`] is `ncclGroupEnd`.
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

/// Every rank must run the same plugin and ABI version (a mixed cluster hangs NCCL).
fn check_same_plugin(peers: &[PeerInfo], rank: usize) -> Result<()> {
    let first = &peers[0];
    let odd: Vec<String> = peers
        .iter()
        .filter(|p| p.plugin != first.plugin || p.plugin_version != first.plugin_version)
        .map(|p| {
            format!(
                "rank {} on {} loaded '{}' v{}",
                p.rank, p.hostname, p.plugin, p.plugin_version
            )
        })
        .collect();
    if odd.is_empty() {
        return Ok(());
    }
    Err(Error::invalid_usage(format!(
        "rank {rank}: ranks loaded different net plugins: rank 0 on {} loaded '{}' v{} but {} \
         (check NCCL_NET_PLUGIN and the plugin files on every host; `cclkit doctor` shows the resolution)",
        first.hostname,
        first.plugin,
        first.plugin_version,
        odd.join(", ")
    )))
}
