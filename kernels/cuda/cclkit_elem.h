// cclkit device kernels: element arithmetic for every NCCL data type.
//
// One source for two compilers:
//   * clang in CUDA device mode (`make ptx`, no CUDA headers: -nocudainc
//     -nocudalib), which produces the committed PTX;
//   * the host C++ compiler (g++/clang++), which builds the emulator the Rust
//     tests use to run these exact kernels on the CPU (kernels/cuda/emulator.cpp).
//
// The arithmetic mirrors kernels/src/element.rs and kernels/src/float.rs bit for
// bit (NaN payloads aside), because NCCL's results are the reference for both:
//   * integers wrap (computed in the unsigned type of the same width);
//   * f32/f64 use round-to-nearest adds and multiplies, never fused (explicit
//     add.rn/mul.rn on the device, -ffp-contract=off on the host);
//   * f16, bf16 and fp8 are widened to f32, computed, and rounded once back
//     (nearest even; f16/bf16 overflow to infinity, fp8 saturates like
//     __NV_SATFINITE), with the same branch-free bit manipulation as float.rs,
//     except where the GPU's own cvt gives the same results (f16 everywhere,
//     e5m2 widening everywhere, all fp8 conversions in the sm_90 PTX; NaN
//     payloads aside);
//   * min/max are IEEE minimumNumber/maximumNumber on the raw bits
//     (a NaN loses to a number, -0 < +0, the result is one of the inputs).
#ifndef CCLKIT_ELEM_H
#define CCLKIT_ELEM_H

#if defined(__CUDA__) && defined(__CUDA_ARCH__)
#define CCLKIT_DEVICE 1
#define CCLKIT_FN __attribute__((device)) __attribute__((always_inline)) inline
#define CCLKIT_UNROLL _Pragma("unroll")
#else
#define CCLKIT_DEVICE 0
#define CCLKIT_FN __attribute__((always_inline)) inline
#define CCLKIT_UNROLL
#endif

typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// The 16- and 8-bit float formats, stored as their bits. Distinct types so the
// templates below pick the right arithmetic.
struct f16 { u16 bits; };
struct bf16 { u16 bits; };
struct e4m3 { u8 bits; };
struct e5m2 { u8 bits; };

CCLKIT_FN float f32_from_bits(u32 x) { float f; __builtin_memcpy(&f, &x, 4); return f; }
CCLKIT_FN u32 f32_to_bits(float f) { u32 x; __builtin_memcpy(&x, &f, 4); return x; }
CCLKIT_FN double f64_from_bits(u64 x) { double f; __builtin_memcpy(&f, &x, 8); return f; }
CCLKIT_FN u64 f64_to_bits(double f) { u64 x; __builtin_memcpy(&x, &f, 8); return x; }

// Round-to-nearest-even add and multiply, never contracted into an FMA and
// never flushing subnormals (the nvvm builtins are add.rn.f32 / mul.rn.f32).
#if CCLKIT_DEVICE
CCLKIT_FN float fadd(float a, float b) { return __nvvm_add_rn_f(a, b); }
CCLKIT_FN float fmul(float a, float b) { return __nvvm_mul_rn_f(a, b); }
CCLKIT_FN double dadd(double a, double b) { return __nvvm_add_rn_d(a, b); }
CCLKIT_FN double dmul(double a, double b) { return __nvvm_mul_rn_d(a, b); }
#else
CCLKIT_FN float fadd(float a, float b) { return a + b; }
CCLKIT_FN float fmul(float a, float b) { return a * b; }
CCLKIT_FN double dadd(double a, double b) { return a + b; }
CCLKIT_FN double dmul(double a, double b) { return a * b; }
#endif

// ---- conversions (float.rs) -------------------------------------------------

CCLKIT_FN float f16_to_f32(u16 h16) {
  u32 h = h16;
  u32 sign = (h & 0x8000u) << 16;
  u32 em = h & 0x7fffu;
  u32 bits;
  if (em >= 0x7c00u) {
    u32 quiet = em > 0x7c00u ? 0x00400000u : 0u;  // NaN gets the quiet bit
    bits = 0x7f800000u | ((em & 0x03ffu) << 13) | quiet;
  } else if (em >= 0x0400u) {
    bits = (em << 13) + (112u << 23);
  } else {
    bits = f32_to_bits(fmul((float)em, 0x1p-24f));  // exact
  }
  return f32_from_bits(bits | sign);
}

