//! Drives the tables `export_profiler!` publishes through their raw function
//! pointers, as NCCL does: every version's init/mask, descriptor decoding with
//! random field values, NULL handles, parents that stopped earlier, stale and
//! doubled handles, and panics contained at the C edge.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::{CStr, CString, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use cclkit_abi::export::profiler::ProfilerExport;
use cclkit_abi::profiler::{
    Event, EventKind, EventMask, EventState, NetDetail, Profiler, ProfilerInit,
};
use cclkit_abi::raw::common::NcclResult;
use cclkit_abi::raw::profiler::{self as raw, ProfilerEventState, event as bit};
use cclkit_abi::{Result, export_profiler};

/// What the recorder saw, one line per call, for exact comparisons.
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Event types the recorder declines (returns `None`).
static DECLINE: AtomicU64 = AtomicU64::new(0);
/// Event types whose start panics.
static PANIC_ON: AtomicU64 = AtomicU64::new(0);
/// Serialises the tests: the exported tables share one registry.
static SERIAL: Mutex<()> = Mutex::new(());
/// `Debug` of the last event the recorder was asked to start.
static LAST: Mutex<String> = Mutex::new(String::new());

fn serial() -> MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    LOG.lock().unwrap().clear();
    DECLINE.store(0, Ordering::SeqCst);
    PANIC_ON.store(0, Ordering::SeqCst);
    g
}

fn log(line: String) {
    LOG.lock().unwrap().push(line);
}

fn take_log() -> Vec<String> {
    std::mem::take(&mut *LOG.lock().unwrap())
}

struct Recorder {
    rank: Option<i32>,
}

struct Rec {
    label: String,
}

impl Profiler for Recorder {
    const NAME: &'static CStr = c"Recorder";
    const MAX_EVENTS: usize = 4;
    type Event = Rec;

    fn init(args: &ProfilerInit<'_>) -> Result<(Self, EventMask)> {
        log(format!(
            "init v{} id={:?} name={:?} nodes={:?} ranks={:?} rank={:?} mask={:#x}",
            args.host_abi,
            args.comm_id,
            args.comm_name,
            args.n_nodes,
            args.n_ranks,
            args.rank,
            args.current_mask.0
        ));
        Ok((Self { rank: args.rank }, EventMask(u64::MAX)))
    }

    fn start_event(&self, event: &Event<'_>, parent: Option<&Rec>) -> Result<Option<Rec>> {
        let ty = event.kind.type_bit();
        if PANIC_ON.load(Ordering::SeqCst) & ty != 0 {
            panic!("recorder asked to panic on {}", event.kind.name());
        }
        *LAST.lock().unwrap() = format!("{event:?}");
        let label = format!("{}#{}", event.kind.name(), LOG.lock().unwrap().len());
        log(format!(
            "start {label} parent={} rank={} ctx_rank={:?}",
            parent.map_or("-", |p| p.label.as_str()),
            event.rank,
            self.rank
        ));
        if DECLINE.load(Ordering::SeqCst) & ty != 0 {
            return Ok(None);
        }
        Ok(Some(Rec { label }))
    }

    fn record_state(&self, event: &Rec, state: &EventState) -> Result<()> {
        log(format!(
            "state {} {:?} {:?}",
            event.label, state.state, state.args
        ));
        Ok(())
    }

    fn stop_event(&self, event: &Rec) -> Result<()> {
        log(format!("stop {}", event.label));
        Ok(())
    }

    fn finalize(&self) -> Result<()> {
        log("finalize".into());
        Ok(())
    }
}

export_profiler!(Recorder);

/// splitmix64: reproducible "random" field values without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn seeded() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let seed = t.as_nanos() as u64;
        eprintln!("rng seed {seed}");
        Rng(seed)
    }
}

fn init_v7(rank: c_int) -> *mut c_void {
    let mut ctx = null_mut();
    let mut mask: c_int = 0x12;
    let name = CString::new("trainer").unwrap();
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    let rc = unsafe {
        (ncclProfiler_v7.init.unwrap())(
            &mut ctx,
            0xABCD,
            &mut mask,
            name.as_ptr(),
            2,
            8,
            rank,
            None,
        )
    };
    assert_eq!(rc, NcclResult::SUCCESS);
    assert_eq!(mask, 0xFFFF, "v7 keeps exactly bits 0-15");
    assert!(!ctx.is_null());
    ctx
}

