//! GID index selection, as NCCL's `ncclIbGetGidIndex` / `ncclUpdateGidIndex`.
//!
//! * InfiniBand: `NCCL_IB_ROUTABLE_FLID_GID_INDEX` (1) when that GID carries a
//!   non-zero FLID (so the port is reachable across subnets), else 0.
//!   `NCCL_IB_GID_INDEX` is ignored on IB, as in NCCL.
//! * RoCE: `NCCL_IB_GID_INDEX` when set; otherwise a walk over the table from index 0
//!   that moves to a candidate of the wanted family (`NCCL_IB_ADDR_FAMILY`) inside
//!   `NCCL_IB_ADDR_RANGE`, preferring the wanted RoCE version
//!   (`NCCL_IB_ROCE_VERSION_NUM`) read from sysfs. When that sysfs file cannot be
//!   opened NCCL fails (`ncclIbRoceGetVersionNum` returns ncclSystemError) instead of
//!   guessing: a silently chosen RoCE v1 GID is not routable at L3. A read failing
//!   with EINVAL (a GID not mapped into a container) counts as "unknown version".

use std::net::{Ipv4Addr, Ipv6Addr};

use cclkit_abi::{Error, Result};

use crate::config::{Config, Family};
use crate::route::{LINK_ETHERNET, flid};

/// Read access to one port's GID table and its sysfs RoCE types.
pub trait GidTable {
    /// `gid_tbl_len`.
    fn len(&self) -> u32;
    /// An empty table (no GID at all).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `ibv_query_gid`.
    fn gid(&self, index: u32) -> Result<[u8; 16]>;
    /// `gid_attrs/types/<index>`: `Ok(Some(1|2))`, `Ok(None)` when the read failed
    /// with EINVAL or the text is unknown, `Err` when the file cannot be opened.
    fn roce_version(&self, index: u32) -> Result<Option<u32>>;
}

/// `getGidAddrFamily`: IPv4-mapped (or its multicast form) is IPv4, the rest IPv6.
fn family_of(gid: &[u8; 16]) -> Family {
    let w =
        |i: usize| u32::from_be_bytes([gid[4 * i], gid[4 * i + 1], gid[4 * i + 2], gid[4 * i + 3]]);
    let mapped = w(0) == 0 && w(1) == 0 && w(2) == 0x0000_ffff;
    let mapped_mc = w(0) == 0xff0e_0000 && w(1) == 0 && w(2) == 0x0000_ffff;
    if mapped || mapped_mc {
        Family::V4
    } else {
        Family::V6
    }
}

/// `validGid`: configured (not all-zero, not a bare fe80::) and not link-local.
pub fn valid_gid(gid: &[u8; 16]) -> bool {
    let w =
        |i: usize| u32::from_be_bytes([gid[4 * i], gid[4 * i + 1], gid[4 * i + 2], gid[4 * i + 3]]);
    let trailer = w(1) | w(2) | w(3);
    let configured = !((w(0) | trailer) == 0 || (w(0) == 0xfe80_0000 && trailer == 0));
    let link_local = w(0) == 0xfe80_0000 && w(1) == 0;
    configured && !link_local
}

/// `NCCL_IB_ADDR_RANGE` parsed for `family` (`envIbAddrRange`): `None` when unset or
/// malformed (NCCL then ignores it).
pub fn parse_range(value: Option<&str>, family: Family) -> Option<([u8; 16], u32)> {
    let (addr, mask) = value?.trim().split_once('/')?;
    let mask: u32 = mask.trim().parse().ok()?;
    let mut out = [0u8; 16];
    match family {
        Family::V4 => {
            let a: Ipv4Addr = addr.trim().parse().ok()?;
            if mask > 32 {
                return None;
            }
            out[12..].copy_from_slice(&a.octets());
        }
        Family::V6 => {
            let a: Ipv6Addr = addr.trim().parse().ok()?;
            if mask > 128 {
                return None;
            }
            out = a.octets();
        }
    }
    Some((out, mask))
}

