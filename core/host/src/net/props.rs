//! `getProperties` for every version, converted to the current shape with the defaults
//! NCCL's shims fill in for older plugins (NCCL_ABI.md §2.7, last paragraph).

use std::ffi::{CStr, c_char, c_int};

use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::net::{
    MAX_COLLNET_SIZE, MAX_NET_SIZE, NCCL_NET_DEVICE_INVALID_VERSION, NCCL_NET_ID_UNDEF,
    NetDeviceType, v6, v7, v8, v9, v11, v12,
};

use super::context::dev_int;
use super::table::TableRef;
use super::{NetError, NetShared, Properties};
use crate::guard::{Overrun, guarded};
use crate::logger;

/// Reads device `dev`'s properties through the plugin's own layout.
pub(crate) fn get(s: &NetShared, dev: usize) -> Result<Properties, NetError> {
    let d = dev_int(s, "getProperties", dev)?;
    match s.raw.get() {
        TableRef::V6(t) => {
            let f = t.getProperties.ok_or_else(|| s.missing("getProperties"))?;
            // SAFETY: `out` points to a guarded, zeroed v6 properties struct.
            let raw: v6::ncclNetProperties_v6_t = call(s, |out| unsafe { f(d, out) })?;
            Ok(from_v6(dev, &raw))
        }
        TableRef::V7(t) => {
            let f = t.getProperties.ok_or_else(|| s.missing("getProperties"))?;
            // SAFETY: `out` points to a guarded, zeroed v7 properties struct.
            let raw: v7::ncclNetProperties_v7_t = call(s, |out| unsafe { f(d, out) })?;
            Ok(from_v7(dev, &raw))
        }
        TableRef::V8(t) => {
            let f = t.getProperties.ok_or_else(|| s.missing("getProperties"))?;
            // SAFETY: `out` points to a guarded, zeroed v8 properties struct.
            let raw: v8::ncclNetProperties_v8_t = call(s, |out| unsafe { f(d, out) })?;
            Ok(from_v8(dev, &raw))
        }
        TableRef::V9(t) => {
            let f = t.getProperties.ok_or_else(|| s.missing("getProperties"))?;
            // SAFETY: `out` points to a guarded, zeroed v9 properties struct.
            let raw: v9::ncclNetProperties_v9_t = call(s, |out| unsafe { f(d, out) })?;
            from_v9(s, &raw)
        }
        TableRef::V10(t) => {
            let f = t.getProperties.ok_or_else(|| s.missing("getProperties"))?;
            // SAFETY: `out` points to a guarded, zeroed v10 (= v9) properties struct.
            let raw: v9::ncclNetProperties_v9_t = call(s, |out| unsafe { f(d, out) })?;
            from_v9(s, &raw)
        }
        TableRef::V11(t) => {
            let f = t.getProperties.ok_or_else(|| s.missing("getProperties"))?;
            // SAFETY: `out` points to a guarded, zeroed v11 properties struct.
            let raw: v11::ncclNetProperties_v11_t = call(s, |out| unsafe { f(d, out) })?;
            from_v11(s, &raw)
        }
        TableRef::V12(t) => {
            let f = t.getProperties.ok_or_else(|| s.missing("getProperties"))?;
            // SAFETY: `out` points to a guarded, zeroed v12 properties struct.
            let raw: v12::ncclNetProperties_v12_t = call(s, |out| unsafe { f(d, out) })?;
            from_v12(s, &raw)
        }
    }
}

/// Runs `f` on a zeroed, canary-guarded `T` and checks the result code and canaries.
fn call<T: Copy>(s: &NetShared, f: impl FnOnce(*mut T) -> NcclResult) -> Result<T, NetError> {
    // SAFETY: every `ncclNetProperties_vN_t` is plain data (pointers, integers, floats,
    // i32 newtypes), so all-zero and any bytes a plugin writes are valid values.
    let zero: T = unsafe { std::mem::zeroed() };
    let mark = logger::warn_mark();
    // SAFETY: as above, `T` accepts every bit pattern.
    let (value, rc, overrun) = unsafe { guarded(&zero, f) };
    if let Some(o) = overrun {
        return Err(overrun_error(s, o));
    }
    s.check("getProperties", mark, rc)?;
    Ok(value)
}

fn overrun_error(s: &NetShared, o: Overrun) -> NetError {
    s.refuse(
        "getProperties",
        format!(
            "the plugin {o} (ncclNetProperties_v{}_t): it was built against a different \
             net ABI version than the symbol it exports",
            s.raw.version()
        ),
    )
}

/// A plugin-owned C string, `None` when NULL.
fn string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL property strings are NUL-terminated and owned by the plugin,
    // valid while it is loaded (ABI contract, NCCL_ABI.md §2.7).
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The defaults every shim applies before copying the fields a version has.
fn base(dev: usize, name: *const c_char, pci: *const c_char, guid: u64) -> Properties {
    Properties {
        name: string(name).unwrap_or_default(),
        pci_path: string(pci),
        guid,
        ptr_support: 0,
        reg_is_global: false,
        force_flush: false,
        speed_mbps: 0,
        port: 0,
        latency_us: 0.0,
        max_comms: 0,
        max_recvs: 0,
        // pre-v7: HOST, NCCL_NET_DEVICE_INVALID_VERSION.
        device_type: NetDeviceType::HOST,
        device_version: NCCL_NET_DEVICE_INVALID_VERSION,
        // pre-v9: vProps = {1, [dev]}, 1 GiB p2p, 512 MiB collectives.
        vdevs: vec![i32::try_from(dev).unwrap_or(i32::MAX)],
        max_p2p_bytes: MAX_NET_SIZE,
        max_coll_bytes: MAX_COLLNET_SIZE,
        // pre-v11: no multi-request; pre-v12: no rail/plane.
        max_multi_request_size: 1,
        rail_id: NCCL_NET_ID_UNDEF,
        plane_id: NCCL_NET_ID_UNDEF,
    }
}

