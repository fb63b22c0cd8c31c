//! Issue 22, item 0: tables completed by `init`. NCCL needs only `name` and `init`
//! before it calls `init`; a plugin may fill in every other slot there (the IB/UCX
//! plugin does). The fixture `nccl22/net_wrap.c` exports such a table for one version
//! and borrows its data path from cclkit's packaged socket transport, so data really
//! moves. Also item 1 at the adapter level: the sizes `test()` reports are passed
//! through as the plugin wrote them (the runtime decides what they mean).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::ptr;
use cclkit_host::Library;
use cclkit_host::error::Cause;
use cclkit_host::net::{CommConfig, NetContext, NetPlugin, RecvBuffer, RecvComm, SendComm};
use cclkit_host::select::{NetRegistry, Outcome};
use common::{Plugins, config, rust_plugin, s};
use rand::{Rng, RngCore};

/// `net_wrap.c` for `version` over the packaged socket transport, with `-D` defines.
fn wrap(p: &Plugins, name: &str, version: u32, defines: &[&str]) -> PathBuf {
    let inner = rust_plugin("libnccl-net-cclkit-socket.so");
    let mut d = vec![
        format!("NET_VERSION={version}"),
        format!("INNER_LIB=\"{}\"", inner.display()),
    ];
    d.extend(defines.iter().map(|x| (*x).to_owned()));
    let refs: Vec<&str> = d.iter().map(String::as_str).collect();
    let mut args = vec!["-ldl".to_owned(), "-lpthread".to_owned()];
    args.extend(refs.iter().map(|x| format!("-D{x}")));
    p.cc(name, &[common::fixture("nccl22/net_wrap.c")], &args)
}

fn load(path: &Path) -> Result<NetPlugin, Cause> {
    NetPlugin::load(Library::open(Some(&s(path))).expect("dlopen")).map_err(|(c, _)| c)
}

fn connect(ctx: &NetContext) -> (SendComm, RecvComm) {
    let (handle, mut listen) = ctx.listen(0).expect("listen");
    let mut connecting = ctx.connect(0, &handle);
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "connection setup timed out");
        if send.is_none() {
            send = connecting.poll().expect("connect");
        }
        if recv.is_none() {
            recv = listen.accept().expect("accept");
        }
    }
    (send.expect("send"), recv.expect("recv"))
}

/// Sends `len` random bytes into a buffer `extra` bytes larger; returns the size the
/// receive's `test()` reported, after checking every byte arrived.
fn transfer(send: &mut SendComm, recv: &mut RecvComm, len: usize, extra: usize) -> usize {
    let mut data = vec![0u8; len];
    rand::rng().fill_bytes(&mut data);
    let mut out = vec![0u8; len + extra];
    // SAFETY: both buffers outlive the requests, which complete before they drop.
    let got = unsafe {
        let smr = send
            .reg_mr(data.as_mut_ptr(), len, ptr::HOST)
            .expect("regMr");
        let rmr = recv
            .reg_mr(out.as_mut_ptr(), out.len(), ptr::HOST)
            .expect("regMr");
        let mut rreq = loop {
            let b = [RecvBuffer {
                data: out.as_mut_ptr(),
                size: out.len(),
                tag: 3,
                mr: Some(&rmr),
            }];
            if let Some(r) = recv.irecv(&b, false).expect("irecv") {
                break r;
            }
        };
        let mut sreq = loop {
            if let Some(r) = send
                .isend(data.as_ptr(), len, 3, Some(&smr))
                .expect("isend")
            {
                break r;
            }
        };
        let (mut sdone, mut rdone) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(20);
        while sdone.is_none() || rdone.is_none() {
            assert!(
                Instant::now() < deadline,
                "transfer of {len} bytes timed out"
            );
            if sdone.is_none() {
                sdone = send.test(&mut sreq).expect("test send");
            }
            if rdone.is_none() {
                rdone = recv.test(&mut rreq).expect("test recv");
            }
        }
        send.dereg_mr(smr).expect("deregMr");
        recv.dereg_mr(rmr).expect("deregMr");
        rdone.expect("sizes").as_slice()[0]
    };
    assert_eq!(&out[..len], &data[..], "payload of {len} bytes");
    got
}