CCLKIT_FN u16 f32_to_f16(float f) {
  u32 x = f32_to_bits(f);
  u32 sign = (x >> 16) & 0x8000u;
  u32 a = x & 0x7fffffffu;
  u32 bits;
  if (a > 0x7f800000u) {
    bits = 0x7e00u | ((a >> 13) & 0x03ffu);
  } else if (a >= 0x47800000u) {
    bits = 0x7c00u;
  } else if (a >= 0x38800000u) {
    u32 odd = (a >> 13) & 1u;
    bits = (a - (112u << 23) + 0x0fffu + odd) >> 13;
  } else {
    // Adding 0.5 rounds onto the subnormal grid (ulp 2^-24).
    bits = f32_to_bits(fadd(f32_from_bits(a), f32_from_bits(126u << 23))) - (126u << 23);
  }
  return (u16)(bits | sign);
}

CCLKIT_FN float bf16_to_f32(u16 b) { return f32_from_bits((u32)b << 16); }

CCLKIT_FN u16 f32_to_bf16(float f) {
  u32 x = f32_to_bits(f);
  u32 bits;
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    bits = (x >> 16) | 0x0040u;
  } else {
    bits = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  }
  return (u16)bits;
}

CCLKIT_FN float e4m3_to_f32(u8 b8) {
  u32 b = b8;
  u32 sign = (b & 0x80u) << 24;
  u32 em = b & 0x7fu;
  u32 bits;
  if (em == 0x7fu) {
    bits = 0x7fc00000u;
  } else if (em >= 0x08u) {
    bits = (em << 20) + (120u << 23);
  } else {
    bits = f32_to_bits(fmul((float)em, 0x1p-9f));
  }
  return f32_from_bits(bits | sign);
}

CCLKIT_FN u8 f32_to_e4m3(float f) {
  u32 x = f32_to_bits(f);
  u32 sign = (x >> 24) & 0x80u;
  u32 a = x & 0x7fffffffu;
  u32 bits;
  if (a > 0x7f800000u) {
    bits = 0x7fu;
  } else if (a > 0x43e00000u) {
    bits = 0x7eu;  // satfinite: 448
  } else if (a >= 0x3c800000u) {
    u32 odd = (a >> 20) & 1u;
    bits = ((a + 0x0007ffffu + odd) >> 20) - (120u << 3);
  } else {
    bits = f32_to_bits(fadd(f32_from_bits(a), f32_from_bits(141u << 23))) - (141u << 23);
  }
  return (u8)(bits | sign);
}

CCLKIT_FN u8 f32_to_e5m2(float f) {
  u32 x = f32_to_bits(f);
  u32 sign = (x >> 24) & 0x80u;
  u32 a = x & 0x7fffffffu;
  u32 bits;
  if (a > 0x7f800000u) {
    bits = 0x7eu | ((a >> 21) & 0x03u);
  } else if (a > 0x47600000u) {
    bits = 0x7bu;  // satfinite: 57344
  } else if (a >= 0x38800000u) {
    u32 odd = (a >> 21) & 1u;
    bits = ((a + 0x000fffffu + odd) >> 21) - (112u << 2);
  } else {
    bits = f32_to_bits(fadd(f32_from_bits(a), f32_from_bits(134u << 23))) - (134u << 23);
  }
  return (u8)(bits | sign);
}

// ---- minimumNumber / maximumNumber on raw bits (element.rs float_minmax!) ----

// `a` orders at or below `b` (-0 < +0): a negative below a positive, and among
// two negatives the larger magnitude below. Written with unsigned operations
// only. The earlier form, a signed key `s ^ (s < 0 ? ABS : 0)`, was right on the
// CPU but clang-14's NVPTX backend turned the 64-bit mask into `bfe.u64 d, s,
// 63, 63`, which yields 0 or 1 rather than the mask (an unsigned bit-field
// extract past bit 63 fills with zeros): f64 min/max were wrong for two
// negatives on a real GPU (H200, 2026-12-04) while the emulator passed.
#define CCLKIT_MINMAX(NAME, BITS, ABS, NAN_ABOVE)                              \
  CCLKIT_FN bool NAME##_neg(BITS b) { return (BITS)(b & (BITS)~(BITS)(ABS)) != 0; } \
  CCLKIT_FN bool NAME##_le(BITS a, BITS b) {                                   \
    bool an = NAME##_neg(a), bn = NAME##_neg(b);                               \
    return an != bn ? an : (an ? a >= b : a <= b);                             \
  }                                                                            \
  CCLKIT_FN bool NAME##_nan(BITS b) { return (BITS)(b & (BITS)(ABS)) > (BITS)(NAN_ABOVE); } \
  CCLKIT_FN BITS NAME##_min(BITS a, BITS b) {                                  \
    return (NAME##_nan(b) || (!NAME##_nan(a) && NAME##_le(a, b))) ? a : b;     \
  }                                                                            \
  CCLKIT_FN BITS NAME##_max(BITS a, BITS b) {                                  \
    return (NAME##_nan(b) || (!NAME##_nan(a) && NAME##_le(b, a))) ? a : b;     \
  }

