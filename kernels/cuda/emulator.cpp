// cclkit device kernels, emulated on the CPU: the same loop bodies as the
// PTX entry points (cclkit_loops.h), run once per emulated thread.
//
// The Rust crate builds this file with the host C++ compiler when its `cuda`
// feature is on, so machines without a GPU can run the device kernels' own
// source against the host kernels (kernels/src/cuda/tests.rs) and the
// runtime's device path can be exercised end to end (CCLKIT_CUDA_EMULATE=1).
//
// cclkit_emul_launch takes its arguments exactly as cuLaunchKernel does: an
// array of pointers to each parameter value. cclkit_emul_signature describes an
// entry's parameters, so a caller (the CUDA stand-in, kernels/cuda-standin/
// module.c) can check a PTX module and each launch's buffers against them.
#include "cclkit_loops.h"

static int name_eq(const char* a, const char* b) {
  while (*a && *a == *b) { a++; b++; }
  return *a == *b;
}

#define CCLKIT_EMUL_BINARY(OP, NAME, T)                                        \
  if (name_eq(entry, "cclkit_" #OP "_" #NAME)) {                               \
    T* d = *(T**)params[0];                                                    \
    const T* a = *(const T**)params[1];                                        \
    const T* b = *(const T**)params[2];                                        \
    u64 n = *(const u64*)params[3];                                            \
    u64 arg = *(const u64*)params[4];                                          \
    for (u64 t = 0; t < threads; t++)                                          \
      binary_loop<T, CCLKIT_FUNCTOR(OP, T)>(t, threads, d, a, b, n, arg);      \
    return 0;                                                                  \
  }

#define CCLKIT_EMUL_UNARY(OP, NAME, T)                                         \
  if (name_eq(entry, "cclkit_" #OP "_" #NAME)) {                               \
    T* d = *(T**)params[0];                                                    \
    const T* s = *(const T**)params[1];                                        \
    u64 n = *(const u64*)params[2];                                            \
    u64 arg = *(const u64*)params[3];                                          \
    for (u64 t = 0; t < threads; t++)                                          \
      unary_loop<T, CCLKIT_FUNCTOR(OP, T)>(t, threads, d, s, n, arg);          \
    return 0;                                                                  \
  }

// Runs entry point `entry` as a grid of `threads` threads in total.
// Returns 0, or -1 when no entry has that name.
extern "C" int cclkit_emul_launch(const char* entry, u64 threads, void** params) {
  if (threads == 0) return -1;
  CCLKIT_BINARY_ENTRIES(CCLKIT_EMUL_BINARY)
  CCLKIT_UNARY_ENTRIES(CCLKIT_EMUL_UNARY)
  if (name_eq(entry, "cclkit_copy")) {
    u8* d = *(u8**)params[0];
    const u8* s = *(const u8**)params[1];
    u64 n = *(const u64*)params[2];
    for (u64 t = 0; t < threads; t++) copy_loop(t, threads, d, s, n);
    return 0;
  }
  return -1;
}

#define CCLKIT_SIG_BINARY(OP, NAME, T)                                         \
  if (name_eq(entry, "cclkit_" #OP "_" #NAME)) {                               \
    *nparams = 5;                                                              \
    *elem_size = sizeof(T);                                                    \
    return 0;                                                                  \
  }
#define CCLKIT_SIG_UNARY(OP, NAME, T)                                          \
  if (name_eq(entry, "cclkit_" #OP "_" #NAME)) {                               \
    *nparams = 4;                                                              \
    *elem_size = sizeof(T);                                                    \
    return 0;                                                                  \
  }

// The shape of entry point `entry`: its parameter count (every parameter is 8
// bytes: pointers, then the element count n, then `arg` for the reductions;
// binary 5: dst, a, b, n, arg; unary 4: dst, src, n, arg; copy 3: dst, src,
// n in bytes) and its element size. Returns 0, or -1 when no entry has that name.
extern "C" int cclkit_emul_signature(const char* entry, int* nparams, u64* elem_size) {
  CCLKIT_BINARY_ENTRIES(CCLKIT_SIG_BINARY)
  CCLKIT_UNARY_ENTRIES(CCLKIT_SIG_UNARY)
  if (name_eq(entry, "cclkit_copy")) {
    *nparams = 3;
    *elem_size = 1;
    return 0;
  }
  return -1;
}
