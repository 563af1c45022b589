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
  static R set1(T x) { return _mm256_set1_pd(x); }
  static R zero() { return _mm256_setzero_pd(); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_pd(a, b, c); }
  static R mul(R a, R b) { return _mm256_mul_pd(a, b); }
  static R add(R a, R b) { return _mm256_add_pd(a, b); }
};

constexpr int kMR = 6, kNV = 2;

template <class V> int64_t pack_elements(int m, int n, int K) {
  return gemm_detail::pack_elements<typename V::T, kMR, kNV * V::kLanes>(m, n, K);
}
template <class V>
void block(const GemmCall<typename V::T>& g, int i0, int m, int j0, int n, typename V::T* pack) {
  gemm_block<V, kMR, kNV>(g, i0, m, j0, n, pack);
}

}  // namespace

extern const GemmKernels kGemmAvx2 = {
    {kMR, kNV* F32x8::kLanes, pack_elements<F32x8>, block<F32x8>},
    {kMR, kNV* F64x4::kLanes, pack_elements<F64x4>, block<F64x4>},
};

}  // namespace moe::gemm_detail
