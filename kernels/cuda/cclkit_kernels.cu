// cclkit device kernels: the CUDA entry points (compiled to the committed PTX
// kernels/cuda/cclkit_kernels.ptx by `make ptx`; see docs/cuda.md).
//
// Built without CUDA headers (clang -nocudainc -nocudalib): the few CUDA
// spellings needed are defined here, thread indices come from the PTX special
// registers. Every entry is `extern "C"` so its PTX name is the plain
// cclkit_<op>_<type> the Rust launcher looks up.
#define __global__ __attribute__((global))

#include "cclkit_loops.h"

static __attribute__((device)) __attribute__((always_inline)) inline u64 global_tid() {
  return (u64)__nvvm_read_ptx_sreg_ctaid_x() * (u64)__nvvm_read_ptx_sreg_ntid_x() +
         (u64)__nvvm_read_ptx_sreg_tid_x();
}

static __attribute__((device)) __attribute__((always_inline)) inline u64 global_threads() {
  return (u64)__nvvm_read_ptx_sreg_nctaid_x() * (u64)__nvvm_read_ptx_sreg_ntid_x();
}

#define CCLKIT_BINARY_KERNEL(OP, NAME, T)                                      \
  extern "C" __global__ void cclkit_##OP##_##NAME(T* dst, const T* a, const T* b, u64 n, u64 arg) { \
    binary_loop<T, CCLKIT_FUNCTOR(OP, T)>(global_tid(), global_threads(), dst, a, b, n, arg); \
  }
CCLKIT_BINARY_ENTRIES(CCLKIT_BINARY_KERNEL)

#define CCLKIT_UNARY_KERNEL(OP, NAME, T)                                       \
  extern "C" __global__ void cclkit_##OP##_##NAME(T* dst, const T* src, u64 n, u64 arg) { \
    unary_loop<T, CCLKIT_FUNCTOR(OP, T)>(global_tid(), global_threads(), dst, src, n, arg); \
  }
CCLKIT_UNARY_ENTRIES(CCLKIT_UNARY_KERNEL)

extern "C" __global__ void cclkit_copy(u8* dst, const u8* src, u64 n) {
  copy_loop(global_tid(), global_threads(), dst, src, n);
}
