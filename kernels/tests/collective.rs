//! Whole reductions over n ranks the way the runtime runs them: a ring
//! (pre-op on rank 0's input, then `reduce_local` per rank, `finish` on the
//! last) and a tree step (`reduce_many`), for every type × op.
//!
//! * Integers: exact (wrapping fold; avg = wrapping sum / n, truncated).
//! * Floats: exactly NCCL's formula, replayed with the reference rounding of
//!   tests/common after every step (for avg: each input × `T(float(1/n))`,
//!   rounded, then summed); and, as a sanity bound, within the usual serial
//!   summation bound of the exact f64 result: `|got − s| ≤ γ(n−1)·Σ|xᵢ| + n·η`
//!   for sums (γ(k) = k·u/(1 − k·u), u the unit roundoff, η the smallest
//!   subnormal), the same plus `3u·Σ|xᵢ|/n` (scale and product rounding)
//!   for avg against the f64 mean, `γ(n−1)·|p|` for products.
//! * `reduce_many` gives exactly the bytes of the equivalent sequence of
//!   single steps, NaNs included, at lengths spanning several fold blocks.

mod common;

use cclkit_kernels::{DataType, RedOp, Reduction};
use common::{
    Rng, Rounder, all_types, bits_at, float_select, float_value, int_bits, int_value, is_int,
    set_bits,
};

const OPS: [RedOp; 5] = [RedOp::SUM, RedOp::PROD, RedOp::MIN, RedOp::MAX, RedOp::AVG];

/// n ranks' inputs: raw bits for integers; for floats finite values in a
/// range where sums/products of 8 ranks cannot overflow any type (products
/// near 1 so they do not underflow either), zeros and signs mixed in.
fn inputs(rng: &mut Rng, dtype: DataType, op: RedOp, ranks: usize, len: usize) -> Vec<Vec<u8>> {
    let size = dtype.size().unwrap();
    let rounder = Rounder::new(dtype);
    (0..ranks)
        .map(|_| {
            let mut v = rng.bytes(len * size);
            if !is_int(dtype) {
                for i in 0..len {
                    let x = match (op, i % 16) {
                        (_, 0) => 0.0,
                        (RedOp::PROD, _) => {
                            rng.range(0.75, 1.5) * if i % 3 == 0 { -1.0 } else { 1.0 }
                        }
                        _ => rng.range(-8.0, 8.0),
                    };
                    set_bits(dtype, &mut v, i, rounder.round(x));
                }
            }
            v
        })
        .collect()
}

/// Ring: rank 0 sends pre(x0); rank r adds pre(x_r) to what it received;
/// the last rank's step finishes (post-op).
fn ring(red: &Reduction, xs: &[Vec<u8>], in_place: bool) -> Vec<u8> {
    let mut acc = vec![0u8; xs[0].len()];
    red.pre_op(&mut acc, &xs[0]).unwrap();
    if xs.len() == 1 {
        red.post_op_in_place(&mut acc).unwrap();
    }
    for (r, x) in xs.iter().enumerate().skip(1) {
        let finish = r == xs.len() - 1;
        if in_place {
            red.reduce_local_in_place(&mut acc, x, finish).unwrap();
        } else {
            let mut next = vec![0u8; acc.len()];
            red.reduce_local(&mut next, &acc, x, finish).unwrap();
            acc = next;
        }
    }
    acc
}

/// Tree root: own input plus every other rank's pre-op'd input in one call.
fn tree(red: &Reduction, xs: &[Vec<u8>]) -> Vec<u8> {
    let peers: Vec<Vec<u8>> = xs[1..]
        .iter()
        .map(|x| {
            let mut p = vec![0u8; x.len()];
            red.pre_op(&mut p, x).unwrap();
            p
        })
        .collect();
    let peer_refs: Vec<&[u8]> = peers.iter().map(Vec::as_slice).collect();
    let mut dst = vec![0u8; xs[0].len()];
    red.reduce_many(&mut dst, Some(&xs[0]), &peer_refs, true)
        .unwrap();
    dst
}

