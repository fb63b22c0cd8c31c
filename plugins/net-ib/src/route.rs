//! The address vector a QP gets at RTR, computed once for the verbs NIC and the test
//! double alike (so the fake NIC checks what real hardware would be given).
//!
//! Follows NCCL's `ncclIbQpRtr`:
//! * RoCE: always global (GRH) with the peer's GID, our GID index, hop limit 255 and
//!   the traffic class;
//! * InfiniBand: LID-routed inside a subnet; global when the subnets differ or the
//!   port requires a GRH (`IBV_QPF_GRH_REQUIRED`). Across subnets the destination
//!   LID is the peer's FLID (bits 16..32 of its GID: `ncclIbExtractFlid`), or its LID
//!   with a warning when the FLID is 0. The traffic class is not set on IB.

use crate::nic::{Link, PortAddr};

/// `IBV_LINK_LAYER_ETHERNET`.
pub const LINK_ETHERNET: u8 = 2;
/// `IBV_LINK_LAYER_INFINIBAND`.
pub const LINK_INFINIBAND: u8 = 1;

/// What `ibv_modify_qp(RTR)` receives in `ah_attr` (+ `path_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressVector {
    /// `ah_attr.is_global`.
    pub is_global: bool,
    /// `ah_attr.dlid`.
    pub dlid: u16,
    /// `grh.dgid`.
    pub dgid: [u8; 16],
    /// `grh.sgid_index`.
    pub sgid_index: u8,
    /// `grh.hop_limit`.
    pub hop_limit: u8,
    /// `grh.traffic_class`.
    pub traffic_class: u8,
    /// `ah_attr.sl`.
    pub sl: u8,
    /// `path_mtu` (`ibv_mtu`).
    pub path_mtu: u8,
}

/// The FLID of an InfiniBand GID (`ncclIbExtractFlid`): bytes 4..6, big-endian.
pub fn flid(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[4], gid[5]])
}

/// The local subnet part NCCL compares (`ncclIbExtractLocalSubnetPrefix`): the low
/// 16 bits of the 64-bit subnet prefix, i.e. bytes 6..8.
pub fn local_subnet(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[6], gid[7]])
}

/// Our side of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPort {
    /// Our address (GID chosen at discovery, LID, MTU, link layer).
    pub addr: PortAddr,
    /// Index of our GID.
    pub gid_index: u8,
    /// `ibv_port_attr.flags & IBV_QPF_GRH_REQUIRED`.
    pub grh_required: bool,
}

/// The address vector toward `remote`, plus a warning to log (FLID 0 across subnets).
pub fn address_vector(
    local: &LocalPort,
    remote: &PortAddr,
    link: Link,
) -> (AddressVector, Option<String>) {
    let mut av = AddressVector {
        is_global: false,
        dlid: 0,
        dgid: [0; 16],
        sgid_index: 0,
        hop_limit: 0,
        traffic_class: 0,
        sl: link.sl,
        path_mtu: local.addr.mtu.min(remote.mtu).max(1),
    };
    let mut warning = None;
    let global = |av: &mut AddressVector| {
        av.is_global = true;
        av.dgid = remote.gid;
        av.sgid_index = local.gid_index;
        av.hop_limit = 255;
    };
    if remote.link_layer == LINK_ETHERNET {
        global(&mut av);
        av.traffic_class = link.traffic_class;
    } else {
        let same_subnet = local_subnet(&local.addr.gid) == local_subnet(&remote.gid);
        av.dlid = remote.lid;
        if !same_subnet || local.grh_required {
            if !same_subnet {
                match flid(&remote.gid) {
                    0 => {
                        warning = Some(format!(
                            "NET/cclkit-ib: remote FLID is 0 although the peer is on another subnet \
                             ({:#06x} vs {:#06x}); using its LID {} (NCCL does the same)",
                            local_subnet(&remote.gid),
                            local_subnet(&local.addr.gid),
                            remote.lid
                        ))
                    }
                    f => av.dlid = f,
                }
            }
            global(&mut av);
        }
    }
    (av, warning)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ib(lid: u16, subnet: u16, flid: u16) -> PortAddr {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[4..6].copy_from_slice(&flid.to_be_bytes());
        gid[6..8].copy_from_slice(&subnet.to_be_bytes());
        gid[8..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, lid as u8]);
        PortAddr {
            lid,
            gid,
            link_layer: LINK_INFINIBAND,
            mtu: 5,
        }
    }

    #[test]
    fn ib_in_one_subnet_is_lid_routed_without_grh() {
        let local = LocalPort {
            addr: ib(1, 7, 0x100),
            gid_index: 1,
            grh_required: false,
        };
        let link = Link {
            traffic_class: 106,
            sl: 3,
        };
        let (av, w) = address_vector(&local, &ib(9, 7, 0x200), link);
        assert!(!av.is_global && w.is_none());
        assert_eq!((av.dlid, av.sl, av.traffic_class), (9, 3, 0));
        let req = LocalPort {
            grh_required: true,
            ..local
        };
        let (av, _) = address_vector(&req, &ib(9, 7, 0x200), link);
        assert!(av.is_global, "GRH_REQUIRED ports always send a GRH");
        assert_eq!((av.dlid, av.sgid_index, av.hop_limit), (9, 1, 255));
    }

    #[test]
    fn ib_across_subnets_uses_the_remote_flid_as_dlid() {
        let local = LocalPort {
            addr: ib(1, 7, 0x100),
            gid_index: 1,
            grh_required: false,
        };
        let remote = ib(9, 8, 0x2345);
        let (av, w) = address_vector(&local, &remote, Link::default());
        assert!(av.is_global && w.is_none());
        assert_eq!(av.dlid, 0x2345);
        assert_eq!(av.dgid, remote.gid);
        let (av, w) = address_vector(&local, &ib(9, 8, 0), Link::default());
        assert!(av.is_global);
        assert_eq!(av.dlid, 9, "FLID 0 → LID, as NCCL");
        assert!(w.unwrap().contains("FLID is 0"));
    }

    #[test]
    fn roce_is_always_global_with_the_traffic_class() {
        let mut a = ib(0, 0, 0);
        a.link_layer = LINK_ETHERNET;
        a.mtu = 3;
        let local = LocalPort {
            addr: a,
            gid_index: 3,
            grh_required: false,
        };
        let mut r = ib(0, 0, 0);
        r.link_layer = LINK_ETHERNET;
        let (av, _) = address_vector(
            &local,
            &r,
            Link {
                traffic_class: 106,
                sl: 5,
            },
        );
        assert!(av.is_global);
        assert_eq!(
            (av.traffic_class, av.sl, av.sgid_index, av.path_mtu),
            (106, 5, 3, 3)
        );
    }
}
