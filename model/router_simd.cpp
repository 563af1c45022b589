// The router's row loops at the CPU's vector width (model/router_simd.hpp).
// Legend: D model width, E experts.
#include "model/router_simd.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "model/simd.hpp"
#include "model/swiglu.hpp"
#include "numeric/det_math.hpp"

namespace moe {
namespace {

// sqrt(softplus(x)) of `count` floats: stable_softplus's operations (model/router.cpp) through
// det's branch-free lanes, so each level's loop vectorises and returns stable_softplus's bits (the
// lanes are exp's and log1p's bits over the softplus's range: tests/model/test_det_math.cpp).
[[gnu::always_inline]] inline void sqrt_softplus_impl(float* s, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const double y = det::log1p_unit_lanes(det::exp_nonpositive_lanes(-std::abs(double(x[i]))));
    s[i] = std::sqrt(std::max(x[i], 0.0f) + static_cast<float>(y));
  }
}
MOE_SIMD_KERNEL(sqrt_softplus_f32, sqrt_softplus_impl, (float* s, const float* x, int64_t count),
                (s, x, count))

// sqrt(softplus)'s backward for `count` floats, score_backward's loop with its branch as a select:
// a lane with s = 0 computes a term and keeps dx as it was, so each level's loop vectorises, and
// the lanes that add do score_backward's operations.
[[gnu::always_inline]] inline void sqrt_softplus_backward_impl(float* dx, const float* ds,
                                                               const float* x, const float* s,
                                                               int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float term = ds[i] * stable_sigmoid(x[i]) / (2.0f * s[i]);
    dx[i] = s[i] > 0.0f ? dx[i] + term : dx[i];
  }
}
MOE_SIMD_KERNEL(sqrt_softplus_backward_f32, sqrt_softplus_backward_impl,
                (float* dx, const float* ds, const float* x, const float* s, int64_t count),
                (dx, ds, x, s, count))

MOE_SIMD_KERNEL(router_logits_f32, router_logits_rows<float>,
                (float* logits, const float* in, const float* w_gate, int n0, int n1, int D, int E),
                (logits, in, w_gate, n0, n1, D, E))

// The integer that orders values as top-k's total order ranks them: larger first, −0 and +0
// equal (they compare equal, so they rank by index), NaN below every number and NaNs equal. A
// float's bits with the sign taken off order its magnitude; a negative value's key is that
// negated (at most the bits of infinity: no overflow).
template <class T> auto rank_key(T v) {
  using I = std::conditional_t<sizeof(T) == 8, int64_t, int32_t>;
  const I bits = std::bit_cast<I>(v);
  const I magnitude = bits & std::numeric_limits<I>::max();
  return std::isnan(v) ? std::numeric_limits<I>::min() : (bits < 0 ? -magnitude : magnitude);
}

// An expert's place in the total order is the number of experts that rank before it (a larger
// key, or an equal one at a lower index); those placed below K are the top K, at their places.
// The E·E comparisons run without a branch on the data, in a loop the compiler vectorises.
template <class I>
[[gnu::always_inline]] inline void top_by_ranks(int32_t* top, const I* key, int E, int K) {
  int before[kRankedMaxE] = {};
  for (int f = 0; f < E; ++f) {
    const I kf = key[f];
    for (int e = 0; e < E; ++e) before[e] += (kf > key[e]) | ((kf == key[e]) & (f < e)) ? 1 : 0;
  }
  for (int e = 0; e < E; ++e) {
    if (before[e] < K) top[before[e]] = e;
  }
}
MOE_SIMD_KERNEL(top_by_ranks_i32, top_by_ranks<int32_t>,
                (int32_t * top, const int32_t* key, int E, int K), (top, key, E, K))

// The same top K by K passes of a maximum, E·K comparisons instead of E·E: each pass takes the
// largest of the experts not yet taken. Key and index go as one 64-bit integer, the key in the
// high half and E − e in the low one, which orders as the ranks do (a larger key first, at an
// equal key the lower index) and makes every pair distinct; a taken expert's pair becomes the
// smallest integer, below every pair (whose low half is at least 1).
[[gnu::always_inline]] inline void top_by_max(int32_t* top, const int32_t* key, int E, int K) {
  constexpr int64_t kTaken = std::numeric_limits<int64_t>::min();
  int64_t pair[kRankedMaxE];
  for (int e = 0; e < E; ++e) pair[e] = int64_t{key[e]} * (int64_t{1} << 32) + (E - e);
  for (int j = 0; j < K; ++j) {
    int64_t best = kTaken;
    for (int e = 0; e < E; ++e) best = std::max(best, pair[e]);
    const int e = E - static_cast<int>(best & 0xffffffff);
    top[j] = e;
    pair[e] = kTaken;
  }
}
MOE_SIMD_KERNEL(top_by_max_i32, top_by_max, (int32_t * top, const int32_t* key, int E, int K),
                (top, key, E, K))

template <class T> void topk_ranked(int32_t* top, const T* s, const float* bias, int E, int K) {
  using I = decltype(rank_key(T(0)));
  I key[kRankedMaxE];
  for (int e = 0; e < E; ++e) key[e] = rank_key(bias != nullptr ? s[e] + T(bias[e]) : s[e]);
  if constexpr (std::is_same_v<I, int32_t>) {
    // Passes of a maximum where K is at most E/8 (measured with bench_row_kernels at E = 64,
    // K = 8: 1.9x faster than ranks at avx512, 1.4x at avx2); ranks where K is larger (E = 32,
    // K = 8 and E = 8, K = 2 measured faster by ranks).
    if (K * 8 <= E) return top_by_max_i32(top, key, E, K);
    top_by_ranks_i32(top, key, E, K);
  } else {
    top_by_ranks(top, key, E, K);
  }
}

}  // namespace

void router_logits_rows_f32(float* logits, const float* in, const float* w_gate, int n0, int n1,
                            int D, int E) {
  router_logits_f32(logits, in, w_gate, n0, n1, D, E);
}

void sqrt_softplus_rows_f32(float* s, const float* x, int64_t count) {
  sqrt_softplus_f32(s, x, count);
}

void sqrt_softplus_backward_rows_f32(float* dx, const float* ds, const float* x, const float* s,
                                     int64_t count) {
  sqrt_softplus_backward_f32(dx, ds, x, s, count);
}

void topk_row_ranked(int32_t* top, const float* s, const float* bias, int E, int K) {
  topk_ranked(top, s, bias, E, K);
}

void topk_row_ranked(int32_t* top, const double* s, const float* bias, int E, int K) {
  topk_ranked(top, s, bias, E, K);
}

}  // namespace moe
