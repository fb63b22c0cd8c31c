//! memcpy of 64 MiB against the sum of two 64 MiB arrays (f32, f16, bf16,
//! fp8 e4m3), single thread, in one run.
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

const BYTES: usize = 64 << 20;
const GROUP: &str = "host_64MiB";

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

fn sum_bench(c: &mut Criterion, id: &str, dtype: DataType, a: &[u8], b: &[u8]) {
    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Bytes(3 * BYTES as u64));
    let mut dst = vec![1u8; BYTES];
    let red = Reduction::new(dtype, RedOp::SUM, 1);
    group.bench_function(id, |bench| {
        bench.iter(|| match &red {
            Ok(r) => black_box(r.reduce(&mut dst, black_box(a), black_box(b))).is_ok(),
            Err(_) => false,
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    let src = vec![7u8; BYTES];
    let mut dst = vec![1u8; BYTES];
    {
        let mut group = c.benchmark_group(GROUP);
        group.throughput(Throughput::Bytes(2 * BYTES as u64));
        group.bench_function("memcpy", |bench| {
            bench.iter(|| black_box(copy(&mut dst, black_box(&src))).is_ok())
        });
        group.finish();
    }
    drop((src, dst));

    let fa = values(BYTES / 4, 1);
    let fb = values(BYTES / 4, 2);
    sum_bench(
        c,
        "f32_sum",
        DataType::FLOAT32,
        as_bytes(&fa),
        as_bytes(&fb),
    );
    drop((fa, fb));

    let ha: Vec<F16> = values(BYTES / 2, 3)
        .into_iter()
        .map(F16::from_f32)
        .collect();
    let hb: Vec<F16> = values(BYTES / 2, 4)
        .into_iter()
        .map(F16::from_f32)
        .collect();
    sum_bench(
        c,
        "f16_sum",
        DataType::FLOAT16,
        as_bytes(&ha),
        as_bytes(&hb),
    );
    drop((ha, hb));

    let ba: Vec<Bf16> = values(BYTES / 2, 5)
        .into_iter()
        .map(Bf16::from_f32)
        .collect();
    let bb: Vec<Bf16> = values(BYTES / 2, 6)
        .into_iter()
        .map(Bf16::from_f32)
        .collect();
    sum_bench(
        c,
        "bf16_sum",
        DataType::BFLOAT16,
        as_bytes(&ba),
        as_bytes(&bb),
    );
    drop((ba, bb));

    let ea: Vec<Fp8E4M3> = values(BYTES, 7)
        .into_iter()
        .map(Fp8E4M3::from_f32)
        .collect();
    let eb: Vec<Fp8E4M3> = values(BYTES, 8)
        .into_iter()
        .map(Fp8E4M3::from_f32)
        .collect();
    sum_bench(
        c,
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
fn mean_ns(id: &str) -> Option<f64> {
    let path = criterion_home()
        .join(GROUP)
        .join(id)
        .join("new")
        .join("estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("mean")?.get("point_estimate")?.as_f64()
}

fn print_ratios() {
    let Some(copy_ns) = mean_ns("memcpy") else {
        println!(
            "(no criterion estimates found under {}; ratios skipped)",
            criterion_home().display()
        );
        return;
    };
    let copy_gbs = 2.0 * BYTES as f64 / copy_ns;
    println!("\nkernel      time/iter   GB/s (read+write)   bandwidth / memcpy");
    println!(
        "memcpy      {:7.2} ms   {copy_gbs:8.2}            1.00",
        copy_ns / 1e6
    );
    for (id, goal) in [
        ("f32_sum", 0.8),
        ("f16_sum", 0.5),
        ("bf16_sum", 0.5),
        ("e4m3_sum", 0.0),
    ] {
        if let Some(ns) = mean_ns(id) {
            let gbs = 3.0 * BYTES as f64 / ns;
            let verdict = if goal == 0.0 {
                String::from("(no goal)")
            } else if gbs / copy_gbs >= goal {
                format!("(goal >= {goal}: met)")
            } else {
                format!("(goal >= {goal}: MISSED)")
            };
            println!(
                "{id:<10}  {:7.2} ms   {gbs:8.2}            {:.2} {verdict}",
                ns / 1e6,
                gbs / copy_gbs
            );
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    print_ratios();
}
