#!/usr/bin/env bash
# Builds the CUDA stand-in into OUT (default build/cuda-standin):
#   libcuda.so.1   (+ libcuda.so)     driver API   (driver.c memory.c streams.c procaddr.c module.c
#                                     unimpl.c, and kernels/cuda/emulator.cpp: cclkit's kernels on the host)
#   libcudart.so.12 (+ libcudart.so)  runtime API  (runtime.c runtime_mem.c unimpl_runtime.c)
# with plain `cc` and `c++` (CC and CXX override); no CUDA toolkit is needed. See docs/cuda-standin.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/../../build/cuda-standin}"
# CC may carry flags ("cc -fsanitize=address"): split it into words.
read -ra cc <<<"${CC:-cc}"
read -ra cxx <<<"${CXX:-c++}"
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
# The kernels' host build, with the flags kernels/build.rs gives it (no FMA
# contraction: results must equal the GPU's add.rn/mul.rn bit for bit), and no C++
# runtime: it uses neither exceptions nor RTTI nor the standard library.
kernels="$here/../cuda"
emul="$out/.cclkit_emulator.o"
"${cxx[@]}" -c -fPIC -O2 -g -std=c++17 -ffp-contract=off -fno-exceptions -fno-rtti -fvisibility=hidden \
  -Wall -Wextra -Werror -I"$kernels" -o "$emul" "$kernels/emulator.cpp"
build libcuda.so.1 libcuda.so \
  "$here/common.c" "$here/driver.c" "$here/memory.c" "$here/streams.c" "$here/procaddr.c" "$here/module.c" \
  "$here/unimpl.c" "$emul"
rm -f "$emul"
build libcudart.so.12 libcudart.so \
  "$here/common.c" "$here/runtime.c" "$here/runtime_mem.c" "$here/unimpl_runtime.c"
echo "cuda-standin: built $out/{libcuda.so.1,libcudart.so.12}"