fn descr_v7(ty: u64, parent: *mut c_void) -> raw::v7::ncclProfilerEventDescr_v7_t {
    // SAFETY: all-zero is a valid value for this plain-data struct (NULL pointers).
    let mut d: raw::v7::ncclProfilerEventDescr_v7_t = unsafe { std::mem::zeroed() };
    d.type_ = ty;
    d.parentObj = parent;
    d.rank = 3;
    d
}

fn start7(
    ctx: *mut c_void,
    d: &mut raw::v7::ncclProfilerEventDescr_v7_t,
) -> (NcclResult, *mut c_void) {
    let mut h = 0x5555usize as *mut c_void; // garbage: must be overwritten
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    let rc = unsafe { (ncclProfiler_v7.startEvent.unwrap())(ctx, &mut h, d) };
    (rc, h)
}

fn stop(h: *mut c_void) -> NcclResult {
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    unsafe { (ncclProfiler_v7.stopEvent.unwrap())(h) }
}

fn finalize(ctx: *mut c_void) -> NcclResult {
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    unsafe { (ncclProfiler_v7.finalize.unwrap())(ctx) }
}

#[test]
fn every_version_inits_with_its_arguments_and_masks_unknown_bits() {
    let _g = serial();
    let name = CString::new("comm-a").unwrap();
    let mut got = Vec::new();
    for v in 1..=7u32 {
        let mut ctx = null_mut();
        let mut mask: c_int = 7;
        // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
        let rc = unsafe {
            match v {
                1 => (ncclProfiler_v1.init.unwrap())(&mut ctx, &mut mask),
                2 => (ncclProfiler_v2.init.unwrap())(&mut ctx, &mut mask),
                3 => (ncclProfiler_v3.init.unwrap())(&mut ctx, &mut mask),
                4 => (ncclProfiler_v4.init.unwrap())(
                    &mut ctx,
                    &mut mask,
                    name.as_ptr(),
                    99,
                    1,
                    4,
                    2,
                    None,
                ),
                5 => (ncclProfiler_v5.init.unwrap())(
                    &mut ctx,
                    77,
                    &mut mask,
                    name.as_ptr(),
                    1,
                    4,
                    2,
                    None,
                ),
                6 => (ncclProfiler_v6.init.unwrap())(
                    &mut ctx,
                    77,
                    &mut mask,
                    std::ptr::null(),
                    1,
                    4,
                    2,
                    None,
                ),
                _ => (ncclProfiler_v7.init.unwrap())(
                    &mut ctx,
                    77,
                    &mut mask,
                    name.as_ptr(),
                    1,
                    4,
                    2,
                    None,
                ),
            }
        };
        assert_eq!(rc, NcclResult::SUCCESS, "v{v}");
        got.push(mask);
        assert_eq!(finalize(ctx), NcclResult::SUCCESS);
        assert_eq!(
            finalize(ctx),
            NcclResult::INVALID_USAGE,
            "double finalize is reported"
        );
    }
    assert_eq!(got, vec![0x3F, 0x3F, 0xFF, 0xFF, 0xFFF, 0x7FFF, 0xFFFF]);
    let log = take_log();
    assert_eq!(
        log[0],
        "init v1 id=None name=None nodes=None ranks=None rank=None mask=0x7"
    );
    assert_eq!(
        log[6],
        "init v4 id=Some(99) name=Some(\"comm-a\") nodes=Some(1) ranks=Some(4) rank=Some(2) mask=0x7"
    );
    assert_eq!(
        log[10],
        "init v6 id=Some(77) name=None nodes=Some(1) ranks=Some(4) rank=Some(2) mask=0x7"
    );
    assert_eq!(<Recorder as ProfilerExport>::state().live_contexts(), 0);
    // NULL out-pointers are rejected, not dereferenced.
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    let rc = unsafe { (ncclProfiler_v1.init.unwrap())(null_mut(), null_mut()) };
    assert_eq!(rc, NcclResult::INVALID_ARGUMENT);
}

