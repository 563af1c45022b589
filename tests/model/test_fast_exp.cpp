// fast_expf against exp in double: relative error below 2·2^-23 over the clamped range, exact
// at 0, finite and monotone at the ends; the float sigmoid built on it.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "model/fast_exp.hpp"
#include "model/swiglu.hpp"

namespace moe {
namespace {

TEST(FastExp, WithinTwoUlpOverTheRange) {
  const double ulp = std::numeric_limits<float>::epsilon();  // 2^-23, one ulp at [1, 2)
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 2000000.0f;
    const double want = std::exp(static_cast<double>(x));
    const double got = fast_expf(x);
    worst = std::max(worst, std::abs(got - want) / want);
  }
  EXPECT_LT(worst, 2 * ulp) << "worst relative error " << worst;
}

TEST(FastExp, ExactAtZeroUnderflowsToZeroFiniteAbove) {
  EXPECT_EQ(fast_expf(0.0f), 1.0f);
  EXPECT_EQ(fast_expf(-1000.0f), 0.0f);  // underflow to 0, as std::exp does
  EXPECT_EQ(fast_expf(-87.7f), 0.0f);
  EXPECT_GT(fast_expf(-87.0f), 0.0f);
  EXPECT_TRUE(std::isfinite(fast_expf(1000.0f)));
  EXPECT_EQ(fast_expf(1000.0f), fast_expf(88.0f));
  float prev = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.37f) {
    EXPECT_GE(fast_expf(x), prev) << x;
    prev = fast_expf(x);
  }
}

TEST(FastExp, FloatSigmoidAgreesWithDouble) {
  for (float x = -120.0f; x <= 120.0f; x += 0.013f) {
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    EXPECT_NEAR(stable_sigmoid(x), want, 1.5e-7) << x;
  }
}

// swiglu_forward/backward in float run the clone for this CPU's instruction-set level (AVX-512
// here); the same formula evaluated element by element in this file (plain SSE2 code, no FMA)
// must give the same bits, with and without the clamp, over normal, large and tiny inputs.
TEST(FastExp, SwigluKernelCloneMatchesScalarFormulaBitwise) {
  const int64_t n = 20000;
  std::vector<float> g(n), v(n), d_h(n), h(n), d_g(n), d_v(n);
  for (int64_t i = 0; i < n; ++i) {
    const float u = static_cast<float>(i) / n;
    g[i] = (i % 7 == 0) ? -100.0f + 200.0f * u : 12.0f * std::sin(37.0f * u);
    v[i] = 11.0f * std::cos(23.0f * u);
    d_h[i] = (i % 5 == 0) ? 1e-30f : std::sin(5.0f * u);
  }
  for (float limit : {10.0f, 0.0f}) {
    swiglu_forward(h.data(), g.data(), v.data(), n, limit);
    swiglu_backward(d_g.data(), d_v.data(), d_h.data(), g.data(), v.data(), n, limit);
    const float lim = limit > 0 ? limit : std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      const float gc = std::min(g[i], lim), vc = std::min(std::max(v[i], -lim), lim);
      const float sig = stable_sigmoid(gc);
      const float want_h = gc * sig * vc;
      const float dg = d_h[i] * vc * sig * (1.0f + gc * (1.0f - sig));
      const float want_dg = g[i] <= lim ? dg : 0.0f;
      const float want_dv = (v[i] >= -lim && v[i] <= lim) ? d_h[i] * (gc * sig) : 0.0f;
      ASSERT_EQ(std::bit_cast<uint32_t>(h[i]), std::bit_cast<uint32_t>(want_h)) << i << " " << limit;
      ASSERT_EQ(std::bit_cast<uint32_t>(d_g[i]), std::bit_cast<uint32_t>(want_dg)) << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(d_v[i]), std::bit_cast<uint32_t>(want_dv)) << i;
    }
  }
}

}  // namespace
}  // namespace moe
