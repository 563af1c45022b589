// SwiGLU forward and backward with DeepSeek-V4's clamp, as plain elementwise loops: split over
// the threads, and in float compiled for each instruction-set level.
// Legend: n = N·F elements (N rows/tokens, F expert width).
//
// silu(x) = x·σ(x), silu'(x) = σ(x)·(1 + x·(1 − σ(x))). The clamp is a min/clamp, so its
// derivative is 1 inside and 0 where the bound is active; at exactly g == limit or |v| == limit
// the gradient passes (either one-sided derivative is a valid subgradient).
#include "model/swiglu.hpp"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "model/parallel.hpp"
#include "model/simd.hpp"

namespace moe {
namespace {

// The clamp bound; +inf when there is no clamp, so the loops below need no branch and vectorise
// (min/max and selects only).
template <class T> T clamp_bound(float limit) {
  return limit > 0.0f ? T(limit) : std::numeric_limits<T>::infinity();
}

// Elements per call below which the loops stay on the calling thread.
constexpr int64_t kParallelMin = 8192;

template <class T>
[[gnu::always_inline]] inline void forward_block(T* h, const T* g, const T* v, int64_t n, T lim) {
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i], vi = v[i];    // values, not references into memory, for min/max
    const T gc = std::min(gi, lim);  // g' = min(g, limit)
    const T vc = std::min(std::max(vi, -lim), lim);  // v' = clamp(v, ±limit); NaN stays NaN
    h[i] = gc * stable_sigmoid(gc) * vc;
  }
}

// d_h_h holds d_h on entry and h on return: each element is read, then written.
template <class T>
[[gnu::always_inline]] inline void backward_block(T* d_g, T* d_v, T* d_h_h, const T* g, const T* v,
                                                  int64_t n, T lim) {
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i], vi = v[i];
    const T gc = std::min(gi, lim);
    const T vc = std::min(std::max(vi, -lim), lim);
    const T sig = stable_sigmoid(gc);
    const T silu = gc * sig;
    // h = silu(g')·v', g' = min(g, limit)  ->  d_g = d_h·v'·silu'(g')·[g <= limit]
    // d_h is read as d_h + 0, so a −0 counts as +0: callers may write d_h with a GEMM of beta 0
    // (linear_backward_input_overwrite) and get the bits of one that added into zeros.
    const T dh = d_h_h[i] + T(0);
    const T dg = dh * vc * sig * (T(1) + gc * (T(1) - sig));
    d_g[i] = gi <= lim ? dg : T(0);
    // h = silu(g')·v', v' = clamp(v, ±limit)  ->  d_v = d_h·silu(g')·[|v| <= limit]
    const T dv = dh * silu;
    d_v[i] = (vi >= -lim && vi <= lim) ? dv : T(0);
    // h itself, by forward_block's operations in its order: (g'·σ(g'))·v'.
    d_h_h[i] = silu * vc;
  }
}

// The float loops, one build per instruction-set level (model/simd.hpp).
MOE_SIMD_KERNEL(forward_block_f32, forward_block,
                (float* h, const float* g, const float* v, int64_t n, float lim), (h, g, v, n, lim))
MOE_SIMD_KERNEL(backward_block_f32, backward_block,
                (float* d_g, float* d_v, float* d_h_h, const float* g, const float* v, int64_t n,
                 float lim),
                (d_g, d_v, d_h_h, g, v, n, lim))

}  // namespace

template <class T> void swiglu_forward(T* h, const T* g, const T* v, int64_t n, float limit) {
  const T lim = clamp_bound<T>(limit);
  parallel_blocks(n, kParallelMin, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      forward_block_f32(h + b, g + b, v + b, e - b, lim);
    } else {
      forward_block(h + b, g + b, v + b, e - b, lim);
    }
  });
}

template <class T>
void swiglu_backward(T* d_g, T* d_v, T* d_h_h, const T* g, const T* v, int64_t n, float limit) {
  const T lim = clamp_bound<T>(limit);
  parallel_blocks(n, kParallelMin, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      backward_block_f32(d_g + b, d_v + b, d_h_h + b, g + b, v + b, e - b, lim);
    } else {
      backward_block(d_g + b, d_v + b, d_h_h + b, g + b, v + b, e - b, lim);
    }
  });
}

template void swiglu_forward<float>(float*, const float*, const float*, int64_t, float);
template void swiglu_forward<double>(double*, const double*, const double*, int64_t, float);
template void swiglu_backward<float>(float*, float*, float*, const float*, const float*, int64_t,
                                     float);
template void swiglu_backward<double>(double*, double*, double*, const double*, const double*,
                                      int64_t, float);

}  // namespace moe
