//! The packaged net template through every exported table version, as NCCL calls them:
//! properties written within each version's struct size (canaries), and real two-process
//! transfers of random data through the v8 and v12 tables.

// Every unsafe call below is an NCCL-convention call into the plugin under test.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::{CStr, c_int, c_void};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use cclkit_abi::raw::common::{NcclResult, ptr};
use cclkit_abi::raw::net::{self, NetDeviceType, ncclNetCommConfig_v10_t};
use cclkit_tests::{Guarded, plugin, run_with_timeout};

/// Opens the library and returns the address of `ncclNetPlugin_v{v}`.
fn table(lib: &libloading::Library, v: u32) -> *const c_void {
    let sym = net::symbol(v).unwrap();
    // SAFETY: the symbol is a data object; we only take its address.
    *unsafe { lib.get::<*const c_void>(sym.as_bytes()) }.unwrap_or_else(|e| panic!("{sym}: {e}"))
}

/// Calls init/devices/getProperties through table version `$v` of type `$t`.
macro_rules! probe {
    ($lib:expr, $v:literal, $t:ty, $props:ty, init = |$tbl:ident, $ctx:ident| $init:expr) => {{
        // SAFETY: the library stays loaded for the block.
        let $tbl: &$t = unsafe { &*table($lib, $v).cast::<$t>() };
        #[allow(unused_mut)]
        let mut $ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: NCCL's init signature for this version.
        assert_eq!(unsafe { $init }, NcclResult::SUCCESS, "v{} init", $v);
        let mut n: c_int = 0;
        // SAFETY: devices(int*).
        assert_eq!(
            unsafe { ($tbl.devices.unwrap())(&mut n) },
            NcclResult::SUCCESS
        );
        assert_eq!(n, 1, "template has one device");
        let size = net::properties_size($v).unwrap();
        assert_eq!(size, std::mem::size_of::<$props>());
        let mut g = Guarded::new(size);
        // SAFETY: a buffer of exactly the version's properties size between canaries.
        assert_eq!(
            unsafe { ($tbl.getProperties.unwrap())(0, g.ptr()) },
            NcclResult::SUCCESS
        );
        assert!(
            g.damaged().is_empty(),
            "v{} getProperties wrote outside its {size} bytes: {:?}",
            $v,
            g.damaged()
        );
        let p: $props = g.read();
        // SAFETY: name points to a static C string.
        let name = unsafe { CStr::from_ptr(p.name) }
            .to_str()
            .unwrap()
            .to_owned();
        assert!(name.starts_with("template-"), "v{} name {name}", $v);
        assert!(p.pciPath.is_null());
        assert_eq!(p.ptrSupport, ptr::HOST);
        assert_eq!(p.maxRecvs, 1);
        // Out-of-range device: an error code, canaries still intact.
        // SAFETY: as above.
        assert_eq!(
            unsafe { ($tbl.getProperties.unwrap())(1, g.ptr()) },
            NcclResult::INVALID_ARGUMENT
        );
        assert!(g.damaged().is_empty());
        // SAFETY: the table's name is a static C string.
        assert_eq!(unsafe { CStr::from_ptr($tbl.name) }, c"Template");
        ($ctx, p)
    }};
}

