#!/usr/bin/env bash
# C tests: the committed header compiles warning-free with layout static asserts, and a
# C host built against it drives packaged plugins through the real ABI (under ASan/UBSan).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
lib_dir=${CCLKIT_LIB_DIR:-$root/build/lib}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-std=c11 -Wall -Wextra -Wpedantic -Werror -I"$root/abi/include")
gcc "${flags[@]}" "$here/abi_layout.c" -o "$out/abi_layout" && "$out/abi_layout"
echo "ok   C header layout (static asserts)"
# Every plugin driven below must be there: a missing one is a failure, never a skip.
for lib in "$lib_dir/libnccl-net-template.so" "$lib_dir/libnccl-tuner-template.so" \
           "$lib_dir/libnccl-net-cclkit-socket.so"; do
  [ -f "$lib" ] || { echo "missing $lib: run 'make package' first" >&2; exit 1; }
done
gcc "${flags[@]}" -g -fsanitize=address,undefined "$here/load_plugin.c" -ldl -o "$out/load_plugin"
# Rust cdylibs keep some allocations until unload; leak checking belongs to valgrind runs.
ASAN_OPTIONS=detect_leaks=0 "$out/load_plugin" "$lib_dir/libnccl-net-template.so" "$lib_dir/libnccl-tuner-template.so"
ASAN_OPTIONS=detect_leaks=0 "$out/load_plugin" "$lib_dir/libnccl-net-cclkit-socket.so" \
  "$lib_dir/libnccl-tuner-template.so"
echo "ok   C host drives packaged plugins (template net and tuner, cclkit-socket)"
# Every tuner-constants layout (NCCL 1152, v7 1272, RCCL 1488 and 1632) with canaries:
# the cclkit model tuner's decisions must follow the value in the layout's own field.
[ -f "$lib_dir/libnccl-tuner-cclkit.so" ] || { echo "missing $lib_dir/libnccl-tuner-cclkit.so" >&2; exit 1; }
gcc "${flags[@]}" -g -fsanitize=address,undefined "$here/tuner_layouts.c" -ldl -o "$out/tuner_layouts"
ASAN_OPTIONS=detect_leaks=0 "$out/tuner_layouts" "$lib_dir/libnccl-tuner-cclkit.so"
ASAN_OPTIONS=detect_leaks=0 "$out/tuner_layouts" "$lib_dir/libnccl-tuner-template.so" canaries
echo "ok   C hosts pass every tuner-constants layout (NCCL 1152, v7 1272, RCCL 1488/1632)"
# The benchmark baselines compile warning-free; the raw-TCP floor probe runs briefly
# and prints one timing per connection model.
gcc -O2 -Wall -Wextra -Werror "$root/core/cli/perf/tcp_exchange.c" -o "$out/tcp_exchange"
probe=$("$out/tcp_exchange" 200)
[ "$(grep -cE '^(one bidirectional socket|two one-way sockets)[^:]*: [0-9]+\.[0-9]+ us per exchange$' <<<"$probe")" = 3 ] ||
  { echo "tcp_exchange printed:"; echo "$probe"; exit 1; } >&2
if "$out/tcp_exchange" 0 2>/dev/null; then echo "tcp_exchange accepted 0 iterations" >&2; exit 1; fi
mpicc -O2 -Wall -Wextra -Werror "$root/core/cli/perf/mpi_allreduce.c" -o "$out/mpi_allreduce"
echo "ok   benchmark baselines (tcp_exchange, mpi_allreduce) build; tcp_exchange runs"
