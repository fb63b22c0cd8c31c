//! Writing [`Properties`] in each version's layout: exactly that version's struct,
//! never more bytes (a v12 struct written into a v11 caller would overflow it).

use std::ffi::c_int;

use super::{NetExport, ops};
use crate::error::{Error, Result};
use crate::net::Properties;
use crate::raw::net::v6::ncclNetProperties_v6_t;
use crate::raw::net::v7::ncclNetProperties_v7_t;
use crate::raw::net::v8::ncclNetProperties_v8_t;
use crate::raw::net::v9::ncclNetProperties_v9_t;
use crate::raw::net::v11::ncclNetProperties_v11_t;
use crate::raw::net::v12::ncclNetProperties_v12_t;
use crate::raw::net::{
    NCCL_MAX_NET_SIZE_BYTES, ncclNetVDeviceProps_v9_t, ncclNetVDeviceProps_v12_t,
};

/// Fields common to every version, already converted to C types.
struct Common {
    name: *mut std::ffi::c_char,
    pci_path: *mut std::ffi::c_char,
}

fn common<T: NetExport>(p: &Properties) -> Common {
    let state = T::state();
    Common {
        name: state.intern(&p.name),
        pci_path: p
            .pci_path
            .as_deref()
            .map_or(std::ptr::null_mut(), |s| state.intern(s)),
    }
}

fn checked(p: &Properties) -> Result<()> {
    if p.max_recvs < 1 {
        return Err(Error::internal(format!(
            "device {}: maxRecvs {} must be ≥ 1",
            p.name, p.max_recvs
        )));
    }
    for (what, v) in [
        ("maxP2pBytes", p.max_p2p_bytes),
        ("maxCollBytes", p.max_coll_bytes),
    ] {
        if v == 0 || v > NCCL_MAX_NET_SIZE_BYTES {
            return Err(Error::internal(format!(
                "device {}: {what} {v} outside 1..=1 TiB",
                p.name
            )));
        }
    }
    Ok(())
}

/// The fused-device list, defaulting to `[dev]`, in an `N`-entry array.
fn vdevs<const N: usize>(p: &Properties, dev: c_int) -> Result<(c_int, [c_int; N])> {
    let mut devs = [0; N];
    if p.vdevs.is_empty() {
        devs[0] = dev;
        return Ok((1, devs));
    }
    if p.vdevs.len() > N {
        return Err(Error::internal(format!(
            "device {}: {} fused devices, this ABI holds {N}",
            p.name,
            p.vdevs.len()
        )));
    }
    devs[..p.vdevs.len()].copy_from_slice(&p.vdevs);
    Ok((p.vdevs.len() as c_int, devs))
}

pub(crate) fn v6<T: NetExport>(dev: c_int) -> Result<ncclNetProperties_v6_t> {
    let p = ops::properties::<T>(dev)?;
    checked(&p)?;
    let c = common::<T>(&p);
    Ok(ncclNetProperties_v6_t {
        name: c.name,
        pciPath: c.pci_path,
        guid: p.guid,
        ptrSupport: p.ptr_support,
        speed: p.speed_mbps,
        port: p.port,
        latency: p.latency_us,
        maxComms: p.max_comms,
        maxRecvs: p.max_recvs,
    })
}

pub(crate) fn v7<T: NetExport>(dev: c_int) -> Result<ncclNetProperties_v7_t> {
    let p = ops::properties::<T>(dev)?;
    checked(&p)?;
    let c = common::<T>(&p);
    Ok(ncclNetProperties_v7_t {
        name: c.name,
        pciPath: c.pci_path,
        guid: p.guid,
        ptrSupport: p.ptr_support,
        speed: p.speed_mbps,
        port: p.port,
        latency: p.latency_us,
        maxComms: p.max_comms,
        maxRecvs: p.max_recvs,
        netDeviceType: p.device_type,
        netDeviceVersion: p.device_version,
    })
}

