// Finite-difference gradient checks shared by the model tests (test_ops.cpp, test_attention.cpp):
// the step and tolerance, central-difference gradients of a scalar loss, the comparison of an
// accumulated analytic gradient against them, and the random inputs and dot product the tests
// build their losses from (loss = Σ out·r, so d_out = r).
// Legend: n elements of the vector being differentiated.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/rng.hpp"

namespace moe::fd_check {

using Vec = std::vector<double>;

// Central differences with h = 1e-6 in double: truncation error O(h²·L''') ~ 1e-12 and round-off
// ~ 1e-16·|L|/h ~ 1e-10..1e-9 for the O(1)..O(10) losses of these tests, so an analytic gradient
// must agree to kFdTol = 1e-6 relative to max(1, |analytic|, |numeric|): a wrong term shows up as
// O(1e-2..1).
inline constexpr double kFdStep = 1e-6;
inline constexpr double kFdTol = 1e-6;

// n standard normal values times `scale`, from the rng stream (seed, stream_name): each test file
// names its own stream, so its inputs do not change when another file's do.
inline Vec normal_vector(std::string_view stream_name, size_t n, uint64_t seed, double scale) {
  const uint64_t stream = rng_stream(seed, stream_name);
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * rng_normal(stream, i);
  return v;
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ∂loss/∂x by central differences; x is restored afterwards.
inline Vec numeric_grad(Vec& x, const std::function<double()>& loss) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kFdStep;
    const double up = loss();
    x[i] = saved - kFdStep;
    const double down = loss();
    x[i] = saved;
    g[i] = (up - down) / (2.0 * kFdStep);
  }
  return g;
}

// Backward functions add into gradients: the tests start them at `prior` and compare
// grad − prior, which checks the accumulation as well as the value. Empty prior: zero.
// A mismatch is reported as `what[i]`.
inline void expect_grad_near(const Vec& grad, const Vec& prior, const Vec& numeric,
                             const std::string& what) {
  ASSERT_EQ(grad.size(), numeric.size());
  for (size_t i = 0; i < grad.size(); ++i) {
    const double analytic = grad[i] - (prior.empty() ? 0.0 : prior[i]);
    const double scale = std::max({1.0, std::abs(analytic), std::abs(numeric[i])});
    EXPECT_NEAR(analytic, numeric[i], kFdTol * scale) << what << "[" << i << "]";
  }
}

}  // namespace moe::fd_check
