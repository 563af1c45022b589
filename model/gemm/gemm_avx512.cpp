// The AVX-512 level (x86-64-v4, compiled with -march=x86-64-v4): the GEMM algorithm
// (gemm_kernel.hpp) on 512-bit registers, 12×32 float tiles (24 of the 32 registers accumulate)
// and 12×16 double tiles, each multiply-add one vfmadd; and the wide tiles, 6×64 float and 6×32
// double, where a call's columns fill them (gemm.cpp).
#include <immintrin.h>

#include "model/gemm/gemm_call.hpp"
#include "model/gemm/gemm_kernel.hpp"

namespace moe::gemm_detail {
namespace {

struct F32x16 {
  using T = float;
  using R = __m512;
  static constexpr int kLanes = 16;
  static R load(const T* p) { return _mm512_loadu_ps(p); }
  static void store(T* p, R v) { _mm512_storeu_ps(p, v); }
  static R load_first(const T* p, int count) { return _mm512_maskz_loadu_ps(mask(count), p); }
  static void store_first(T* p, R v, int count) { _mm512_mask_storeu_ps(p, mask(count), v); }
  static __mmask16 mask(int count) { return static_cast<__mmask16>((1u << count) - 1); }
  static R set1(T x) { return _mm512_set1_ps(x); }
  static R zero() { return _mm512_setzero_ps(); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
};

struct F64x8 {
  using T = double;
  using R = __m512d;
  static constexpr int kLanes = 8;
  static R load(const T* p) { return _mm512_loadu_pd(p); }
  static void store(T* p, R v) { _mm512_storeu_pd(p, v); }
  static R load_first(const T* p, int count) { return _mm512_maskz_loadu_pd(mask(count), p); }
  static void store_first(T* p, R v, int count) { _mm512_mask_storeu_pd(p, mask(count), v); }
  static __mmask8 mask(int count) { return static_cast<__mmask8>((1u << count) - 1); }
  static R set1(T x) { return _mm512_set1_pd(x); }
  static R zero() { return _mm512_setzero_pd(); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_pd(a, b, c); }
  static R mul(R a, R b) { return _mm512_mul_pd(a, b); }
  static R add(R a, R b) { return _mm512_add_pd(a, b); }
};

}  // namespace

extern constinit const GemmKernels kGemmAvx512 = level_kernels<F32x16, F64x8, 12, 2, true>();

}  // namespace moe::gemm_detail
