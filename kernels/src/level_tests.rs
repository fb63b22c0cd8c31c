//! The portable (baseline) loops and the AVX2/F16C loops give the same bytes
//! for every data type, op and step, on random bit patterns (NaNs, infinities
//! and subnormals included) at odd lengths and odd byte offsets.
//!
//! The integration tests check results against references, but only on the
//! level this CPU picks; this test pins the other level to it.

use crate::host::{Level, available_levels};
use crate::{DataType, RedOp, Reduction};

/// xorshift64*: deterministic random bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// Whether the element at `i` is a float NaN (NaN payloads may differ
/// between levels: which operand's NaN an add returns is the compiler's
/// choice of operand order).
fn is_nan(dtype: DataType, e: &[u8]) -> bool {
    let u16_at = |e: &[u8]| u16::from_ne_bytes([e[0], e[1]]);
    match dtype {
        DataType::FLOAT16 => (u16_at(e) & 0x7fff) > 0x7c00,
        DataType::BFLOAT16 => (u16_at(e) & 0x7fff) > 0x7f80,
        DataType::FLOAT32 => f32::from_ne_bytes([e[0], e[1], e[2], e[3]]).is_nan(),
        DataType::FLOAT64 => {
            f64::from_ne_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]).is_nan()
        }
        DataType::FLOAT8E4M3 => (e[0] & 0x7f) == 0x7f,
        DataType::FLOAT8E5M2 => (e[0] & 0x7f) > 0x7c,
        _ => false,
    }
}

fn assert_same(dtype: DataType, what: &str, x: &[u8], y: &[u8]) {
    let size = dtype.size().unwrap_or(1);
    assert_eq!(x.len(), y.len());
    for (i, (ex, ey)) in x.chunks(size).zip(y.chunks(size)).enumerate() {
        if ex != ey && !(is_nan(dtype, ex) && is_nan(dtype, ey)) {
            panic!("{dtype:?} {what}: element {i} differs between levels: {ex:02x?} vs {ey:02x?}");
        }
    }
}

/// Every step of `red` at `level`, outputs concatenated with labels.
fn run_all(red: &Reduction, level: Level, inputs: &[&[u8]]) -> Vec<(&'static str, Vec<u8>)> {
    let at = red.at(level);
    let len = inputs[0].len();
    let mut out = Vec::new();
    let mut dst = vec![0u8; len];
    at.reduce(&mut dst, inputs[0], inputs[1]).unwrap();
    out.push(("reduce", dst.clone()));
    let mut acc = inputs[0].to_vec();
    at.reduce_in_place(&mut acc, inputs[1]).unwrap();
    out.push(("reduce_in_place", acc));
    for finish in [false, true] {
        at.reduce_local(&mut dst, inputs[0], inputs[1], finish)
            .unwrap();
        out.push(("reduce_local", dst.clone()));
        let mut acc = inputs[0].to_vec();
        at.reduce_local_in_place(&mut acc, inputs[1], finish)
            .unwrap();
        out.push(("reduce_local_in_place", acc));
        at.reduce_many(&mut dst, Some(inputs[0]), &inputs[1..], finish)
            .unwrap();
        out.push(("reduce_many(local)", dst.clone()));
        at.reduce_many(&mut dst, None, inputs, finish).unwrap();
        out.push(("reduce_many", dst.clone()));
    }
    at.pre_op(&mut dst, inputs[2]).unwrap();
    out.push(("pre_op", dst.clone()));
    let mut buf = inputs[2].to_vec();
    at.pre_op_in_place(&mut buf).unwrap();
    out.push(("pre_op_in_place", buf));
    at.post_op(&mut dst, inputs[3]).unwrap();
    out.push(("post_op", dst.clone()));
    let mut buf = inputs[3].to_vec();
    at.post_op_in_place(&mut buf).unwrap();
    out.push(("post_op_in_place", buf));
    out
}

#[test]
fn levels_agree_on_every_type_op_and_step() {
    let levels = available_levels();
    if levels.len() < 2 {
        eprintln!("only the baseline level runs on this CPU; nothing to compare");
    }
    for dtype in (0..DataType::COUNT).map(DataType) {
        let size = dtype.size().unwrap();
        // 9001 elements (more than one 8 KiB block of the many-input fold for
        // every type), read from odd byte offsets.
        let len = 9001 * size;
        let data: Vec<Vec<u8>> = (0..4)
            .map(|k| bytes(len + 1, 17 * dtype.0 as u64 + k))
            .collect();
        let inputs: Vec<&[u8]> = data.iter().map(|d| &d[1..]).collect();
        for op in (0..RedOp::COUNT).map(RedOp) {
            let red = Reduction::new(dtype, op, 3).unwrap();
            let reference = run_all(&red, Level::Baseline, &inputs);
            for &level in &levels[1..] {
                for ((what, x), (_, y)) in reference.iter().zip(run_all(&red, level, &inputs)) {
                    assert_same(dtype, &format!("{op:?} {what} at {level:?}"), x, &y);
                }
            }
        }
    }
}