/// NCCL's result for element i, replayed with reference rounding.
fn nccl_formula(dtype: DataType, op: RedOp, xs: &[Vec<u8>], i: usize, rounder: &Rounder) -> u64 {
    let n = xs.len();
    let bits: Vec<u64> = xs.iter().map(|x| bits_at(dtype, x, i)).collect();
    if is_int(dtype) {
        let mut acc = int_value(dtype, bits[0]);
        for &b in &bits[1..] {
            let y = int_value(dtype, b);
            acc = match op {
                RedOp::PROD => int_value(dtype, int_bits(dtype, acc.wrapping_mul(y))),
                RedOp::MIN => acc.min(y),
                RedOp::MAX => acc.max(y),
                _ => int_value(dtype, int_bits(dtype, acc + y)),
            };
        }
        if op == RedOp::AVG {
            acc /= n as i128; // i128 division truncates toward zero
        }
        return int_bits(dtype, acc);
    }
    if op == RedOp::MIN || op == RedOp::MAX {
        return bits[1..]
            .iter()
            .fold(bits[0], |a, &b| float_select(dtype, a, b, op == RedOp::MIN));
    }
    // The avg scale exactly as hostToDevRedOp: T(float(1.0/n)).
    let scale = match dtype {
        DataType::FLOAT64 => 1.0 / n as f64,
        _ => float_value(dtype, rounder.round(f64::from((1.0 / n as f64) as f32))),
    };
    let pre = |b: u64| -> f64 {
        let x = float_value(dtype, b);
        if op == RedOp::AVG {
            float_value(dtype, rounder.round(x * scale))
        } else {
            x
        }
    };
    let mut acc = pre(bits[0]);
    for &b in &bits[1..] {
        let r = if op == RedOp::PROD {
            acc * pre(b)
        } else {
            acc + pre(b)
        };
        acc = float_value(dtype, rounder.round(r));
    }
    rounder.round(acc)
}

/// The a-priori bound against the exact f64 value (floats, sum/prod/avg).
fn check_bound(dtype: DataType, op: RedOp, xs: &[Vec<u8>], i: usize, got: f64, rounder: &Rounder) {
    let n = xs.len();
    let vals: Vec<f64> = xs
        .iter()
        .map(|x| float_value(dtype, bits_at(dtype, x, i)))
        .collect();
    let (u, eta) = rounder.unit_roundoff();
    let k = (n - 1) as f64;
    let gamma = k * u / (1.0 - k * u);
    // f64's reference is itself computed in f64: allow its error as well.
    let gamma = if dtype == DataType::FLOAT64 {
        2.0 * gamma
    } else {
        gamma
    };
    let abs_sum: f64 = vals.iter().map(|v| v.abs()).sum();
    let (exact, bound) = match op {
        RedOp::PROD => {
            let p: f64 = vals.iter().product();
            (p, gamma * p.abs() + n as f64 * eta)
        }
        RedOp::AVG => {
            let mean = vals.iter().sum::<f64>() / n as f64;
            (
                mean,
                (gamma + 3.0 * u) * abs_sum / n as f64 + n as f64 * eta,
            )
        }
        _ => (vals.iter().sum(), gamma * abs_sum + n as f64 * eta),
    };
    assert!(
        (got - exact).abs() <= bound,
        "{dtype:?} {op:?} n={n} [{i}]: got {got}, exact {exact}, error {} > bound {bound}",
        (got - exact).abs()
    );
}

