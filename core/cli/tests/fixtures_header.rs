//! The C fixtures declare every table and struct independently (from NCCL_ABI.md, so
//! they can catch a layout mistake anywhere); compiled with the generated
//! `abi/include/cclkit_abi.h` force-included, their `_Static_assert`s check that the
//! official header agrees with them, version by version.

mod common;

use common::{Plugins, fixture};

fn header() -> String {
    let h = common::abi_include().join("cclkit_abi.h");
    assert!(h.exists(), "{} is missing: run `make headers`", h.display());
    h.display().to_string()
}

#[test]
fn every_net_and_tuner_version_agrees_with_the_generated_header() {
    let p = Plugins::new();
    let h = header();
    for v in 6..=12 {
        p.cc(
            &format!("net{v}.so"),
            &[fixture("net_mock.c")],
            &["-include".into(), h.clone(), format!("-DNET_VERSION={v}")],
        );
    }
    for v in 1..=6 {
        p.cc(
            &format!("tuner{v}.so"),
            &[fixture("tuner_mock.c")],
            &["-include".into(), h.clone(), format!("-DTUNER_VERSION={v}")],
        );
    }
}