fn from_v6(dev: usize, r: &v6::ncclNetProperties_v6_t) -> Properties {
    Properties {
        ptr_support: r.ptrSupport,
        speed_mbps: r.speed,
        port: r.port,
        latency_us: r.latency,
        max_comms: r.maxComms,
        max_recvs: r.maxRecvs,
        ..base(dev, r.name, r.pciPath, r.guid)
    }
}

fn from_v7(dev: usize, r: &v7::ncclNetProperties_v7_t) -> Properties {
    Properties {
        ptr_support: r.ptrSupport,
        speed_mbps: r.speed,
        port: r.port,
        latency_us: r.latency,
        max_comms: r.maxComms,
        max_recvs: r.maxRecvs,
        device_type: r.netDeviceType,
        device_version: r.netDeviceVersion,
        ..base(dev, r.name, r.pciPath, r.guid)
    }
}

fn from_v8(dev: usize, r: &v8::ncclNetProperties_v8_t) -> Properties {
    Properties {
        ptr_support: r.ptrSupport,
        reg_is_global: r.regIsGlobal != 0,
        speed_mbps: r.speed,
        port: r.port,
        latency_us: r.latency,
        max_comms: r.maxComms,
        max_recvs: r.maxRecvs,
        device_type: r.netDeviceType,
        device_version: r.netDeviceVersion,
        ..base(dev, r.name, r.pciPath, r.guid)
    }
}

/// `vProps.devs[..ndevs]`, refusing an `ndevs` outside the array.
fn vdevs(s: &NetShared, ndevs: c_int, devs: &[c_int]) -> Result<Vec<i32>, NetError> {
    match usize::try_from(ndevs) {
        Ok(n) if n <= devs.len() => Ok(devs[..n].to_vec()),
        _ => Err(s.refuse(
            "getProperties",
            format!(
                "vProps.ndevs = {ndevs}, but net v{} holds at most {}",
                s.raw.version(),
                devs.len()
            ),
        )),
    }
}

/// Sizes NCCL accepts for maxP2pBytes/maxCollBytes (1 B … 1 TiB); others fail
/// connection setup in NCCL, so they are reported here.
fn max_bytes(s: &NetShared, field: &str, v: usize) -> Result<usize, NetError> {
    if v == 0 || v > cclkit_abi::raw::net::NCCL_MAX_NET_SIZE_BYTES {
        return Err(s.refuse(
            "getProperties",
            format!("{field} = {v}; NCCL accepts 1 byte to 1 TiB"),
        ));
    }
    Ok(v)
}

fn from_v9(s: &NetShared, r: &v9::ncclNetProperties_v9_t) -> Result<Properties, NetError> {
    Ok(Properties {
        ptr_support: r.ptrSupport,
        reg_is_global: r.regIsGlobal != 0,
        force_flush: r.forceFlush != 0,
        speed_mbps: r.speed,
        port: r.port,
        latency_us: r.latency,
        max_comms: r.maxComms,
        max_recvs: r.maxRecvs,
        device_type: r.netDeviceType,
        device_version: r.netDeviceVersion,
        vdevs: vdevs(s, r.vProps.ndevs, &r.vProps.devs)?,
        max_p2p_bytes: max_bytes(s, "maxP2pBytes", r.maxP2pBytes)?,
        max_coll_bytes: max_bytes(s, "maxCollBytes", r.maxCollBytes)?,
        ..base(0, r.name, r.pciPath, r.guid)
    })
}

fn from_v11(s: &NetShared, r: &v11::ncclNetProperties_v11_t) -> Result<Properties, NetError> {
    Ok(Properties {
        ptr_support: r.ptrSupport,
        reg_is_global: r.regIsGlobal != 0,
        force_flush: r.forceFlush != 0,
        speed_mbps: r.speed,
        port: r.port,
        latency_us: r.latency,
        max_comms: r.maxComms,
        max_recvs: r.maxRecvs,
        device_type: r.netDeviceType,
        device_version: r.netDeviceVersion,
        vdevs: vdevs(s, r.vProps.ndevs, &r.vProps.devs)?,
        max_p2p_bytes: max_bytes(s, "maxP2pBytes", r.maxP2pBytes)?,
        max_coll_bytes: max_bytes(s, "maxCollBytes", r.maxCollBytes)?,
        max_multi_request_size: r.maxMultiRequestSize,
        ..base(0, r.name, r.pciPath, r.guid)
    })
}

fn from_v12(s: &NetShared, r: &v12::ncclNetProperties_v12_t) -> Result<Properties, NetError> {
    Ok(Properties {
        ptr_support: r.ptrSupport,
        reg_is_global: r.regIsGlobal != 0,
        force_flush: r.forceFlush != 0,
        speed_mbps: r.speed,
        port: r.port,
        latency_us: r.latency,
        max_comms: r.maxComms,
        max_recvs: r.maxRecvs,
        device_type: r.netDeviceType,
        device_version: r.netDeviceVersion,
        vdevs: vdevs(s, r.vProps.ndevs, &r.vProps.devs)?,
        max_p2p_bytes: max_bytes(s, "maxP2pBytes", r.maxP2pBytes)?,
        max_coll_bytes: max_bytes(s, "maxCollBytes", r.maxCollBytes)?,
        max_multi_request_size: r.maxMultiRequestSize,
        rail_id: r.railId,
        plane_id: r.planeId,
        ..base(0, r.name, r.pciPath, r.guid)
    })
}
