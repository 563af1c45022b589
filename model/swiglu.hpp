// SwiGLU activation of the experts, elementwise over the two projections g = u·W1 and
// v = u·W3: h = silu(g')·v' with g' = min(g, limit), v' = clamp(v, -limit, limit) when limit > 0,
// and no clamp when limit <= 0 (the shared experts). Also the overflow-free sigmoid that the
// router's score functions share.
// Legend: n = N·F elements (N rows/tokens, F expert width); D, E experts, K top-k, V vocab unused.
#pragma once

#include <cmath>
#include <cstdint>

#include "model/fast_exp.hpp"

namespace moe {

// 1/(1+exp(-x)) without overflow: exp is only taken of a non-positive number, so the result is
// accurate for all x and tends to 0 (not NaN) for x → -inf and to 1 for x → +inf. In float the
// exp is fast_expf (under 2 ulp), so that the elementwise loops vectorise.
template <class T> inline T stable_sigmoid(T x) {
  // exp of a non-positive argument never overflows; a select instead of a branch keeps the
  // elementwise loops free of mispredictions on random-sign inputs (measured 2.6× faster).
  const T e = kernel_exp(-std::abs(x));
  const T r = T(1) / (T(1) + e);
  return x >= T(0) ? r : e * r;
}

// Overwrites h.
template <class T>
void swiglu_forward(T* h,        // [n]
                    const T* g,  // [n] gate projection u·W1
                    const T* v,  // [n] value projection u·W3
                    int64_t n, float limit);

// Overwrites d_g and d_v: they are elementwise intermediates (the caller turns them into weight
// and input gradients with linear_backward), so there is nothing to accumulate into.
// Where the clamp is active (g > limit, |v| > limit) the gradient is zero. d_h is read as d_h + 0
// (−0 as +0), so that a d_h written by linear_backward_input_overwrite gives the bits of one
// added into zeros. Then overwrites d_h with the forward's h, the same bits as swiglu_forward's
// (the same operations on the same values): the MoE layer keeps no h from its forward, whose
// W2 weight gradient reads it back from here.
template <class T>
void swiglu_backward(T* d_g,      // [n]
                     T* d_v,      // [n]
                     T* d_h_h,    // [n] in: d_h; out: h
                     const T* g,  // [n] forward input, before the clamp
                     const T* v,  // [n] forward input, before the clamp
                     int64_t n, float limit);

}  // namespace moe
