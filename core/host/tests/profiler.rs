//! Profiler host adapter against a recording C profiler (tests/fixtures/profiler):
//! resolution, newest-version choice, per-version encoding, masks, NULL handles,
//! state filtering, the net-plugin callback, init failure and finalize.

use std::ffi::{CStr, c_char, c_void};

use cclkit_abi::profiler::{
    Coll, CollApi, Event, EventKind, EventState, GroupApi, ProxyOp, StateArgs,
};
use cclkit_abi::raw::profiler::{ProfilerEventState, event as bit};
use cclkit_host::Library;
use cclkit_host::profiler::callback::{StepHandle, callback, install};
use cclkit_host::profiler::{
    EventHandle, InitArgs, LoadOutcome, Parents, ProfilerContext, ProfilerPlugin, candidates,
};
use cclkit_tests::cplugin::Plugins;
use rand::Rng;

fn build(p: &Plugins, name: &str, defines: &[&str]) -> Library {
    let path = p.with_header(name, "profiler/profiler_mock.c", defines);
    Library::open(Some(path.to_str().expect("utf-8 path"))).expect("open mock profiler")
}

fn log(lib: &Library) -> String {
    let f = lib
        .data_symbol("mock_profiler_log")
        .expect("mock_profiler_log");
    // SAFETY: the fixture exports `const char *mock_profiler_log(void)`.
    let f: extern "C" fn() -> *const c_char = unsafe { std::mem::transmute(f.as_ptr()) };
    // SAFETY: it returns its NUL-terminated log buffer.
    unsafe { CStr::from_ptr(f()) }
        .to_string_lossy()
        .into_owned()
}

fn args(rank: i32) -> InitArgs<'static> {
    InitArgs {
        comm_id: 0xfeed_0042,
        comm_name: Some("world"),
        n_nodes: 1,
        n_ranks: 3,
        rank,
    }
}

fn coll(count: usize) -> Coll<'static> {
    Coll {
        seq_number: 5,
        func: Some("AllReduce"),
        send_buff: 0x1000,
        recv_buff: 0x2000,
        count,
        root: 0,
        datatype: Some("ncclFloat32"),
        n_channels: 2,
        n_warps: 8,
        algo: Some("RING"),
        proto: Some("SIMPLE"),
        comm_name: Some("world"),
        comm_hash: Some(0xfeed_0042),
        traffic_bytes: None,
        red_op: Some(0),
        kernel_variant: None,
        is_sym_coll: None,
        user_tag: Some(77),
    }
}

