//! Device discovery: usable IP interfaces chosen the way NCCL chooses them, and the
//! facts about each that the properties and the stream auto-tuning need.

use std::net::IpAddr;
use std::path::Path;

use cclkit_abi::sock::{IfAddr, IfList, interface_addresses};
use cclkit_abi::{Error, Result};

use crate::config::Family;

/// One usable interface (a net device of the plugin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Interface name (`eth0`).
    pub name: String,
    /// The address listens bind to and peers connect to.
    pub addr: IpAddr,
    /// IPv6 scope (interface index) for link-scoped addresses, else 0.
    pub scope_id: u32,
    /// Link speed from `/sys/class/net/<if>/speed` (Mbps), `None` when unknown.
    pub speed_mbps: Option<u32>,
    /// Realpath of `/sys/class/net/<if>/device`, `None` for virtual interfaces.
    pub pci_path: Option<String>,
    /// PCI vendor id of that device (auto-tuning: AWS ENA, GCP gVNIC).
    pub pci_vendor: Option<u16>,
    /// True for the loopback interface.
    pub loopback: bool,
}

/// Picks one address per selected interface (IPv4 first, no IPv6 link-local).
pub fn select(addrs: &[IfAddr], list: &IfList, family: Option<Family>) -> Vec<IfAddr> {
    let mut picked: Vec<IfAddr> = Vec::new();
    for want_v4 in [true, false] {
        for a in addrs {
            if !a.up || !a.running || a.addr.is_ipv4() != want_v4 || !list.selects(&a.name) {
                continue;
            }
            match (family, a.addr) {
                (Some(Family::V4), IpAddr::V6(_)) | (Some(Family::V6), IpAddr::V4(_)) => continue,
                // Link-local IPv6 needs a scope on every peer; NCCL skips it too.
                (_, IpAddr::V6(v6)) if v6.segments()[0] & 0xffc0 == 0xfe80 => continue,
                _ => {}
            }
            if !picked.iter().any(|p| p.name == a.name) {
                picked.push(a.clone());
            }
        }
    }
    picked
}

/// The interfaces NCCL would pick: the user's list, else `ib*`, else anything but
/// docker/loopback/virbr, else docker, else loopback.
pub fn discover(ifname: Option<&str>, family: Option<Family>) -> Result<Vec<Device>> {
    let addrs = interface_addresses().map_err(|e| Error::io("getifaddrs", e))?;
    let picked = match ifname {
        Some(spec) => select(&addrs, &IfList::parse(spec), family),
        None => ["ib", "^docker,lo,virbr", "docker", "lo"]
            .iter()
            .map(|spec| select(&addrs, &IfList::parse(spec), family))
            .find(|found| !found.is_empty())
            .unwrap_or_default(),
    };
    Ok(picked.into_iter().map(describe).collect())
}

/// Reads the sysfs facts about one interface.
fn describe(a: IfAddr) -> Device {
    let base = Path::new("/sys/class/net").join(&a.name);
    let speed_mbps = std::fs::read_to_string(base.join("speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|&s| s > 0)
        .and_then(|s| u32::try_from(s).ok());
    let device = base.join("device");
    let pci_path = std::fs::canonicalize(&device)
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let pci_vendor = std::fs::read_to_string(device.join("vendor"))
        .ok()
        .and_then(|s| u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok());
    Device {
        name: a.name,
        addr: a.addr,
        scope_id: a.scope_id,
        speed_mbps,
        pci_path,
        pci_vendor,
        loopback: a.loopback,
    }
}

/// PCI vendor of AWS ENA NICs (NCCL: 2 threads × 8 sockets).
const VENDOR_AWS: u16 = 0x1d0f;
/// PCI vendor of GCP gVNIC NICs (NCCL: 4 threads × 1 socket).
const VENDOR_GCP: u16 = 0x1ae0;

/// Default `(threads, sockets per thread)` for a device when the user set neither.
///
/// NCCL's cloud-vendor rules, else by link speed: one stream cannot fill a fast
/// link (a core moves roughly 20–40 Gb/s through TCP), so faster links get more
/// streams and threads, but never more helper threads than half the CPUs (the
/// proxy threads poll too). Loopback gets none: its throughput is the CPU copying
/// on both ends, which extra streams only split, and handing a message to a helper
/// thread costs a wake-up that the proxy thread's own I/O does not.
pub fn auto_streams(dev: &Device, cpus: usize) -> (usize, usize) {
    let (threads, socks) = match dev.pci_vendor {
        Some(VENDOR_AWS) => (2, 8),
        Some(VENDOR_GCP) => (4, 1),
        _ if dev.loopback => (0, 1),
        _ => match dev.speed_mbps.unwrap_or(10_000) {
            s if s >= 100_000 => (4, 2),
            s if s >= 25_000 => (2, 2),
            _ => (1, 2),
        },
    };
    (threads.min((cpus / 2).max(1)), socks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(name: &str, ip: &str, up: bool) -> IfAddr {
        IfAddr {
            name: name.to_owned(),
            addr: ip.parse().unwrap(),
            scope_id: 0,
            up,
            running: up,
            loopback: name == "lo",
        }
    }

    #[test]
    fn selection_prefers_v4_skips_link_local_and_down() {
        let addrs = vec![
            addr("eth0", "fe80::1", true),
            addr("eth0", "fd00::2", true),
            addr("eth0", "192.0.2.2", true),
            addr("eth1", "fe80::2", true),
            addr("eth2", "10.0.0.1", false),
            addr("lo", "127.0.0.1", true),
        ];
        let all = IfList::parse("");
        let got = select(&addrs, &all, None);
        let names: Vec<_> = got.iter().map(|a| (a.name.as_str(), a.addr)).collect();
        assert_eq!(
            names,
            vec![
                ("eth0", "192.0.2.2".parse().unwrap()),
                ("lo", "127.0.0.1".parse().unwrap())
            ]
        );
        let v6 = select(&addrs, &all, Some(Family::V6));
        assert_eq!(v6.len(), 1);
        assert_eq!(v6[0].addr, "fd00::2".parse::<IpAddr>().unwrap());
        assert!(select(&addrs, &IfList::parse("^eth,lo"), None).is_empty());
    }

    #[test]
    fn auto_streams_rules() {
        let mut d = Device {
            name: "eth0".into(),
            addr: "10.0.0.1".parse().unwrap(),
            scope_id: 0,
            speed_mbps: Some(100_000),
            pci_path: None,
            pci_vendor: Some(VENDOR_AWS),
            loopback: false,
        };
        assert_eq!(auto_streams(&d, 64), (2, 8));
        d.pci_vendor = None;
        assert_eq!(auto_streams(&d, 64), (4, 2));
        assert_eq!(auto_streams(&d, 2), (1, 2));
        d.speed_mbps = None;
        assert_eq!(auto_streams(&d, 64), (1, 2));
        d.loopback = true;
        assert_eq!(auto_streams(&d, 64), (0, 1));
    }
}
