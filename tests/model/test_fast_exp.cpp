// fast_expf against exp in double: relative error below 2·2^-23 over the clamped range, exact
// at 0, finite and monotone at the ends; the float sigmoid built on it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

}  // namespace
}  // namespace moe
