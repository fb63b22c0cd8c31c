//! Device discovery: every active port of every HCA that passes `NCCL_IB_HCA`, with
//! the properties NCCL reads (speed, port, guid, PCI path, pointer support, …).

use std::path::Path;

use cclkit_abi::net::Properties;
use cclkit_abi::raw::common::ptr;
use cclkit_abi::raw::common::subsys;
use cclkit_abi::raw::net::MAX_COLLNET_SIZE;
use cclkit_abi::{Error, Result, nccl_info, nccl_warn};

use super::loader;
use super::nic::VerbsNic;
use super::safe::{Context, DeviceList, Pd};
use super::sys::*;
use crate::config::{Config, Family};
use crate::proto::{MAX_MESSAGE, MAX_RECVS};

/// A usable port and what NCCL should know about it.
pub struct Found {
    /// The NIC (device context, PD, port, chosen GID).
    pub nic: VerbsNic,
    /// Its properties.
    pub props: Properties,
}

/// Link speed in Mbps from `ibv_port_attr` (NCCL's tables: per-lane rate of the
/// lowest set `active_speed` bit × lanes of the lowest set `active_width` bit).
pub fn port_speed_mbps(active_speed: u8, active_width: u8) -> i32 {
    const SPEEDS: [i32; 9] = [
        2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000, 200000,
    ];
    const WIDTHS: [i32; 5] = [1, 4, 8, 12, 2];
    let first = |v: u8, max: usize| (0..max).find(|i| v & (1 << i) != 0).unwrap_or(max);
    SPEEDS[first(active_speed, SPEEDS.len() - 1)] * WIDTHS[first(active_width, WIDTHS.len() - 1)]
}

/// One GID table entry considered for RoCE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidCandidate {
    /// Index in the port's table.
    pub index: u32,
    /// The GID.
    pub gid: [u8; 16],
    /// RoCE v2 (true), v1 (false), unknown (None).
    pub roce_v2: Option<bool>,
}

fn is_v4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// Picks the RoCE GID as NCCL does when `NCCL_IB_GID_INDEX` is unset: a configured,
/// non-link-local GID of the wanted address family, preferring the wanted RoCE
/// version; the lowest index among equals.
pub fn select_gid(cands: &[GidCandidate], family: Family, roce_version: u32) -> Option<u32> {
    let score = |c: &GidCandidate| -> Option<u32> {
        let zero = c.gid.iter().all(|&b| b == 0);
        let link_local = c.gid[0] == 0xfe && c.gid[1] & 0xc0 == 0x80;
        if zero || link_local {
            return None;
        }
        let fam = match family {
            Family::V4 => is_v4_mapped(&c.gid),
            Family::V6 => !is_v4_mapped(&c.gid),
        };
        let ver = c.roce_v2 == Some(roce_version == 2);
        Some(2 * u32::from(fam) + u32::from(ver))
    };
    cands
        .iter()
        .filter_map(|c| score(c).map(|s| (s, c.index)))
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|(_, i)| i)
}

