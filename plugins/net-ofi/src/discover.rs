//! Provider selection and device discovery.
//!
//! One `fi_getinfo` for `FI_EP_RDM` + `FI_TAGGED` lists every provider and domain.
//! The first provider in preference order that has a usable domain wins, and each
//! of its domains (NIC) becomes one NCCL device. Default order:
//!
//! 1. `efa`;
//! 2. providers not named below, in libfabric's order (hardware: psm2/psm3,
//!    `verbs;ofi_rxm`, cxi, opx, …);
//! 3. `tcp;ofi_rxm`: the stable TCP path;
//! 4. `net`, `net;ofi_rxm`: 1.17's experimental TCP rewrite (folded back into
//!    `tcp` in later releases), so it comes after the stable one;
//! 5. `udp;ofi_rxd` and other `ofi_rxd` stacks: reliability emulated over
//!    datagrams, slowest of the working ones;
//! 6. `shm`: reaches only processes on this host, so it is a last resort for a
//!    *network* plugin (name it in `CCLKIT_OFI_PROVIDER` to use it).
//!
//! `sockets` is never chosen by default (about 20× slower); naming it works.

use cclkit_abi::{Error, Result, nccl_info};

use crate::config::Config;
use crate::fabric::{FiResult, Hints, Info, InfoList, InfoRef, getinfo};
use crate::sys;
use crate::tags::TagLayout;

/// Capabilities every endpoint needs.
const CAPS: u64 = sys::FI_TAGGED as u64;
/// Context modes we satisfy (every operation carries an `fi_context2`).
const MODE: u64 = sys::FI_CONTEXT | sys::FI_CONTEXT2;
/// Registration modes we can honour (see `mr.rs`).
const MR_MODE: u32 = sys::FI_MR_LOCAL
    | sys::FI_MR_VIRT_ADDR
    | sys::FI_MR_ALLOCATED
    | sys::FI_MR_PROV_KEY
    | sys::FI_MR_ENDPOINT;

/// One NCCL device: a domain of the chosen provider.
pub struct DeviceDesc {
    /// The domain's entry from discovery.
    pub info: Info,
    /// Domain name (`lo`, `efa_0-rdm`, `shm`).
    pub name: String,
    /// The provider supports `FI_HMEM` on this domain.
    pub hmem: bool,
    /// Tag layout for the provider's tag width.
    pub layout: TagLayout,
    /// Provider's `mr_mode` bits.
    pub mr_mode: u32,
    /// Largest message.
    pub max_msg_size: usize,
    /// Receives the endpoint can have posted at once.
    pub rx_size: usize,
    /// `/sys/bus/pci/devices/…` of the NIC, when known.
    pub pci_path: Option<String>,
    /// Link speed in Mbps, when the provider reports it.
    pub speed_mbps: Option<i32>,
    /// Address string the endpoint binds to (`FI_SOURCE`), for IP providers.
    pub bind_node: Option<String>,
}

/// The discovery result.
pub struct Discovery {
    /// The chosen provider.
    pub provider: String,
    /// Its devices.
    pub devices: Vec<DeviceDesc>,
}

fn hints(hmem: bool) -> FiResult<Hints> {
    let mut h = Hints::new()?;
    h.caps(CAPS | if hmem { sys::FI_HMEM } else { 0 })
        .mode(MODE)
        .ep_type(sys::FI_EP_RDM)
        .mr_mode(MR_MODE | if hmem { sys::FI_MR_HMEM } else { 0 })
        .threading(sys::FI_THREAD_SAFE);
    Ok(h)
}

/// Rank of a provider in the default order; `None` = never by default.
pub fn default_rank(prov: &str) -> Option<u32> {
    let layers: Vec<&str> = prov.split(';').collect();
    Some(match prov {
        "sockets" => return None,
        "efa" => 0,
        "tcp;ofi_rxm" | "tcp" => 20,
        "net" => 30,
        "net;ofi_rxm" => 31,
        "shm" => 50,
        _ if layers.contains(&"ofi_rxd") => 40,
        _ if layers.contains(&"sockets") => return None,
        _ => 10,
    })
}

/// Rank of a provider in a user list: the first entry naming it, or one of its
/// layers (`tcp` matches `tcp;ofi_rxm`).
pub fn user_rank(prov: &str, wanted: &[String]) -> Option<u32> {
    wanted
        .iter()
        .position(|w| {
            w.eq_ignore_ascii_case(prov) || prov.split(';').any(|l| l.eq_ignore_ascii_case(w))
        })
        .map(|p| p as u32)
}

