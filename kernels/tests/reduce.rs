//! One binary step, `dst = a ⊕ b`, for every data type × op at odd lengths
//! (0, 1, primes, > 1 MiB), out of place, in place, through the typed API
//! and from misaligned byte offsets, against references computed
//! independently in i128 (integers) and f64 (floats).
//!
//! Integers must be exact, with wrapping sum/prod. For floats a single step
//! must be *correctly rounded*: the f64 result of the exact inputs, rounded
//! once to the type by the reference rounding of tests/common. That is the
//! tightest floating-point bound there is (½ ulp), and the bits NCCL's
//! `__hadd`/`__hmul`/float kernels produce. Min/max must return the exact
//! input `minimumNumber`/`maximumNumber` picks. A NaN result only needs to
//! be a NaN.

mod common;

use cclkit_kernels::{
    DataType, Element, F16, Fp8E4M3, RedOp, as_bytes, reduce, reduce_in_place,
    reduce_in_place_typed, reduce_typed,
};
use common::{
    Rng, Rounder, all_types, bits_at, float_select, float_value, format_of, int_bits, int_value,
    is_int,
};

const OPS: [RedOp; 5] = [RedOp::SUM, RedOp::PROD, RedOp::MIN, RedOp::MAX, RedOp::AVG];

/// Random inputs: for floats half raw bit patterns (NaN, inf, subnormals,
/// everything) and half values of moderate size, so sums and products are
/// mostly finite and interesting; for integers raw bits (wraps often).
fn input(rng: &mut Rng, dtype: DataType, n: usize) -> Vec<u8> {
    let size = dtype.size().unwrap();
    let mut v = rng.bytes(n * size);
    if !is_int(dtype) {
        let rounder = Rounder::new(dtype);
        for i in (0..n).filter(|i| i % 2 == 1) {
            let x = rng.range(-8.0, 8.0);
            common::set_bits(dtype, &mut v, i, rounder.round(x));
        }
    }
    v
}

/// Reference for element `i`: the expected bits, or `None` for "any NaN".
fn expected(dtype: DataType, op: RedOp, rounder: &Rounder, a: u64, b: u64) -> Option<u64> {
    if is_int(dtype) {
        let (x, y) = (int_value(dtype, a), int_value(dtype, b));
        let r = match op {
            RedOp::SUM | RedOp::AVG => x + y,
            RedOp::PROD => x.wrapping_mul(y),
            RedOp::MIN => x.min(y),
            _ => x.max(y),
        };
        return Some(int_bits(dtype, r));
    }
    match op {
        RedOp::MIN => return Some(float_select(dtype, a, b, true)),
        RedOp::MAX => return Some(float_select(dtype, a, b, false)),
        _ => {}
    }
    let (x, y) = (float_value(dtype, a), float_value(dtype, b));
    let r = if op == RedOp::PROD { x * y } else { x + y };
    if r.is_nan() {
        None
    } else {
        Some(rounder.round(r))
    }
}

fn is_nan(dtype: DataType, bits: u64) -> bool {
    !is_int(dtype) && float_value(dtype, bits).is_nan()
}

fn check(dtype: DataType, op: RedOp, what: &str, a: &[u8], b: &[u8], got: &[u8]) {
    let rounder = Rounder::new(dtype);
    let n = a.len() / dtype.size().unwrap();
    for i in 0..n {
        let (x, y, g) = (
            bits_at(dtype, a, i),
            bits_at(dtype, b, i),
            bits_at(dtype, got, i),
        );
        match expected(dtype, op, &rounder, x, y) {
            None => assert!(
                is_nan(dtype, g),
                "{dtype:?} {op:?} {what} [{i}]: {x:#x} ⊕ {y:#x} = {g:#x}, want NaN"
            ),
            Some(want) => assert_eq!(
                g, want,
                "{dtype:?} {op:?} {what} [{i}] of {n}: {x:#x} ⊕ {y:#x} = {g:#x}, want {want:#x}"
            ),
        }
    }
}

/// Element counts: empty, tiny, primes around vector widths and block sizes,
/// and one above 1 MiB of data for the type.
fn lengths(dtype: DataType) -> Vec<usize> {
    let mut v = vec![
        0, 1, 2, 3, 5, 7, 13, 17, 31, 61, 127, 257, 1021, 4099, 65537,
    ];
    v.push((1 << 20) / dtype.size().unwrap() + 13);
    v
}

#[test]
fn every_type_and_op_out_of_place() {
    let mut rng = Rng::new(1);
    for dtype in all_types() {
        for n in lengths(dtype) {
            let (a, b) = (input(&mut rng, dtype, n), input(&mut rng, dtype, n));
            for op in OPS {
                let mut dst = vec![0xa5u8; a.len()];
                reduce(dtype, op, &mut dst, &a, &b).unwrap();
                check(dtype, op, "reduce", &a, &b, &dst);
            }
        }
    }
}

#[test]
fn every_type_and_op_in_place() {
    let mut rng = Rng::new(2);
    for dtype in all_types() {
        for n in lengths(dtype) {
            let (a, b) = (input(&mut rng, dtype, n), input(&mut rng, dtype, n));
            for op in OPS {
                let mut acc = a.clone();
                reduce_in_place(dtype, op, &mut acc, &b).unwrap();
                check(dtype, op, "reduce_in_place", &a, &b, &acc);
            }
        }
    }
}