pub(crate) fn v8<T: NetExport>(dev: c_int) -> Result<ncclNetProperties_v8_t> {
    let p = ops::properties::<T>(dev)?;
    checked(&p)?;
    let c = common::<T>(&p);
    Ok(ncclNetProperties_v8_t {
        name: c.name,
        pciPath: c.pci_path,
        guid: p.guid,
        ptrSupport: p.ptr_support,
        regIsGlobal: c_int::from(p.reg_is_global),
        speed: p.speed_mbps,
        port: p.port,
        latency: p.latency_us,
        maxComms: p.max_comms,
        maxRecvs: p.max_recvs,
        netDeviceType: p.device_type,
        netDeviceVersion: p.device_version,
    })
}

/// v9 and v10 share this layout.
pub(crate) fn v9<T: NetExport>(dev: c_int) -> Result<ncclNetProperties_v9_t> {
    let p = ops::properties::<T>(dev)?;
    checked(&p)?;
    let c = common::<T>(&p);
    let (ndevs, devs) = vdevs(&p, dev)?;
    Ok(ncclNetProperties_v9_t {
        name: c.name,
        pciPath: c.pci_path,
        guid: p.guid,
        ptrSupport: p.ptr_support,
        regIsGlobal: c_int::from(p.reg_is_global),
        forceFlush: c_int::from(p.force_flush),
        speed: p.speed_mbps,
        port: p.port,
        latency: p.latency_us,
        maxComms: p.max_comms,
        maxRecvs: p.max_recvs,
        netDeviceType: p.device_type,
        netDeviceVersion: p.device_version,
        vProps: ncclNetVDeviceProps_v9_t { ndevs, devs },
        maxP2pBytes: p.max_p2p_bytes,
        maxCollBytes: p.max_coll_bytes,
    })
}

pub(crate) fn v11<T: NetExport>(dev: c_int) -> Result<ncclNetProperties_v11_t> {
    let p = ops::properties::<T>(dev)?;
    checked(&p)?;
    let c = common::<T>(&p);
    let (ndevs, devs) = vdevs(&p, dev)?;
    Ok(ncclNetProperties_v11_t {
        name: c.name,
        pciPath: c.pci_path,
        guid: p.guid,
        ptrSupport: p.ptr_support,
        regIsGlobal: c_int::from(p.reg_is_global),
        forceFlush: c_int::from(p.force_flush),
        speed: p.speed_mbps,
        port: p.port,
        latency: p.latency_us,
        maxComms: p.max_comms,
        maxRecvs: p.max_recvs,
        netDeviceType: p.device_type,
        netDeviceVersion: p.device_version,
        vProps: ncclNetVDeviceProps_v9_t { ndevs, devs },
        maxP2pBytes: p.max_p2p_bytes,
        maxCollBytes: p.max_coll_bytes,
        maxMultiRequestSize: p.max_multi_request_size,
    })
}

pub(crate) fn v12<T: NetExport>(dev: c_int) -> Result<ncclNetProperties_v12_t> {
    let p = ops::properties::<T>(dev)?;
    checked(&p)?;
    let c = common::<T>(&p);
    let (ndevs, devs) = vdevs(&p, dev)?;
    Ok(ncclNetProperties_v12_t {
        name: c.name,
        pciPath: c.pci_path,
        guid: p.guid,
        ptrSupport: p.ptr_support,
        regIsGlobal: c_int::from(p.reg_is_global),
        forceFlush: c_int::from(p.force_flush),
        speed: p.speed_mbps,
        port: p.port,
        latency: p.latency_us,
        maxComms: p.max_comms,
        maxRecvs: p.max_recvs,
        netDeviceType: p.device_type,
        netDeviceVersion: p.device_version,
        vProps: ncclNetVDeviceProps_v12_t { ndevs, devs },
        maxP2pBytes: p.max_p2p_bytes,
        maxCollBytes: p.max_coll_bytes,
        maxMultiRequestSize: p.max_multi_request_size,
        railId: p.rail_id,
        planeId: p.plane_id,
    })
}