#[test]
fn ring_and_tree_match_nccl_for_every_type_and_op() {
    let mut rng = Rng::new(11);
    let len = 1031;
    for dtype in all_types() {
        let rounder = Rounder::new(dtype);
        for op in OPS {
            for ranks in [1usize, 2, 3, 4, 7, 8] {
                let red = Reduction::new(dtype, op, ranks as u32).unwrap();
                let xs = inputs(&mut rng, dtype, op, ranks, len);
                let got = ring(&red, &xs, false);
                assert_eq!(
                    got,
                    ring(&red, &xs, true),
                    "{dtype:?} {op:?} n={ranks}: in-place ring differs"
                );
                assert_eq!(
                    got,
                    tree(&red, &xs),
                    "{dtype:?} {op:?} n={ranks}: tree differs from ring"
                );
                for i in 0..len {
                    let g = bits_at(dtype, &got, i);
                    let want = nccl_formula(dtype, op, &xs, i, &rounder);
                    assert_eq!(
                        g, want,
                        "{dtype:?} {op:?} n={ranks} [{i}]: got {g:#x}, NCCL gives {want:#x}"
                    );
                    if !is_int(dtype) && op != RedOp::MIN && op != RedOp::MAX {
                        check_bound(dtype, op, &xs, i, float_value(dtype, g), &rounder);
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_many_equals_the_sequence_of_single_steps() {
    let mut rng = Rng::new(12);
    for dtype in all_types() {
        let size = dtype.size().unwrap();
        // Several 8 KiB fold blocks and a ragged end for every element size.
        let len = 3 * (8192 / size) + 7;
        let inputs: Vec<Vec<u8>> = (0..6).map(|_| rng.bytes(len * size)).collect();
        for op in OPS {
            let red = Reduction::new(dtype, op, 5).unwrap();
            for with_local in [false, true] {
                for k in 1..=5usize {
                    if !with_local && k < 1 {
                        continue;
                    }
                    let local = with_local.then(|| inputs[5].as_slice());
                    let peers: Vec<&[u8]> = inputs[..k].iter().map(Vec::as_slice).collect();
                    for finish in [false, true] {
                        let mut got = vec![0u8; len * size];
                        red.reduce_many(&mut got, local, &peers, finish).unwrap();
                        let mut want = vec![0u8; len * size];
                        let rest = match local {
                            Some(l) => {
                                red.pre_op(&mut want, l).unwrap();
                                &peers[..]
                            }
                            None => {
                                want.copy_from_slice(peers[0]);
                                &peers[1..]
                            }
                        };
                        for p in rest {
                            red.reduce_in_place(&mut want, p).unwrap();
                        }
                        if finish {
                            red.post_op_in_place(&mut want).unwrap();
                        }
                        for i in 0..len {
                            let (g, w) = (bits_at(dtype, &got, i), bits_at(dtype, &want, i));
                            let both_nan = !is_int(dtype)
                                && float_value(dtype, g).is_nan()
                                && float_value(dtype, w).is_nan();
                            assert!(
                                g == w || both_nan,
                                "{dtype:?} {op:?} local={with_local} peers={k} finish={finish} [{i}]: {g:#x} vs {w:#x}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// NCCL's integer avg: the sum wraps in the type, then divides truncating
/// toward zero.
#[test]
fn integer_avg_wraps_then_truncates() {
    let red = Reduction::new(DataType::INT32, RedOp::AVG, 2).unwrap();
    let mut out = [0u8; 4];
    red.reduce_local(
        &mut out,
        &(-3i32).to_ne_bytes(),
        &(-4i32).to_ne_bytes(),
        true,
    )
    .unwrap();
    assert_eq!(i32::from_ne_bytes(out), -3);
    let red = Reduction::new(DataType::UINT8, RedOp::AVG, 3).unwrap();
    let mut acc = [255u8];
    red.reduce_local_in_place(&mut acc, &[255], false).unwrap();
    red.reduce_local_in_place(&mut acc, &[255], true).unwrap();
    assert_eq!(acc, [((255u32 * 3) % 256 / 3) as u8]);
    assert!(red.has_post_op() && !red.has_pre_op());
}

/// NCCL's float avg multiplies each input by `T(float(1/n))`; for e4m3 and
/// n ≥ 1024 that scale rounds to zero, so the average is zero (NCCL does the
/// same).
#[test]
fn float_avg_scale_underflow_matches_nccl() {
    let red = Reduction::new(DataType::FLOAT8E4M3, RedOp::AVG, 1024).unwrap();
    assert!(red.has_pre_op() && !red.has_post_op());
    let x = [cclkit_kernels::Fp8E4M3::from_f32(100.0).0; 4];
    let mut out = [0xffu8; 4];
    red.pre_op(&mut out, &x).unwrap();
    assert_eq!(out, [0; 4]);
}
