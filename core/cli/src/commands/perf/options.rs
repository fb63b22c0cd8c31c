//! Parsing nccl-tests' option values: sizes with K/M/G suffixes, the size sweep,
//! data types, reduction ops and roots (each also `all`).

use cclkit_abi::raw::common::{DataType, RedOp};

/// A size as nccl-tests parses it: a number with an optional binary K/M/G suffix
/// (case-insensitive; `1.5K` = 1536).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, unit) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let unit: usize = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ if t[..i].trim().parse::<f64>().is_ok() => {
                    return Err(format!("'{s}': unknown size suffix '{c}' (use K, M or G)"));
                }
                _ => return Err(format!("'{s}' is not a size (examples: 8, 64K, 1M, 2G)")),
            };
            (&t[..i], unit)
        }
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 8, 64K, 1M, 2G)"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("'{s}' is not a size"));
    }
    Ok((v * unit as f64) as usize)
}

/// `-T/--timeout`: seconds, positive, finite and at most a week.
pub fn timeout_arg(s: &str) -> Result<f64, String> {
    cclkit_runtime::config::parse_secs("-T/--timeout", s)
        .map(|d| d.as_secs_f64())
        .map_err(|e| e.message().to_string())
}

/// `--iter-time`: milliseconds, positive and at most an hour.
pub fn iter_time_arg(s: &str) -> Result<f64, String> {
    let ms: f64 = s.trim().parse().map_err(|_| {
        format!(
            "--iter-time={}: expected milliseconds",
            cclkit_runtime::config::shown(s)
        )
    })?;
    if !ms.is_finite() || ms <= 0.0 || ms > 3_600_000.0 {
        return Err(format!(
            "--iter-time={ms}: expected milliseconds in (0, 3600000]"
        ));
    }
    Ok(ms)
}

/// `--np`: 1 up to the bootstrap's rank limit.
pub fn np_arg(s: &str) -> Result<usize, String> {
    let max = cclkit_runtime::launch::MAX_RANKS as u64;
    cclkit_runtime::config::parse_count("--np", s, 1, max)
        .map(|n| n as usize)
        .map_err(|e| e.message().to_string())
}

/// The sizes of a sweep: `min`, then ×`factor` (when > 1) or +`step`, up to `max`.
pub fn sweep(min: usize, max: usize, step: usize, factor: usize) -> Result<Vec<usize>, String> {
    if max < min {
        return Err(format!(
            "maximum size {max} is smaller than the minimum size {min}"
        ));
    }
    if factor <= 1 && step == 0 {
        return Err("a step of 0 bytes with no factor would never reach the maximum size".into());
    }
    let mut out = Vec::new();
    let mut s = min;
    loop {
        out.push(s);
        let next = if factor > 1 {
            if s == 0 {
                // nccl-tests would loop forever on 0 × f; go on from 1 element's worth.
                1
            } else {
                s.saturating_mul(factor)
            }
        } else {
            s.saturating_add(step)
        };
        if next > max || next == s {
            break;
        }
        s = next;
    }
    Ok(out)
}

/// nccl-tests' type names, in its `-d all` order.
pub const TYPES: [(&str, DataType); 12] = [
    ("int8", DataType::INT8),
    ("uint8", DataType::UINT8),
    ("int32", DataType::INT32),
    ("uint32", DataType::UINT32),
    ("int64", DataType::INT64),
    ("uint64", DataType::UINT64),
    ("half", DataType::FLOAT16),
    ("float", DataType::FLOAT32),
    ("double", DataType::FLOAT64),
    ("bfloat16", DataType::BFLOAT16),
    ("f8e4m3", DataType::FLOAT8E4M3),
    ("f8e5m2", DataType::FLOAT8E5M2),
];

/// nccl-tests' op names, in its `-o all` order (`mulsum`, a user-created op, is not
/// available in this runtime).
pub const OPS: [(&str, RedOp); 5] = [
    ("sum", RedOp::SUM),
    ("prod", RedOp::PROD),
    ("max", RedOp::MAX),
    ("min", RedOp::MIN),
    ("avg", RedOp::AVG),
];

/// The nccl-tests name of a data type.
pub fn type_name(d: DataType) -> &'static str {
    TYPES.iter().find(|(_, t)| *t == d).map_or("?", |(n, _)| n)
}

/// The nccl-tests name of an op.
pub fn op_name(o: RedOp) -> &'static str {
    OPS.iter().find(|(_, x)| *x == o).map_or("?", |(n, _)| n)
}

