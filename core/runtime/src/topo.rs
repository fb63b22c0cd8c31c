//! Topology: which ranks share a host, the ring order, the trees, and which NIC each
//! channel uses — the seed ideas made concrete.
//!
//! * **Ring order follows the underlay.** Ranks on one host are adjacent, and hosts
//!   are visited so that consecutive hosts are close in the network (same subnet
//!   before same /16 before anything else). The ring's *stretch* is its total
//!   underlay distance divided by the best any ring could do; 1.0 is optimal.
//! * **Trees**: NCCL-style double binary tree across hosts (the second tree mirrors
//!   or shifts the first so every host is a leaf in one of them), with a chain inside
//!   each host.
//! * **NIC choice** scores devices by PCI distance like NCCL (PIX < PXB < PHB < NODE <
//!   SYS), keeps the closest, prefers the rank's rail, and spreads channels and local
//!   ranks across equally close devices.
//! * **GPUDirect RDMA**: the decision rule lives here ([`gdr_enabled`]) for the device
//!   path.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// One net device as a rank sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetDevice {
    /// Device name.
    pub name: String,
    /// `/sys` PCI path, if the device has one.
    pub pci_path: Option<String>,
    /// Port guid.
    pub guid: u64,
    /// Link speed in Mbps.
    pub speed_mbps: i32,
    /// Latency in µs (0 = unknown).
    pub latency_us: f32,
    /// Rail id, -1 = none.
    pub rail_id: i16,
    /// Plane id, -1 = none.
    pub plane_id: i16,
}

/// What every rank tells the others at init.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// Global rank.
    pub rank: usize,
    /// Identifies the host (see `host_hash`).
    pub host_hash: u64,
    /// Hostname, for messages.
    pub hostname: String,
    /// The IP this rank is reached at (its bootstrap address).
    pub ip: IpAddr,
    /// Process id.
    pub pid: u32,
    /// Net plugin name and ABI version this rank loaded.
    pub plugin: String,
    /// ABI version of that plugin's table.
    pub plugin_version: u32,
    /// The rank's net devices.
    pub devices: Vec<NetDevice>,
    /// Whether this rank's buffers are device memory (a CUDA device, or the
    /// stand-in): a communicator with any such rank runs every rank as a device
    /// communicator, so all agree on protocol, chunk and slice sizes.
    #[serde(default)]
    pub device_buffers: bool,
}

/// Hash identifying "a host": hostname, `NCCL_HOSTID` (or the kernel boot id), and the
/// network namespace. Ranks in different network namespaces are different network
/// endpoints (as containers are), so they count as different hosts.
pub fn host_hash() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    hostname.trim().hash(&mut h);
    // Through the env plugin when there is one, as NCCL reads its own settings.
    match cclkit_host::env::process_env().get("NCCL_HOSTID") {
        Some(id) => id.hash(&mut h),
        None => std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap_or_default()
            .trim()
            .hash(&mut h),
    }
    std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

/// This machine's hostname.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Underlay distance between two hosts from their addresses: 1 for the same /24
/// (typically one switch), 2 for the same /16, 3 otherwise. Loopback peers are 1.
pub fn host_distance(a: IpAddr, b: IpAddr) -> u32 {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let (a, b) = (a.octets(), b.octets());
            if a[..3] == b[..3] || a[0] == 127 && b[0] == 127 {
                1
            } else if a[..2] == b[..2] {
                2
            } else {
                3
            }
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let (a, b) = (a.segments(), b.segments());
            if a[..4] == b[..4] {
                1
            } else if a[..3] == b[..3] {
                2
            } else {
                3
            }
        }
        _ => 3,
    }
}

/// The ring and how well it fits the underlay.
#[derive(Clone, Debug, PartialEq)]
pub struct Ring {
    /// Ranks in ring order, starting with rank 0.
    pub order: Vec<usize>,
    /// Number of hosts.
    pub hosts: usize,
    /// Ring edges that leave a host.
    pub crossings: usize,
    /// Underlay distance of the ring / the lower bound (1.0 = optimal).
    pub stretch: f64,
    /// Stretch of the naive rank-order ring, for comparison.
    pub rank_order_stretch: f64,
}

