//! Virtual devices: NCCL's merged IB devices (`ncclIbMakeVDeviceInternal`,
//! `NCCL_IB_MERGE_NICS`).
//!
//! Every physical port starts as a virtual device of itself (NCCL's init makes one
//! per port). `makeVDevice` appends a new virtual device fusing up to
//! [`MAX_DEVS`] ports, normally the ports of NICs behind one PCI switch that NCCL's
//! topology chose to merge (`NCCL_NET_MERGE_LEVEL`). A connection on a fused device
//! opens `NCCL_IB_QPS_PER_CONNECTION` QPs on **each** port (QP `i` on port
//! `i mod n`, with that port's CQ and registrations), and a message goes out on the
//! QPs round-robin (or split over all), so traffic spreads over the physical NICs
//! ([`crate::proto::endpoint`], [`crate::proto::plan`]).

use cclkit_abi::net::Properties;
use cclkit_abi::raw::common::subsys;
use cclkit_abi::{Error, Result, nccl_info, nccl_warn};

use crate::proto::MAX_DEVS;

/// Most virtual devices (NCCL's `MAX_IB_VDEVS` = `MAX_IB_DEVS` × 8).
pub const MAX_VDEVS: usize = 32 * 8;

/// A virtual device: the physical ports it uses and what NCCL is told about it.
#[derive(Debug, Clone)]
pub struct VDev {
    /// Indices of the physical ports, in order (QP `i` uses `devs[i mod n]`).
    pub devs: Vec<usize>,
    /// Its properties.
    pub props: Properties,
}

impl VDev {
    /// The virtual device of one physical port (as NCCL's init makes them).
    pub fn physical(dev: usize, props: Properties) -> Self {
        Self {
            devs: vec![dev],
            props,
        }
    }
}

/// What fusing needs to know of a physical port.
#[derive(Debug, Clone, Copy)]
pub struct PhysInfo<'a> {
    /// Its properties.
    pub props: &'a Properties,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
}

/// NCCL's `ncclIbMakeVDeviceInternal`: the virtual device fusing `devs` (indices
/// into `phys`), with NCCL's checks and messages. Properties: those of the first
/// port, with the names joined by `+`, the speeds summed, `vdevs` listing the ports
/// (for more than one) and the rail undefined when the ports' rails differ.
/// `ptrSupport` is what every port supports (NCCL takes the first port's; the ports
/// of one PCI switch normally agree, and a registration must succeed on all).
pub fn fuse(merge_nics: bool, devs: &[usize], phys: &[PhysInfo<'_>]) -> Result<VDev> {
    if !merge_nics && devs.len() > 1 {
        nccl_info!(
            subsys::NET,
            "NET/cclkit-ib: skipping makeVDevice, NCCL_IB_MERGE_NICS=0"
        );
        return Err(Error::invalid_usage(
            "NET/cclkit-ib: skipping makeVDevice, NCCL_IB_MERGE_NICS=0",
        ));
    }
    let Some(&first) = devs.first() else {
        nccl_warn!("NET/cclkit-ib: can't make virtual NIC with 0 devices");
        return Err(Error::invalid_usage(
            "NET/cclkit-ib: can't make virtual NIC with 0 devices",
        ));
    };
    if devs.len() > MAX_DEVS {
        return Err(Error::invalid_usage(format!(
            "NET/cclkit-ib: cannot fuse {} devices into one virtual NIC (at most {MAX_DEVS})",
            devs.len()
        )));
    }
    if let Some(&bad) = devs.iter().find(|&&d| d >= phys.len()) {
        nccl_warn!(
            "NET/cclkit-ib: cannot use physical device {bad}, max {}",
            phys.len()
        );
        return Err(Error::invalid_argument(format!(
            "NET/cclkit-ib: cannot use physical device {bad}, max {}",
            phys.len()
        )));
    }
    let p0 = phys[first];
    if let Some(&other) = devs.iter().find(|&&d| phys[d].link_layer != p0.link_layer) {
        let msg = format!(
            "NET/cclkit-ib: attempted to merge incompatible devices [{first}]{}:{} and \
             [{other}]{}:{} (link layers {} and {}); select NICs of one link type with \
             NCCL_IB_HCA",
            p0.props.name,
            p0.props.port,
            phys[other].props.name,
            phys[other].props.port,
            p0.link_layer,
            phys[other].link_layer
        );
        nccl_warn!("{msg}");
        return Err(Error::invalid_usage(msg));
    }
    let mut props = p0.props.clone();
    if devs.len() > 1 {
        props.name = devs
            .iter()
            .map(|&d| phys[d].props.name.as_str())
            .collect::<Vec<_>>()
            .join("+");
        props.speed_mbps = devs
            .iter()
            .fold(0i32, |s, &d| s.saturating_add(phys[d].props.speed_mbps));
        props.vdevs = devs.iter().map(|&d| d as i32).collect();
        props.ptr_support = devs
            .iter()
            .fold(p0.props.ptr_support, |p, &d| p & phys[d].props.ptr_support);
        if devs.iter().any(|&d| {
            let r = phys[d].props.rail_id;
            r < 0 || r != p0.props.rail_id
        }) {
            props.rail_id = -1;
        }
    }
    Ok(VDev {
        devs: devs.to_vec(),
        props,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cclkit_abi::raw::common::ptr;

    fn props(name: &str, speed: i32, ptr_support: i32, rail: i16) -> Properties {
        Properties {
            speed_mbps: speed,
            ptr_support,
            rail_id: rail,
            port: 1,
            ..Properties::host(name)
        }
    }

    #[test]
    fn a_fused_device_joins_names_sums_speeds_and_lists_its_ports() {
        let p = [
            props("mlx5_0", 200_000, ptr::HOST | ptr::CUDA | ptr::DMABUF, 3),
            props("mlx5_1", 400_000, ptr::HOST | ptr::DMABUF, 3),
            props("mlx5_2", 100_000, ptr::HOST, 4),
        ];
        let phys: Vec<PhysInfo<'_>> = p
            .iter()
            .map(|props| PhysInfo {
                props,
                link_layer: 1,
            })
            .collect();
        let v = fuse(true, &[1, 0], &phys).unwrap();
        assert_eq!(v.devs, vec![1, 0]);
        assert_eq!(v.props.name, "mlx5_1+mlx5_0");
        assert_eq!(v.props.speed_mbps, 600_000);
        assert_eq!(v.props.vdevs, vec![1, 0]);
        assert_eq!(
            v.props.ptr_support,
            ptr::HOST | ptr::DMABUF,
            "what both support"
        );
        assert_eq!(v.props.rail_id, 3, "same rail kept");
        let v = fuse(true, &[0, 1, 2], &phys).unwrap();
        assert_eq!(v.props.speed_mbps, 700_000);
        assert_eq!(v.props.rail_id, -1, "rails differ");
        let one = fuse(true, &[2], &phys).unwrap();
        assert_eq!(one.props.name, "mlx5_2");
        assert!(one.props.vdevs.is_empty(), "one port is just that port");
        let e = fuse(false, &[0, 1], &phys).unwrap_err();
        assert!(
            e.message().contains("NCCL_IB_MERGE_NICS=0"),
            "{}",
            e.message()
        );
        assert!(
            fuse(false, &[1], &phys).is_ok(),
            "one device needs no merging"
        );
        assert!(fuse(true, &[], &phys).is_err());
        assert!(fuse(true, &[0, 3], &phys).is_err());
        let nine = [0usize; 9];
        assert!(
            fuse(true, &nine, &phys).is_err(),
            "more than NCCL_IB_MAX_DEVS_PER_NIC"
        );
    }
}