fn record7(
    h: *mut c_void,
    state: ProfilerEventState,
    args: Option<raw::ncclProfilerEventStateArgs_v4_t>,
) -> NcclResult {
    let mut a = args;
    let p = a.as_mut().map_or(null_mut(), |a| a as *mut _);
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    unsafe { (ncclProfiler_v7.recordEventState.unwrap())(h, state, p) }
}

#[test]
fn v7_events_nest_and_a_stopped_parent_still_resolves() {
    let _g = serial();
    let mut rng = Rng::seeded();
    let ctx = init_v7(5);
    let mut g = descr_v7(bit::GROUP, null_mut());
    let (rc, group) = start7(ctx, &mut g);
    assert_eq!(rc, NcclResult::SUCCESS);
    let (count, seq, tag) = (rng.next() % 1_000_003 + 1, rng.next(), rng.next());
    let mut c = descr_v7(bit::COLL, group);
    c.u.coll = raw::v7::ncclProfilerCollDescr_v7_t {
        seqNumber: seq,
        func: c"AllReduce".as_ptr(),
        sendBuff: 0x1000 as *const c_void,
        recvBuff: 0x2000 as *mut c_void,
        count: count as usize,
        root: -1,
        datatype: c"ncclFloat32".as_ptr(),
        nChannels: 3,
        nWarps: 16,
        algo: c"RING".as_ptr(),
        proto: c"SIMPLE".as_ptr(),
        parentGroup: group,
        kernelVariant: c"sym".as_ptr(),
        isSymColl: 7, // any non-zero byte is true, never UB
        userTag: tag,
    };
    let (rc, coll) = start7(ctx, &mut c);
    assert_eq!(rc, NcclResult::SUCCESS);
    let expect = format!(
        "Event {{ rank: 3, kind: Coll(Coll {{ seq_number: {seq}, func: Some(\"AllReduce\"), send_buff: 4096, recv_buff: 8192, count: {count}, root: -1, datatype: Some(\"ncclFloat32\"), n_channels: 3, n_warps: 16, algo: Some(\"RING\"), proto: Some(\"SIMPLE\"), comm_name: None, comm_hash: None, traffic_bytes: None, red_op: None, kernel_variant: Some(\"sym\"), is_sym_coll: Some(true), user_tag: Some({tag}) }}) }}"
    );
    assert_eq!(*LAST.lock().unwrap(), expect);
    // NCCL stops the collective when it is enqueued; its proxy work starts later.
    assert_eq!(stop(coll), NcclResult::SUCCESS);
    assert_eq!(stop(group), NcclResult::SUCCESS);
    let mut op = descr_v7(bit::PROXY_OP, coll);
    op.u.proxyOp = raw::ncclProfilerProxyOpDescr_v1_t {
        pid: 42,
        channelId: 1,
        peer: 6,
        nSteps: 8,
        chunkSize: 524288,
        isSend: 1,
    };
    let (_, proxy) = start7(ctx, &mut op);
    let mut st = descr_v7(bit::PROXY_STEP, proxy);
    st.u.proxyStep.step = 9;
    let (_, step) = start7(ctx, &mut st);
    let bytes = (rng.next() % 65536) as usize;
    let args = raw::ncclProfilerEventStateArgs_v4_t {
        proxyStep: raw::ncclProfilerProxyStepStateArgs_v4_t { transSize: bytes },
    };
    assert_eq!(
        record7(step, ProfilerEventState::PROXY_STEP_SEND_WAIT, Some(args)),
        NcclResult::SUCCESS
    );
    let mut sock = raw::ncclProfilerNetSockDescr_v1_t {
        type_: raw::NCCL_PROFILE_SOCKET,
        sock: raw::ncclProfilerNetSockSockDescr_v1_t {
            fd: 17,
            op: 0,
            length: bytes,
        },
    };
    let mut n = descr_v7(bit::NET_PLUGIN, step);
    n.u.netPlugin = raw::ncclProfilerNetPluginDescr_v3_t {
        id: i64::from(raw::NCCL_PROFILER_NET_TYPE_SOCK | 1),
        data: (&mut sock as *mut raw::ncclProfilerNetSockDescr_v1_t).cast(),
    };
    let (_, net) = start7(ctx, &mut n);
    let net_kind = format!(
        "{:?}",
        EventKind::NetPlugin(cclkit_abi::profiler::NetPlugin {
            id: i64::from(raw::NCCL_PROFILER_NET_TYPE_SOCK | 1),
            detail: Some(NetDetail::Socket {
                fd: 17,
                op: 0,
                length: bytes
            }),
        })
    );
    assert!(LAST.lock().unwrap().contains(&net_kind));
    for h in [net, step, proxy] {
        assert_eq!(stop(h), NcclResult::SUCCESS);
    }
    assert_eq!(finalize(ctx), NcclResult::SUCCESS);
    let log = take_log();
    let want = [
        "init v7 id=Some(43981) name=Some(\"trainer\") nodes=Some(2) ranks=Some(8) rank=Some(5) mask=0x12",
        "start Group#1 parent=- rank=3 ctx_rank=Some(5)",
        "start Coll#2 parent=Group#1 rank=3 ctx_rank=Some(5)",
        "stop Coll#2",
        "stop Group#1",
        "start ProxyOp#5 parent=Coll#2 rank=3 ctx_rank=Some(5)",
        "start ProxyStep#6 parent=ProxyOp#5 rank=3 ctx_rank=Some(5)",
        &format!("state ProxyStep#6 ProxyStepSendWait ProxyStep {{ trans_size: {bytes} }}"),
        "start NetPlugin#8 parent=ProxyStep#6 rank=3 ctx_rank=Some(5)",
        "stop NetPlugin#8",
        "stop ProxyStep#6",
        "stop ProxyOp#5",
        "finalize",
    ];
    assert_eq!(log, want);
}