impl Ring {
    /// Position of `rank` in the ring.
    pub fn index_of(&self, rank: usize) -> usize {
        self.order.iter().position(|&r| r == rank).unwrap_or(0)
    }
    /// The rank after `rank` (where it sends).
    pub fn next(&self, rank: usize) -> usize {
        self.order[(self.index_of(rank) + 1) % self.order.len()]
    }
    /// The rank before `rank` (where it receives from).
    pub fn prev(&self, rank: usize) -> usize {
        let n = self.order.len();
        self.order[(self.index_of(rank) + n - 1) % n]
    }
}

/// Groups ranks by host: host hash → ranks (ascending), hosts in first-rank order.
fn hosts_of(peers: &[PeerInfo]) -> Vec<Vec<usize>> {
    let mut by: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for p in peers {
        by.entry(p.host_hash).or_default().push(p.rank);
    }
    let mut hosts: Vec<Vec<usize>> = by.into_values().collect();
    for h in &mut hosts {
        h.sort_unstable();
    }
    hosts.sort_by_key(|h| h[0]);
    hosts
}

/// Underlay cost of a ring given as a rank sequence.
fn ring_cost(order: &[usize], peers: &[PeerInfo]) -> u32 {
    let n = order.len();
    (0..n)
        .map(|i| {
            let (a, b) = (&peers[order[i]], &peers[order[(i + 1) % n]]);
            if a.host_hash == b.host_hash {
                0
            } else {
                host_distance(a.ip, b.ip)
            }
        })
        .sum()
}

/// Computes the ring for `peers` (indexed by rank).
pub fn ring(peers: &[PeerInfo]) -> Ring {
    let hosts = hosts_of(peers);
    let ip = |h: &Vec<usize>| peers[h[0]].ip;
    // Host tour: nearest neighbour from rank 0's host, then 2-opt until no gain.
    let mut tour: Vec<usize> = vec![0];
    let mut left: Vec<usize> = (1..hosts.len()).collect();
    while !left.is_empty() {
        let last = ip(&hosts[*tour.last().unwrap_or(&0)]);
        let (i, _) = left
            .iter()
            .enumerate()
            .min_by_key(|(_, h)| (host_distance(last, ip(&hosts[**h])), **h))
            .unwrap_or((0, &0));
        tour.push(left.remove(i));
    }
    let d = |a: usize, b: usize| host_distance(ip(&hosts[a]), ip(&hosts[b]));
    let m = tour.len();
    let mut improved = m > 3;
    while improved {
        improved = false;
        for i in 1..m - 1 {
            for j in i + 1..m {
                let (a, b, c, e) = (tour[i - 1], tour[i], tour[j], tour[(j + 1) % m]);
                if d(a, c) + d(b, e) < d(a, b) + d(c, e) {
                    tour[i..=j].reverse();
                    improved = true;
                }
            }
        }
    }
    let order: Vec<usize> = tour
        .iter()
        .flat_map(|&h| hosts[h].iter().copied())
        .collect();
    let crossings = if hosts.len() > 1 { hosts.len() } else { 0 };
    // Lower bound: each host is left once, at least at the smallest inter-host distance.
    let min_d = (0..m)
        .flat_map(|a| (0..m).filter(move |&b| b != a).map(move |b| (a, b)))
        .map(|(a, b)| d(a, b))
        .min();
    let bound = min_d.map_or(0, |x| x * m as u32);
    let stretch = |cost: u32| {
        if bound == 0 {
            1.0
        } else {
            f64::from(cost) / f64::from(bound)
        }
    };
    let naive: Vec<usize> = (0..peers.len()).collect();
    Ring {
        stretch: stretch(ring_cost(&order, peers)),
        rank_order_stretch: stretch(ring_cost(&naive, peers)),
        order,
        hosts: hosts.len(),
        crossings,
    }
}

