//! Net host adapter against C plugins of every version (v6–v12), cclkit's built-in
//! socket transport and the packaged Rust template: data path, NCCL's shim rules
//! (size narrowing, sentinel, v10 config, refcounted pre-v11 init), property
//! conversion, and errors that quote the plugin.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::ptr;
use cclkit_abi::raw::net::NetDeviceType;
use cclkit_host::Library;
use cclkit_host::net::{
    CommConfig, NetContext, NetPlugin, RecvBuffer, RecvComm, Request, SendComm, Sizes,
};
use common::{Plugins, counter, s};
use rand::{Rng, RngCore};

fn load(path: &Path) -> NetPlugin {
    NetPlugin::load(Library::open(Some(&s(path))).expect("dlopen")).expect("net table")
}

/// Connects a send and a receive comm through `ctx` (device 0), within a deadline.
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
    listen.close().expect("closeListen");
    (send.expect("send"), recv.expect("recv"))
}

/// Tests a request through its comm until done, within a deadline.
fn wait(test: &mut dyn FnMut() -> Option<Sizes>) -> Sizes {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = test() {
            return s;
        }
        assert!(Instant::now() < deadline, "request did not complete");
        std::thread::yield_now();
    }
}

/// One transfer of `len` random bytes into a larger buffer; checks data and sizes.
fn transfer(send: &mut SendComm, recv: &mut RecvComm, len: usize, rng: &mut impl RngCore) {
    let mut data = vec![0u8; len];
    rng.fill_bytes(&mut data);
    let mut out = vec![0u8; len + 13];
    // SAFETY: both buffers outlive the requests, which complete before they drop.
    unsafe {
        let smr = send
            .reg_mr(data.as_mut_ptr(), data.len(), ptr::HOST)
            .expect("regMr send");
        let rmr = recv
            .reg_mr(out.as_mut_ptr(), out.len(), ptr::HOST)
            .expect("regMr recv");
        let mut rreq: Request = loop {
            let b = [RecvBuffer {
                data: out.as_mut_ptr(),
                size: out.len(),
                tag: 5,
                mr: Some(&rmr),
            }];
            if let Some(r) = recv.irecv(&b, false).expect("irecv") {
                break r;
            }
        };
        let mut sreq = loop {
            if let Some(r) = send
                .isend(data.as_ptr(), data.len(), 5, Some(&smr))
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
        assert_eq!(sdone.expect("send sizes").as_slice(), [len]);
        assert_eq!(rdone.expect("recv sizes").as_slice(), [len]);
        assert!(
            send.test(&mut sreq).is_err(),
            "a completed request must not be tested again"
        );
        send.dereg_mr(smr).expect("deregMr");
        recv.dereg_mr(rmr).expect("deregMr");
    }
    assert_eq!(&out[..len], &data[..], "payload of {len} bytes");
}

#[test]
fn every_version_moves_data_and_closes_everything() {
    let p = Plugins::new();
    let mut rng = rand::rng();
    for v in 6..=12u32 {
        let path = p.net(&format!("v{v}.so"), v, &[]);
        let plugin = load(&path);
        assert_eq!(plugin.version(), v);
        let ctx = plugin.init(0x42, CommConfig::default()).expect("init");
        assert_eq!(ctx.devices().expect("devices"), 1);
        let (mut send, mut recv) = connect(&ctx);
        assert_eq!(
            counter(&path, "connect"),
            2,
            "v{v}: the first connect returns NULL"
        );
        for len in [0, 1, rng.random_range(2..4096), 100_003] {
            transfer(&mut send, &mut recv, len, &mut rng);
        }
        // Three buffers (NCCL's grouped receives), then eleven: more sizes than a
        // completion keeps inline.
        grouped_receive_matches_tags(&mut send, &mut recv, v, 3, &mut rng);
        grouped_receive_matches_tags(&mut send, &mut recv, v, 11, &mut rng);
        assert_eq!(
            counter(&path, "irecvConsumed"),
            if v >= 7 { 2 } else { 0 },
            "v{v}"
        );
        send.close().expect("closeSend");
        drop(recv);
        assert_eq!(
            [
                counter(&path, "closeSend"),
                counter(&path, "closeRecv"),
                counter(&path, "closeListen")
            ],
            [1, 1, 1],
            "v{v}"
        );
        assert_eq!(counter(&path, "regMr"), counter(&path, "deregMr"), "v{v}");
        let finalized = ctx.finalize().expect("finalize");
        assert!(finalized);
        assert_eq!(
            counter(&path, "finalize"),
            if v >= 11 { 1 } else { 0 },
            "v{v}"
        );
    }
}

/// `n` buffers of one receive, tags 1..=n; the sends arrive in a shuffled tag order
/// and each lands by its tag, with its own size reported in buffer order.
fn grouped_receive_matches_tags(
    send: &mut SendComm,
    recv: &mut RecvComm,
    version: u32,
    n: usize,
    rng: &mut impl RngCore,
) {
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 300]).collect();
    let payloads: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let mut v = vec![0u8; rng.random_range(1..=300)];
            rng.fill_bytes(&mut v);
            v
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    // SAFETY: buffers and payloads outlive the requests.
    unsafe {
        let rb: Vec<RecvBuffer<'_>> = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| RecvBuffer {
                data: b.as_mut_ptr(),
                size: b.len(),
                tag: i as i32 + 1,
                mr: None,
            })
            .collect();
        let mut rreq = recv.irecv(&rb, false).expect("irecv").expect("posted");
        let mut sreqs: Vec<Request> = order
            .iter()
            .map(|&i| {
                let pl = &payloads[i];
                send.isend(pl.as_ptr(), pl.len(), i as i32 + 1, None)
                    .expect("isend")
                    .expect("posted")
            })
            .collect();
        let sizes = wait(&mut || recv.test(&mut rreq).expect("test"));
        let want: Vec<usize> = payloads.iter().map(Vec::len).collect();
        assert_eq!(sizes.as_slice(), want, "{n} buffers");
        for r in &mut sreqs {
            wait(&mut || send.test(r).expect("test send"));
        }
        let id = rreq.id();
        let consumed = recv.irecv_consumed(n, id).expect("irecvConsumed");
        assert_eq!(consumed, version >= 7, "irecvConsumed exists from v7");
    }
    for (i, pl) in payloads.iter().enumerate() {
        assert_eq!(&bufs[i][..pl.len()], &pl[..]);
    }
}