CCLKIT_MINMAX(mm16, u16, 0x7fffu, 0x7c00u)
CCLKIT_MINMAX(mmbf16, u16, 0x7fffu, 0x7f80u)
CCLKIT_MINMAX(mm32, u32, 0x7fffffffu, 0x7f800000u)
CCLKIT_MINMAX(mm64, u64, 0x7fffffffffffffffull, 0x7ff0000000000000ull)
CCLKIT_MINMAX(mme4m3, u8, 0x7fu, 0x7eu)
CCLKIT_MINMAX(mme5m2, u8, 0x7fu, 0x7cu)

// ---- per-type arithmetic: Arith<T> ------------------------------------------
//
// sum, prod, min, max, premul (avg pre-op: x * scale, rounded once) and
// postdiv (avg post-op: x / n truncated toward zero; integers only). `scale`
// arrives as the bits of a T value computed on the host exactly as NCCL's
// hostToDevRedOp does (Element::avg_scale), so host and device agree.

template <class T> struct Arith;

#define CCLKIT_INT_ARITH(T, U, WIDE)                                           \
  template <> struct Arith<T> {                                                \
    CCLKIT_FN static T sum(T a, T b) { return (T)(U)((U)a + (U)b); }           \
    CCLKIT_FN static T prod(T a, T b) { return (T)(U)((U)a * (U)b); }          \
    CCLKIT_FN static T min(T a, T b) { return a <= b ? a : b; }                \
    CCLKIT_FN static T max(T a, T b) { return a >= b ? a : b; }                \
    CCLKIT_FN static T premul(T a, u64) { return a; }                          \
    CCLKIT_FN static T postdiv(T a, u64 n) {                                   \
      WIDE d = (WIDE)(n == 0 ? 1 : n);                                         \
      return (T)((WIDE)a / d);                                                 \
    }                                                                          \
  };

// The products are computed in unsigned int for 8-bit types (promotion), which
// holds 255 * 255; the cast back keeps the low bits, i.e. wraps.
CCLKIT_INT_ARITH(i8, u8, i64)
CCLKIT_INT_ARITH(u8, u8, u64)
CCLKIT_INT_ARITH(i32, u32, i64)
CCLKIT_INT_ARITH(u32, u32, u64)
CCLKIT_INT_ARITH(i64, u64, i64)
CCLKIT_INT_ARITH(u64, u64, u64)

template <> struct Arith<float> {
  CCLKIT_FN static float sum(float a, float b) { return fadd(a, b); }
  CCLKIT_FN static float prod(float a, float b) { return fmul(a, b); }
  CCLKIT_FN static float min(float a, float b) {
    return f32_from_bits(mm32_min(f32_to_bits(a), f32_to_bits(b)));
  }
  CCLKIT_FN static float max(float a, float b) {
    return f32_from_bits(mm32_max(f32_to_bits(a), f32_to_bits(b)));
  }
  CCLKIT_FN static float premul(float a, u64 scale) { return fmul(a, f32_from_bits((u32)scale)); }
  CCLKIT_FN static float postdiv(float a, u64) { return a; }
};

template <> struct Arith<double> {
  CCLKIT_FN static double sum(double a, double b) { return dadd(a, b); }
  CCLKIT_FN static double prod(double a, double b) { return dmul(a, b); }
  CCLKIT_FN static double min(double a, double b) {
    return f64_from_bits(mm64_min(f64_to_bits(a), f64_to_bits(b)));
  }
  CCLKIT_FN static double max(double a, double b) {
    return f64_from_bits(mm64_max(f64_to_bits(a), f64_to_bits(b)));
  }
  CCLKIT_FN static double premul(double a, u64 scale) { return dmul(a, f64_from_bits(scale)); }
  CCLKIT_FN static double postdiv(double a, u64) { return a; }
};

