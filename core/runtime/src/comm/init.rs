//! `ncclCommInitRank` step by step: the device, the bootstrap, the net plugin and its
//! devices, the peer exchange, ring and trees, tuning, FIFO placement, the proxy and
//! the collective connections.

use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use cclkit_abi::raw::common::Protocol;

use super::{Comm, Limits};
use crate::bootstrap::{Bootstrap, BootstrapRoot, UniqueId};
use crate::config::Config;
use crate::device::{Device, GdrEnv, Placement};
use crate::error::net_err;
use crate::error::{Error, Result};
use crate::protocol::ProtoParams;
use crate::proxy::Proxy;
use crate::schedule::{RingView, Shape, TreeView};
use crate::topo::{self, NetDevice, PeerInfo};
use crate::tune::{self, ModelInputs, Tuning};
use cclkit_host::net::{CommConfig as NetCommConfig, NetContext};
use cclkit_host::select::{NetRegistry, TunerArgs, TunerRegistry};
use cclkit_host::tuner::NvlDomainInfo;

/// A communicator's 64-bit id for plugins (`commId`), from its unique id.
pub(crate) fn comm_id(id: &UniqueId) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

impl Comm {
    pub(super) fn init_inner(
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
        let boot = Bootstrap::init(id, rank, nranks, config.bootstrap_timeout)?;
        crate::install_builtin_net();
        let registry: &NetRegistry = match config.registry.as_deref() {
            Some(r) => r,
            None => NetRegistry::global(),
        };
        crate::profile::preload();
        let local = LocalNet::select(registry, config, comm_id(id), rank)?;
        let (peers, limits) = exchange_peers(&boot, &local, rank, nranks, device.is_cuda())?;
        check_same_plugin(&peers, rank)?;
        // Slices, chunks and protocols must match on both ends of every connection:
        // one device rank makes the whole communicator a device communicator.
        let host_buffers = host_buffers(&peers, rank);
        let kind_config = Self::config_for_buffers(config, host_buffers);
        let config = &kind_config;
        let ring = topo::ring(&peers);
        let shape = shape_of(&peers, &ring, rank, nranks);
        let local_rank = peers
            .iter()
            .filter(|p| p.host_hash == peers[rank].host_hash && p.rank < rank)
            .count();
        let LocalNet {
            net,
            devices,
            nic_caps,
            ..
        } = local;
        let channels = config.channels(devices.len());
        // NCCL_BUFFSIZE & co. through the env plugin, as NCCL reads them.
        let params = crate::config::with_nccl_env(|env| {
            Ok([
                ProtoParams::new(Protocol::LL, env)?,
                ProtoParams::new(Protocol::LL128, env)?,
                ProtoParams::new(Protocol::SIMPLE, env)?,
            ])
        })?;
        let mut tuning = Self::tuning_for(config, registry, &peers, &ring, comm_id(id), &devices)?;
        tuning.buffers_on_host(host_buffers);
        let gpu_pci = device.gpu_pci_path();
        let places = Self::placements(&device, &devices, &nic_caps, config, rank)?;
        let proxy = Proxy::start_on(rank, device.compute()?, config.direct, config.run_ahead)?;
        let profile = crate::profile::Profile::init(comm_id(id), ring.hosts, nranks, rank);
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
            p2p_links: Mutex::new(vec![[false; 2]; nranks]),
            step_cache: Mutex::new(None),
            tuning,
            host_buffers,
            device,
            gpu_pci,
            places,
            proxy,
            net,
            profile,
        };
        comm.connect_collective_links()?;
        if rank == 0 {
            comm.log_init(comm_id(id));
        }
        Ok(comm)
    }

    /// The INFO line rank 0 prints once the communicator is up.
    fn log_init(&self, id: u64) {
        tracing::info!(
            target: "cclkit::init",
            "comm {id:#x}: {} ranks on {} host(s), net '{}' v{}, {} channel(s), ring {:?} (stretch {:.2}, rank order {:.2})",
            self.nranks,
            self.ring.hosts,
            self.net.plugin().name(),
            self.net.plugin().version(),
            self.channels,
            self.ring.order,
            self.ring.stretch,
            self.ring.rank_order_stretch
        );
    }

    /// The configuration a communicator runs with: device communicators (any rank
    /// on device memory) use the Simple protocol only (LL/LL128 are flag protocols
    /// GPU threads poll; cclkit's proxy decodes them on the host).
    fn config_for_buffers(config: &Config, host_buffers: bool) -> Config {
        let mut c = config.clone();
        if !host_buffers {
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
        let env = crate::config::with_nccl_env(|get| GdrEnv::from_lookup(get))?;
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

    /// Loads the tuner (if any) for this communicator and sets up the cost model.
    fn tuning_for(
        config: &Config,
        net_registry: &NetRegistry,
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
            .select(net_registry.tuner_library().as_ref(), args, &mut constants)
            .map_err(|e| Error::invalid_usage(format!("tuner: {e}")))?;
        let model = ModelInputs::from_devices(
            peers.len(),
            ring.hosts,
            devices.iter().map(|d| (d.speed_mbps, d.latency_us)),
        );
        let mut tuning = Tuning::new(sel.tuner, constants, model, net_registry.config().strict);
        tuning.force(config.algo.clone(), config.proto.clone());
        Ok(tuning)
    }
}

/// This rank's net plugin, initialised for the communicator, and what its devices
/// report.
struct LocalNet {
    net: NetContext,
    devices: Vec<NetDevice>,
    /// Per device: `ptrSupport` and `forceFlush` (for the GDR decision).
    nic_caps: Vec<(i32, bool)>,
    /// The minimum over this rank's devices.
    limits: Limits,
}

impl LocalNet {
    /// Selects the plugin as NCCL does and reads every device's properties.
    fn select(registry: &NetRegistry, config: &Config, id: u64, rank: usize) -> Result<Self> {
        let selection = registry
            .select(
                id,
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
        Ok(Self {
            net,
            devices,
            nic_caps,
            limits,
        })
    }
}

/// Allgathers every rank's peer info and limits; returns the peers in rank order and
/// the limits every rank agrees on (the minimum).
fn exchange_peers(
    boot: &Bootstrap,
    local: &LocalNet,
    rank: usize,
    nranks: usize,
    device_buffers: bool,
) -> Result<(Vec<PeerInfo>, Limits)> {
    let me = PeerInfo {
        rank,
        host_hash: topo::host_hash(),
        hostname: topo::hostname(),
        ip: boot
            .peer_addr(rank)
            .map_or(std::net::Ipv4Addr::LOCALHOST.into(), |a| a.ip()),
        pid: std::process::id(),
        plugin: local.net.plugin().name().to_owned(),
        plugin_version: local.net.plugin().version(),
        devices: local.devices.clone(),
        device_buffers,
    };
    let mut limits = local.limits;
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
    Ok((peers, limits))
}

/// This rank's place in the ring and in both trees.
fn shape_of(peers: &[PeerInfo], ring: &topo::Ring, rank: usize, nranks: usize) -> Shape {
    let trees = [topo::tree(peers, ring, 0), topo::tree(peers, ring, 1)];
    Shape {
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
    }
}

/// Whether every rank's buffers are host memory. When some are not, says once (on
/// a host rank, which is the one whose behaviour changes) that this rank runs with
/// device sizes and the Simple protocol.
fn host_buffers(peers: &[PeerInfo], rank: usize) -> bool {
    let device: Vec<usize> = peers
        .iter()
        .filter(|p| p.device_buffers)
        .map(|p| p.rank)
        .collect();
    if !device.is_empty() && !peers[rank].device_buffers {
        tracing::info!(
            target: "cclkit::init",
            "rank {rank}: host buffers, but ranks {device:?} use device memory: \
             running as a device communicator (Simple protocol, NCCL's chunk and slice sizes)"
        );
    }
    device.is_empty()
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
