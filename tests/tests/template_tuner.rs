//! The packaged tuner template through the v1–v7 tables, as NCCL calls them: the
//! flat float[7][3] cost table between canaries, only supported entries touched.

// Every unsafe call below is an NCCL-convention call into the plugin under test.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_int, c_void};

use cclkit_abi::raw::common::{Algorithm, Func, NCCL_ALGO_PROTO_IGNORE, NcclResult, Protocol};
use cclkit_abi::raw::tuner::*;
use cclkit_tests::plugin;

const NA: usize = 7;
const NP: usize = 3;
const CANARIES: usize = 8;
const CANARY: f32 = 4242.0;

/// A table with Tree and Ring supported (cost 100) between canaries.
fn table() -> Vec<f32> {
    let mut t = vec![CANARY; CANARIES * 2 + NA * NP];
    let flat = &mut t[CANARIES..CANARIES + NA * NP];
    flat.fill(NCCL_ALGO_PROTO_IGNORE);
    for a in [Algorithm::TREE, Algorithm::RING] {
        for p in 0..NP {
            flat[a.0 as usize * NP + p] = 100.0;
        }
    }
    t
}

/// The chosen entry (the only one lowered below 100), checking canaries and that
/// unsupported entries stayed -1.
fn chosen(t: &[f32]) -> (Algorithm, Protocol) {
    assert!(
        t[..CANARIES]
            .iter()
            .chain(&t[CANARIES + NA * NP..])
            .all(|&c| c == CANARY),
        "canaries damaged"
    );
    let flat = &t[CANARIES..CANARIES + NA * NP];
    for (i, &c) in flat.iter().enumerate() {
        if i / NP > 1 {
            assert_eq!(
                c, NCCL_ALGO_PROTO_IGNORE,
                "tuner enabled unsupported entry {i}"
            );
        }
    }
    let low: Vec<usize> = (0..NA * NP)
        .filter(|&i| flat[i] >= 0.0 && flat[i] < 100.0)
        .collect();
    assert_eq!(low.len(), 1, "exactly one entry preferred: {flat:?}");
    (
        Algorithm((low[0] / NP) as i32),
        Protocol((low[0] % NP) as i32),
    )
}

fn sym<T>(lib: &libloading::Library, v: u32) -> &'static T {
    let name = format!("ncclTunerPlugin_v{v}\0");
    // SAFETY: a data object of the version's table type; the library outlives the test.
    unsafe { &**lib.get::<*const T>(name.as_bytes()).unwrap() }
}