// Small floats: widen, compute in f32, round once.
#define CCLKIT_SMALL_ARITH(T, BITS, TO, FROM, MM)                              \
  template <> struct Arith<T> {                                                \
    CCLKIT_FN static T make(BITS b) { T t; t.bits = b; return t; }             \
    CCLKIT_FN static T sum(T a, T b) { return make(FROM(fadd(TO(a.bits), TO(b.bits)))); } \
    CCLKIT_FN static T prod(T a, T b) { return make(FROM(fmul(TO(a.bits), TO(b.bits)))); } \
    CCLKIT_FN static T min(T a, T b) { return make(MM##_min(a.bits, b.bits)); } \
    CCLKIT_FN static T max(T a, T b) { return make(MM##_max(a.bits, b.bits)); } \
    CCLKIT_FN static T premul(T a, u64 scale) {                                \
      return make(FROM(fmul(TO(a.bits), TO((BITS)scale))));                    \
    }                                                                          \
    CCLKIT_FN static T postdiv(T a, u64) { return a; }                         \
  };

// The conversions the arithmetic uses: the GPU's own cvt where it gives the
// same results as the software ones above (IEEE round-to-nearest-even,
// subnormals kept, f16 overflow to infinity, fp8 .satfinite as __NV_SATFINITE;
// NaN payloads aside), the software ones elsewhere. On an H200 the software
// ones held f16 sums to 0.74 and fp8 sums to 0.37-0.41 of the copy bandwidth
// (docs/cuda.md). bf16 keeps them: it already runs at the copy bandwidth.
//   * f16: cvt on every GPU (sm_53 and later).
//   * e5m2 widens as the top byte of an f16, so through the f16 conversion.
//   * e4m3, and e5m2 narrowing: cvt from sm_89, so in the sm_90 PTX only. Both
//     halves of each x2 operand carry the same value, so the result does not
//     depend on which half the instruction puts where.
#if CCLKIT_DEVICE
CCLKIT_FN float f16_widen(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
CCLKIT_FN u16 f16_narrow(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#else
CCLKIT_FN float f16_widen(u16 h) { return f16_to_f32(h); }
CCLKIT_FN u16 f16_narrow(float f) { return f32_to_f16(f); }
#endif
CCLKIT_FN float e5m2_widen(u8 b) { return f16_widen((u16)((u16)b << 8)); }
#if CCLKIT_DEVICE && __CUDA_ARCH__ >= 890
CCLKIT_FN float e4m3_widen(u8 b) {
  u16 two = (u16)(b | ((u16)b << 8));
  u32 halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(two));
  return f16_widen((u16)halves);
}
CCLKIT_FN u8 e4m3_narrow(float f) {
  u16 two;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(two) : "f"(f));
  return (u8)two;
}
CCLKIT_FN u8 e5m2_narrow(float f) {
  u16 two;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %1;" : "=h"(two) : "f"(f));
  return (u8)two;
}
#else
CCLKIT_FN float e4m3_widen(u8 b) { return e4m3_to_f32(b); }
CCLKIT_FN u8 e4m3_narrow(float f) { return f32_to_e4m3(f); }
CCLKIT_FN u8 e5m2_narrow(float f) { return f32_to_e5m2(f); }
#endif

CCLKIT_SMALL_ARITH(f16, u16, f16_widen, f16_narrow, mm16)
CCLKIT_SMALL_ARITH(bf16, u16, bf16_to_f32, f32_to_bf16, mmbf16)
CCLKIT_SMALL_ARITH(e4m3, u8, e4m3_widen, e4m3_narrow, mme4m3)
CCLKIT_SMALL_ARITH(e5m2, u8, e5m2_widen, e5m2_narrow, mme5m2)

// ---- the device-level ops (NCCL's ncclDevRedOp_t), as functors ---------------
//
// Binary ops see (a, b, arg): dst = a (+) b. PreMulSum is ncclAvg on floats
// (dst = a + premul(b): `b` is this rank's own input); SumPostDiv is ncclAvg on
// integers at the step that completes the reduction (dst = (a + b) / n).
// Unary ops see (x, arg): PreMul (avg pre-op) and PostDiv (avg post-op).

template <class T> struct OpSum { CCLKIT_FN static T apply(T a, T b, u64) { return Arith<T>::sum(a, b); } };
template <class T> struct OpProd { CCLKIT_FN static T apply(T a, T b, u64) { return Arith<T>::prod(a, b); } };
template <class T> struct OpMin { CCLKIT_FN static T apply(T a, T b, u64) { return Arith<T>::min(a, b); } };
template <class T> struct OpMax { CCLKIT_FN static T apply(T a, T b, u64) { return Arith<T>::max(a, b); } };
template <class T> struct OpPreMulSum {
  CCLKIT_FN static T apply(T a, T b, u64 scale) { return Arith<T>::sum(a, Arith<T>::premul(b, scale)); }
};
template <class T> struct OpSumPostDiv {
  CCLKIT_FN static T apply(T a, T b, u64 n) { return Arith<T>::postdiv(Arith<T>::sum(a, b), n); }
};
template <class T> struct OpPreMul { CCLKIT_FN static T apply(T x, u64 scale) { return Arith<T>::premul(x, scale); } };
template <class T> struct OpPostDiv { CCLKIT_FN static T apply(T x, u64 n) { return Arith<T>::postdiv(x, n); } };

#endif  // CCLKIT_ELEM_H
