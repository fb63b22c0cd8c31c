//! `props-written`: every field of the version's ncclNetProperties struct is written.
//!
//! NCCL passes a struct from its stack, uninitialised, and reads every field; a field
//! the plugin forgets holds whatever was there (the adapter's canaries catch writes
//! past the end, not fields left out). Filling the buffer with two different
//! patterns and reading it back finds them: a byte that holds the first pattern after
//! the first call and the second after the second was never written. A written field
//! may differ between the calls (aws-ofi-nccl hands out a fresh copy of the name each
//! time); of `vProps` only `ndevs` and the `devs` it counts are NCCL's to read.

use std::mem::{offset_of, size_of};

use cclkit_abi::raw::net::{v6, v7, v8, v9, v11, v12};

use super::setup::Ready;
use crate::check::child::{Env, step};
use crate::check::{Checked, Stop, fail};
use cclkit_host::logger;
use cclkit_host::net::table::TableRef;

/// The two fill patterns.
const PATTERNS: [u8; 2] = [0x5A, 0xA5];
/// Room for the largest properties struct (v12: 128 bytes).
const ROOM: usize = 256;

/// The size of the field a projection reaches.
fn size_of_field<T, F>(_: impl Fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// `(name, offset, size)` of each listed field of `$t`.
macro_rules! fields {
    ($t:ty; $($f:ident),* $(,)?) => {
        vec![$((
            stringify!($f),
            offset_of!($t, $f),
            size_of_field(|s: &$t| &s.$f),
        )),*]
    };
}

/// The fields of net `version`'s properties struct and the offset of `vProps`, if
/// any ([`unwritten`] reads `vProps` as its `ndevs` and the `devs` that counts).
fn layout(version: u32) -> (Vec<(&'static str, usize, usize)>, Option<usize>) {
    match version {
        6 => (
            fields!(v6::ncclNetProperties_v6_t; name, pciPath, guid, ptrSupport, speed, port,
                latency, maxComms, maxRecvs),
            None,
        ),
        7 => (
            fields!(v7::ncclNetProperties_v7_t; name, pciPath, guid, ptrSupport, speed, port,
                latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion),
            None,
        ),
        8 => (
            fields!(v8::ncclNetProperties_v8_t; name, pciPath, guid, ptrSupport, regIsGlobal,
                speed, port, latency, maxComms, maxRecvs, netDeviceType, netDeviceVersion),
            None,
        ),
        9 | 10 => (
            fields!(v9::ncclNetProperties_v9_t; name, pciPath, guid, ptrSupport, regIsGlobal,
                forceFlush, speed, port, latency, maxComms, maxRecvs, netDeviceType,
                netDeviceVersion, vProps, maxP2pBytes, maxCollBytes),
            Some(offset_of!(v9::ncclNetProperties_v9_t, vProps)),
        ),
        11 => (
            fields!(v11::ncclNetProperties_v11_t; name, pciPath, guid, ptrSupport, regIsGlobal,
                forceFlush, speed, port, latency, maxComms, maxRecvs, netDeviceType,
                netDeviceVersion, vProps, maxP2pBytes, maxCollBytes, maxMultiRequestSize),
            Some(offset_of!(v11::ncclNetProperties_v11_t, vProps)),
        ),
        _ => (
            fields!(v12::ncclNetProperties_v12_t; name, pciPath, guid, ptrSupport, regIsGlobal,
                forceFlush, speed, port, latency, maxComms, maxRecvs, netDeviceType,
                netDeviceVersion, vProps, maxP2pBytes, maxCollBytes, maxMultiRequestSize,
                railId, planeId),
            Some(offset_of!(v12::ncclNetProperties_v12_t, vProps)),
        ),
    }
}

/// `getProperties(dev)` into a buffer filled with `fill`; the raw bytes.
fn raw_props(r: &Ready, dev: i32, fill: u8) -> Result<[u8; ROOM], Stop> {
    // u64 words keep the buffer aligned for every version's struct.
    let mut buf = [u64::from_ne_bytes([fill; 8]); ROOM / 8];
    let p = buf.as_mut_ptr().cast::<std::ffi::c_void>();
    let s = &r.plugin.shared;
    let mark = logger::warn_mark();
    // SAFETY: the version's getProperties with a buffer larger than its struct.
    let rc = unsafe {
        match s.raw.get() {
            TableRef::V6(t) => t.getProperties.map(|f| f(dev, p.cast())),
            TableRef::V7(t) => t.getProperties.map(|f| f(dev, p.cast())),
            TableRef::V8(t) => t.getProperties.map(|f| f(dev, p.cast())),
            TableRef::V9(t) => t.getProperties.map(|f| f(dev, p.cast())),
            TableRef::V10(t) => t.getProperties.map(|f| f(dev, p.cast())),
            TableRef::V11(t) => t.getProperties.map(|f| f(dev, p.cast())),
            TableRef::V12(t) => t.getProperties.map(|f| f(dev, p.cast())),
        }
    }
    .ok_or_else(|| Stop::Fail("getProperties is NULL".into()))?;
    s.check("getProperties", mark, rc)?;
    let mut out = [0u8; ROOM];
    for (chunk, w) in out.chunks_exact_mut(8).zip(buf) {
        chunk.copy_from_slice(&w.to_ne_bytes());
    }
    Ok(out)
}

/// How many bytes of `[off, off + len)` the plugin left alone: each still holds the
/// fill pattern of its call in both answers.
fn untouched(a: &[u8; ROOM], b: &[u8; ROOM], off: usize, len: usize) -> usize {
    (off..off + len)
        .filter(|&i| a[i] == PATTERNS[0] && b[i] == PATTERNS[1])
        .count()
}

/// The fields of `layout` with bytes the plugin left alone ("partly" when it wrote
/// some of them); `vProps` counts as its `ndevs` and the `devs` that names.
fn unwritten(
    a: &[u8; ROOM],
    b: &[u8; ROOM],
    fields: &[(&'static str, usize, usize)],
    vprops: Option<usize>,
) -> Vec<String> {
    let mut spans: Vec<(String, usize, usize)> = fields
        .iter()
        .map(|&(n, off, len)| {
            if Some(off) == vprops {
                ("vProps.ndevs".to_owned(), off, 4)
            } else {
                (n.to_owned(), off, len)
            }
        })
        .collect();
    if let Some(v) = vprops {
        let mut nd = [0u8; 4];
        nd.copy_from_slice(&a[v..v + 4]);
        let ndevs = usize::try_from(i32::from_ne_bytes(nd)).unwrap_or(0).min(8);
        spans.extend((0..ndevs).map(|i| (format!("vProps.devs[{i}]"), v + 4 + 4 * i, 4)));
    }
    spans
        .into_iter()
        .filter_map(|(name, off, len)| match untouched(a, b, off, len) {
            0 => None,
            n if n == len => Some(name),
            _ => Some(format!("{name} (partly)")),
        })
        .collect()
}

/// Every device's properties, read twice into buffers filled with different
/// patterns: each field the version defines must read the same both times.
pub(crate) fn written(env: &Env) -> Checked {
    let r = Ready::new(env)?;
    let (fields, vprops) = layout(env.version);
    for dev in 0..r.ndev.min(64) {
        let d = i32::try_from(dev).unwrap_or(i32::MAX);
        step(format!(
            "getProperties({dev}) into buffers filled with {:#04x} and {:#04x}",
            PATTERNS[0], PATTERNS[1]
        ));
        let a = raw_props(&r, d, PATTERNS[0])?;
        let b = raw_props(&r, d, PATTERNS[1])?;
        let missing = unwritten(&a, &b, &fields, vprops);
        if !missing.is_empty() {
            return fail!(
                "device {dev}: getProperties left {} unwritten (the field read back as the \
                 fill pattern, {:#04x} then {:#04x}): NCCL passes an uninitialised \
                 ncclNetProperties_v{}_t and uses every field",
                missing.join(", "),
                PATTERNS[0],
                PATTERNS[1],
                env.version
            );
        }
    }
    Ok(format!(
        "all {} fields of ncclNetProperties_v{}_t written on {} device{}",
        fields.len(),
        env.version,
        r.ndev.min(64),
        if r.ndev == 1 { "" } else { "s" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_struct_sizes_and_a_missed_field_is_named() {
        for v in 6..=12 {
            let (fields, vprops) = layout(v);
            let end = fields.iter().map(|(_, o, l)| o + l).max().unwrap_or(0);
            let size = cclkit_abi::raw::net::properties_size(v).unwrap_or(0);
            assert!(
                end <= size && size - end < 8,
                "v{v}: fields end at {end} of {size}"
            );
            assert_eq!(vprops.is_some(), v >= 9);
        }
        let (fields, vprops) = layout(11);
        let mut a = [0u8; ROOM];
        let mut b = [0u8; ROOM];
        let (_, off, len) = fields
            .iter()
            .find(|f| f.0 == "forceFlush")
            .copied()
            .unwrap_or_default();
        a[off..off + len].fill(0x5A);
        b[off..off + len].fill(0xA5);
        assert_eq!(unwritten(&a, &b, &fields, vprops), ["forceFlush"]);
        assert!(unwritten(&a, &a, &fields, vprops).is_empty());
    }

    #[test]
    fn fresh_values_and_uncounted_devs_are_written_and_half_writes_are_not() {
        let (fields, vprops) = layout(9);
        let field = |name: &str| {
            let (_, off, len) = fields
                .iter()
                .find(|f| f.0 == name)
                .copied()
                .unwrap_or_default();
            (off, len)
        };
        let (mut a, mut b) = ([0u8; ROOM], [0u8; ROOM]);
        // A name pointer that differs between the calls (a fresh strdup): written.
        let (n, nl) = field("name");
        a[n..n + nl].copy_from_slice(&0x1000_u64.to_ne_bytes());
        b[n..n + nl].copy_from_slice(&0x2000_u64.to_ne_bytes());
        // ndevs 1, devs[0] written, the rest of devs left alone: nothing NCCL reads.
        let (v, vl) = field("vProps");
        a[v..v + vl].fill(PATTERNS[0]);
        b[v..v + vl].fill(PATTERNS[1]);
        for buf in [&mut a, &mut b] {
            buf[v..v + 4].copy_from_slice(&1i32.to_ne_bytes());
            buf[v + 4..v + 8].copy_from_slice(&0i32.to_ne_bytes());
        }
        assert!(unwritten(&a, &b, &fields, vprops).is_empty());
        // An int of which one byte was written.
        let (s, _) = field("speed");
        a[s + 1..s + 4].fill(PATTERNS[0]);
        b[s + 1..s + 4].fill(PATTERNS[1]);
        assert_eq!(unwritten(&a, &b, &fields, vprops), ["speed (partly)"]);
    }
}
