//! The hot path does not allocate: getCollInfo and getChunkSize through the v6
//! table, for rule hits, rule misses that fall to the model, partial rules and
//! chunk rules, counted by a global allocator on this thread.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::c_void;

use cclkit_abi::raw::common::{Func, NcclResult};
use cclkit_abi::tuner::NCCL_DEFAULT_CONSTANTS;
use common::{Channels, Env, Table};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counters are const thread-locals
// without destructors, so touching them never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: forwarded.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn get_coll_info_and_chunk_size_do_not_allocate() {
    let mut env = Env::lock();
    env.config(
        r#"
[[rule]]
collective = "allreduce"
size = "..64K"
algorithm = "tree"
protocol = "ll"
channels = 4

[[rule]]
collective = "allgather"
protocol = "ll128"

[[rule]]
collective = "broadcast"
channels = 3

[[rule]]
collective = "allreduce"
size = "64K.."
algorithm = "ring"
chunk_size = "512K"
"#,
        "toml",
    );
    let t = &cclkit_tuner::ncclTunerPlugin_v6;
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let mut consts = NCCL_DEFAULT_CONSTANTS;
    let mut nvl = Default::default();
    // SAFETY: valid pointers for the call.
    let rc = unsafe { t.init.unwrap()(&mut ctx, 1, 16, 2, None, &mut nvl, &mut consts) };
    assert_eq!(rc, NcclResult::SUCCESS);
    let get = t.getCollInfo.unwrap();
    let chunk = t.getChunkSize.unwrap();

    let calls = |rounds: usize| {
        for i in 0..rounds {
            for func in (0..5).map(Func) {
                let mut table = Table::typical();
                let mut ch = Channels::new();
                let n = 1usize << (i % 32);
                // SAFETY: live context, flat 7×3 table, writable nChannels.
                let rc = unsafe { get(ctx, func, n, 1, table.ptr(), 7, 3, 0, ch.ptr()) };
                assert_eq!(rc, NcclResult::SUCCESS);
                let mut c = 131072usize;
                // SAFETY: live context, writable chunk size.
                let rc = unsafe { chunk(ctx, func, n, 1, 2, 8, &mut c) };
                assert_eq!(rc, NcclResult::SUCCESS);
            }
        }
    };
    // Warm-up: the SDK's guard installs its panic hook on the first call.
    calls(1);
    COUNTING.with(|c| c.set(true));
    calls(200);
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCS.with(Cell::get), 0);

    // The counter works: an init allocates.
    let mut ctx2: *mut c_void = std::ptr::null_mut();
    COUNTING.with(|c| c.set(true));
    // SAFETY: valid pointers for the call.
    let rc = unsafe { t.init.unwrap()(&mut ctx2, 2, 16, 2, None, &mut nvl, &mut consts) };
    COUNTING.with(|c| c.set(false));
    assert_eq!(rc, NcclResult::SUCCESS);
    assert!(ALLOCS.with(Cell::get) > 0);
    // SAFETY: contexts from init, finalized once.
    unsafe {
        assert_eq!(t.finalize.unwrap()(ctx), NcclResult::SUCCESS);
        assert_eq!(t.finalize.unwrap()(ctx2), NcclResult::SUCCESS);
    }
}
