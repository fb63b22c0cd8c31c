//! The host adapter emulating RCCL (`CCLKIT_FLAVOR=rccl`): a v6 tuner built with
//! `export_tuner!` gets RCCL's constants struct and `float[8][3]` table, its writes
//! to NCCL's fields come back to the host's model at the right cells, and the
//! export side and the host agree on the layout through the same variables.
//!
//! One test function: both sides read the process environment.

use std::ffi::CStr;
use std::sync::Mutex;

use cclkit_abi::error::Result;
use cclkit_abi::raw::common::{Algorithm, Func, Protocol};
use cclkit_abi::tuner::{CollInfo, ConstantsLayout, CostTable, Tuner, TunerInit};
use cclkit_host::tuner::{NvlDomainInfo, TunerConstants, TunerPlugin};

/// What the tuner saw: (layout at init, NET/RING/SIMPLE latency read, numAlgo).
static SEEN: Mutex<Vec<(ConstantsLayout, Option<f64>, usize)>> = Mutex::new(Vec::new());

struct Probe {
    layout: ConstantsLayout,
    read: Option<f64>,
}

impl Tuner for Probe {
    const NAME: &'static CStr = c"rccl-probe";

    fn init(args: TunerInit<'_>) -> Result<Self> {
        let mut c = args.constants.expect("v6 host passes constants");
        let read = c.hw_latency(2, Algorithm::RING, Protocol::SIMPLE);
        c.set_hw_latency(2, Algorithm::TREE, Protocol::LL, 55.5);
        c.set_bw_ratio(0, Algorithm::RING, Protocol::SIMPLE, 0.5);
        Ok(Self {
            layout: c.layout(),
            read,
        })
    }

    fn get_coll_info(&self, _: &CollInfo, t: &mut CostTable<'_>, _: &mut i32) -> Result<()> {
        assert!(
            !t.prefer(Algorithm(7), Protocol::SIMPLE),
            "DIRECT_A2A unsupported"
        );
        t.prefer(Algorithm::TREE, Protocol::LL128);
        SEEN.lock()
            .expect("seen")
            .push((self.layout, self.read, t.num_algo()));
        Ok(())
    }
}

cclkit_abi::export_tuner!(Probe);

fn set_env(flavor: &str, algos: Option<&str>) {
    // SAFETY: the only test in this binary; no other thread reads the environment.
    unsafe {
        std::env::set_var("CCLKIT_FLAVOR", flavor);
        match algos {
            Some(a) => std::env::set_var("CCLKIT_RCCL_NUM_ALGO", a),
            None => std::env::remove_var("CCLKIT_RCCL_NUM_ALGO"),
        }
    }
}

#[test]
fn rccl_emulation_agrees_with_the_export_side() {
    let t = TunerPlugin::from_static_v6(&ncclTunerPlugin_v6);
    let cases = [
        ("nccl", None, ConstantsLayout::Nccl, 7),
        ("rccl", Some("7"), ConstantsLayout::Rccl7, 7),
        ("rccl", None, ConstantsLayout::Rccl8, 8),
    ];
    for (i, (flavor, algos, layout, na)) in cases.into_iter().enumerate() {
        set_env(flavor, algos);
        let mut constants = TunerConstants::default();
        // A distinctive latency the tuner must read at the host layout's offset.
        let lat = 3.25 + i as f64;
        constants.hwLatencies[2][1][2] = lat;
        let mut ctx = t
            .init(8, 2, 0x77, NvlDomainInfo::default(), &mut constants)
            .expect("init");
        assert_eq!(ctx.layout(), layout);
        assert_eq!(
            constants.hwLatencies[2][0][0], 55.5,
            "{layout:?}: write came back"
        );
        let mut expect = TunerConstants::default();
        expect.hwLatencies[2][1][2] = lat;
        expect.hwLatencies[2][0][0] = 55.5;
        assert_eq!(constants, expect, "{layout:?}: nothing else moved");
        let mut table = [10.0f32; 21];
        let mut nch = 0;
        ctx.get_coll_info(Func::ALL_REDUCE, 1 << 20, 1, false, &mut table, &mut nch)
            .expect("getCollInfo");
        let mut want = [10.0f32; 21];
        want[1] = 0.0;
        assert_eq!(table, want, "{layout:?}: TREE/LL128 preferred");
        let seen = SEEN.lock().expect("seen").pop().expect("called");
        assert_eq!(seen, (layout, Some(lat), na));
        ctx.finalize().expect("finalize");
    }
    set_env("", None);
}
