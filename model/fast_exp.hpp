// A vectorisable exp for the experts' elementwise loops. std::exp is a library call that GCC
// cannot vectorise, and SwiGLU evaluates it twice per element of every expert activation (about
// 1.8 M calls per deepseek4-tiny step): at ~7 ns each it was a quarter of a 1-rank step.
//
// exp(x) = 2^n · exp(r), n = round(x / ln 2), r = x − n·ln 2 in [−ln2/2, ln2/2] (ln 2 split in a
// high part exact in float and a low part, Cody–Waite, so r is exact to rounding), exp(r) by its
// Taylor series to r^7 (truncation < 6e-9 relative on that interval, below float's half-ulp), and
// 2^n built from its exponent bits. Branch-free: conversions, min/max and multiply-adds, which
// GCC vectorises with SSE2, AVX2 or AVX-512. Relative error below 2·2^-23 for x in [−87, 88]
// (tested; exp(−87) ≈ 1.6e-38 is about the smallest normal float); below about −87.68 the
// result is 0, between that and −87 a subnormal; above 88 it is exp(88) (finite).
// Double uses det::exp (numeric/det_math.hpp): the gradient checks run in double against finite
// differences.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "numeric/det_math.hpp"

namespace moe {

inline float fast_expf(float x_in) {
  // min/max, copysign and a shift only, no select: the loops that call this vectorise with any
  // instruction set (GCC turns a select here into a branch when building for AVX2).
  const float x = std::min(std::max(x_in, -88.0f), 88.0f);
  const float t = x * 1.44269504088896341f;                            // x / ln 2
  const int32_t n = static_cast<int32_t>(t + std::copysign(0.5f, t));  // round half away
  const float nf = static_cast<float>(n);
  const float r = (x - nf * 0.693145751953125f) - nf * 1.42860682030941723e-6f;  // ln2 hi + lo
  // Horner form of 1 + r + r²/2! + ... + r⁷/7!
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n from its exponent bits; n >= −127 after the clamp, and n = −127 gives the bits of +0,
  // so that the result underflows to exactly 0, as exp does in float.
  const float scale = std::bit_cast<float>(static_cast<int32_t>((n + 127) << 23));
  return p * scale;
}

// exp for the elementwise kernels: fast_expf in float, det::exp in double.
template <class T> inline T kernel_exp(T x) {
  return det::exp(x);
}
template <> inline float kernel_exp<float>(float x) {
  return fast_expf(x);
}

}  // namespace moe
