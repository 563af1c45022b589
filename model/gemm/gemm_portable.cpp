// The portable level: the GEMM algorithm (gemm_kernel.hpp) on scalars, each multiply-add
// std::fma, which is one rounding on every CPU (in hardware where the CPU has FMA, in software
// where it has none: slow, the same bits). The reference every wider level is tested against.
#include <cmath>

#include "model/gemm/gemm_call.hpp"
#include "model/gemm/gemm_kernel.hpp"

namespace moe::gemm_detail {
namespace {

template <class Type> struct Scalar {
  using T = Type;
  using R = Type;
  static constexpr int kLanes = 1;
  static R load(const T* p) { return *p; }
  static void store(T* p, R v) { *p = v; }
  static R set1(T x) { return x; }
  static R zero() { return T(0); }
  static R fma(R a, R b, R c) { return std::fma(a, b, c); }
  static R mul(R a, R b) { return a * b; }
  static R add(R a, R b) { return a + b; }
};

constexpr int kMR = 4, kNV = 4;

template <class T> int64_t pack_elements(int m, int n, int K) {
  return gemm_detail::pack_elements<T, kMR, kNV * Scalar<T>::kLanes>(m, n, K);
}
template <class T> void block(const GemmCall<T>& g, int i0, int m, int j0, int n, T* pack) {
  gemm_block<Scalar<T>, kMR, kNV>(g, i0, m, j0, n, pack);
}

}  // namespace

extern const GemmKernels kGemmPortable = {
    {kMR, kNV, pack_elements<float>, block<float>},
    {kMR, kNV, pack_elements<double>, block<double>},
};

}  // namespace moe::gemm_detail