#[test]
fn declined_events_give_null_handles_that_every_call_tolerates() {
    let _g = serial();
    let ctx = init_v7(0);
    DECLINE.store(bit::COLL, Ordering::SeqCst);
    let mut c = descr_v7(bit::COLL, null_mut());
    let (rc, coll) = start7(ctx, &mut c);
    assert_eq!(rc, NcclResult::SUCCESS);
    assert!(
        coll.is_null(),
        "declined ⇒ NULL, garbage in *eHandle overwritten"
    );
    assert_eq!(stop(coll), NcclResult::SUCCESS);
    assert_eq!(
        record7(coll, ProfilerEventState::PROXY_CTRL_IDLE, None),
        NcclResult::SUCCESS
    );
    // A child of a declined parent starts without a parent.
    let mut op = descr_v7(bit::PROXY_OP, coll);
    let (rc, proxy) = start7(ctx, &mut op);
    assert_eq!(rc, NcclResult::SUCCESS);
    assert!(!proxy.is_null());
    assert_eq!(stop(proxy), NcclResult::SUCCESS);
    assert_eq!(finalize(ctx), NcclResult::SUCCESS);
    let log = take_log();
    assert_eq!(log[1], "start Coll#1 parent=- rank=3 ctx_rank=Some(0)");
    assert_eq!(log[2], "start ProxyOp#2 parent=- rank=3 ctx_rank=Some(0)");
    assert_eq!(log.len(), 5);
}