/// `-d`: one type name (or a common alias), a comma list, or `all`.
pub fn parse_types(s: &str) -> Result<Vec<DataType>, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(TYPES.iter().map(|(_, d)| *d).collect());
    }
    s.split(',')
        .map(|one| {
            let k = one.trim().to_ascii_lowercase();
            let canonical = match k.as_str() {
                "char" | "i8" => "int8",
                "u8" => "uint8",
                "int" | "i32" => "int32",
                "u32" => "uint32",
                "i64" => "int64",
                "u64" => "uint64",
                "fp16" | "f16" | "float16" => "half",
                "fp32" | "f32" | "float32" => "float",
                "fp64" | "f64" | "float64" => "double",
                "bf16" => "bfloat16",
                "fp8e4m3" | "e4m3" | "float8e4m3" => "f8e4m3",
                "fp8e5m2" | "e5m2" | "float8e5m2" => "f8e5m2",
                other => other,
            };
            TYPES
                .iter()
                .find(|(n, _)| *n == canonical)
                .map(|(_, d)| *d)
                .ok_or_else(|| {
                    format!(
                        "unknown data type '{}' (one of {}, or all)",
                        one.trim(),
                        TYPES.map(|(n, _)| n).join(", ")
                    )
                })
        })
        .collect()
}

/// `-o`: one op name, a comma list, or `all`.
pub fn parse_ops(s: &str) -> Result<Vec<RedOp>, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(OPS.iter().map(|(_, o)| *o).collect());
    }
    s.split(',')
        .map(|one| {
            let k = one.trim().to_ascii_lowercase();
            if k == "mulsum" || k == "premulsum" {
                return Err(
                    "op 'mulsum' needs ncclRedOpCreatePreMulSum, which this runtime does not have"
                        .to_string(),
                );
            }
            OPS.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, o)| *o)
                .ok_or_else(|| {
                    format!(
                        "unknown op '{}' (one of {}, or all)",
                        one.trim(),
                        OPS.map(|(n, _)| n).join(", ")
                    )
                })
        })
        .collect()
}

/// `-r`: a root rank or `all` (every rank of an `nranks` communicator).
pub fn parse_roots(s: &str, nranks: usize) -> Result<Vec<usize>, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok((0..nranks).collect());
    }
    let r: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("root '{s}' is not a rank number or 'all'"))?;
    if r >= nranks {
        return Err(format!("root {r} is not a rank (there are {nranks})"));
    }
    Ok(vec![r])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert!(parse_size("12Q").unwrap_err().contains("suffix"));
        assert!(parse_size("abc").unwrap_err().contains("not a size"));
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn sweeps_by_factor_and_step() {
        assert_eq!(sweep(8, 64, 0, 2).unwrap(), [8, 16, 32, 64]);
        assert_eq!(sweep(8, 100, 0, 2).unwrap(), [8, 16, 32, 64]);
        assert_eq!(sweep(10, 40, 10, 1).unwrap(), [10, 20, 30, 40]);
        assert_eq!(sweep(5, 5, 1, 1).unwrap(), [5]);
        assert_eq!(sweep(0, 4, 0, 2).unwrap(), [0, 1, 2, 4]);
        assert!(sweep(64, 8, 0, 2).is_err());
        assert!(sweep(8, 64, 0, 1).is_err());
    }

    #[test]
    fn types_ops_roots() {
        assert_eq!(parse_types("float").unwrap(), [DataType::FLOAT32]);
        assert_eq!(
            parse_types("half,bf16").unwrap(),
            [DataType::FLOAT16, DataType::BFLOAT16]
        );
        assert_eq!(parse_types("all").unwrap().len(), 12);
        assert!(parse_types("float128").unwrap_err().contains("float128"));
        assert_eq!(parse_ops("all").unwrap().len(), 5);
        assert_eq!(parse_ops("max").unwrap(), [RedOp::MAX]);
        assert!(parse_ops("mulsum").unwrap_err().contains("PreMulSum"));
        assert!(parse_ops("xor").is_err());
        assert_eq!(parse_roots("all", 3).unwrap(), [0, 1, 2]);
        assert_eq!(parse_roots("1", 3).unwrap(), [1]);
        assert!(parse_roots("3", 3).is_err());
        assert_eq!(type_name(DataType::FLOAT16), "half");
        assert_eq!(op_name(RedOp::AVG), "avg");
    }
}