/// A rank's place in one tree: parent and up to three children (two across hosts plus
/// the next rank of its host chain).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TreeNode {
    /// Parent rank, `None` at the root.
    pub up: Option<usize>,
    /// Child ranks.
    pub down: Vec<usize>,
}

/// NCCL's binary tree over `n` nodes: `(parent, child0, child1)` of node `r`.
pub fn btree(n: usize, r: usize) -> (Option<usize>, Option<usize>, Option<usize>) {
    if n <= 1 {
        return (None, None, None);
    }
    let mut bit = 1;
    while bit < n && bit & r == 0 {
        bit <<= 1;
    }
    if r == 0 {
        return (None, None, Some(bit >> 1).filter(|&c| c > 0 && c < n));
    }
    let mut up = (r ^ bit) | (bit << 1);
    if up >= n {
        up = r ^ bit;
    }
    let mut low = bit >> 1;
    let d0 = (low > 0).then(|| r - low);
    let mut d1 = (low > 0).then(|| r + low);
    while let Some(c) = d1 {
        if c < n {
            break;
        }
        low >>= 1;
        d1 = (low > 0).then(|| r + low);
    }
    (Some(up), d0, d1)
}

/// The second tree of NCCL's double binary tree: mirrored (even n) or shifted (odd n).
pub fn btree_second(n: usize, r: usize) -> (Option<usize>, Option<usize>, Option<usize>) {
    if n % 2 == 1 {
        let (u, a, b) = btree(n, (r + n - 1) % n);
        let f = |x: Option<usize>| x.map(|x| (x + 1) % n);
        (f(u), f(a), f(b))
    } else {
        let (u, a, b) = btree(n, n - 1 - r);
        let f = |x: Option<usize>| x.map(|x| n - 1 - x);
        (f(u), f(a), f(b))
    }
}

/// Tree `which` (0 or 1) for every rank: binary tree across hosts (in ring order),
/// chain inside each host. Indexed by rank.
pub fn tree(peers: &[PeerInfo], ring: &Ring, which: usize) -> Vec<TreeNode> {
    let mut hosts: Vec<Vec<usize>> = Vec::new();
    for &r in &ring.order {
        match hosts.last_mut() {
            Some(h) if peers[h[0]].host_hash == peers[r].host_hash => h.push(r),
            _ => hosts.push(vec![r]),
        }
    }
    let n = hosts.len();
    let mut nodes = vec![TreeNode::default(); peers.len()];
    for (hi, host) in hosts.iter().enumerate() {
        let (u, a, b) = if which == 0 {
            btree(n, hi)
        } else {
            btree_second(n, hi)
        };
        let head = host[0];
        nodes[head].up = u.map(|p| hosts[p][0]);
        nodes[head]
            .down
            .extend([a, b].into_iter().flatten().map(|c| hosts[c][0]));
        for w in host.windows(2) {
            nodes[w[0]].down.push(w[1]);
            nodes[w[1]].up = Some(w[0]);
        }
    }
    nodes
}

/// PCI distance classes, closest first (NCCL's PATH_PIX … PATH_SYS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PciDistance {
    /// Same PCI switch, one hop.
    Pix,
    /// Through several PCI switches, not the host bridge.
    Pxb,
    /// Through the host bridge (same root complex).
    Phb,
    /// Same NUMA node, different root complex.
    Node,
    /// Across NUMA nodes (or unknown).
    Sys,
}

impl PciDistance {
    /// NCCL's name (`NCCL_NET_GDR_LEVEL` accepts these).
    pub fn name(self) -> &'static str {
        match self {
            Self::Pix => "PIX",
            Self::Pxb => "PXB",
            Self::Phb => "PHB",
            Self::Node => "NODE",
            Self::Sys => "SYS",
        }
    }
    /// Parses a level name (or NCCL's legacy numbers 0–5).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.trim().to_ascii_uppercase().as_str() {
            "PIX" | "0" | "1" => Self::Pix,
            "PXB" | "2" => Self::Pxb,
            "PHB" | "3" => Self::Phb,
            "NODE" | "4" => Self::Node,
            "SYS" | "5" => Self::Sys,
            _ => return None,
        })
    }
}