#[test]
fn decisions_through_v2_v3_v4_v5_v6_and_v1() {
    // SAFETY: env set before any thread of this test binary reads it (single test fn).
    unsafe {
        std::env::set_var("CCLKIT_TEMPLATE_THRESHOLD", "4096");
        std::env::set_var("CCLKIT_TEMPLATE_CHANNELS", "3");
    }
    // SAFETY: loading the plugin under test.
    let lib = unsafe { libloading::Library::new(plugin("libnccl-tuner-template.so")) }.unwrap();
    let small = 1000usize;
    let big = 1 << 20;

    // v6: ctx first, constants between canaries, getChunkSize absent.
    let t6: &ncclTuner_v6_t = sym(&lib, 6);
    assert!(t6.getChunkSize.is_none());
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let mut consts = [ncclTunerConstants_v5_t::default(); 3];
    consts[0].baseLatencies[0][0] = 7.0;
    consts[2].baseLatencies[0][0] = 9.0;
    let mut nvl = ncclNvlDomainInfo_v5_t {
        nNvlDomains: 1,
        minRanksPerNvlDomain: 4,
        maxRanksPerNvlDomain: 4,
    };
    // SAFETY: NCCL's v6 init.
    let r = unsafe { (t6.init.unwrap())(&mut ctx, 99, 4, 1, None, &mut nvl, &mut consts[1]) };
    assert_eq!(r, NcclResult::SUCCESS);
    assert_eq!(
        (consts[0].baseLatencies[0][0], consts[2].baseLatencies[0][0]),
        (7.0, 9.0)
    );
    for (bytes, want, ch) in [
        (small, (Algorithm::TREE, Protocol::LL), 3),
        (big, (Algorithm::RING, Protocol::SIMPLE), 3),
    ] {
        let mut t = table();
        let mut nch: c_int = 0;
        let flat = t[CANARIES..].as_mut_ptr();
        // SAFETY: the flat table passed as float**, as NCCL does.
        let r = unsafe {
            (t6.getCollInfo.unwrap())(
                ctx,
                Func::ALL_REDUCE,
                bytes,
                1,
                flat.cast(),
                7,
                3,
                0,
                &mut nch,
            )
        };
        assert_eq!(r, NcclResult::SUCCESS);
        assert_eq!(chosen(&t), want);
        assert_eq!(nch, ch);
    }
    // Tree unsupported for this call: nothing may be enabled, and the choice stays NCCL's.
    let mut t = table();
    let flat = &mut t[CANARIES..CANARIES + NA * NP];
    flat[..NP].fill(NCCL_ALGO_PROTO_IGNORE);
    let mut nch: c_int = 0;
    // SAFETY: as above.
    let r = unsafe {
        (t6.getCollInfo.unwrap())(
            ctx,
            Func::ALL_REDUCE,
            small,
            1,
            t[CANARIES..].as_mut_ptr().cast(),
            7,
            3,
            0,
            &mut nch,
        )
    };
    assert_eq!(r, NcclResult::SUCCESS);
    assert_eq!(t[CANARIES..CANARIES + NP], [NCCL_ALGO_PROTO_IGNORE; 3]);
    assert_eq!(nch, 0, "no choice made, channels untouched");
    // SAFETY: ctx from init; a second finalize is rejected, not a crash.
    unsafe {
        assert_eq!((t6.finalize.unwrap())(ctx), NcclResult::SUCCESS);
        assert_eq!(
            (t6.finalize.unwrap())(std::ptr::null_mut()),
            NcclResult::INVALID_ARGUMENT
        );
    }

    // v5: same shapes as v6 without getChunkSize.
    let t5: &ncclTuner_v5_t = sym(&lib, 5);
    let mut ctx = std::ptr::null_mut();
    // SAFETY: NCCL's v5 init with NULL nvl/constants (allowed).
    assert_eq!(
        unsafe {
            (t5.init.unwrap())(
                &mut ctx,
                5,
                2,
                2,
                None,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        },
        NcclResult::SUCCESS
    );
    let mut t = table();
    let mut nch = 0;
    // SAFETY: as above.
    assert_eq!(
        unsafe {
            (t5.getCollInfo.unwrap())(
                ctx,
                Func::BROADCAST,
                big,
                1,
                t[CANARIES..].as_mut_ptr().cast(),
                7,
                3,
                1,
                &mut nch,
            )
        },
        NcclResult::SUCCESS
    );
    assert_eq!(chosen(&t), (Algorithm::RING, Protocol::SIMPLE));
    // SAFETY: ctx from init.
    assert_eq!(unsafe { (t5.finalize.unwrap())(ctx) }, NcclResult::SUCCESS);

    // v4 and v3: ctx last in init; v3 has no regBuff.
    let t4: &ncclTuner_v4_t = sym(&lib, 4);
    let mut ctx = std::ptr::null_mut();
    // SAFETY: NCCL's v4 init (context out-pointer last).
    assert_eq!(
        unsafe { (t4.init.unwrap())(8, 2, None, &mut ctx) },
        NcclResult::SUCCESS
    );
    let mut t = table();
    let mut nch = 0;
    // SAFETY: as above.
    assert_eq!(
        unsafe {
            (t4.getCollInfo.unwrap())(
                ctx,
                Func::ALL_GATHER,
                small,
                2,
                t[CANARIES..].as_mut_ptr().cast(),
                7,
                3,
                0,
                &mut nch,
            )
        },
        NcclResult::SUCCESS
    );
    assert_eq!(chosen(&t), (Algorithm::TREE, Protocol::LL));
    // SAFETY: ctx from init.
    assert_eq!(unsafe { (t4.destroy.unwrap())(ctx) }, NcclResult::SUCCESS);
    let t3: &ncclTuner_v3_t = sym(&lib, 3);
    let mut ctx = std::ptr::null_mut();
    // SAFETY: NCCL's v3 init; a 6-algorithm table (NCCL 2.22 had no PAT).
    unsafe {
        assert_eq!(
            (t3.init.unwrap())(8, 2, None, &mut ctx),
            NcclResult::SUCCESS
        );
        let mut t6a = vec![100.0f32; 6 * 3];
        t6a[6..].fill(NCCL_ALGO_PROTO_IGNORE);
        let mut nch = 0;
        assert_eq!(
            (t3.getCollInfo.unwrap())(
                ctx,
                Func::REDUCE,
                big,
                1,
                t6a.as_mut_ptr().cast(),
                6,
                3,
                &mut nch
            ),
            NcclResult::SUCCESS
        );
        assert_eq!(
            t6a[Algorithm::RING.0 as usize * 3 + Protocol::SIMPLE.0 as usize],
            0.0
        );
        assert_eq!((t3.destroy.unwrap())(ctx), NcclResult::SUCCESS);
    }

    // v2: returns algorithm/protocol directly.
    let t2: &ncclTuner_v2_t = sym(&lib, 2);
    let mut ctx = std::ptr::null_mut();
    // SAFETY: NCCL's v2 calls.
    unsafe {
        assert_eq!(
            (t2.init.unwrap())(4, 1, None, &mut ctx),
            NcclResult::SUCCESS
        );
        let (mut a, mut p, mut nch) = (-1, -1, 0);
        assert_eq!(
            (t2.getCollInfo.unwrap())(
                ctx,
                Func::ALL_REDUCE,
                small,
                0,
                0,
                1,
                &mut a,
                &mut p,
                &mut nch
            ),
            NcclResult::SUCCESS
        );
        assert_eq!(
            (Algorithm(a), Protocol(p), nch),
            (Algorithm::TREE, Protocol::LL, 3)
        );
        assert_eq!(
            (t2.getCollInfo.unwrap())(
                ctx,
                Func::ALL_REDUCE,
                big,
                0,
                0,
                1,
                &mut a,
                &mut p,
                &mut nch
            ),
            NcclResult::SUCCESS
        );
        assert_eq!(
            (Algorithm(a), Protocol(p)),
            (Algorithm::RING, Protocol::SIMPLE)
        );
        assert_eq!((t2.destroy.unwrap())(ctx), NcclResult::SUCCESS);
    }

    // v1: process-global, no context.
    let t1: &ncclTuner_v1_t = sym(&lib, 1);
    // SAFETY: NCCL's v1 calls.
    unsafe {
        assert_eq!((t1.init.unwrap())(4, 1, None), NcclResult::SUCCESS);
        let (mut a, mut p, mut nch) = (-1, -1, 0);
        assert_eq!(
            (t1.getCollInfo.unwrap())(Func::ALL_REDUCE, big, 0, 0, 1, &mut a, &mut p, &mut nch),
            NcclResult::SUCCESS
        );
        assert_eq!(
            (Algorithm(a), Protocol(p)),
            (Algorithm::RING, Protocol::SIMPLE)
        );
        assert_eq!((t1.destroy.unwrap())(), NcclResult::SUCCESS);
        assert_eq!(
            (t1.getCollInfo.unwrap())(Func::ALL_REDUCE, big, 0, 0, 1, &mut a, &mut p, &mut nch),
            NcclResult::INVALID_USAGE
        );
    }
}