/// GPUDirect RDMA through a peer-memory module (`nv_peermem`), as NCCL checks it.
pub fn gdr_peermem_loaded() -> bool {
    [
        "/sys/kernel/mm/memory_peers/nv_mem/version",
        "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
        "/sys/module/nvidia_peermem/version",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

/// Whether the kernel and device take dma-buf registrations: a dummy
/// `ibv_reg_dmabuf_mr` with fd -1 fails with EBADF when they do, and with
/// EOPNOTSUPP/EPROTONOSUPPORT when they do not (NCCL's probe).
fn dmabuf_supported(pd: &Pd) -> bool {
    match pd.reg_dmabuf_mr(0, 0, 0, -1, 0) {
        Ok(mr) => {
            let _ = mr.dereg();
            true
        }
        Err(e) => !e.is_unsupported(),
    }
}

/// Why there is no device at all: NULL from `ibv_get_device_list`.
fn no_device_list(e: &super::safe::VerbsError) -> Error {
    let hint = if Path::new("/dev/infiniband").exists() {
        "/dev/infiniband exists but verbs could not use it (missing provider library or permissions?)"
    } else {
        "/dev/infiniband does not exist: no RDMA device or no uverbs support in this kernel"
    };
    Error::system(format!(
        "NET/cclkit-ib: no RDMA devices: ibv_get_device_list returned NULL ({}); {hint}",
        e.source
    ))
}

/// Opens every active port that passes the filters; an error when there is none
/// (so NCCL and cclkit fall back to another transport).
pub fn discover(cfg: &Config) -> Result<Vec<Found>> {
    let verbs = loader::verbs().map_err(|m| Error::system(format!("NET/cclkit-ib: {m}")))?;
    let list = DeviceList::new(verbs).map_err(|e| no_device_list(&e))?;
    if list.is_empty() {
        return Err(Error::system(
            "NET/cclkit-ib: no RDMA devices: ibv_get_device_list returned an empty list",
        ));
    }
    let gdr = gdr_peermem_loaded();
    let mut found = Vec::new();
    let mut seen = Vec::new();
    for i in 0..list.len() {
        let Some(name) = list.name(i) else { continue };
        seen.push(name.clone());
        if !cfg.hca.matches(&name, None) {
            continue;
        }
        match open_ports(&list, i, &name, cfg, gdr) {
            Ok(mut ports) => found.append(&mut ports),
            Err(e) => nccl_warn!("NET/cclkit-ib: skipping {name}: {}", e.message()),
        }
    }
    if found.is_empty() {
        return Err(Error::system(format!(
            "NET/cclkit-ib: no active port on the RDMA devices [{}] with NCCL_IB_HCA={}",
            seen.join(", "),
            cfg.hca
        )));
    }
    Ok(found)
}

fn open_ports(
    list: &DeviceList,
    i: usize,
    name: &str,
    cfg: &Config,
    gdr: bool,
) -> Result<Vec<Found>> {
    let ctx = list.open(i)?;
    let attr = ctx.query_device()?;
    let pd = ctx.alloc_pd()?;
    let dmabuf = dmabuf_supported(&pd);
    let pci_path = std::fs::canonicalize(format!("/sys/class/infiniband/{name}/device"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let mut out = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        let pattr = ctx.query_port(port)?;
        if pattr.state != IBV_PORT_ACTIVE {
            nccl_info!(
                subsys::NET | subsys::INIT,
                "NET/cclkit-ib: {name}:{port} is not active"
            );
            continue;
        }
        if pattr.link_layer != IBV_LINK_LAYER_INFINIBAND
            && pattr.link_layer != IBV_LINK_LAYER_ETHERNET
        {
            continue;
        }
        if !cfg.hca.matches(name, Some(u32::from(port))) {
            continue;
        }
        let gid_index = choose_gid(&ctx, name, port, &pattr, cfg)?;
        let gid = ctx.query_gid(port, gid_index as i32)?;
        let mut ptr_support = ptr::HOST;
        if gdr {
            ptr_support |= ptr::CUDA;
        }
        if dmabuf {
            // GPUDirect through dma-buf needs no peer-memory module.
            ptr_support |= ptr::CUDA | ptr::DMABUF;
        }
        let props = Properties {
            name: name.to_owned(),
            pci_path: pci_path.clone(),
            guid: attr.sys_image_guid,
            ptr_support,
            reg_is_global: true,
            speed_mbps: port_speed_mbps(pattr.active_speed, pattr.active_width),
            port: i32::from(port),
            max_comms: attr.max_qp,
            max_recvs: MAX_RECVS as i32,
            max_p2p_bytes: MAX_MESSAGE,
            max_coll_bytes: MAX_COLLNET_SIZE,
            ..Properties::host(name)
        };
        nccl_info!(
            subsys::NET | subsys::INIT,
            "NET/cclkit-ib: {name}:{port} {} speed {} Mbps, GID index {gid_index}, ptrSupport {ptr_support:#x}",
            if pattr.link_layer == IBV_LINK_LAYER_ETHERNET {
                "RoCE"
            } else {
                "IB"
            },
            props.speed_mbps
        );
        let nic = VerbsNic::new(
            ctx.clone(),
            pd.clone(),
            port,
            &pattr,
            &attr,
            gid,
            gid_index as u8,
            cfg,
        )?;
        out.push(Found { nic, props });
    }
    Ok(out)
}

/// `NCCL_IB_GID_INDEX`, else for RoCE the best GID of the table, for IB index 0.
fn choose_gid(
    ctx: &Context,
    name: &str,
    port: u8,
    pattr: &ibv_port_attr,
    cfg: &Config,
) -> Result<u32> {
    if let Some(i) = cfg.gid_index {
        return Ok(i);
    }
    if pattr.link_layer != IBV_LINK_LAYER_ETHERNET {
        return Ok(0);
    }
    let n = u32::try_from(pattr.gid_tbl_len).unwrap_or(0).min(256);
    let cands: Vec<GidCandidate> = (0..n)
        .filter_map(|index| {
            let gid = ctx.query_gid(port, index as i32).ok()?;
            let kind = std::fs::read_to_string(format!(
                "/sys/class/infiniband/{name}/ports/{port}/gid_attrs/types/{index}"
            ))
            .ok();
            let roce_v2 = kind.map(|k| k.trim().eq_ignore_ascii_case("RoCE v2"));
            Some(GidCandidate {
                index,
                gid,
                roce_v2,
            })
        })
        .collect();
    select_gid(&cands, cfg.addr_family, cfg.roce_version).ok_or_else(|| {
        Error::system(format!(
            "NET/cclkit-ib: {name}:{port} has no usable RoCE GID (set NCCL_IB_GID_INDEX)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speed_is_lane_rate_times_width_like_nccl() {
        assert_eq!(port_speed_mbps(1, 1), 2500); // SDR 1x
        assert_eq!(port_speed_mbps(32, 2), 100_000); // EDR 4x
        assert_eq!(port_speed_mbps(64, 2), 200_000); // HDR 4x
        assert_eq!(port_speed_mbps(128, 2), 400_000); // NDR 4x
        assert_eq!(port_speed_mbps(128, 16), 200_000); // NDR 2x
        assert_eq!(port_speed_mbps(16, 4), 112_000); // FDR 8x
        assert_eq!(port_speed_mbps(32, 8), 300_000); // EDR 12x
        assert_eq!(
            port_speed_mbps(0, 0),
            200_000 * 2,
            "unknown bits → last entries"
        );
    }

    fn v4(index: u32, last: u8, v2: Option<bool>) -> GidCandidate {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 0, 0, last]);
        GidCandidate {
            index,
            gid,
            roce_v2: v2,
        }
    }

    fn v6(index: u32, first: u8, v2: Option<bool>) -> GidCandidate {
        let mut gid = [0x20; 16];
        gid[0] = first;
        gid[1] = 0x80;
        GidCandidate {
            index,
            gid,
            roce_v2: v2,
        }
    }

    #[test]
    fn roce_gid_prefers_family_then_version_and_skips_unusable_entries() {
        let table = [
            v6(0, 0xfe, Some(false)), // link-local
            v6(1, 0xfe, Some(true)),  // link-local
            v4(2, 5, Some(false)),
            v4(3, 5, Some(true)),
            v6(4, 0x20, Some(true)),
            GidCandidate {
                index: 5,
                gid: [0; 16],
                roce_v2: Some(true),
            },
        ];
        assert_eq!(select_gid(&table, Family::V4, 2), Some(3));
        assert_eq!(select_gid(&table, Family::V4, 1), Some(2));
        assert_eq!(select_gid(&table, Family::V6, 2), Some(4));
        assert_eq!(
            select_gid(&table, Family::V6, 1),
            Some(4),
            "family outranks version"
        );
        assert_eq!(
            select_gid(&table[..2], Family::V4, 2),
            None,
            "only link-local"
        );
        assert_eq!(
            select_gid(&[v4(7, 1, None), v4(6, 2, None)], Family::V4, 2),
            Some(6)
        );
    }
}
