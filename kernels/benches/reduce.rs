//! memcpy of 64 MiB against the sum of two 64 MiB arrays (f32, f16, bf16,
//! fp8 e4m3 and e5m2), single thread, in one run; then the same at 256 KiB,
//! where the arrays stay in L2 (the size of a ring chunk), which shows the
//! kernels' compute speed rather than DRAM's.
//!
//! Bandwidth is counted the STREAM way: bytes the kernel must read plus bytes
//! it must write (copy: 2 × size; sum: 3 × size), no write-allocate traffic.
//!
//! Each size runs twice: timed by the wall clock (groups `host_<size>`), and
//! by the thread's CPU time (groups `host_<size>_cpu`), which does not count
//! the time other processes on a shared machine take the core away (memory
//! stalls still count: the thread is on the CPU while it waits). After
//! criterion's report the bench prints each kernel's bandwidth as a fraction
//! of memcpy's in the same group, from criterion's own estimates.
//!
//! `cargo bench -p cclkit-kernels --bench reduce -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use cclkit_kernels::{Bf16, DataType, F16, Fp8E4M3, Fp8E5M2, RedOp, Reduction, as_bytes, copy};
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, Throughput};

/// (group name, array size in bytes).
const SIZES: [(&str, usize); 2] = [("host_64MiB", 64 << 20), ("host_256KiB", 256 << 10)];
/// The kernels after memcpy, with the goal (bandwidth / memcpy's,
/// for the 64 MiB size; 0 = no goal).
const KERNELS: [(&str, f64); 5] = [
    ("f32_sum", 0.8),
    ("f16_sum", 0.5),
    ("bf16_sum", 0.5),
    ("e4m3_sum", 0.0),
    ("e5m2_sum", 0.0),
];

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
struct ThreadCpuTime;

fn thread_cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec; the clock id is a constant
    // Linux supports. On failure ts stays zero (the bench shows nonsense
    // rather than crashing).
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;
    fn start(&self) -> Duration {
        thread_cpu_now()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu_now().saturating_sub(start)
    }
    fn add(&self, v1: &Duration, v2: &Duration) -> Duration {
        *v1 + *v2
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        static WALL: WallTime = WallTime;
        WALL.formatter()
    }
}

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

/// The two inputs of every kernel, as bytes.
struct Inputs {
    bytes: usize,
    sums: Vec<(&'static str, DataType, Vec<u8>, Vec<u8>)>,
}

fn inputs(bytes: usize) -> Inputs {
    fn pair<T: cclkit_kernels::Element>(
        n: usize,
        seed: u64,
        f: fn(f32) -> T,
    ) -> (Vec<u8>, Vec<u8>) {
        let a: Vec<T> = values(n, seed).into_iter().map(f).collect();
        let b: Vec<T> = values(n, seed + 1).into_iter().map(f).collect();
        (as_bytes(&a).to_vec(), as_bytes(&b).to_vec())
    }
    let (fa, fb) = pair(bytes / 4, 1, |x| x);
    let (ha, hb) = pair(bytes / 2, 3, F16::from_f32);
    let (ba, bb) = pair(bytes / 2, 5, Bf16::from_f32);
    let (ea, eb) = pair(bytes, 7, Fp8E4M3::from_f32);
    let (ga, gb) = pair(bytes, 9, Fp8E5M2::from_f32);
    Inputs {
        bytes,
        sums: vec![
            ("f32_sum", DataType::FLOAT32, fa, fb),
            ("f16_sum", DataType::FLOAT16, ha, hb),
            ("bf16_sum", DataType::BFLOAT16, ba, bb),
            ("e4m3_sum", DataType::FLOAT8E4M3, ea, eb),
            ("e5m2_sum", DataType::FLOAT8E5M2, ga, gb),
        ],
    }
}

fn benches<M: Measurement>(c: &mut Criterion<M>, group: &str, inputs: &Inputs) {
    let bytes = inputs.bytes;
    let mut g = c.benchmark_group(group);
    let src = vec![7u8; bytes];
    let mut dst = vec![1u8; bytes];
    g.throughput(Throughput::Bytes(2 * bytes as u64));
    g.bench_function("memcpy", |bench| {
        bench.iter(|| black_box(copy(&mut dst, black_box(&src))).is_ok())
    });
    g.throughput(Throughput::Bytes(3 * bytes as u64));
    for (id, dtype, a, b) in &inputs.sums {
        let red = Reduction::new(*dtype, RedOp::SUM, 1);
        g.bench_function(*id, |bench| {
            bench.iter(|| match &red {
                Ok(r) => black_box(r.reduce(&mut dst, black_box(a), black_box(b))).is_ok(),
                Err(_) => false,
            })
        });
    }
    g.finish();
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

/// Time per iteration in ns from criterion's `estimates.json`: the slope
/// (the figure criterion prints) when it sampled linearly, else the mean.
fn time_ns(group: &str, id: &str) -> Option<f64> {
    let path = criterion_home()
        .join(group)
        .join(id)
        .join("new")
        .join("estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    let estimate = |key: &str| json.get(key)?.get("point_estimate")?.as_f64();
    estimate("slope").or_else(|| estimate("mean"))
}

/// Bandwidth of each kernel as a fraction of memcpy's in the same group,
/// with the goals for the 64 MiB size.
fn print_ratios(group: &str, bytes: usize, goals: bool) {
    let Some(copy_ns) = time_ns(group, "memcpy") else {
        println!(
            "(no criterion estimates for {group} under {}; ratios skipped)",
            criterion_home().display()
        );
        return;
    };
    let copy_gbs = 2.0 * bytes as f64 / copy_ns;
    println!("\n{group}: kernel, time/iter, GB/s (read+write), bandwidth / memcpy");
    println!(
        "  memcpy    {:10.1} us  {copy_gbs:7.2}  1.00",
        copy_ns / 1e3
    );
    for (id, goal) in KERNELS {
        let Some(ns) = time_ns(group, id) else {
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
            "  {id:<9} {:10.1} us  {gbs:7.2}  {ratio:.2} {verdict}",
            ns / 1e3
        );
    }
}

fn main() {
    let mut wall = Criterion::default().configure_from_args();
    let mut cpu = Criterion::default()
        .with_measurement(ThreadCpuTime)
        .configure_from_args();
    for (name, bytes) in SIZES {
        let data = inputs(bytes);
        benches(&mut wall, name, &data);
        benches(&mut cpu, &format!("{name}_cpu"), &data);
    }
    wall.final_summary();
    cpu.final_summary();
    for (i, (name, bytes)) in SIZES.into_iter().enumerate() {
        print_ratios(name, bytes, i == 0);
        print_ratios(&format!("{name}_cpu"), bytes, i == 0);
    }
}
