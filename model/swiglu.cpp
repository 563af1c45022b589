// SwiGLU forward and backward with DeepSeek-V4's clamp, as plain elementwise loops.
// Legend: n = N·F elements (N rows/tokens, F expert width).
//
// silu(x) = x·σ(x), silu'(x) = σ(x)·(1 + x·(1 − σ(x))). The clamp is a min/clamp, so its
// derivative is 1 inside and 0 where the bound is active; at exactly g == limit or |v| == limit
// the gradient passes (either one-sided derivative is a valid subgradient).
#include "model/swiglu.hpp"

namespace moe {
namespace {

// The clamped pair (g', v') of the forward; `pass_g`/`pass_v` say whether the clamp let the
// value through unchanged, i.e. whether its derivative is 1 rather than 0.
template <class T>
struct Clamped {
  T g, v;
  bool pass_g, pass_v;
};

template <class T>
Clamped<T> swiglu_clamp(T g, T v, float limit) {
  if (!(limit > 0.0f)) return {g, v, true, true};
  const T lim = T(limit);
  Clamped<T> c{g, v, true, true};
  if (g > lim) {
    c.g = lim;
    c.pass_g = false;
  }
  if (v > lim || v < -lim) {
    c.v = v > lim ? lim : -lim;
    c.pass_v = false;
  }
  return c;
}

}  // namespace

template <class T>
void swiglu_forward(T* h, const T* g, const T* v, int64_t n, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const Clamped<T> c = swiglu_clamp(g[i], v[i], limit);
    h[i] = c.g * stable_sigmoid(c.g) * c.v;
  }
}

template <class T>
void swiglu_backward(T* d_g, T* d_v, const T* d_h, const T* g, const T* v, int64_t n,
                     float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const Clamped<T> c = swiglu_clamp(g[i], v[i], limit);
    const T sig = stable_sigmoid(c.g);
    const T silu = c.g * sig;
    // h = silu(g')·v', g' = min(g, limit)  ->  d_g = d_h·v'·silu'(g')·[g <= limit]
    d_g[i] = c.pass_g ? d_h[i] * c.v * sig * (T(1) + c.g * (T(1) - sig)) : T(0);
    // h = silu(g')·v', v' = clamp(v, ±limit)  ->  d_v = d_h·silu(g')·[|v| <= limit]
    d_v[i] = c.pass_v ? d_h[i] * silu : T(0);
  }
}

template void swiglu_forward<float>(float*, const float*, const float*, int64_t, float);
template void swiglu_forward<double>(double*, const double*, const double*, int64_t, float);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*,
                                     int64_t, float);
template void swiglu_backward<double>(double*, double*, const double*, const double*,
                                      const double*, int64_t, float);

}  // namespace moe
