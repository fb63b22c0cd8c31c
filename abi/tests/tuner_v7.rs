//! `ncclTunerPlugin_v7` from `export_tuner!`: the v6 slots with NCCL's 1272-byte v7
//! constants. The tuner sees a view of the v7 struct itself: its writes land at the
//! v7 offsets (the fifth GPU-generation row included), everything else and the bytes
//! around the struct stay as the host left them.

use std::ffi::{CStr, c_void};

use cclkit_abi::error::Result;
use cclkit_abi::raw::common::{Algorithm, Protocol};
use cclkit_abi::raw::common::{Func, NcclResult};
use cclkit_abi::raw::tuner::{ncclNvlDomainInfo_v7_t, ncclTunerConstants_v7_t};
use cclkit_abi::tuner::{
    BwTableKind as Bw, CollInfo, ConstantsLayout, CostTable, Tuner, TunerInit,
};

/// Seeds the values this test writes, so a tuner and its checker agree.
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// A value in 1..1000 derived from `SEED` and `i` (an odd, non-round number).
fn value(i: u64) -> f64 {
    let x = SEED.wrapping_mul(i + 1).rotate_left(17) % 99_991;
    (x as f64) / 100.0 + 0.37
}

/// Rewrites a few constants it can see, and records what it read.
struct Rewriter;

impl Tuner for Rewriter {
    const NAME: &'static CStr = c"v7-rewriter";

    fn init(args: TunerInit<'_>) -> Result<Self> {
        let mut c = args.constants.expect("a v7 host passes constants");
        assert_eq!(args.host_abi, 7);
        assert_eq!(c.layout(), ConstantsLayout::NcclV7);
        // Read what the host put in Blackwell's row: it must be the v7 row 3.
        assert_eq!(c.bw(Bw::Tree, 3, 2), Some(value(100)));
        assert_eq!(c.bw(Bw::Tree, 4, 1), Some(value(210)));
        assert_eq!(c.bw(Bw::Tree, 5, 0), None, "no sixth generation");
        assert!(c.set_bw(Bw::LlMax, 3, 1, value(1)));
        assert!(c.set_bw(Bw::NvlsTree, 2, 0, value(2)));
        assert!(c.set_hw_latency(2, Algorithm::PAT, Protocol::SIMPLE, value(3)));
        assert!(c.set_bw(Bw::RingLl128, 4, 2, value(4)));
        assert!(
            !c.set_bw_ratio(0, Algorithm::RING, Protocol::LL, 1.0),
            "NCCL has no bwRatio"
        );
        assert!(
            !c.set_base_latency(Algorithm(7), Protocol::LL, 1.0),
            "no eighth algorithm"
        );
        Ok(Self)
    }

    fn get_coll_info(&self, _: &CollInfo, t: &mut CostTable<'_>, _: &mut i32) -> Result<()> {
        assert_eq!((t.num_algo(), t.num_proto()), (7, 3));
        Ok(())
    }
}

cclkit_abi::export_tuner!(Rewriter);

/// The v7 constants between 64-byte canaries, as a careful host would pass them.
#[repr(C, align(8))]
struct Guarded {
    before: [u8; 64],
    c: ncclTunerConstants_v7_t,
    after: [u8; 64],
}

#[test]
fn v7_init_writes_land_at_v7_offsets_and_keep_the_fifth_row() {
    let t = &ncclTunerPlugin_v7;
    // SAFETY: `name` is the tuner's static C string.
    assert_eq!(unsafe { CStr::from_ptr(t.name) }, c"v7-rewriter");
    assert!(t.getChunkSize.is_none(), "no chunk size: the slot is NULL");

    let mut g = Guarded {
        before: [0xa5; 64],
        c: ncclTunerConstants_v7_t::nccl_defaults(),
        after: [0x5a; 64],
    };
    g.c.perChMaxTreeBws[3][2] = value(100);
    let fifth: Vec<f64> = (0..15).map(|i| value(200 + i)).collect();
    for (row, vals) in [
        &mut g.c.llMaxBws[4],
        &mut g.c.perChMaxRingLL128Bws[4],
        &mut g.c.perChMaxTreeLL128Bws[4],
        &mut g.c.perChMaxTreeBws[4],
        &mut g.c.perChMaxNVLSTreeBws[4],
    ]
    .into_iter()
    .zip(fifth.chunks(3))
    {
        row.copy_from_slice(vals);
    }
    let before = g.c;
    let mut nvl = ncclNvlDomainInfo_v7_t::default();
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let init = t.init.expect("init");
    // SAFETY: v7 `init` with a context out-pointer, NVL info and v7 constants, all
    // valid for the call; NULL logger is allowed.
    let rc = unsafe { init(&mut ctx, 7, 8, 2, None, &mut nvl, &mut g.c) };
    assert_eq!(rc, NcclResult::SUCCESS);
    assert!(!ctx.is_null());

    // The writes, read back through the raw bytes at NCCL's v7 offsets.
    let bytes: &[u8; 1272] =
        // SAFETY: the struct is 1272 bytes of f64, readable as bytes.
        unsafe { &*(&g.c as *const ncclTunerConstants_v7_t).cast() };
    let at = |off: usize| f64::from_ne_bytes(bytes[off..off + 8].try_into().expect("8 bytes"));
    // llMaxBws at 672, [3][1] → (3 * 3 + 1) * 8.
    assert_eq!(at(672 + (3 * 3 + 1) * 8), value(1));
    // perChMaxNVLSTreeBws at 1152, [2][0].
    assert_eq!(at(1152 + (2 * 3) * 8), value(2));
    // hwLatencies at 168, [2][6][2] → ((2 * 7 + 6) * 3 + 2) * 8.
    assert_eq!(at(168 + ((2 * 7 + 6) * 3 + 2) * 8), value(3));

    // Nothing else changed: the fifth row and every other cell are the host's.
    let mut expect = before;
    expect.llMaxBws[3][1] = value(1);
    expect.perChMaxNVLSTreeBws[2][0] = value(2);
    expect.hwLatencies[2][6][2] = value(3);
    expect.perChMaxRingLL128Bws[4][2] = value(4);
    assert_eq!(g.c, expect);
    assert_eq!(g.before, [0xa5; 64]);
    assert_eq!(g.after, [0x5a; 64]);

    let mut table = [-1.0f32; 21];
    // RING (1) × 3 protocols + SIMPLE (2): the one supported entry.
    table[3 + 2] = 10.0;
    let mut nch = 0;
    let get = t.getCollInfo.expect("getCollInfo");
    // SAFETY: v7 `getCollInfo` with this context and NCCL's flat table.
    let rc = unsafe {
        get(
            ctx,
            Func::ALL_REDUCE,
            1 << 20,
            1,
            table.as_mut_ptr().cast(),
            7,
            3,
            0,
            &mut nch,
        )
    };
    assert_eq!(rc, NcclResult::SUCCESS);
    let fin = t.finalize.expect("finalize");
    // SAFETY: the context from init, finalized once.
    assert_eq!(unsafe { fin(ctx) }, NcclResult::SUCCESS);
}

#[test]
fn v7_init_without_constants_still_initialises() {
    // NULL constants would be a host bug NCCL never has; the adapter must not crash,
    // and this tuner's init insists on constants, so the call fails cleanly.
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let init = ncclTunerPlugin_v7.init.expect("init");
    // SAFETY: v7 `init` with NULL NVL info and constants; valid out-pointer.
    let rc = unsafe {
        init(
            &mut ctx,
            1,
            2,
            1,
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_ne!(rc, NcclResult::SUCCESS, "the tuner's panic is contained");
    assert!(ctx.is_null());
}
