// The router's row loops at the CPU's vector width (model/router_simd.hpp).
// Legend: D model width, E experts.
#include "model/router_simd.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

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

}  // namespace moe
