//! memcpy of 64 MiB against the sum of two 64 MiB arrays (f32, f16, bf16,
//! fp8 e4m3), single thread, in one run; then the same at 256 KiB, where the
//! arrays stay in L2 (the size of a ring chunk), which shows the kernels'
//! compute speed rather than DRAM's.
//!
//! Bandwidth is counted the STREAM way: bytes the kernel must read plus bytes
//! it must write (copy: 2 × 64 MiB; sum: 3 × 64 MiB), no write-allocate
//! traffic. After criterion's report the bench prints each kernel's
//! bandwidth as a fraction of memcpy's, from criterion's own estimates.
//!
//! `cargo bench -p cclkit-kernels --bench reduce -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::PathBuf;

use cclkit_kernels::{Bf16, DataType, F16, Fp8E4M3, RedOp, Reduction, as_bytes, copy};
use criterion::{Criterion, Throughput};

/// (criterion group, array size in bytes).
const SIZES: [(&str, usize); 2] = [("host_64MiB", 64 << 20), ("host_256KiB", 256 << 10)];

/// Deterministic values in [0.5, 2): no denormals, NaNs or overflow, so the
/// timing is that of ordinary data.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            0.5 + (x >> 40) as f32 / (1u64 << 24) as f32 * 1.5
        })
        .collect()
}

fn sum_bench(c: &mut Criterion, group: &str, id: &str, dtype: DataType, a: &[u8], b: &[u8]) {
    let mut group = c.benchmark_group(group);
    group.throughput(Throughput::Bytes(3 * a.len() as u64));
    let mut dst = vec![1u8; a.len()];
    let red = Reduction::new(dtype, RedOp::SUM, 1);
    group.bench_function(id, |bench| {
        bench.iter(|| match &red {
            Ok(r) => black_box(r.reduce(&mut dst, black_box(a), black_box(b))).is_ok(),
            Err(_) => false,
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion, name: &str, bytes: usize) {
    let src = vec![7u8; bytes];
    let mut dst = vec![1u8; bytes];
    {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Bytes(2 * bytes as u64));
        group.bench_function("memcpy", |bench| {
            bench.iter(|| black_box(copy(&mut dst, black_box(&src))).is_ok())
        });
        group.finish();
    }
    drop((src, dst));

    let fa = values(bytes / 4, 1);
    let fb = values(bytes / 4, 2);
    sum_bench(
        c,
        name,
        "f32_sum",
        DataType::FLOAT32,
        as_bytes(&fa),
        as_bytes(&fb),
    );
    drop((fa, fb));

    let ha: Vec<F16> = values(bytes / 2, 3)
        .into_iter()
        .map(F16::from_f32)
        .collect();
    let hb: Vec<F16> = values(bytes / 2, 4)
        .into_iter()
        .map(F16::from_f32)
        .collect();
    sum_bench(
        c,
        name,
        "f16_sum",
        DataType::FLOAT16,
        as_bytes(&ha),
        as_bytes(&hb),
    );
    drop((ha, hb));

    let ba: Vec<Bf16> = values(bytes / 2, 5)
        .into_iter()
        .map(Bf16::from_f32)
        .collect();
    let bb: Vec<Bf16> = values(bytes / 2, 6)
        .into_iter()
        .map(Bf16::from_f32)
        .collect();
    sum_bench(
        c,
        name,
        "bf16_sum",
        DataType::BFLOAT16,
        as_bytes(&ba),
        as_bytes(&bb),
    );
    drop((ba, bb));

    let ea: Vec<Fp8E4M3> = values(bytes, 7)
        .into_iter()
        .map(Fp8E4M3::from_f32)
        .collect();
    let eb: Vec<Fp8E4M3> = values(bytes, 8)
        .into_iter()
        .map(Fp8E4M3::from_f32)
        .collect();
    sum_bench(
        c,
        name,
        "e4m3_sum",
        DataType::FLOAT8E4M3,
        as_bytes(&ea),
        as_bytes(&eb),
    );
}

/// Where criterion writes its estimates (its own rule: `CRITERION_HOME`, else
/// `$CARGO_TARGET_DIR/criterion`, else `target/criterion`).
fn criterion_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| PathBuf::from("target"), PathBuf::from)
        .join("criterion")
}

/// Mean time per iteration in ns from criterion's `estimates.json`.
fn mean_ns(group: &str, id: &str) -> Option<f64> {
    let path = criterion_home()
        .join(group)
        .join(id)
        .join("new")
        .join("estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("mean")?.get("point_estimate")?.as_f64()
}

/// Bandwidth of each kernel as a fraction of memcpy's in the same group,
/// with the goals for the 64 MiB group.
fn print_ratios(group: &str, bytes: usize) {
    let Some(copy_ns) = mean_ns(group, "memcpy") else {
        println!(
            "(no criterion estimates under {}; ratios skipped)",
            criterion_home().display()
        );
        return;
    };
    let goals = group == SIZES[0].0;
    let copy_gbs = 2.0 * bytes as f64 / copy_ns;
    println!("\n{group}: kernel, time/iter, GB/s (read+write), bandwidth / memcpy");
    println!("  memcpy    {:9.1} us  {copy_gbs:7.2}  1.00", copy_ns / 1e3);
    for (id, goal) in [
        ("f32_sum", 0.8),
        ("f16_sum", 0.5),
        ("bf16_sum", 0.5),
        ("e4m3_sum", 0.0),
    ] {
        let Some(ns) = mean_ns(group, id) else {
            continue;
        };
        let gbs = 3.0 * bytes as f64 / ns;
        let ratio = gbs / copy_gbs;
        let verdict = match (goals, goal > 0.0) {
            (true, true) if ratio >= goal => format!("(goal >= {goal}: met)"),
            (true, true) => format!("(goal >= {goal}: MISSED)"),
            _ => String::new(),
        };
        println!(
            "  {id:<9} {:9.1} us  {gbs:7.2}  {ratio:.2} {verdict}",
            ns / 1e3
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    for (name, bytes) in SIZES {
        benches(&mut c, name, bytes);
    }
    c.final_summary();
    for (name, bytes) in SIZES {
        print_ratios(name, bytes);
    }
}