fn numa_node(pci: &str) -> Option<i32> {
    std::fs::read_to_string(format!("{pci}/numa_node"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Distance between two devices from their `/sys/devices/pci…` paths.
pub fn pci_distance(a: &str, b: &str) -> PciDistance {
    let pa: Vec<&str> = a.trim_end_matches('/').split('/').collect();
    let pb: Vec<&str> = b.trim_end_matches('/').split('/').collect();
    let common = pa.iter().zip(&pb).take_while(|(x, y)| x == y).count();
    // Components: "", "sys", "devices", "pci0000:00" (root complex), root port, switches…, device.
    let root = pa
        .iter()
        .position(|c| c.starts_with("pci"))
        .map_or(usize::MAX, |i| i + 1);
    if common < root {
        return match (numa_node(a), numa_node(b)) {
            (Some(x), Some(y)) if x == y && x >= 0 => PciDistance::Node,
            _ => PciDistance::Sys,
        };
    }
    let below = |p: &Vec<&str>| p.len().saturating_sub(common);
    match common - root {
        0 => PciDistance::Phb,
        _ if below(&pa) <= 1 && below(&pb) <= 1 => PciDistance::Pix,
        _ => PciDistance::Pxb,
    }
}

/// The device channel `channel` of a rank uses: the closest devices to `near` (the
/// rank's GPU, if any), preferring the rank's rail, spread across ranks and channels.
pub fn select_nic(
    devices: &[NetDevice],
    near: Option<&str>,
    local_rank: usize,
    channel: usize,
) -> Option<usize> {
    let dist = |d: &NetDevice| match (near, d.pci_path.as_deref()) {
        (Some(g), Some(n)) => pci_distance(g, n),
        _ => PciDistance::Node,
    };
    let best = devices.iter().map(dist).min()?;
    let mut close: Vec<usize> = (0..devices.len())
        .filter(|&i| dist(&devices[i]) == best)
        .collect();
    let rails: Vec<usize> = close
        .iter()
        .copied()
        .filter(|&i| devices[i].rail_id >= 0)
        .collect();
    if !rails.is_empty() {
        let n_rails = rails.len();
        let mine: Vec<usize> = rails
            .iter()
            .copied()
            .filter(|&i| devices[i].rail_id as usize % n_rails == local_rank % n_rails)
            .collect();
        if !mine.is_empty() {
            close = mine;
        }
    }
    Some(close[(local_rank + channel) % close.len()])
}

/// Whether GPUDirect RDMA may be used between a GPU and a NIC at `distance`:
/// `NCCL_NET_GDR_LEVEL` (default PXB) bounds the distance; for sends (reads from GPU
/// memory) `NCCL_NET_GDR_READ` must also allow it (default: on).
pub fn gdr_enabled(
    distance: PciDistance,
    read: bool,
    level: Option<PciDistance>,
    gdr_read: Option<bool>,
) -> bool {
    distance <= level.unwrap_or(PciDistance::Pxb) && (!read || gdr_read.unwrap_or(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: usize, host: u64, ip: &str) -> PeerInfo {
        PeerInfo {
            rank,
            host_hash: host,
            hostname: format!("h{host}"),
            ip: ip.parse().unwrap(),
            pid: 1,
            plugin: "x".into(),
            plugin_version: 12,
            devices: vec![],
            device_buffers: false,
        }
    }

    #[test]
    fn ring_keeps_hosts_contiguous_and_near() {
        // Ranks interleaved over 3 hosts; hosts A and C share a subnet, B is far.
        let ips = ["10.0.1.1", "10.1.7.1", "10.0.1.2"];
        let peers: Vec<PeerInfo> = (0..9)
            .map(|r| peer(r, (r % 3) as u64, ips[r % 3]))
            .collect();
        let ring = ring(&peers);
        assert_eq!(ring.order.len(), 9);
        assert_eq!(ring.order[0], 0);
        // Each host's ranks are adjacent: the host changes exactly 3 times around the ring.
        let changes = (0..9)
            .filter(|&i| peers[ring.order[i]].host_hash != peers[ring.order[(i + 1) % 9]].host_hash)
            .count();
        assert_eq!((changes, ring.crossings, ring.hosts), (3, 3, 3));
        assert!(ring.rank_order_stretch > ring.stretch, "{ring:?}");
        for r in 0..9 {
            assert_eq!(ring.prev(ring.next(r)), r);
        }
    }

    #[test]
    fn btree_is_a_spanning_tree_for_any_n() {
        for n in 1..40 {
            for second in [false, true] {
                let f = |r| {
                    if second {
                        btree_second(n, r)
                    } else {
                        btree(n, r)
                    }
                };
                let mut parents = vec![None; n];
                let mut roots = 0;
                for r in 0..n {
                    let (u, a, b) = f(r);
                    if u.is_none() {
                        roots += 1;
                    }
                    for c in [a, b].into_iter().flatten() {
                        assert!(c < n && c != r);
                        assert_eq!(f(c).0, Some(r), "n={n} child {c} of {r}");
                        assert!(parents[c].replace(r).is_none());
                    }
                }
                assert_eq!(roots, 1, "n={n}");
                assert_eq!(parents.iter().filter(|p| p.is_none()).count(), 1);
            }
        }
        // The two trees of an even-sized set have different roots' neighbourhoods.
        assert_ne!(btree(8, 0), btree_second(8, 0));
    }

    #[test]
    fn tree_chains_inside_hosts() {
        let peers: Vec<PeerInfo> = (0..6)
            .map(|r| peer(r, (r / 2) as u64, &format!("10.0.0.{}", r / 2 + 1)))
            .collect();
        let ring = ring(&peers);
        for which in 0..2 {
            let t = tree(&peers, &ring, which);
            assert_eq!(t.iter().filter(|n| n.up.is_none()).count(), 1);
            // Second rank of each host hangs below the first.
            for h in 0..3 {
                assert_eq!(t[2 * h + 1].up, Some(2 * h));
            }
            // Walking up from every rank reaches the root without cycles.
            for r in 0..6 {
                let (mut x, mut steps) = (r, 0);
                while let Some(u) = t[x].up {
                    assert!(t[u].down.contains(&x));
                    x = u;
                    steps += 1;
                    assert!(steps < 6);
                }
            }
        }
    }

    #[test]
    fn pci_distances_and_nic_choice() {
        let gpu = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0";
        let nic_same_switch = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0";
        let nic_other_port = "/sys/devices/pci0000:00/0000:00:02.0/0000:05:00.0";
        let nic_other_rc = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";
        assert_eq!(pci_distance(gpu, nic_same_switch), PciDistance::Pix);
        assert_eq!(pci_distance(gpu, nic_other_port), PciDistance::Phb);
        assert_eq!(pci_distance(gpu, nic_other_rc), PciDistance::Sys);
        let dev = |p: &str, rail| NetDevice {
            name: p.into(),
            pci_path: Some(p.into()),
            guid: 0,
            speed_mbps: 1,
            latency_us: 0.0,
            rail_id: rail,
            plane_id: -1,
        };
        let devs = vec![
            dev(nic_other_rc, -1),
            dev(nic_same_switch, -1),
            dev(nic_other_port, -1),
        ];
        assert_eq!(select_nic(&devs, Some(gpu), 0, 0), Some(1));
        // Without a GPU every device is equally close: channels spread across them.
        let picks: Vec<_> = (0..3)
            .map(|c| select_nic(&devs, None, 0, c).unwrap())
            .collect();
        assert_eq!(picks, vec![0, 1, 2]);
        assert!(gdr_enabled(PciDistance::Pix, true, None, None));
        assert!(!gdr_enabled(PciDistance::Sys, false, None, None));
        assert!(!gdr_enabled(PciDistance::Pix, true, None, Some(false)));
        assert!(gdr_enabled(
            PciDistance::Sys,
            false,
            PciDistance::parse("SYS"),
            None
        ));
    }
}