#[test]
fn sizes_are_narrowed_exactly_as_nccls_shims() {
    let p = Plugins::new();
    let mut byte = [0u8; 8];
    for v in [6u32, 7, 8, 9, 12] {
        let path = p.net(&format!("n{v}.so"), v, &[]);
        let plugin = load(&path);
        let ctx = plugin.init(1, CommConfig::default()).expect("init");
        let (mut send, _recv) = connect(&ctx);
        let two_gib = 1usize << 31;
        // SAFETY: the mock only records sizes for requests that are never progressed.
        unsafe {
            let r = send.reg_mr(byte.as_mut_ptr(), two_gib, ptr::HOST);
            if v <= 7 {
                let e = r.expect_err("v6/v7 regMr takes an int");
                assert_eq!((e.call, e.code.0), ("regMr", 3));
                assert!(e.to_string().contains("registers at most 2 GiB - 1"), "{e}");
                assert_eq!(counter(&path, "regMr"), 0, "refused before the plugin");
                let ok = send
                    .reg_mr(byte.as_mut_ptr(), two_gib - 1, ptr::HOST)
                    .expect("just fits");
                send.dereg_mr(ok).expect("dereg");
            } else {
                send.dereg_mr(r.expect("size_t regMr")).expect("dereg");
                assert_eq!(counter(&path, "last_regmr_size"), two_gib as i64);
            }
            let gib = 1usize << 30;
            let r = send.isend(byte.as_ptr(), gib + 1, 1, None);
            if v <= 8 {
                let e = r.expect_err("v6–v8 isend is capped at 1 GiB");
                assert!(e.to_string().contains("sends at most 1 GiB"), "{e}");
                assert_eq!(counter(&path, "isend"), 0);
                send.isend(byte.as_ptr(), gib, 1, None)
                    .expect("1 GiB fits")
                    .expect("posted");
                assert_eq!(counter(&path, "last_isend_size"), gib as i64);
            } else {
                r.expect("size_t isend").expect("posted");
                assert_eq!(counter(&path, "last_isend_size"), (gib + 1) as i64);
            }
        }
    }
}

