//! The constants struct and cost-table shape of the host cclkit emulates.
//!
//! Under NCCL a v5/v6 tuner gets NCCL's 1152-byte constants and a `float[7][3]` cost
//! table. Under RCCL (`CCLKIT_FLAVOR=rccl`, or `--rccl` where a command offers it)
//! it gets RCCL's struct with `bwRatio` appended and RCCL's algorithm count: 8
//! (current RCCL, `DIRECT_A2A`: 1632 bytes, `float[8][3]`), or 7 with
//! `CCLKIT_RCCL_NUM_ALGO=7` (released RCCL: 1488 bytes). The export side of cclkit
//! follows the same variables (see `cclkit_abi::export::tuner::host`), so a cclkit
//! tuner and a cclkit host agree on the layout. v7 is NCCL-only (RCCL has no v7).
//!
//! cclkit's runtime has no DIRECT_A2A algorithm: its cost-table row is handed over
//! at -1 (unsupported) and RCCL's `bwRatio` starts at 1.0 (no scaling); what a tuner
//! writes to NCCL's fields comes back to the host's NCCL-shaped model.

use std::ffi::c_void;

use cclkit_abi::raw::tuner::{ncclTunerConstants_v5_t, rcclTunerConstants_v5_t};
pub use cclkit_abi::tuner::ConstantsLayout;

use crate::config::Flavor;
use crate::guard::{Overrun, guarded};

/// The layout a v5/v6 tuner gets from this process's host flavour.
pub fn host_layout() -> ConstantsLayout {
    let flavor = std::env::var("CCLKIT_FLAVOR").ok();
    let algos = std::env::var("CCLKIT_RCCL_NUM_ALGO").ok();
    layout_for(
        flavor
            .as_deref()
            .and_then(Flavor::parse)
            .unwrap_or_default(),
        algos.as_deref(),
    )
}

/// The layout for `flavor` with `CCLKIT_RCCL_NUM_ALGO` = `rccl_num_algo`.
pub fn layout_for(flavor: Flavor, rccl_num_algo: Option<&str>) -> ConstantsLayout {
    match flavor {
        Flavor::Nccl => ConstantsLayout::Nccl,
        Flavor::Rccl if rccl_num_algo.map(str::trim) == Some("7") => ConstantsLayout::Rccl7,
        Flavor::Rccl => ConstantsLayout::Rccl8,
    }
}

/// RCCL's `bwRatio` as cclkit's host fills it: 1.0 everywhere (no scaling).
const NEUTRAL_RATIO: f64 = 1.0;

/// Calls `f` with RCCL's `A`-algorithm constants built from `nccl` (canary-guarded);
/// on return `nccl` holds what the tuner left in NCCL's fields.
///
/// # Safety
/// `f` must only hand the pointer to a tuner `init` as its constants argument.
pub(crate) unsafe fn with_rccl<const A: usize, R>(
    nccl: &mut ncclTunerConstants_v5_t,
    f: impl FnOnce(*mut c_void) -> R,
) -> (R, Option<Overrun>) {
    let mut wide = rcclTunerConstants_v5_t::<A>::zeroed();
    for rows in wide.bwRatio.iter_mut() {
        for row in rows.iter_mut() {
            *row = [NEUTRAL_RATIO; 3];
        }
    }
    wide.update_from_nccl(nccl);
    // SAFETY: the struct is plain f64s (any bit pattern valid), at most 1632 bytes.
    let (value, r, overrun) = unsafe { guarded(&wide, |p| f(p.cast())) };
    if overrun.is_none() {
        *nccl = value.to_nccl();
    }
    (r, overrun)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flavour_and_algorithm_count_pick_the_layout() {
        assert_eq!(layout_for(Flavor::Nccl, Some("7")), ConstantsLayout::Nccl);
        assert_eq!(layout_for(Flavor::Rccl, None), ConstantsLayout::Rccl8);
        assert_eq!(layout_for(Flavor::Rccl, Some("8")), ConstantsLayout::Rccl8);
        assert_eq!(layout_for(Flavor::Rccl, Some(" 7")), ConstantsLayout::Rccl7);
    }

    #[test]
    fn rccl_struct_round_trips_nccl_fields_and_sees_overruns() {
        let mut c = cclkit_abi::raw::tuner::NCCL_DEFAULT_CONSTANTS;
        // SAFETY: the closure writes inside the 1632-byte struct, then one past it.
        let (seen, overrun) = unsafe {
            with_rccl::<8, _>(&mut c, |p| {
                let d = p.cast::<f64>();
                let ratio = d.add(156).read();
                // hwLatencies[NET][RING][SIMPLE] in the 8-algorithm layout.
                d.add(24 + 3 * (2 * 8 + 1) + 2).write(123.5);
                ratio
            })
        };
        assert_eq!(seen, NEUTRAL_RATIO);
        assert!(overrun.is_none());
        assert_eq!(c.hwLatencies[2][1][2], 123.5);
        // SAFETY: deliberately writes the first byte past the struct, into the canary.
        let (_, overrun) =
            unsafe { with_rccl::<7, _>(&mut c, |p| p.cast::<u8>().add(1488).write(0)) };
        assert_eq!(overrun.map(|o| o.size), Some(1488));
    }
}
