#!/usr/bin/env bash
# The prepared GPU check of cclkit's CUDA path (docs/cuda.md). Run it from the
# repository root on a machine with an NVIDIA GPU and driver:
#
#   kernels/cuda/gpu-check.sh [OUT_DIR]            # default OUT_DIR: $OUT or build/gpu-check
#
# It (1) builds with the `cuda` feature (or takes prebuilt binaries from
# $CCLKIT_GPU_BIN, see below), (2) runs the device kernels against the host
# kernels for every type x op x step on random data, (3) measures each kernel's
# bandwidth as a fraction of the device's own copy bandwidth (cuMemcpy DtoD),
# (4) runs `cclkit perf --device cuda --np 2` (all_reduce, float sum) next to
# the same run on host memory, (5) checks every collective x type x op on device
# buffers with 3 ranks (`perf-all`), (6) has a real NCCL (PyTorch's, when python3
# has torch) load the packaged plugins (`nccl-load`, kernels/cuda/nccl-load.py),
# and (7) prints `cclkit doctor`'s GPU section.
# Every step has a time limit; the summary at the end says what passed. All
# output is kept under OUT_DIR (the numbers for docs/PERFORMANCE.md are in
# bench.txt and perf-cuda.txt).
#
# Without cargo on the GPU machine, build on another x86_64 Linux box first:
#   cargo test --release -p cclkit-kernels --features cuda --lib --no-run
#   cargo build --release -p cclkit-kernels --features cuda --example cuda-bench
#   cargo build --release -p cclkit-cli --bin cclkit
# and copy target/release/{cclkit,examples/cuda-bench,deps/cclkit_kernels-*}
# (the test binary is the executable deps/cclkit_kernels-<hash>) into one
# directory named by CCLKIT_GPU_BIN. The packaged plugins (`make package`) are
# taken from CCLKIT_GPU_LIB (default build/lib).
set -uo pipefail

out=${1:-${OUT:-build/gpu-check}}
mkdir -p "$out"
status=()
step() { # step NAME SECONDS CMD...: runs CMD with a limit, tees its output to OUT/NAME.txt
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  status+=("$name: $([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s")
  return "$rc"
}

{ command -v nvidia-smi >/dev/null && nvidia-smi; } >"$out/nvidia-smi.txt" 2>&1 || true
head -n 15 "$out/nvidia-smi.txt"

if [ -n "${CCLKIT_GPU_BIN:-}" ]; then
  bin=$CCLKIT_GPU_BIN
  kernels_test=$(find "$bin" -maxdepth 1 -type f -name 'cclkit_kernels-*' -perm -u+x | head -n 1)
  bench=$bin/cuda-bench
  cclkit=$bin/cclkit
else
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
  step build 900 bash -c '
    cargo build --release -p cclkit-kernels --features cuda --example cuda-bench &&
    cargo build --release -p cclkit-cli --bin cclkit &&
    cargo test --release -p cclkit-kernels --features cuda --lib --no-run' || true
  rel=$CARGO_TARGET_DIR/release
  kernels_test=$(ls -t "$rel"/deps/cclkit_kernels-* 2>/dev/null | grep -v '\.d$' | head -n 1)
  bench=$rel/examples/cuda-bench
  cclkit=$rel/cclkit
fi

# 2. Device kernels == host kernels (every type x op x step, odd lengths,
#    misaligned offsets, up to 1 MiB), plus the non-GPU CUDA tests, which on a
#    GPU machine check the driver path (query, open) instead of the no-driver error.
if [ -x "${kernels_test:-}" ]; then
  step kernels 600 "$kernels_test" --include-ignored --test-threads 1 cuda:: || true
  # The sm_80 PTX too, where the GPU would load the sm_90 one (compute capability 9.0+).
  step kernels-sm80 300 env CCLKIT_CUDA_PTX=sm_80 "$kernels_test" --include-ignored \
    --test-threads 1 cuda::tests::gpu_ || true
else
  status+=("kernels: SKIPPED (no kernels test binary)")
fi

# 3. Kernel bandwidth as a fraction of cuMemcpy DtoD (256 MiB buffers).
if [ -x "${bench:-}" ]; then
  step bench 300 "$bench" --bytes 256M --iters 20 || true
  step bench-sm80 300 env CCLKIT_CUDA_PTX=sm_80 "$bench" --bytes 256M --iters 20 || true
else
  status+=("bench: SKIPPED (no cuda-bench binary)")
fi

# 4. The runtime on device buffers, 2 local ranks, next to host memory.
if [ -x "${cclkit:-}" ]; then
  step perf-cuda 300 "$cclkit" perf --device cuda --np 2 -b 1M -e 256M -f 4 -n 10 -w 2 || true
  step perf-host 300 "$cclkit" perf --np 2 -b 1M -e 256M -f 4 -n 10 -w 2 || true
  # Exactness on device buffers: every collective x type x op, 3 ranks (not a
  # power of two), odd element counts from the size sweep's remainders.
  step perf-all 240 "$cclkit" perf --device cuda --np 3 --coll all -d all -o all \
    -b 1K -e 1M -f 32 -n 2 -w 1 || true
  step doctor 120 bash -c "\"$cclkit\" doctor | sed -n '/^GPU/,/^\$/p'" || true
else
  status+=("perf: SKIPPED (no cclkit binary)")
fi

# 6. A real NCCL loading the packaged plugins (one rank: one GPU is enough).
lib=${CCLKIT_GPU_LIB:-build/lib}
if [ -f "$lib/libnccl-net-cclkit-socket.so" ] && python3 -c 'import torch' 2>/dev/null; then
  step nccl-load 480 python3 "$(dirname "$0")/nccl-load.py" "$lib" || true
else
  status+=("nccl-load: SKIPPED (no $lib/libnccl-net-cclkit-socket.so, or no python3 with torch)")
fi

echo
echo "== summary (outputs in $out)"
printf '  %s\n' "${status[@]}" | tee "$out/summary.txt"
! grep -q 'FAILED\|SKIPPED' "$out/summary.txt"