#[test]
fn the_optional_completion_sentinel_reaches_v9_and_later_only() {
    let p = Plugins::new();
    for (v, seen) in [(8u32, 0), (9, 1), (12, 1)] {
        let path = p.net(&format!("s{v}.so"), v, &[]);
        let plugin = load(&path);
        let ctx = plugin.init(1, CommConfig::default()).expect("init");
        let (_send, mut recv) = connect(&ctx);
        let mut buf = [0u8; 16];
        // SAFETY: the buffer outlives the comm (the request is never completed).
        unsafe {
            let b = [RecvBuffer {
                data: buf.as_mut_ptr(),
                size: 16,
                tag: 0,
                mr: None,
            }];
            recv.irecv(&b, true).expect("irecv").expect("posted");
            assert_eq!(counter(&path, "sentinel_seen"), seen, "v{v}");
            recv.irecv(&b, false).expect("irecv").expect("posted");
            assert_eq!(counter(&path, "sentinel_seen"), 0, "v{v}: not asked");
        }
    }
}

#[test]
fn traffic_class_reaches_v10_connect_and_v11_init() {
    let p = Plugins::new();
    let cfg = CommConfig {
        traffic_class: Some(5),
    };
    let v10 = p.net("tc10.so", 10, &[]);
    let ctx = load(&v10).init(1, cfg).expect("init");
    assert_eq!(
        counter(&v10, "last_traffic_class"),
        -100,
        "v10 sees it at connect"
    );
    let _comms = connect(&ctx);
    assert_eq!(counter(&v10, "last_traffic_class"), 5);
    let v11 = p.net("tc11.so", 11, &[]);
    let _ctx = load(&v11).init(1, cfg).expect("init");
    assert_eq!(counter(&v11, "last_traffic_class"), 5);
    let _undef = load(&v11).init(2, CommConfig::default()).expect("init");
    assert_eq!(
        counter(&v11, "last_traffic_class"),
        -1,
        "NCCL_NET_TRAFFIC_CLASS_UNDEF"
    );
}

#[test]
fn pre_v11_init_is_refcounted_and_v11_is_per_communicator() {
    let p = Plugins::new();
    let v8 = p.net("r8.so", 8, &[]);
    let plugin = load(&v8);
    let a = plugin.init(1, CommConfig::default()).expect("a");
    let b = plugin.init(2, CommConfig::default()).expect("b");
    assert_eq!(counter(&v8, "init"), 1, "one init while a context lives");
    drop(a);
    drop(b);
    let _c = plugin.init(3, CommConfig::default()).expect("c");
    assert_eq!(
        counter(&v8, "init"),
        2,
        "after the last finalize, init runs again"
    );
    let v11 = p.net("r11.so", 11, &[]);
    let plugin = load(&v11);
    let a = plugin.init(1, CommConfig::default()).expect("a");
    let b = plugin.init(2, CommConfig::default()).expect("b");
    assert_eq!(counter(&v11, "init"), 2);
    let (send, recv) = connect(&a);
    assert!(
        !a.finalize().expect("deferred"),
        "comms still open: finalize waits"
    );
    assert_eq!(counter(&v11, "finalize"), 0);
    drop((send, recv));
    assert_eq!(
        counter(&v11, "finalize"),
        1,
        "finalize after the last comm closed"
    );
    drop(b);
    assert_eq!(counter(&v11, "finalize"), 2);
}

