// The FMA-on-SSE-registers level (CPUs with AVX and FMA3, compiled with -mavx -mfma): the GEMM
// algorithm (gemm_kernel.hpp) on 128-bit registers, 6×8 float tiles and 6×4 double tiles, each
// multiply-add one vfmadd. Here to run the same tiles at half the width of AVX2 in tests.
#include <immintrin.h>

#include "model/gemm/gemm_call.hpp"
#include "model/gemm/gemm_kernel.hpp"

namespace moe::gemm_detail {
namespace {

struct F32x4 {
  using T = float;
  using R = __m128;
  static constexpr int kLanes = 4;
  static R load(const T* p) { return _mm_loadu_ps(p); }
  static void store(T* p, R v) { _mm_storeu_ps(p, v); }
  static R set1(T x) { return _mm_set1_ps(x); }
  static R zero() { return _mm_setzero_ps(); }
  static R fma(R a, R b, R c) { return _mm_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm_mul_ps(a, b); }
  static R add(R a, R b) { return _mm_add_ps(a, b); }
};

struct F64x2 {
  using T = double;
  using R = __m128d;
  static constexpr int kLanes = 2;
  static R load(const T* p) { return _mm_loadu_pd(p); }
  static void store(T* p, R v) { _mm_storeu_pd(p, v); }
  static R set1(T x) { return _mm_set1_pd(x); }
  static R zero() { return _mm_setzero_pd(); }
  static R fma(R a, R b, R c) { return _mm_fmadd_pd(a, b, c); }
  static R mul(R a, R b) { return _mm_mul_pd(a, b); }
  static R add(R a, R b) { return _mm_add_pd(a, b); }
};

}  // namespace

extern constinit const GemmKernels kGemmFma128 = level_kernels<F32x4, F64x2, 6, 2>();

}  // namespace moe::gemm_detail
