//! f16, bf16, fp8 e4m3 and fp8 e5m2 conversions against references written
//! from the format definitions (tests/common): every bit pattern decodes to
//! its exact value and round-trips; encoding rounds to nearest even at every
//! rounding boundary of every format, overflows (f16/bf16) or saturates
//! (fp8) as documented, and agrees with the reference on random f32s.

mod common;

use cclkit_kernels::{Bf16, F16, Fp8E4M3, Fp8E5M2};
use common::{BF16, E4M3, E5M2, F16 as F16_FMT, Format, Kind, Rng};

/// The crate's conversions for one format, as plain functions on bits.
struct Conv {
    fmt: Format,
    to_f32: fn(u32) -> f32,
    from_f32: fn(f32) -> u32,
}

fn convs() -> [(&'static str, Conv); 4] {
    [
        (
            "f16",
            Conv {
                fmt: F16_FMT,
                to_f32: |b| F16(b as u16).to_f32(),
                from_f32: |f| u32::from(F16::from_f32(f).0),
            },
        ),
        (
            "bf16",
            Conv {
                fmt: BF16,
                to_f32: |b| Bf16(b as u16).to_f32(),
                from_f32: |f| u32::from(Bf16::from_f32(f).0),
            },
        ),
        (
            "e4m3",
            Conv {
                fmt: E4M3,
                to_f32: |b| Fp8E4M3(b as u8).to_f32(),
                from_f32: |f| u32::from(Fp8E4M3::from_f32(f).0),
            },
        ),
        (
            "e5m2",
            Conv {
                fmt: E5M2,
                to_f32: |b| Fp8E5M2(b as u8).to_f32(),
                from_f32: |f| u32::from(Fp8E5M2::from_f32(f).0),
            },
        ),
    ]
}

/// Every bit pattern (2^16 or 2^8) decodes exactly, and encoding the decoded
/// value gives the same bits back (e5m2 infinities excepted: they saturate);
/// NaNs stay NaN and come back quiet with their sign.
#[test]
fn every_bit_pattern_decodes_exactly_and_round_trips() {
    for (name, c) in convs() {
        let sign_bit = 1u32 << (c.fmt.width() - 1);
        for bits in 0..(1u32 << c.fmt.width()) {
            let want = c.fmt.decode(bits);
            let got = (c.to_f32)(bits);
            let back = (c.from_f32)(got);
            if want.is_nan() {
                assert!(
                    got.is_nan(),
                    "{name} {bits:#x} should decode to NaN, got {got}"
                );
                assert!(
                    c.fmt.is_nan(back),
                    "{name} NaN {bits:#x} re-encoded as {back:#x}"
                );
                assert_eq!(
                    back & sign_bit,
                    bits & sign_bit,
                    "{name} NaN {bits:#x} lost its sign"
                );
            } else {
                assert_eq!(
                    f64::from(got),
                    want,
                    "{name} {bits:#x} decodes to {got}, not {want}"
                );
                assert_eq!(
                    got.is_sign_negative(),
                    bits & sign_bit != 0,
                    "{name} {bits:#x} sign"
                );
                if want.is_infinite() && c.fmt.kind == Kind::IeeeSatfinite {
                    // e5m2 has infinities, but conversions to it saturate.
                    let max = c.fmt.table().last().unwrap().1;
                    assert_eq!(back, max | (bits & sign_bit), "{name} {bits:#x} saturates");
                } else {
                    assert_eq!(back, bits, "{name} {bits:#x} -> {got} -> {back:#x}");
                }
            }
        }
    }
}

/// f16 NaNs keep their top payload bits and gain the quiet bit (what F16C
/// does, so the portable and F16C kernels agree).
#[test]
fn f16_nan_payloads_are_quieted_not_lost() {
    for bits in (0x7c01u16..=0x7fff).chain(0xfc01..=0xffff) {
        assert_eq!(
            F16::from_f32(F16(bits).to_f32()).0,
            bits | 0x0200,
            "{bits:#06x}"
        );
    }
}

/// For every pair of adjacent non-negative values of every format: the
/// lower value, one f32 step above it, just below the midpoint, the midpoint
/// itself (ties go to the even pattern) and just above it. Both signs. This
/// visits every rounding decision the format has.
#[test]
fn encoding_rounds_to_nearest_even_at_every_boundary() {
    for (name, c) in convs() {
        let table = c.fmt.table();
        for pair in table.windows(2) {
            let (lo, hi) = (pair[0].0, pair[1].0);
            let mid = (lo + hi) / 2.0; // exact: adjacent values differ in few bits
            let mid32 = mid as f32;
            assert_eq!(
                f64::from(mid32),
                mid,
                "{name}: midpoint not representable in f32"
            );
            let probes = [
                lo as f32,
                (lo as f32).next_up(),
                mid32.next_down(),
                mid32,
                mid32.next_up(),
                hi as f32,
            ];
            for p in probes {
                for x in [p, -p] {
                    let want = c.fmt.round(&table, f64::from(x));
                    let got = (c.from_f32)(x);
                    assert_eq!(
                        got,
                        want,
                        "{name}: {x:e} ({:#010x}) -> {got:#x}, want {want:#x}",
                        x.to_bits()
                    );
                }
            }
        }
    }
}

/// Overflow: f16/bf16 go to infinity from the halfway point above the
/// largest value (IEEE); fp8 saturates everything above the largest value,
/// infinities included (`__NV_SATFINITE`).
#[test]
fn overflow_goes_to_inf_or_saturates() {
    assert_eq!(F16::from_f32(65519.99).0, 0x7bff);
    assert_eq!(F16::from_f32(65520.0).0, 0x7c00);
    assert_eq!(F16::from_f32(f32::NEG_INFINITY).0, 0xfc00);
    assert_eq!(Bf16::from_f32(f32::MAX).0, 0x7f80);
    assert_eq!(Bf16::from_f32(f32::INFINITY).0, 0x7f80);
    for x in [448.0f32, 449.0, 464.0, 480.0, 1e30, f32::MAX, f32::INFINITY] {
        assert_eq!(Fp8E4M3::from_f32(x), Fp8E4M3::MAX, "e4m3 {x}");
        assert_eq!(Fp8E4M3::from_f32(-x).0, 0xfe, "e4m3 -{x}");
    }
    for x in [57344.0f32, 61439.0, 61440.0, 65536.0, f32::INFINITY] {
        assert_eq!(Fp8E5M2::from_f32(x), Fp8E5M2::MAX, "e5m2 {x}");
        assert_eq!(Fp8E5M2::from_f32(-x).0, 0xfb, "e5m2 -{x}");
    }
    assert_eq!(Fp8E4M3::from_f32(f32::NAN).0, 0x7f);
    assert_eq!(Fp8E4M3::from_f32(-f32::NAN).0, 0xff);
    assert!(Fp8E5M2::from_f32(f32::NAN).is_nan());
}

/// Random f32 bit patterns (every exponent, NaNs and infinities included)
/// and random values near each format's range agree with the reference.
#[test]
fn encoding_matches_reference_on_random_f32() {
    let mut rng = Rng::new(0x5eed);
    for (name, c) in convs() {
        let table = c.fmt.table();
        let max = table.last().unwrap().0;
        for i in 0..200_000 {
            let x = if i % 2 == 0 {
                f32::from_bits(rng.next_u64() as u32)
            } else {
                // Concentrate on the format's own range, subnormals included.
                let mag = rng.range(0.0, 1.0).powi(8) * max * 1.1;
                (if rng.next_u64() & 1 == 0 { mag } else { -mag }) as f32
            };
            let got = (c.from_f32)(x);
            if x.is_nan() {
                assert!(
                    c.fmt.is_nan(got),
                    "{name}: NaN {:#010x} -> {got:#x}",
                    x.to_bits()
                );
            } else {
                let want = c.fmt.round(&table, f64::from(x));
                assert_eq!(got, want, "{name}: {x:e} ({:#010x})", x.to_bits());
            }
        }
    }
}