#[test]
fn stale_doubled_foreign_and_overflowing_handles_are_reported_not_followed() {
    let _g = serial();
    let ctx = init_v7(1);
    let mut handles = Vec::new();
    for _ in 0..Recorder::MAX_EVENTS {
        let mut d = descr_v7(bit::PROXY_STEP, null_mut());
        let (rc, h) = start7(ctx, &mut d);
        assert_eq!(rc, NcclResult::SUCCESS);
        assert!(!h.is_null());
        handles.push(h);
    }
    // Every slot holds a live event: the next one is declined, not unbounded.
    let mut d = descr_v7(bit::PROXY_STEP, null_mut());
    let (rc, full) = start7(ctx, &mut d);
    assert_eq!((rc, full), (NcclResult::SUCCESS, null_mut()));
    assert_eq!(stop(handles[2]), NcclResult::SUCCESS);
    assert_eq!(stop(handles[2]), NcclResult::INVALID_USAGE, "double stop");
    assert_eq!(
        record7(handles[2], ProfilerEventState::PROXY_STEP_RECV_WAIT, None),
        NcclResult::INVALID_USAGE
    );
    let (rc, reused) = start7(ctx, &mut d);
    assert_eq!(rc, NcclResult::SUCCESS);
    assert!(
        !reused.is_null() && reused != handles[2],
        "slot reused under a new generation"
    );
    assert_eq!(
        stop(handles[2]),
        NcclResult::INVALID_ARGUMENT,
        "stale handle"
    );
    assert_eq!(
        stop(0x1234usize as *mut c_void),
        NcclResult::INVALID_ARGUMENT,
        "not ours"
    );
    assert_eq!(
        stop(ctx),
        NcclResult::INVALID_ARGUMENT,
        "a context is not an event"
    );
    let (rc, h) = start7(0x40usize as *mut c_void, &mut d);
    assert_eq!((rc, h), (NcclResult::INVALID_ARGUMENT, null_mut()));
    assert_eq!(finalize(ctx), NcclResult::SUCCESS);
    assert_eq!(
        stop(handles[0]),
        NcclResult::INVALID_USAGE,
        "after finalize"
    );
    assert_eq!(<Recorder as ProfilerExport>::state().live_contexts(), 0);
}

#[test]
fn a_panicking_profiler_returns_internal_error_and_a_null_handle() {
    let _g = serial();
    let ctx = init_v7(2);
    PANIC_ON.store(bit::P2P, Ordering::SeqCst);
    let mut p = descr_v7(bit::P2P, null_mut());
    let (rc, h) = start7(ctx, &mut p);
    assert_eq!(rc, NcclResult::INTERNAL_ERROR);
    assert!(h.is_null());
    let mut nil: *mut c_void = 0x99usize as *mut c_void;
    // SAFETY: the exported table's entry point, called as NCCL does with live arguments.
    let rc = unsafe { (ncclProfiler_v7.startEvent.unwrap())(ctx, &mut nil, null_mut()) };
    assert_eq!(
        (rc, nil),
        (NcclResult::INVALID_ARGUMENT, null_mut()),
        "NULL descriptor"
    );
    // The panicking start left no slot behind: all of them are still available.
    PANIC_ON.store(0, Ordering::SeqCst);
    let held: Vec<_> = (0..Recorder::MAX_EVENTS)
        .map(|_| start7(ctx, &mut p).1)
        .collect();
    assert!(held.iter().all(|h| !h.is_null()), "{held:?}");
    assert_eq!(finalize(ctx), NcclResult::SUCCESS);
}

#[test]
fn concurrent_starts_and_stops_from_many_threads_stay_consistent() {
    let _g = serial();
    let ctx = init_v7(4) as usize;
    let threads: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let mut accepted = 0usize;
                for i in 0..300 {
                    let mut d = descr_v7(bit::PROXY_STEP, null_mut());
                    d.u.proxyStep.step = i;
                    let (rc, h) = start7(ctx as *mut c_void, &mut d);
                    assert_eq!(rc, NcclResult::SUCCESS);
                    if h.is_null() {
                        continue; // all 4 slots live: declined, as designed
                    }
                    accepted += 1;
                    assert_eq!(
                        record7(h, ProfilerEventState::PROXY_STEP_SEND_WAIT, None),
                        NcclResult::SUCCESS
                    );
                    assert_eq!(stop(h), NcclResult::SUCCESS);
                }
                accepted
            })
        })
        .collect();
    let accepted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(finalize(ctx as *mut c_void), NcclResult::SUCCESS);
    let log = take_log();
    let count = |p: &str| log.iter().filter(|l| l.starts_with(p)).count();
    assert!(accepted > 0);
    assert_eq!(
        count("stop "),
        accepted,
        "every accepted event stopped exactly once"
    );
    assert_eq!(count("state "), accepted);
    // Full tables decline before the profiler runs: it sees only what it keeps.
    assert_eq!(count("start "), accepted);
}