fn is_ip(format: u32) -> bool {
    format == sys::FI_SOCKADDR_IN || format == sys::FI_SOCKADDR_IN6 || format == sys::FI_SOCKADDR
}

/// The IP address of a sockaddr-format source address, as text.
fn ip_of(info: InfoRef<'_>) -> Option<String> {
    cclkit_abi::sock::from_sockaddr_bytes(info.src_addr()?).map(|a| a.ip().to_string())
}

fn is_loopback(info: InfoRef<'_>) -> bool {
    info.domain_name() == "lo"
        || ip_of(info)
            .and_then(|s| s.parse::<std::net::IpAddr>().ok())
            .is_some_and(|ip| ip.is_loopback())
}

fn pci_path(info: InfoRef<'_>, name: &str) -> Option<String> {
    let sys_path = match info.pci() {
        Some((d, b, dev, f)) => format!("/sys/bus/pci/devices/{d:04x}:{b:02x}:{dev:02x}.{f:x}"),
        None => format!("/sys/class/net/{name}/device"),
    };
    std::fs::canonicalize(sys_path)
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// Chooses the provider and lists its devices.
pub fn discover(cfg: &Config) -> Result<Discovery> {
    let all = getinfo(None, None, 0, &hints(false)?)?;
    // A provider without FI_HMEM simply does not answer this query.
    let hmem = hints(true).and_then(|h| getinfo(None, None, 0, &h)).ok();
    let mut seen: Vec<String> = Vec::new();
    for i in all.iter() {
        let p = i.provider();
        if !seen.contains(&p) {
            seen.push(p);
        }
    }
    let rank = |p: &str| match &cfg.providers {
        Some(w) => user_rank(p, w),
        None => default_rank(p),
    };
    let mut order: Vec<&String> = seen.iter().filter(|p| rank(p).is_some()).collect();
    order.sort_by_key(|p| rank(p));
    let mut skipped = Vec::new();
    for prov in order {
        match devices_of(&all, &hmem, prov, cfg) {
            Ok(devices) if !devices.is_empty() => {
                nccl_info!(
                    cclkit_abi::raw::common::subsys::NET | cclkit_abi::raw::common::subsys::INIT,
                    "NET/OFI: provider {prov}, {} device(s): {}",
                    devices.len(),
                    devices
                        .iter()
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                return Ok(Discovery {
                    provider: prov.clone(),
                    devices,
                });
            }
            Ok(_) => skipped.push(format!("{prov} (no domain matches CCLKIT_OFI_IFACE)")),
            Err(e) => skipped.push(format!("{prov} ({})", e.message())),
        }
    }
    let wanted = match &cfg.providers {
        Some(w) => format!("CCLKIT_OFI_PROVIDER={}", w.join(",")),
        None => "efa or another FI_EP_RDM+FI_TAGGED provider except sockets".into(),
    };
    Err(Error::internal(format!(
        "NET/OFI: no usable libfabric provider (wanted {wanted}); providers offering \
         FI_EP_RDM+FI_TAGGED: [{}]{}{}",
        seen.join(", "),
        if skipped.is_empty() {
            ""
        } else {
            "; skipped: "
        },
        skipped.join("; ")
    )))
}

fn devices_of(
    all: &InfoList,
    hmem: &Option<InfoList>,
    prov: &str,
    cfg: &Config,
) -> Result<Vec<DeviceDesc>> {
    let mut picked: Vec<InfoRef<'_>> = Vec::new();
    for i in all.iter().filter(|i| i.provider() == prov) {
        let name = i.domain_name();
        if let Some(k) = picked.iter().position(|p| p.domain_name() == name) {
            // Several entries per domain (IPv4, IPv6, …): prefer IPv4.
            if picked[k].addr_format() != sys::FI_SOCKADDR_IN
                && i.addr_format() == sys::FI_SOCKADDR_IN
            {
                picked[k] = i;
            }
            continue;
        }
        picked.push(i);
    }
    match &cfg.ifaces {
        Some(want) => picked.retain(|i| want.iter().any(|w| *w == i.domain_name())),
        None if picked.iter().any(|i| !is_loopback(*i)) => picked.retain(|i| !is_loopback(*i)),
        None => {}
    }
    let mut out = Vec::new();
    for i in picked {
        let name = i.domain_name();
        let layout = TagLayout::new(i.tag_bits()).ok_or_else(|| {
            Error::internal(format!("matches only {} tag bits, 58 needed", i.tag_bits()))
        })?;
        // Only IP-addressed providers bind to a node address (efa and shm have
        // their own address formats).
        let bind_node = if is_ip(i.addr_format()) {
            cfg.addr.clone().or_else(|| ip_of(i))
        } else {
            None
        };
        out.push(DeviceDesc {
            hmem: hmem
                .iter()
                .flat_map(|l| l.iter())
                .any(|h| h.provider() == prov && h.domain_name() == name),
            layout,
            mr_mode: i.mr_mode(),
            max_msg_size: i.max_msg_size(),
            rx_size: i.rx_size(),
            pci_path: pci_path(i, &name),
            speed_mbps: i
                .link_speed_bps()
                .map(|bps| i32::try_from(bps / 1_000_000).unwrap_or(i32::MAX)),
            bind_node,
            info: i.to_owned()?,
            name,
        });
    }
    Ok(out)
}

/// The entry to open a device's endpoint with, and whether it has the write path's
/// `FI_RMA` with 8 bytes of remote CQ data (asked for when `rma`; without it, or
/// when the provider says no, the entry is the tagged-only one). For IP
/// providers it is a fresh `fi_getinfo(node, FI_SOURCE)` so the endpoint binds to
/// that address (without it a peer may answer through another interface and the
/// exchange stalls, DEPENDENCIES.md §4).
pub fn bind_info(prov: &str, dev: &DeviceDesc, rma: bool) -> Result<(Info, bool)> {
    if rma {
        match query(prov, dev, CAPS | sys::FI_RMA as u64) {
            Ok(i) if i.as_ref().cq_data_size() >= 8 => return Ok((i, true)),
            Ok(i) => nccl_info!(
                cclkit_abi::raw::common::subsys::NET,
                "NET/OFI: {prov} on {} carries {} bytes of remote CQ data, 8 needed: no writes",
                dev.name,
                i.as_ref().cq_data_size()
            ),
            Err(e) => nccl_info!(
                cclkit_abi::raw::common::subsys::NET,
                "NET/OFI: {prov} on {} offers no FI_RMA: no writes ({})",
                dev.name,
                e.message()
            ),
        }
    }
    if dev.bind_node.is_none() {
        return Ok((dev.info.as_ref().to_owned()?, false));
    }
    Ok((query(prov, dev, CAPS)?, false))
}

/// The first entry of `prov` for `dev`'s domain with `caps`, bound to its node
/// address when it has one.
fn query(prov: &str, dev: &DeviceDesc, caps: u64) -> Result<Info> {
    let mut h = hints(false)?;
    h.caps(caps);
    h.provider(prov)?.domain(&dev.name)?;
    let (node, flags) = match &dev.bind_node {
        Some(n) => (Some(n.as_str()), sys::FI_SOURCE),
        None => (None, 0),
    };
    let list = getinfo(node, None, flags, &h).map_err(|e| {
        Error::system(format!(
            "NET/OFI: binding {} to {}: {e}",
            dev.name,
            node.unwrap_or("its domain")
        ))
    })?;
    let first = list.iter().next().ok_or_else(|| {
        Error::system(format!(
            "NET/OFI: provider {prov} has no endpoint for domain {}{}",
            dev.name,
            node.map(|n| format!(" bound to {n}")).unwrap_or_default()
        ))
    })?;
    Ok(first.to_owned()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_order() {
        let mut provs = vec![
            "shm",
            "udp;ofi_rxd",
            "net",
            "tcp;ofi_rxm",
            "psm2",
            "efa",
            "sockets",
            "net;ofi_rxm",
        ];
        provs.retain(|p| default_rank(p).is_some());
        provs.sort_by_key(|p| default_rank(p));
        assert_eq!(
            provs,
            [
                "efa",
                "psm2",
                "tcp;ofi_rxm",
                "net",
                "net;ofi_rxm",
                "udp;ofi_rxd",
                "shm"
            ]
        );
    }

    #[test]
    fn user_list_matches_layers() {
        let w = vec!["tcp".to_owned(), "shm".to_owned()];
        assert_eq!(user_rank("tcp;ofi_rxm", &w), Some(0));
        assert_eq!(user_rank("shm", &w), Some(1));
        assert_eq!(user_rank("net", &w), None);
        assert_eq!(user_rank("sockets", &["sockets".to_owned()]), Some(0));
    }
}
