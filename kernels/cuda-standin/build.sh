#!/usr/bin/env bash
# Builds the CUDA stand-in into OUT (default build/cuda-standin):
#   libcuda.so.1   (+ libcuda.so)     driver API   (driver.c memory.c streams.c procaddr.c unimpl.c)
#   libcudart.so.12 (+ libcudart.so)  runtime API  (runtime.c runtime_mem.c unimpl_runtime.c)
# with plain `cc` (CC overrides); no CUDA toolkit is needed. See docs/cuda-standin.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/../../build/cuda-standin}"
# CC may carry flags ("cc -fsanitize=address"): split it into words.
read -ra cc <<<"${CC:-cc}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
flags=(-shared -fPIC -O2 -g -std=gnu11 -Wall -Wextra -Werror -fvisibility=hidden -pthread)
# Each library is written to a temporary name and renamed, so a process that has the
# old one mapped is never handed a half-written file.
build() {
  local soname="$1" link="$2"; shift 2
  "${cc[@]}" "${flags[@]}" -Wl,-soname,"$soname" -o "$out/.$soname.tmp" "$@" -ldl
  mv -f "$out/.$soname.tmp" "$out/$soname"
  ln -sf "$soname" "$out/$link"
}
build libcuda.so.1 libcuda.so \
  "$here/common.c" "$here/driver.c" "$here/memory.c" "$here/streams.c" "$here/procaddr.c" "$here/unimpl.c"
build libcudart.so.12 libcudart.so \
  "$here/common.c" "$here/runtime.c" "$here/runtime_mem.c" "$here/unimpl_runtime.c"
echo "cuda-standin: built $out/{libcuda.so.1,libcudart.so.12}"