#[test]
fn properties_get_the_shims_defaults() {
    let p = Plugins::new();
    let props = |v: u32| {
        let path = p.net(&format!("p{v}.so"), v, &["NDEV=2"]);
        let ctx = load(&path).init(1, CommConfig::default()).expect("init");
        ctx.properties(1).expect("properties")
    };
    let p6 = props(6);
    assert_eq!(
        (p6.name.as_str(), p6.guid, p6.port, p6.speed_mbps),
        ("mockdev1", 0x101, 1, 25000)
    );
    assert_eq!(
        (p6.latency_us, p6.max_comms, p6.max_recvs, p6.ptr_support),
        (1.5, 64, 8, ptr::HOST)
    );
    assert_eq!(p6.device_type, NetDeviceType::HOST);
    assert_eq!((p6.reg_is_global, p6.force_flush), (false, false));
    assert_eq!(p6.vdevs, [1], "pre-v9: vProps = {{1, [dev]}}");
    assert_eq!((p6.max_p2p_bytes, p6.max_coll_bytes), (1 << 30, 512 << 20));
    assert_eq!(
        (p6.max_multi_request_size, p6.rail_id, p6.plane_id),
        (1, -1, -1)
    );
    assert!(props(8).reg_is_global);
    let p9 = props(9);
    assert_eq!(
        (
            p9.max_p2p_bytes,
            p9.max_coll_bytes,
            p9.max_multi_request_size
        ),
        (1 << 33, 1 << 29, 1)
    );
    let p11 = props(11);
    assert_eq!((p11.max_multi_request_size, p11.rail_id), (2, -1));
    let p12 = props(12);
    assert_eq!(
        (
            p12.max_multi_request_size,
            p12.rail_id,
            p12.plane_id,
            p12.vdevs.as_slice()
        ),
        (2, 3, 1, &[1][..])
    );
    let path = p.net("pover.so", 12, &["PROPS_OVERRUN"]);
    let e = load(&path)
        .init(1, CommConfig::default())
        .expect("init")
        .properties(0)
        .expect_err("overrun");
    assert!(
        e.to_string()
            .contains("past the end of the 128-byte struct"),
        "{e}"
    );
}

#[test]
fn optional_hooks_report_whether_they_exist() {
    let p = Plugins::new();
    let v8 = p.net("h8.so", 8, &["NDEV=4"]);
    let ctx8 = load(&v8).init(1, CommConfig::default()).expect("init");
    assert_eq!(ctx8.make_vdevice(&[0, 1]).expect("none"), None);
    assert!(!ctx8.set_net_attr(&Default::default()).expect("no hook"));
    let v9 = p.net("h9.so", 9, &["NDEV=4"]);
    let ctx9 = load(&v9).init(1, CommConfig::default()).expect("init");
    assert_eq!(ctx9.make_vdevice(&[0, 1]).expect("fused"), Some(6));
    assert!(
        ctx9.make_vdevice(&[0, 1, 2, 3, 0]).is_err(),
        "v9 fuses at most 4"
    );
    let v12 = p.net("h12.so", 12, &[]);
    let ctx12 = load(&v12).init(1, CommConfig::default()).expect("init");
    assert_eq!(ctx12.make_vdevice(&[0; 8]).expect("8 ok for v12"), Some(9));
    let mut attr = cclkit_abi::raw::net::ncclNetAttr_v11_t::default();
    attr.sendCommAttr.maxConcurrentPeers = 7;
    assert!(ctx12.set_net_attr(&attr).expect("hook"));
    assert_eq!(counter(&v12, "attr_max_peers"), 7);
}

#[test]
fn errors_carry_code_call_plugin_and_its_message() {
    let p = Plugins::new();
    let path = p.net("err.so", 11, &[]);
    let ctx = load(&path).init(1, CommConfig::default()).expect("init");
    let (mut send, mut recv) = connect(&ctx);
    let byte = [0u8; 1];
    // SAFETY: the mock refuses this call before using the buffer.
    let e = unsafe { send.isend(byte.as_ptr(), 1, -7, None) }.expect_err("refused");
    assert_eq!(
        (e.call, e.code.0, &*e.plugin, e.version),
        ("isend", 4, "Mock", 11)
    );
    assert_eq!(
        e.plugin_message.as_deref(),
        Some("mock: isend refused tag -7")
    );
    assert_eq!(
        e.to_string(),
        "NET plugin 'Mock' (v11): isend failed: ncclInvalidArgument (4); the plugin said: \
         \"mock: isend refused tag -7\""
    );
    let abi: cclkit_abi::Error = e.into();
    assert_eq!(abi.code().0, 4);
    // A request belongs to its comm.
    let mut buf = [0u8; 4];
    // SAFETY: the buffer outlives the comm.
    let mut r = unsafe {
        recv.irecv(
            &[RecvBuffer {
                data: buf.as_mut_ptr(),
                size: 4,
                tag: 0,
                mr: None,
            }],
            false,
        )
    }
    .expect("irecv")
    .expect("posted");
    let e = send.test(&mut r).expect_err("wrong comm");
    assert!(e.to_string().contains("belongs to another comm"), "{e}");
}

