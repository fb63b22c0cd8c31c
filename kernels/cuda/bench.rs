//! Device kernel bandwidth, as a fraction of the device's own copy bandwidth.
//!
//! ```text
//! cargo run --release -p cclkit-kernels --features cuda --example cuda-bench -- [--bytes N] [--iters N] [--emulated]
//! ```
//!
//! Bandwidth counts bytes read + written, as STREAM and the host kernel bench
//! do (copy 2 × size, binary reductions 3 × size). The reference is
//! `cuMemcpyAsync` device-to-device on the same buffers. Each line is the best
//! of `--iters` timed runs after warm-up, timed on the host around a
//! stream synchronisation (launch overhead is negligible at the default
//! 256 MiB). `--emulated` runs the host emulator instead (a smoke test of
//! this program, not a measurement).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cclkit_kernels::cuda::{self, CudaDevice, CudaError, DevPtr, Stream};
use cclkit_kernels::{DataType, RedOp, Reduction};

struct Args {
    bytes: usize,
    iters: usize,
    emulated: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        bytes: 256 << 20,
        iters: 20,
        emulated: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = |name: &str| -> Result<usize, String> {
            let v = it.next().ok_or(format!("{name} needs a value"))?;
            let (digits, mult) = match v.chars().last() {
                Some('K' | 'k') => (&v[..v.len() - 1], 1 << 10),
                Some('M' | 'm') => (&v[..v.len() - 1], 1 << 20),
                Some('G' | 'g') => (&v[..v.len() - 1], 1 << 30),
                _ => (v.as_str(), 1),
            };
            digits
                .parse::<usize>()
                .map(|n| n * mult)
                .map_err(|e| format!("{name} {v}: {e}"))
        };
        match arg.as_str() {
            "--bytes" => a.bytes = num("--bytes")?,
            "--iters" => a.iters = num("--iters")?.max(1),
            "--emulated" => a.emulated = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// Best time of `iters` runs of `f` (after two warm-up runs).
fn best(
    s: &Stream,
    iters: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<Duration, CudaError> {
    for _ in 0..2 {
        f()?;
    }
    s.synchronize()?;
    let mut best = Duration::MAX;
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        s.synchronize()?;
        best = best.min(t.elapsed());
    }
    Ok(best)
}

fn gbs(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn run(args: &Args) -> Result<(), CudaError> {
    let dev = if args.emulated {
        CudaDevice::emulated()
    } else {
        CudaDevice::open(0)?
    };
    let info = dev.info();
    let ptx = cuda::ptx_loaded_for(info.compute_capability).map_or("-", |p| p.1);
    println!(
        "device: {} (sm_{}{}, {} SMs{}, {ptx} PTX), {} MiB per buffer, best of {}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.sm_count,
        if info.emulated {
            ", EMULATED: not a measurement"
        } else {
            ""
        },
        args.bytes >> 20,
        args.iters
    );
    let s = dev.stream()?;
    let n = args.bytes & !15;
    let (a, b, d) = (dev.alloc(n)?, dev.alloc(n)?, dev.alloc(n)?);
    // Deterministic contents (moderate values for every type: small bytes).
    let fill: Vec<u8> = (0..n).map(|i| (i % 61) as u8 & 0x3f).collect();
    let (mut a, mut b) = (a, b);
    s.upload(&mut a, 0, &fill)?;
    s.upload(&mut b, 0, &fill)?;
    let (pa, pb, pd): (DevPtr, DevPtr, DevPtr) = (a.ptr(), b.ptr(), d.ptr());

    // Every raw call below: the three buffers hold `n` bytes each and
    // outlive the stream's work (each timed run synchronises).
    let memcpy = best(&s, args.iters, || {
        // SAFETY: see above.
        unsafe { s.memcpy(pd, pa, n) }
    })?;
    let base = gbs(2 * n, memcpy);
    println!("{:<28} {:>9} {:>8}", "kernel", "GB/s", "x memcpy");
    println!(
        "{:<28} {:>9.1} {:>8.2}",
        "cuMemcpy DtoD (reference)", base, 1.0
    );
    let t = best(&s, args.iters, || {
        // SAFETY: see above.
        unsafe { s.copy_raw(pd, pa, n) }
    })?;
    println!(
        "{:<28} {:>9.1} {:>8.2}",
        "copy kernel",
        gbs(2 * n, t),
        gbs(2 * n, t) / base
    );
    let cases = [
        (DataType::FLOAT32, RedOp::SUM, 1),
        (DataType::FLOAT32, RedOp::MAX, 1),
        (DataType::FLOAT32, RedOp::AVG, 8),
        (DataType::FLOAT64, RedOp::SUM, 1),
        (DataType::FLOAT64, RedOp::MIN, 1),
        (DataType::FLOAT16, RedOp::MAX, 1),
        (DataType::FLOAT16, RedOp::SUM, 1),
        (DataType::BFLOAT16, RedOp::SUM, 1),
        (DataType::FLOAT8E4M3, RedOp::SUM, 1),
        (DataType::FLOAT8E5M2, RedOp::SUM, 1),
        (DataType::FLOAT8E4M3, RedOp::MAX, 1),
        (DataType::INT32, RedOp::SUM, 1),
        (DataType::INT64, RedOp::PROD, 1),
        (DataType::INT8, RedOp::MIN, 1),
        (DataType::INT32, RedOp::AVG, 8),
    ];
    for (dtype, op, ranks) in cases {
        let red = Reduction::new(dtype, op, ranks)?;
        // reduce_local with finish: avg runs its fused pre-/post-op kernel.
        let t = best(&s, args.iters, || {
            // SAFETY: see above.
            unsafe { s.reduce_local_raw(&red, pd, pa, pb, n, true) }
        })?;
        let name = format!("{dtype:?} {op:?}");
        println!(
            "{:<28} {:>9.1} {:>8.2}",
            name,
            gbs(3 * n, t),
            gbs(3 * n, t) / base
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cuda-bench: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuda-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