fn ev(kind: EventKind<'static>) -> Event<'static> {
    Event { rank: 2, kind }
}

#[test]
fn candidates_follow_plugin_open_rules() {
    assert_eq!(
        candidates(None),
        vec![Some("libnccl-profiler.so".to_owned())]
    );
    assert_eq!(
        candidates(Some("")),
        vec![Some("libnccl-profiler.so".to_owned())]
    );
    assert!(candidates(Some("NoNe")).is_empty());
    assert_eq!(
        candidates(Some("cclkit")),
        vec![
            Some("cclkit".to_owned()),
            Some("libnccl-profiler-cclkit.so".to_owned())
        ]
    );
    assert_eq!(
        candidates(Some("/x/libp.so")),
        vec![Some("/x/libp.so".to_owned())]
    );
    assert_eq!(
        candidates(Some("libfoo.so")),
        vec![Some("libfoo.so".to_owned())]
    );
    assert_eq!(
        ProfilerPlugin::load_with(Some("none"), None).unwrap_err(),
        LoadOutcome::Disabled
    );
    match ProfilerPlugin::load_with(Some("cclkit-no-such-profiler"), None) {
        Err(LoadOutcome::NotFound(t)) => assert_eq!(t.len(), 2, "{t:?}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn v7_tree_mask_decline_and_states() {
    let p = Plugins::new();
    // Everything but ProxyCtrl; P2p declined on purpose.
    let mask = format!("MASK={:#x}", 0xffff & !bit::PROXY_CTRL);
    let decline = format!("DECLINE={:#x}", bit::P2P);
    let lib = build(&p, "libprof7.so", &[&mask, &decline]);
    let plugin = ProfilerPlugin::from_library(lib.clone()).expect("load");
    assert_eq!((plugin.version(), plugin.name()), (7, "mock"));
    let ctx = ProfilerContext::init(&plugin, &args(2)).expect("init");
    assert_eq!(ctx.mask(), 0xffff & !bit::PROXY_CTRL);
    let count = rand::rng().random_range(1..1_000_000usize);
    let g = ctx.start(&ev(EventKind::Group), Parents::default());
    let api = ctx.start(
        &ev(EventKind::GroupApi(GroupApi {
            graph_captured: false,
            group_depth: 1,
        })),
        Parents::default(),
    );
    let capi = ctx.start(
        &ev(EventKind::CollApi(CollApi {
            func: Some("AllReduce"),
            count,
            datatype: Some("ncclFloat32"),
            root: 0,
            stream: 0,
            graph_captured: false,
            user_tag: None,
        })),
        Parents {
            parent: api.0,
            group: 0,
        },
    );
    let c = ctx.start(
        &ev(EventKind::Coll(coll(count))),
        Parents {
            parent: capi.0,
            group: g.0,
        },
    );
    let ctrl = ctx.start(&ev(EventKind::ProxyCtrl), Parents::default());
    assert!(ctrl.is_null(), "ProxyCtrl is masked out");
    let op = ctx.start(
        &ev(EventKind::ProxyOp(ProxyOp {
            pid: 1,
            channel_id: 1,
            peer: 0,
            n_steps: 3,
            chunk_size: 4096,
            is_send: true,
        })),
        Parents {
            parent: c.0,
            group: 0,
        },
    );
    let step = ctx.start(
        &ev(EventKind::ProxyStep { step: 0 }),
        Parents {
            parent: op.0,
            group: 0,
        },
    );
    let size = rand::rng().random_range(1..1 << 20usize);
    let st = |s| EventState {
        state: s,
        args: StateArgs::ProxyStep { trans_size: size },
    };
    ctx.record(step, &st(ProfilerEventState::PROXY_STEP_SEND_GPU_WAIT));
    ctx.record(step, &st(ProfilerEventState::PROXY_STEP_SEND_WAIT));
    // A declined event: NULL handle, and stopping/recording on it is a no-op.
    let p2p = ctx.start(
        &ev(EventKind::P2p(cclkit_abi::profiler::P2p {
            func: Some("Send"),
            buff: 0,
            datatype: Some("ncclInt8"),
            count: 1,
            peer: 1,
            n_channels: Some(1),
            comm_name: None,
            comm_hash: None,
            user_tag: None,
        })),
        Parents {
            parent: g.0,
            group: g.0,
        },
    );
    assert_eq!(p2p, EventHandle::NULL);
    ctx.record(p2p, &st(ProfilerEventState::PROXY_STEP_SEND_WAIT));
    ctx.stop(p2p);
    for h in [step, op, c, capi, api, g] {
        ctx.stop(h);
    }
    drop(ctx);
    let expect = format!(
        "init v7 name=world id=feed0042 nodes=1 ranks=3 rank=2\n\
         start 1 type=1 parent=0\n\
         start 2 type=256 parent=0\n\
         start 3 type=512 parent=2\n\
         start 4 type=2 parent=3 func=AllReduce dtype=ncclFloat32 algo=RING proto=SIMPLE count={count} group=1 tag=77\n\
         start 5 type=8 parent=4\n\
         start 6 type=16 parent=5\n\
         state 6 8 size={size}\n\
         state 6 9 size={size}\n\
         decline 4\n\
         stop 6\nstop 5\nstop 4\nstop 3\nstop 2\nstop 1\n\
         kept name=world func=AllReduce dtype=ncclFloat32 algo=RING proto=SIMPLE api=AllReduce\n\
         finalize 1\n"
    );
    assert_eq!(log(&lib), expect);
}

/// Profilers keep the name pointers NCCL gives them and read them later (NCCL's
/// example profiler prints them at finalize): NCCL's enum names are static and the
/// communicator's name lives as long as the communicator. Names built at run time
/// and dropped after the call, heap churn in between, and a comm name too long to
/// be kept for the process (owned by the context instead) must all read back.
#[test]
fn names_outlive_the_call_that_passed_them() {
    let p = Plugins::new();
    let lib = build(&p, "libprof7_kept.so", &[]);
    let plugin = ProfilerPlugin::from_library(lib.clone()).expect("load");
    let tag: u64 = rand::rng().random();
    for comm in [
        format!("comm-{tag:x}"),
        format!("long-{tag:x}-{}", "n".repeat(300)),
    ] {
        let ctx = ProfilerContext::init(
            &plugin,
            &InitArgs {
                comm_name: Some(&comm),
                ..args(0)
            },
        )
        .expect("init");
        let (func, dtype) = (String::from("ReduceScatter"), format!("ncclInt{}", 32));
        let (algo, proto) = ("PAT".to_owned(), "LL128".to_owned());
        let c = ctx.start(
            &Event {
                rank: 0,
                kind: EventKind::Coll(Coll {
                    func: Some(&func),
                    datatype: Some(&dtype),
                    algo: Some(&algo),
                    proto: Some(&proto),
                    ..coll(3)
                }),
            },
            Parents::default(),
        );
        ctx.stop(c);
        drop((func, dtype, algo, proto));
        // Reuse the freed heap: any name read from freed memory reads this.
        let churn: Vec<Vec<u8>> = (1..2048).map(|i| vec![b'#'; i % 300 + 1]).collect();
        drop(ctx);
        drop(churn);
        let want =
            format!("kept name={comm} func=ReduceScatter dtype=ncclInt32 algo=PAT proto=LL128");
        assert!(log(&lib).contains(&want), "{want}\n{}", log(&lib));
    }
}

#[test]
fn v1_numbers_and_unknown_events_and_states() {
    let p = Plugins::new();
    let lib = build(&p, "libprof1.so", &["PROF_VERSION=1"]);
    let plugin = ProfilerPlugin::from_library(lib.clone()).expect("load");
    assert_eq!(plugin.version(), 1);
    let ctx = ProfilerContext::init(&plugin, &args(0)).expect("init");
    assert_eq!(
        ctx.mask(),
        bit::known(1),
        "bits a v1 host cannot emit are dropped"
    );
    let count = rand::rng().random_range(1..1_000_000usize);
    let api = ctx.start(
        &ev(EventKind::GroupApi(GroupApi {
            graph_captured: false,
            group_depth: 1,
        })),
        Parents::default(),
    );
    assert!(api.is_null(), "v1 has no GroupApi");
    let c = ctx.start(&ev(EventKind::Coll(coll(count))), Parents::default());
    // ProxyOpInProgress (19) is a v4 state: not sent to v1.
    ctx.record(
        c,
        &EventState {
            state: ProfilerEventState::PROXY_OP_IN_PROGRESS,
            args: StateArgs::None,
        },
    );
    ctx.record(
        c,
        &EventState {
            state: ProfilerEventState::PROXY_OP_SEND_POSTED,
            args: StateArgs::ProxyOp {
                trans_size: 9,
                steps: 1,
            },
        },
    );
    ctx.stop(c);
    ctx.finalize().expect("finalize");
    ctx.finalize().expect("second finalize is a no-op");
    assert_eq!(
        log(&lib),
        format!(
            "init v1\nstart 1 type=2 parent=0 func=4 dtype=7 algo=1 proto=2 count={count} hash=feed0042\n\
             state 1 0 size=9\nstop 1\nfinalize 1\n"
        )
    );
}

#[test]
fn net_callback_nests_under_the_step() {
    let p = Plugins::new();
    let lib = build(&p, "libprof4.so", &["PROF_VERSION=4"]);
    let plugin = ProfilerPlugin::from_library(lib.clone()).expect("load");
    install(&plugin);
    let ctx = ProfilerContext::init(&plugin, &args(1)).expect("init");
    let step = ctx.start(&ev(EventKind::ProxyStep { step: 3 }), Parents::default());
    let cb = callback().expect("callback");
    let mut sh = StepHandle::new(&ctx, step);
    let mut descr = [0u8; 24];
    let mut e: *mut c_void = std::ptr::null_mut();
    // SAFETY: as NCCL calls it: a handle slot, a live StepHandle, a descriptor.
    unsafe {
        assert!(
            cb(
                &mut e,
                0,
                sh.as_phandle(),
                0x2_0001,
                descr.as_mut_ptr().cast()
            )
            .is_ok()
        );
        assert!(!e.is_null());
        assert!(
            cb(
                &mut e,
                2,
                std::ptr::null_mut(),
                0,
                descr.as_mut_ptr().cast()
            )
            .is_ok()
        );
        assert!(cb(&mut e, 1, std::ptr::null_mut(), 0, std::ptr::null_mut()).is_ok());
        // A NULL phandle starts nothing and leaves the slot NULL.
        let mut none: *mut c_void = std::ptr::null_mut();
        assert!(
            cb(
                &mut none,
                0,
                std::ptr::null_mut(),
                0x2_0001,
                descr.as_mut_ptr().cast()
            )
            .is_ok()
        );
        assert!(none.is_null());
        assert!(cb(&mut none, 1, std::ptr::null_mut(), 0, std::ptr::null_mut()).is_ok());
        assert!(
            !cb(
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut()
            )
            .is_ok()
        );
    }
    ctx.stop(step);
    drop(ctx);
    assert_eq!(
        log(&lib),
        "init v4 name=world id=feed0042 nodes=1 ranks=3 rank=1\n\
         start 1 type=16 parent=0\n\
         start 2 type=128 parent=1 id=20001\n\
         state 2 21 size=0\n\
         stop 2\nstop 1\nfinalize 1\n"
            .replace("size=0", &format!("size={}", descr.as_ptr() as usize))
    );
}

#[test]
fn failing_init_and_missing_table() {
    let p = Plugins::new();
    let lib = build(&p, "libprofbad.so", &["FAIL_INIT"]);
    let plugin = ProfilerPlugin::from_library(lib).expect("load");
    let e = ProfilerContext::init(&plugin, &args(0)).unwrap_err();
    assert_eq!((e.call, e.code.0), ("init", 3));
    let no = p.tuner("libnoprof.so", 6, &[]);
    let lib = Library::open(Some(no.to_str().expect("utf-8"))).expect("open");
    assert!(matches!(
        ProfilerPlugin::from_library(lib),
        Err(LoadOutcome::Unsupported { .. })
    ));
}

#[test]
fn ancestors_start_when_only_a_descendant_is_active() {
    let p = Plugins::new();
    let mask = format!("MASK={:#x}", bit::PROXY_STEP);
    let lib = build(&p, "libprofstep.so", &[&mask]);
    let plugin = ProfilerPlugin::from_library(lib.clone()).expect("load");
    let ctx = ProfilerContext::init(&plugin, &args(0)).expect("init");
    let count = rand::rng().random_range(1..1000usize);
    let c = ctx.start(&ev(EventKind::Coll(coll(count))), Parents::default());
    assert!(
        !c.is_null(),
        "Coll is an ancestor of ProxyStep: NCCL starts it"
    );
    assert!(
        ctx.start(&ev(EventKind::ProxyCtrl), Parents::default())
            .is_null()
    );
    ctx.stop(c);
    assert_eq!(
        cclkit_host::profiler::activated_by(bit::PROXY_CTRL),
        bit::PROXY_CTRL
    );
    // A copy-engine sync or batch bit alone still starts its CeColl parent.
    for b in [bit::CE_SYNC, bit::CE_BATCH] {
        assert_ne!(cclkit_host::profiler::activated_by(bit::CE_COLL) & b, 0);
        assert_eq!(cclkit_host::profiler::activated_by(b), b);
    }
    assert!(log(&lib).contains(&format!("start 1 type=2 parent=0 func=AllReduce dtype=ncclFloat32 algo=RING proto=SIMPLE count={count}")));
}
