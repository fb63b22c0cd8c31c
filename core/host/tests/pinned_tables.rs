//! Tables chosen by the caller rather than by NCCL's walk: a statically linked table
//! of any version (`NetPlugin::from_static`), one version of a loaded library
//! (`NetPlugin::load_version`), and the plugin-log observer (`logger::set_observer`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use cclkit_abi::raw::common::{LogLevel, NcclResult};
use cclkit_host::net::{CommConfig, NetContext, NetPlugin, RecvBuffer};
use cclkit_host::{Cause, Library, logger};
use rand::RngCore;

/// Connects `ctx` to itself on device 0 and moves `len` random bytes through it,
/// into a receive buffer 13 bytes larger; returns the size `test` reported.
fn loop_once(ctx: &NetContext, len: usize) -> usize {
    let (handle, mut listen) = ctx.listen(0).expect("listen");
    let mut connecting = ctx.connect(0, &handle);
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "connect/accept timed out");
        if send.is_none() {
            send = connecting.poll().expect("connect");
        }
        if recv.is_none() {
            recv = listen.accept().expect("accept");
        }
    }
    let (mut send, mut recv) = (send.expect("send"), recv.expect("recv"));
    let mut data = vec![0u8; len];
    rand::rng().fill_bytes(&mut data);
    let mut sink = vec![0xeeu8; len + 13];
    let buf = RecvBuffer {
        data: sink.as_mut_ptr(),
        size: sink.len(),
        tag: 5,
        mr: None,
    };
    // SAFETY: both buffers outlive the requests, which are tested to completion.
    let (mut r, mut s) = unsafe {
        let r = recv.irecv(&[buf], false).expect("irecv").expect("posted");
        let s = loop {
            if let Some(s) = send.isend(data.as_ptr(), len, 5, None).expect("isend") {
                break s;
            }
            assert!(Instant::now() < deadline, "isend never posted");
        };
        (r, s)
    };
    let (mut got, mut sent) = (None, None);
    while got.is_none() || sent.is_none() {
        assert!(Instant::now() < deadline, "transfer timed out");
        if sent.is_none() {
            sent = send.test(&mut s).expect("test send");
        }
        if got.is_none() {
            got = recv.test(&mut r).expect("test recv");
        }
    }
    assert_eq!(sent.expect("sent").as_slice(), &[len]);
    assert_eq!(&sink[..len], &data[..], "received bytes differ");
    assert!(
        sink[len..].iter().all(|&b| b == 0xee),
        "bytes past the message"
    );
    got.expect("got").as_slice()[0]
}

#[test]
fn static_tables_of_every_exported_version() {
    let plugins = [
        NetPlugin::from_static(&cclkit_net_socket::ncclNetPlugin_v8),
        NetPlugin::from_static(&cclkit_net_socket::ncclNetPlugin_v11),
        NetPlugin::from_static(&cclkit_net_socket::ncclNetPlugin_v12),
    ];
    for (plugin, version) in plugins.iter().zip([8, 11, 12]) {
        assert_eq!(plugin.version(), version);
        assert_eq!(plugin.symbol(), format!("ncclNetPlugin_v{version}"));
        assert_eq!(plugin.name(), "cclkit-socket");
        assert!(plugin.library().is_none() && !plugin.is_builtin());
        let ctx = plugin.init(7, CommConfig::default()).expect("init");
        assert!(ctx.devices().expect("devices") >= 1);
        let len = 1 + rand::random::<u32>() as usize % 200_000;
        assert_eq!(loop_once(&ctx, len), len, "v{version}");
        // A device past the last one is the plugin's own error, with its code.
        let n = ctx.devices().expect("devices");
        let e = ctx.properties(n).expect_err("no such device");
        assert_eq!(
            (e.call, e.code),
            ("getProperties", NcclResult::INVALID_ARGUMENT)
        );
    }
}

#[test]
fn load_version_picks_an_older_table_of_a_library() {
    let path = cclkit_tests::plugin("libnccl-net-cclkit-socket.so");
    let open = || Library::open(Some(path.to_str().expect("utf-8 path"))).expect("dlopen");
    for version in [6, 8, 11, 12] {
        let plugin = NetPlugin::load_version(open(), version).expect("load_version");
        assert_eq!(plugin.version(), version);
        assert_eq!(plugin.symbol(), format!("ncclNetPlugin_v{version}"));
        let ctx = plugin.init(9, CommConfig::default()).expect("init");
        let len = rand::random::<u32>() as usize % 70_000 + 3;
        assert_eq!(loop_once(&ctx, len), len, "v{version}");
    }
    // It exports v6 to v12: v5 is older than any host accepts, v13 does not exist.
    for version in [5, 13] {
        match NetPlugin::load_version(open(), version) {
            Err(Cause::NoSymbol { tried, exported }) => {
                assert_eq!(tried, [format!("ncclNetPlugin_v{version}")]);
                assert!(
                    exported.contains(&"ncclNetPlugin_v12".to_owned()),
                    "{exported:?}"
                );
            }
            other => panic!("v{version}: {:?}", other.map(|p| p.version())),
        }
    }
}

static SEEN: Mutex<Vec<(i32, u64, String)>> = Mutex::new(Vec::new());

fn observe(level: LogLevel, subsys: u64, text: &str) {
    SEEN.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((level.0, subsys, text.to_owned()));
}

fn other_observer(_: LogLevel, _: u64, _: &str) {}

#[test]
fn observer_sees_every_level_formatted() {
    assert!(logger::set_observer(observe));
    assert!(
        !logger::set_observer(other_observer),
        "the first observer stays"
    );
    assert!(logger::set_observer(observe));
    let log = logger::logger().expect("logger");
    let token = rand::random::<u32>();
    // SAFETY: printf formats with matching arguments, as a plugin calls the logger.
    unsafe {
        log(
            LogLevel::INFO,
            0x10,
            c"f.c".as_ptr(),
            1,
            c"info %u".as_ptr(),
            token,
        );
        log(
            LogLevel::TRACE,
            0x20,
            c"f.c".as_ptr(),
            2,
            c"trace %s\n".as_ptr(),
            c"x".as_ptr(),
        );
        log(
            LogLevel::WARN,
            0x10,
            c"f.c".as_ptr(),
            3,
            c"warn %d".as_ptr(),
            -7,
        );
    }
    let seen = SEEN.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        seen,
        [
            (3, 0x10, format!("info {token}")),
            (5, 0x20, "trace x".to_owned()),
            (2, 0x10, "warn -7".to_owned()),
        ]
    );
    // The WARN is still remembered for error messages.
    assert_eq!(logger::last_warn().as_deref(), Some("warn -7"));
}
