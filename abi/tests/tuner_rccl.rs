//! `ncclTunerPlugin_v5`/`_v6` under each host layout: the same tuner writes the same
//! logical cells, and they land at NCCL's or RCCL's offsets as the host flavour says,
//! never outside the struct (canaries on both sides stay intact).
//!
//! One test function: the layout rule reads the process environment, so the cases run
//! in sequence.

use std::ffi::{CStr, c_void};

use cclkit_abi::error::Result;
use cclkit_abi::raw::common::{Algorithm, NcclResult, Protocol};
use cclkit_abi::raw::tuner::ncclNvlDomainInfo_v5_t;
use cclkit_abi::tuner::{
    BwTableKind as Bw, CollInfo, ConstantsLayout, CostTable, Tuner, TunerInit,
};

struct Writer;

/// Odd values derived from the cell, so a misplaced write is visible.
fn val(i: u32) -> f64 {
    f64::from(i) * 1.75 + 0.3125
}

impl Tuner for Writer {
    const NAME: &'static CStr = c"rccl-writer";

    fn init(args: TunerInit<'_>) -> Result<Self> {
        let Some(mut c) = args.constants else {
            return Ok(Self);
        };
        // Reads first: the host put `val(k)` in double k, so a read proves the offset.
        let probe = c.hw_latency(2, Algorithm::RING, Protocol::SIMPLE);
        let probe_bw = c.bw(Bw::Tree, 1, 2);
        c.set_base_latency(Algorithm::RING, Protocol::LL128, -probe.unwrap_or(0.0));
        c.set_hw_latency(2, Algorithm::PAT, Protocol::SIMPLE, 1001.0);
        c.set_bw(Bw::NvlsTree, 3, 2, -probe_bw.unwrap_or(0.0));
        c.set_bw_ratio(1, Algorithm(7), Protocol::SIMPLE, 1002.0);
        c.set_base_latency(Algorithm(7), Protocol::LL, 1003.0);
        c.set_base_latency(Algorithm(8), Protocol::LL, 1004.0);
        c.set_bw(Bw::LlMax, 4, 0, 1005.0);
        Ok(Self)
    }

    fn get_coll_info(&self, _: &CollInfo, _: &mut CostTable<'_>, _: &mut i32) -> Result<()> {
        Ok(())
    }
}

cclkit_abi::export_tuner!(Writer);

const CANARY: f64 = -7777.125;

/// Calls v5 `init` on `doubles` doubles surrounded by 8 canary doubles per side;
/// returns the struct as written.
fn run(doubles: usize) -> Vec<f64> {
    let mut buf: Vec<f64> = vec![CANARY; doubles + 16];
    for (k, d) in buf[8..8 + doubles].iter_mut().enumerate() {
        *d = val(k as u32);
    }
    let mut nvl = ncclNvlDomainInfo_v5_t::default();
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let init = ncclTunerPlugin_v5.init.expect("init");
    // SAFETY: the buffer holds at least the layout's bytes at index 8.
    let rc = unsafe {
        init(
            &mut ctx,
            3,
            16,
            2,
            None,
            &mut nvl,
            buf.as_mut_ptr().add(8).cast(),
        )
    };
    assert_eq!(rc, NcclResult::SUCCESS);
    let fin = ncclTunerPlugin_v5.finalize.expect("finalize");
    // SAFETY: the context init returned.
    assert_eq!(unsafe { fin(ctx) }, NcclResult::SUCCESS);
    assert!(buf[..8].iter().all(|d| *d == CANARY), "wrote before");
    assert!(
        buf[8 + doubles..].iter().all(|d| *d == CANARY),
        "wrote after"
    );
    buf[8..8 + doubles].to_vec()
}

/// Expected struct: every double as the host wrote it, plus the tuner's writes at
/// `(index, value)`.
fn expect(doubles: usize, writes: &[(usize, f64)]) -> Vec<f64> {
    let mut v: Vec<f64> = (0..doubles).map(|k| val(k as u32)).collect();
    for &(i, x) in writes {
        v[i] = x;
    }
    v
}

fn set_env(flavor: &str, algos: Option<&str>) {
    // SAFETY: this file's only test runs alone in its process (one #[test]) and no
    // other thread reads the environment meanwhile.
    unsafe {
        std::env::set_var("CCLKIT_FLAVOR", flavor);
        match algos {
            Some(a) => std::env::set_var("CCLKIT_RCCL_NUM_ALGO", a),
            None => std::env::remove_var("CCLKIT_RCCL_NUM_ALGO"),
        }
    }
}

#[test]
fn each_host_layout_gets_writes_at_its_own_offsets() {
    // NCCL, 1152 bytes (144 doubles): A = 7.
    // hw[2][RING][SIMPLE] = (2*7+1)*3+2 + 21 = 68; tree bw [1][2] = 120 + 1*3+2 = 125.
    set_env("nccl", None);
    assert_eq!(
        cclkit_abi::export::tuner::host::v5_layout(),
        ConstantsLayout::Nccl
    );
    let got = run(144);
    assert_eq!(
        got,
        expect(
            144,
            &[
                (4, -val(68)),
                (21 + 3 * (2 * 7 + 6) + 2, 1001.0),
                (132 + 3 * 3 + 2, -val(125)),
            ]
        )
    );

    // RCCL with 7 algorithms, 1488 bytes (186 doubles): NCCL's offsets plus bwRatio
    // at double 144; bwRatio[1][7] does not exist.
    set_env("rccl", Some("7"));
    let got = run(186);
    assert_eq!(
        got,
        expect(
            186,
            &[
                (4, -val(68)),
                (21 + 3 * (2 * 7 + 6) + 2, 1001.0),
                (132 + 3 * 3 + 2, -val(125)),
            ]
        )
    );

    // RCCL with 8 algorithms, 1632 bytes (204 doubles): base 24, hw at 24 (3×24),
    // bandwidth tables at 96, 108, 120, 132, 144, bwRatio at 156.
    set_env("rccl", None);
    assert_eq!(
        cclkit_abi::export::tuner::host::v5_layout(),
        ConstantsLayout::Rccl8
    );
    let hw_ring_simple = 24 + 3 * (2 * 8 + 1) + 2;
    let tree_1_2 = 132 + 3 + 2;
    let got = run(204);
    assert_eq!(
        got,
        expect(
            204,
            &[
                (4, -val(hw_ring_simple as u32)),
                (24 + 3 * (2 * 8 + 6) + 2, 1001.0),
                (144 + 3 * 3 + 2, -val(tree_1_2)),
                (156 + 3 * (8 + 7) + 2, 1002.0),
                (21, 1003.0),
            ]
        )
    );
    set_env("", None);
}