#[test]
fn a_table_completed_by_init_loads_and_moves_data_in_every_version() {
    let p = Plugins::new();
    for v in 6..=12u32 {
        let path = wrap(&p, &format!("wrap{v}.so"), v, &[]);
        let plugin = load(&path).unwrap_or_else(|c| panic!("v{v}: refused before init: {c:?}"));
        assert_eq!(plugin.version(), v);
        assert_eq!(plugin.name(), "Wrap");
        let ctx = plugin.init(0x22, CommConfig::default()).expect("init");
        assert!(ctx.devices().expect("devices") >= 1, "v{v}");
        ctx.properties(0).expect("getProperties");
        let (mut send, mut recv) = connect(&ctx);
        let len = rand::rng().random_range(1..70_000);
        assert_eq!(transfer(&mut send, &mut recv, len, 9), len, "v{v}");
        drop((send, recv));
        ctx.finalize().expect("finalize");
    }
}

#[test]
fn a_table_init_leaves_incomplete_is_refused_after_init_naming_the_slot() {
    let p = Plugins::new();
    // Slot 2 is `devices`, slot 3 `getProperties`; 20 is `finalize` from v11.
    for (v, slot, name) in [
        (6, 2, "devices"),
        (9, 3, "getProperties"),
        (12, 20, "finalize"),
    ] {
        let path = wrap(
            &p,
            &format!("hole{v}.so"),
            v,
            &[&format!("LEAVE_NULL={slot}")],
        );
        let plugin = load(&path).expect("name and init are enough to load");
        let Err(err) = plugin.init(1, CommConfig::default()) else {
            panic!("v{v}: a table still missing '{name}' after init was accepted");
        };
        let text = err.to_string();
        assert!(text.contains(&format!("'{name}'")), "v{v}: {text}");
        assert!(text.contains("init"), "v{v}: {text}");
    }
}

#[test]
fn a_table_without_init_or_name_is_refused_before_init() {
    let p = Plugins::new();
    let src = |name: &str, init: &str| {
        format!(
            "typedef int (*f_t)(void);\n\
             static int dev(void) {{ return 0; }}\n\
             const void *ncclNetPlugin_v6[17] = {{ {name}, {init}, (void *)dev }};\n"
        )
    };
    let no_init = p.c_source("noinit.so", &src("\"X\"", "0"), &[]);
    assert!(matches!(
        load(&no_init),
        Err(Cause::MissingFunction { slot: "init" })
    ));
    let no_name = p.c_source("noname.so", &src("0", "(void *)dev"), &[]);
    assert!(matches!(load(&no_name), Err(Cause::NullName)));
}

#[test]
fn the_walk_selects_a_table_completed_by_init() {
    let p = Plugins::new();
    let path = wrap(&p, "walk.so", 8, &[]);
    let reg = NetRegistry::new(config(Some(&s(&path)), None));
    let sel = reg.select(7, CommConfig::default()).expect("selected");
    assert!(!sel.fell_back);
    assert!(matches!(
        sel.attempts.last().map(|a| &a.outcome),
        Some(Outcome::Selected(c)) if c.name == "Wrap" && c.version == 8
    ));
}

#[test]
fn reported_receive_sizes_reach_the_caller_as_written() {
    let p = Plugins::new();
    for (mode, what) in [(1, "never written"), (2, "posted size")] {
        let path = wrap(
            &p,
            &format!("sizes{mode}.so"),
            6,
            &[&format!("SIZES={mode}")],
        );
        let ctx = load(&path)
            .expect("load")
            .init(2, CommConfig::default())
            .expect("init");
        let (mut send, mut recv) = connect(&ctx);
        let len = rand::rng().random_range(1..5000);
        let got = transfer(&mut send, &mut recv, len, 31);
        let want = if mode == 1 { 0 } else { len + 31 };
        assert_eq!(got, want, "{what}");
    }
}
