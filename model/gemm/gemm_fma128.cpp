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
  static R load_first(const T* p, int count) { return _mm_maskload_ps(p, mask(count)); }
  static void store_first(T* p, R v, int count) { _mm_maskstore_ps(p, mask(count), v); }
  static __m128i mask(int count) {  // lanes before `count` all ones
    return _mm_cmpgt_epi32(_mm_set1_epi32(count), _mm_setr_epi32(0, 1, 2, 3));
  }
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
  // count is 1: the first lane.
  static R load_first(const T* p, int) { return _mm_maskload_pd(p, _mm_set_epi64x(0, -1)); }
  static void store_first(T* p, R v, int) { _mm_maskstore_pd(p, _mm_set_epi64x(0, -1), v); }
  static R set1(T x) { return _mm_set1_pd(x); }
  static R zero() { return _mm_setzero_pd(); }
  static R fma(R a, R b, R c) { return _mm_fmadd_pd(a, b, c); }
  static R mul(R a, R b) { return _mm_mul_pd(a, b); }
  static R add(R a, R b) { return _mm_add_pd(a, b); }
};

}  // namespace

extern constinit const GemmKernels kGemmFma128 = level_kernels<F32x4, F64x2, 6, 2>();

}  // namespace moe::gemm_detail