#[test]
fn properties_through_every_version_stay_within_size() {
    let path = plugin("libnccl-net-template.so");
    // SAFETY: loading the plugin under test.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    let mut cfg = ncclNetCommConfig_v10_t { trafficClass: -1 };

    let (_, p) = probe!(
        &lib,
        6,
        net::v6::ncclNet_v6_t,
        net::v6::ncclNetProperties_v6_t,
        init = |t, c| (t.init.unwrap())(None)
    );
    assert_eq!(p.speed, 10_000);
    let (_, p) = probe!(
        &lib,
        7,
        net::v7::ncclNet_v7_t,
        net::v7::ncclNetProperties_v7_t,
        init = |t, c| (t.init.unwrap())(None)
    );
    assert_eq!(p.netDeviceType, NetDeviceType::HOST);
    let (_, p) = probe!(
        &lib,
        8,
        net::v8::ncclNet_v8_t,
        net::v8::ncclNetProperties_v8_t,
        init = |t, c| (t.init.unwrap())(None)
    );
    assert_eq!(p.regIsGlobal, 0);
    let (_, p) = probe!(
        &lib,
        9,
        net::v9::ncclNet_v9_t,
        net::v9::ncclNetProperties_v9_t,
        init = |t, c| (t.init.unwrap())(None)
    );
    assert_eq!((p.vProps.ndevs, p.vProps.devs[0]), (1, 0));
    assert_eq!(p.maxP2pBytes, net::NCCL_MAX_NET_SIZE_BYTES);
    let (_, p) = probe!(
        &lib,
        10,
        net::v10::ncclNet_v10_t,
        net::v9::ncclNetProperties_v9_t,
        init = |t, c| (t.init.unwrap())(None, None)
    );
    assert_eq!(p.maxCollBytes, net::MAX_COLLNET_SIZE);
    let (ctx, p) = probe!(
        &lib,
        11,
        net::v11::ncclNet_v11_t,
        net::v11::ncclNetProperties_v11_t,
        init = |t, c| (t.init.unwrap())(&mut c, 11, &mut cfg, None, None)
    );
    assert_eq!(p.maxMultiRequestSize, 1);
    let t11: &net::v11::ncclNet_v11_t = unsafe { &*table(&lib, 11).cast() };
    // SAFETY: ctx from this table's init.
    assert_eq!(unsafe { (t11.finalize.unwrap())(ctx) }, NcclResult::SUCCESS);
    let (ctx, p) = probe!(
        &lib,
        12,
        net::v12::ncclNet_v12_t,
        net::v12::ncclNetProperties_v12_t,
        init = |t, c| (t.init.unwrap())(&mut c, 12, &mut cfg, None, None)
    );
    assert_eq!((p.railId, p.planeId), (-1, -1));
    let t12: &net::v12::ncclNet_v12_t = unsafe { &*table(&lib, 12).cast() };
    // SAFETY: ctx from this table's init; a second finalize of it must be rejected.
    unsafe {
        assert_eq!((t12.finalize.unwrap())(ctx), NcclResult::SUCCESS);
        assert!(t12.setNetAttr.is_none() && t12.makeVDevice.is_none() && t12.regMrDmaBuf.is_none());
        assert!(t12.getDeviceMr.is_none() && t12.irecvConsumed.is_none());
    }
}

/// Runs a receiver and a sender process through table `version`.
fn transfer(version: u32, sizes: &[usize]) {
    let lib = plugin("libnccl-net-template.so");
    let peer = cclkit_tests::example("net_peer");
    let seed: u64 = rand::random();
    let list = sizes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut recv = Command::new(&peer)
        .args([
            "listen",
            lib.to_str().unwrap(),
            &version.to_string(),
            &seed.to_string(),
            &list,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(recv.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let handle = line
        .strip_prefix("HANDLE ")
        .unwrap_or_else(|| panic!("receiver said {line:?}"))
        .trim()
        .to_owned();
    let send = run_with_timeout(
        Command::new(&peer).args([
            "connect",
            lib.to_str().unwrap(),
            &version.to_string(),
            &seed.to_string(),
            &list,
            &handle,
        ]),
        Duration::from_secs(90),
    );
    let send_out = String::from_utf8_lossy(&send.stdout);
    assert!(
        send.status.success(),
        "sender failed: {send_out} {}",
        String::from_utf8_lossy(&send.stderr)
    );
    let status =
        cclkit_tests::wait_timeout(&mut recv, Duration::from_secs(60)).expect("receiver timed out");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(status.success(), "receiver failed: {rest}");
    assert_eq!(rest.trim(), format!("OK {}", sizes.len()));
}

fn sizes() -> Vec<usize> {
    let mut v = vec![0, 1, 7, 4095, 65536 + 3, (1 << 20) + 5];
    // More messages than the 32 requests NCCL keeps in flight, with random odd sizes.
    v.extend((0..40).map(|_| rand::random::<u32>() as usize % 300_000));
    v
}

#[test]
fn two_process_transfer_v8() {
    transfer(8, &sizes());
}

#[test]
fn two_process_transfer_v12() {
    transfer(12, &sizes());
}