/// `matchGidAddrPrefix`: IPv4 compares the last word, IPv6 the leading bits.
fn in_range(range: Option<&([u8; 16], u32)>, family: Family, gid: &[u8; 16]) -> bool {
    let Some((base, bits)) = range else {
        return true;
    };
    let (a, b, bits) = match family {
        Family::V4 => (&base[12..], &gid[12..], *bits),
        Family::V6 => (&base[..], &gid[..], *bits),
    };
    let full = (bits / 8) as usize;
    if a[..full] != b[..full] {
        return false;
    }
    let rest = bits % 8;
    rest == 0 || {
        let m = 0xffu8 << (8 - rest);
        a[full] & m == b[full] & m
    }
}

/// The GID index to use on a port of link layer `link_layer`.
pub fn choose_gid_index(table: &dyn GidTable, link_layer: u8, cfg: &Config) -> Result<u32> {
    let len = table.len();
    if link_layer != LINK_ETHERNET {
        let routable = cfg.routable_flid_gid_index;
        if routable < len && flid(&table.gid(routable)?) != 0 {
            return Ok(routable);
        }
        return Ok(0);
    }
    if let Some(i) = cfg.gid_index {
        return Ok(i);
    }
    let family = cfg.addr_family;
    let range = parse_range(cfg.addr_range.as_deref(), family);
    let mut current = 0;
    for candidate in 1..len {
        let gid = table.gid(current)?;
        let cand = table.gid(candidate)?;
        let cand_fam = family_of(&cand);
        let cand_in_range = in_range(range.as_ref(), family, &cand);
        if cand_fam != family_of(&gid) && cand_fam == family && cand_in_range {
            current = candidate;
            continue;
        }
        if cand_fam != family || !valid_gid(&cand) || !cand_in_range {
            continue;
        }
        let v_cur = table.roce_version(current)?;
        let v_cand = table.roce_version(candidate)?;
        if (v_cur != v_cand || !valid_gid(&gid)) && v_cand == Some(cfg.roce_version) {
            current = candidate;
        }
    }
    Ok(current)
}

/// The sysfs-backed table of a real port.
pub struct SysfsTable<'a> {
    /// Device name (`mlx5_0`).
    pub name: &'a str,
    /// Port number.
    pub port: u8,
    /// `gid_tbl_len`.
    pub len: u32,
    /// `ibv_query_gid`.
    pub query: &'a dyn Fn(u32) -> Result<[u8; 16]>,
}

/// Parses a `gid_attrs/types/N` text.
pub fn parse_roce_type(text: &str) -> Option<u32> {
    let t = text.trim();
    if t.starts_with("IB/RoCE v1") || t.starts_with("RoCE v1") {
        Some(1)
    } else if t.starts_with("RoCE v2") {
        Some(2)
    } else {
        None
    }
}

impl GidTable for SysfsTable<'_> {
    fn len(&self) -> u32 {
        self.len
    }

    fn gid(&self, index: u32) -> Result<[u8; 16]> {
        (self.query)(index)
    }

    fn roce_version(&self, index: u32) -> Result<Option<u32>> {
        let path = format!(
            "/sys/class/infiniband/{}/ports/{}/gid_attrs/types/{index}",
            self.name, self.port
        );
        let mut f = std::fs::File::open(&path).map_err(|e| {
            Error::system(format!(
                "NET/cclkit-ib: cannot open {path} ({e}): the RoCE version of GID {index} is \
                 unknown; set NCCL_IB_GID_INDEX (see `show_gids`) as NCCL requires"
            ))
        })?;
        let mut buf = String::new();
        match std::io::Read::read_to_string(&mut f, &mut buf) {
            Ok(_) => Ok(parse_roce_type(&buf)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
            Err(e) => Err(Error::system(format!("NET/cclkit-ib: read {path}: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests;