/// Byte slices at every offset 1..8 from an allocation (so no element is
/// aligned) give the same results.
#[test]
fn misaligned_slices() {
    let mut rng = Rng::new(3);
    for dtype in all_types() {
        let n = 1009;
        let size = dtype.size().unwrap();
        for offset in 1..8 {
            let a = input(&mut rng, dtype, n + 8);
            let b = input(&mut rng, dtype, n + 8);
            let (a, b) = (
                &a[offset..offset + n * size],
                &b[size - 1..size - 1 + n * size],
            );
            for op in OPS {
                let mut dst = vec![0u8; n * size + 3];
                reduce(dtype, op, &mut dst[3..], a, b).unwrap();
                check(dtype, op, "misaligned", a, b, &dst[3..]);
                let mut acc = vec![0u8; n * size + 5];
                acc[5..].copy_from_slice(a);
                reduce_in_place(dtype, op, &mut acc[5..], b).unwrap();
                check(dtype, op, "misaligned in place", a, b, &acc[5..]);
            }
        }
    }
}

fn typed_case<T: Element>(rng: &mut Rng) {
    let n = 4099;
    let a_bytes = input(rng, T::DTYPE, n);
    let b_bytes = input(rng, T::DTYPE, n);
    let from = |bytes: &[u8]| -> Vec<T> {
        let mut v = vec![T::default(); n];
        cclkit_kernels::as_bytes_mut(&mut v).copy_from_slice(bytes);
        v
    };
    let (a, b) = (from(&a_bytes), from(&b_bytes));
    for op in OPS {
        let mut dst = vec![T::default(); n];
        reduce_typed(op, &mut dst, &a, &b).unwrap();
        check(T::DTYPE, op, "typed", &a_bytes, &b_bytes, as_bytes(&dst));
        let mut acc = a.clone();
        reduce_in_place_typed(op, &mut acc, &b).unwrap();
        check(
            T::DTYPE,
            op,
            "typed in place",
            &a_bytes,
            &b_bytes,
            as_bytes(&acc),
        );
    }
}

#[test]
fn typed_api() {
    let mut rng = Rng::new(4);
    typed_case::<i8>(&mut rng);
    typed_case::<u8>(&mut rng);
    typed_case::<i32>(&mut rng);
    typed_case::<u32>(&mut rng);
    typed_case::<i64>(&mut rng);
    typed_case::<u64>(&mut rng);
    typed_case::<F16>(&mut rng);
    typed_case::<f32>(&mut rng);
    typed_case::<f64>(&mut rng);
    typed_case::<cclkit_kernels::Bf16>(&mut rng);
    typed_case::<Fp8E4M3>(&mut rng);
    typed_case::<cclkit_kernels::Fp8E5M2>(&mut rng);
}

/// Integer overflow wraps (two's complement), as NCCL's CUDA kernels do.
#[test]
fn integer_overflow_wraps() {
    let mut d = [0i8; 2];
    reduce_typed(RedOp::SUM, &mut d, &[127, -128], &[1, -1]).unwrap();
    assert_eq!(d, [-128, 127]);
    let mut d = [0u8; 1];
    reduce_typed(RedOp::PROD, &mut d, &[200], &[2]).unwrap();
    assert_eq!(d, [144]);
    let mut d = [0i32; 1];
    reduce_typed(RedOp::PROD, &mut d, &[i32::MIN], &[-1]).unwrap();
    assert_eq!(d, [i32::MIN]);
    let mut d = [0u64; 1];
    reduce_typed(RedOp::SUM, &mut d, &[u64::MAX], &[2]).unwrap();
    assert_eq!(d, [1]);
}

/// Float edge cases: f16/bf16 overflow to inf, fp8 saturates (even from an
/// e5m2 infinity), NaN loses min/max, -0 < +0.
#[test]
fn float_edges() {
    use cclkit_kernels::{Bf16, Fp8E5M2};
    let mut h = [F16(0)];
    reduce_typed(RedOp::SUM, &mut h, &[F16::MAX], &[F16::MAX]).unwrap();
    assert_eq!(h, [F16::INFINITY]);
    let mut b = [Bf16(0)];
    reduce_typed(RedOp::PROD, &mut b, &[Bf16::MAX], &[Bf16::from_f32(2.0)]).unwrap();
    assert_eq!(b, [Bf16::INFINITY]);
    let mut e = [Fp8E4M3(0)];
    reduce_typed(RedOp::SUM, &mut e, &[Fp8E4M3::MAX], &[Fp8E4M3::MAX]).unwrap();
    assert_eq!(e, [Fp8E4M3::MAX]);
    let mut e = [Fp8E5M2(0)];
    reduce_typed(
        RedOp::SUM,
        &mut e,
        &[Fp8E5M2::INFINITY],
        &[Fp8E5M2::from_f32(1.0)],
    )
    .unwrap();
    assert_eq!(e, [Fp8E5M2::MAX]);
    let mut f = [0f32; 3];
    reduce_typed(
        RedOp::MIN,
        &mut f,
        &[f32::NAN, 0.0, 1.0],
        &[2.0, -0.0, f32::NAN],
    )
    .unwrap();
    assert_eq!(
        f.map(f32::to_bits),
        [2.0f32.to_bits(), (-0.0f32).to_bits(), 1.0f32.to_bits()]
    );
    let mut f = [0f64; 1];
    reduce_typed(RedOp::MAX, &mut f, &[-0.0], &[0.0]).unwrap();
    assert_eq!(f[0].to_bits(), 0);
    assert!(format_of(DataType::FLOAT16).is_some());
}
