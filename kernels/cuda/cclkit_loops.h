// cclkit device kernels: the element-wise loops and the list of entry points.
//
// Every loop is written for one thread of a grid: `tid` is the global thread
// index and `nth` the number of threads; the grid strides over the data. On the
// device `tid`/`nth` come from the PTX special registers; the host emulator
// (emulator.cpp) calls the same function once per emulated thread, which gives
// the same result because every element is computed by exactly one thread and
// no thread reads what another writes (in place: dst == a, element by element).
//
// Memory is read 16 bytes at a time where the pointers allow it: when every
// pointer has the same offset modulo 16, a scalar head reaches 16-byte
// alignment, whole 16-byte vectors follow (one vector per thread per step), and
// a scalar tail finishes. Otherwise every element is scalar. Element pointers
// must be aligned to the element size (the Rust launcher checks it).
#ifndef CCLKIT_LOOPS_H
#define CCLKIT_LOOPS_H

#include "cclkit_elem.h"

struct alignas(16) V16 { u64 lo, hi; };

// Splits [0, n) of T into a scalar head, 16-byte vectors, and a scalar tail.
template <class T>
struct Split {
  u64 head, nvec, tail_start;
  static const u64 PER = 16 / sizeof(T);
  CCLKIT_FN static Split make(u64 mis_equal, u64 mis, u64 n) {
    Split s;
    if (mis_equal && mis % sizeof(T) == 0) {
      u64 head = ((16 - mis) & 15) / sizeof(T);
      s.head = head < n ? head : n;
      s.nvec = (n - s.head) / PER;
    } else {
      s.head = 0;
      s.nvec = 0;
    }
    s.tail_start = s.head + s.nvec * PER;
    return s;
  }
};

// dst[i] = Op(a[i], b[i], arg) for i < n.
template <class T, class Op>
CCLKIT_FN void binary_loop(u64 tid, u64 nth, T* dst, const T* a, const T* b, u64 n, u64 arg) {
  u64 mis = (u64)dst & 15;
  Split<T> s = Split<T>::make(((u64)a & 15) == mis && ((u64)b & 15) == mis, mis, n);
  for (u64 i = tid; i < s.head; i += nth) dst[i] = Op::apply(a[i], b[i], arg);
  const V16* va = (const V16*)(a + s.head);
  const V16* vb = (const V16*)(b + s.head);
  V16* vd = (V16*)(dst + s.head);
  for (u64 v = tid; v < s.nvec; v += nth) {
    V16 x = va[v], y = vb[v], z;
    T ex[Split<T>::PER], ey[Split<T>::PER], ez[Split<T>::PER];
    __builtin_memcpy(ex, &x, 16);
    __builtin_memcpy(ey, &y, 16);
CCLKIT_UNROLL
    for (u64 k = 0; k < Split<T>::PER; k++) ez[k] = Op::apply(ex[k], ey[k], arg);
    __builtin_memcpy(&z, ez, 16);
    vd[v] = z;
  }
  for (u64 i = s.tail_start + tid; i < n; i += nth) dst[i] = Op::apply(a[i], b[i], arg);
}

// dst[i] = Op(src[i], arg) for i < n.
template <class T, class Op>
CCLKIT_FN void unary_loop(u64 tid, u64 nth, T* dst, const T* src, u64 n, u64 arg) {
  u64 mis = (u64)dst & 15;
  Split<T> s = Split<T>::make(((u64)src & 15) == mis, mis, n);
  for (u64 i = tid; i < s.head; i += nth) dst[i] = Op::apply(src[i], arg);
  const V16* vs = (const V16*)(src + s.head);
  V16* vd = (V16*)(dst + s.head);
  for (u64 v = tid; v < s.nvec; v += nth) {
    V16 x = vs[v], z;
    T ex[Split<T>::PER], ez[Split<T>::PER];
    __builtin_memcpy(ex, &x, 16);
CCLKIT_UNROLL
    for (u64 k = 0; k < Split<T>::PER; k++) ez[k] = Op::apply(ex[k], arg);
    __builtin_memcpy(&z, ez, 16);
    vd[v] = z;
  }
  for (u64 i = s.tail_start + tid; i < n; i += nth) dst[i] = Op::apply(src[i], arg);
}

template <class T> struct OpCopy { CCLKIT_FN static T apply(T x, u64) { return x; } };

// dst[i] = src[i] for i < n bytes (any alignment; 16-byte vectors when the
// pointers share their offset modulo 16).
CCLKIT_FN void copy_loop(u64 tid, u64 nth, u8* dst, const u8* src, u64 n) {
  unary_loop<u8, OpCopy<u8> >(tid, nth, dst, src, n, 0);
}

// The entry points: X(op, type name, C type) for every (type, op) pair NCCL's
// built-in reductions need. Names are cclkit_<op>_<type>; the Rust side keeps
// the same table (kernels/src/cuda/entries.rs) and a test checks the PTX
// against it.
//
// Binary: (T* dst, const T* a, const T* b, u64 n, u64 arg).
#define CCLKIT_FOR_EACH_TYPE(X, OP)                                            \
  X(OP, i8, i8) X(OP, u8, u8) X(OP, i32, i32) X(OP, u32, u32)                  \
  X(OP, i64, i64) X(OP, u64, u64) X(OP, f16, f16) X(OP, f32, float)            \
  X(OP, f64, double) X(OP, bf16, bf16) X(OP, e4m3, e4m3) X(OP, e5m2, e5m2)
#define CCLKIT_FOR_EACH_FLOAT(X, OP)                                           \
  X(OP, f16, f16) X(OP, f32, float) X(OP, f64, double) X(OP, bf16, bf16)       \
  X(OP, e4m3, e4m3) X(OP, e5m2, e5m2)
#define CCLKIT_FOR_EACH_INT(X, OP)                                             \
  X(OP, i8, i8) X(OP, u8, u8) X(OP, i32, i32) X(OP, u32, u32)                  \
  X(OP, i64, i64) X(OP, u64, u64)

#define CCLKIT_BINARY_ENTRIES(X)                                               \
  CCLKIT_FOR_EACH_TYPE(X, sum)                                                 \
  CCLKIT_FOR_EACH_TYPE(X, prod)                                                \
  CCLKIT_FOR_EACH_TYPE(X, min)                                                 \
  CCLKIT_FOR_EACH_TYPE(X, max)                                                 \
  CCLKIT_FOR_EACH_FLOAT(X, premulsum)                                          \
  CCLKIT_FOR_EACH_INT(X, sumpostdiv)

// Unary: (T* dst, const T* src, u64 n, u64 arg).
#define CCLKIT_UNARY_ENTRIES(X)                                                \
  CCLKIT_FOR_EACH_FLOAT(X, premul)                                             \
  CCLKIT_FOR_EACH_INT(X, postdiv)

// Functor for each op name.
#define CCLKIT_OP_sum OpSum
#define CCLKIT_OP_prod OpProd
#define CCLKIT_OP_min OpMin
#define CCLKIT_OP_max OpMax
#define CCLKIT_OP_premulsum OpPreMulSum
#define CCLKIT_OP_sumpostdiv OpSumPostDiv
#define CCLKIT_OP_premul OpPreMul
#define CCLKIT_OP_postdiv OpPostDiv
#define CCLKIT_FUNCTOR(OP, T) CCLKIT_OP_##OP<T>

#endif  // CCLKIT_LOOPS_H
