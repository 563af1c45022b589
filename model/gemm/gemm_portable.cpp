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
  // One lane is a whole vector: the kernels never store part of one, and never call these.
  static R load_first(const T* p, int) { return *p; }
  static void store_first(T* p, R v, int) { *p = v; }
  static R set1(T x) { return x; }
  static R zero() { return T(0); }
  static R fma(R a, R b, R c) { return std::fma(a, b, c); }
  static R mul(R a, R b) { return a * b; }
  static R add(R a, R b) { return a + b; }
};

}  // namespace

extern constinit const GemmKernels kGemmPortable =
    level_kernels<Scalar<float>, Scalar<double>, 4, 4>();

}  // namespace moe::gemm_detail