#[test]
fn the_built_in_socket_transport_moves_random_data() {
    let plugin = common::builtin();
    assert!(plugin.is_builtin() && plugin.library().is_none());
    assert_eq!((plugin.name(), plugin.version()), ("cclkit-socket", 12));
    let ctx = plugin.init(0x77, CommConfig::default()).expect("init");
    assert!(ctx.devices().expect("devices") >= 1);
    let props = ctx.properties(0).expect("properties");
    assert_eq!(props.ptr_support & ptr::HOST, ptr::HOST);
    let (mut send, mut recv) = connect(&ctx);
    let mut rng = rand::rng();
    for len in [1, 4096, rng.random_range(10_000..200_000), 1 << 20] {
        transfer(&mut send, &mut recv, len, &mut rng);
    }
}

#[test]
fn the_rust_template_plugins_work_through_their_v12_tables() {
    let mut rng = rand::rng();
    for name in ["libnccl-net-template.so", "libnccl-net-cclkit-socket.so"] {
        let path = common::rust_plugin(name);
        let plugin = load(&path);
        assert_eq!(plugin.version(), 12, "{name}");
        let versions: Vec<u32> = plugin
            .exported()
            .iter()
            .filter(|e| e.family == cclkit_host::symbols::Family::Net)
            .map(|e| e.version)
            .collect();
        assert_eq!(versions, [12, 11, 10, 9, 8, 7, 6], "{name}");
        let ctx = plugin.init(9, CommConfig::default()).expect("init");
        assert!(ctx.devices().expect("devices") >= 1);
        let (mut send, mut recv) = connect(&ctx);
        for len in [1, rng.random_range(2..70_000)] {
            transfer(&mut send, &mut recv, len, &mut rng);
        }
    }
}

#[test]
fn groups_larger_than_eight_buffers_take_the_wide_path() {
    let p = Plugins::new();
    let mut rng = rand::rng();
    for v in [8u32, 12] {
        let path = p.net(&format!("wide{v}.so"), v, &[]);
        let ctx = load(&path).init(1, CommConfig::default()).expect("init");
        let (mut send, mut recv) = connect(&ctx);
        let n = 12usize;
        let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 64]).collect();
        let payloads: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let mut v = vec![0u8; 1 + i * 5];
                rng.fill_bytes(&mut v);
                v
            })
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.reverse();
        // SAFETY: buffers and payloads outlive the requests.
        unsafe {
            let rb: Vec<RecvBuffer<'_>> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| RecvBuffer {
                    data: b.as_mut_ptr(),
                    size: b.len(),
                    tag: i as i32,
                    mr: None,
                })
                .collect();
            let mut rreq = recv.irecv(&rb, false).expect("irecv").expect("posted");
            let mut sreqs: Vec<Request> = order
                .iter()
                .map(|&i| {
                    let pl = &payloads[i];
                    send.isend(pl.as_ptr(), pl.len(), i as i32, None)
                        .expect("isend")
                        .expect("posted")
                })
                .collect();
            let sizes = wait(&mut || recv.test(&mut rreq).expect("test"));
            let want: Vec<usize> = (0..n).map(|i| 1 + i * 5).collect();
            assert_eq!(sizes.as_slice(), want.as_slice(), "v{v}");
            for r in &mut sreqs {
                wait(&mut || send.test(r).expect("test send"));
            }
        }
        for (i, pl) in payloads.iter().enumerate() {
            assert_eq!(&bufs[i][..pl.len()], &pl[..], "v{v} buffer {i}");
        }
    }
}
