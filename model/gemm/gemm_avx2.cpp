// The AVX2 level (x86-64-v3, compiled with -march=x86-64-v3): the GEMM algorithm
// (gemm_kernel.hpp) on 256-bit registers, 6×16 float tiles (12 accumulators) and 6×8 double
// tiles, each multiply-add one vfmadd.
#include <immintrin.h>

#include "model/gemm/gemm_call.hpp"
#include "model/gemm/gemm_kernel.hpp"

namespace moe::gemm_detail {
namespace {

struct F32x8 {
  using T = float;
  using R = __m256;
  static constexpr int kLanes = 8;
  static R load(const T* p) { return _mm256_loadu_ps(p); }
  static void store(T* p, R v) { _mm256_storeu_ps(p, v); }
  static R load_first(const T* p, int count) { return _mm256_maskload_ps(p, mask(count)); }
  static void store_first(T* p, R v, int count) { _mm256_maskstore_ps(p, mask(count), v); }
  static __m256i mask(int count) {  // lanes before `count` all ones
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static R set1(T x) { return _mm256_set1_ps(x); }
  static R zero() { return _mm256_setzero_ps(); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
};

struct F64x4 {
  using T = double;
  using R = __m256d;
  static constexpr int kLanes = 4;
  static R load(const T* p) { return _mm256_loadu_pd(p); }
  static void store(T* p, R v) { _mm256_storeu_pd(p, v); }
  static R load_first(const T* p, int count) { return _mm256_maskload_pd(p, mask(count)); }
  static void store_first(T* p, R v, int count) { _mm256_maskstore_pd(p, mask(count), v); }
  static __m256i mask(int count) {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(count), _mm256_setr_epi64x(0, 1, 2, 3));
  }
  static R set1(T x) { return _mm256_set1_pd(x); }
  static R zero() { return _mm256_setzero_pd(); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_pd(a, b, c); }
  static R mul(R a, R b) { return _mm256_mul_pd(a, b); }
  static R add(R a, R b) { return _mm256_add_pd(a, b); }
};

}  // namespace

extern constinit const GemmKernels kGemmAvx2 = level_kernels<F32x8, F64x4, 6, 2>();

}  // namespace moe::gemm_detail
