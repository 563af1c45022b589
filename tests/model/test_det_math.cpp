// numeric/det_math.hpp against the C library: within a few units in the last place over the
// ranges moe_rt uses them on (and beyond), exact at the points where the value is exact, and the
// special values. Its point is that its bits are the same everywhere; that it is accurate is what
// this checks (the golden test, tests/cli/test_golden.py, checks the bits).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "numeric/det_math.hpp"

namespace moe {
namespace {

// Distance in units of the last place of `want` (double).
double ulps(double got, double want) {
  if (got == want) return 0;
  const double ulp =
      std::nextafter(std::abs(want), std::numeric_limits<double>::infinity()) - std::abs(want);
  return std::abs(got - want) / ulp;
}

template <class F, class G>
void expect_close(const char* name, F ours, G libm, double lo, double hi, double max_ulps,
                  int samples = 200000) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(lo, hi);
  double worst = 0, at = 0;
  for (int i = 0; i < samples; ++i) {
    const double x = u(rng);
    const double d = ulps(ours(x), libm(x));
    if (d > worst) worst = d, at = x;
  }
  EXPECT_LE(worst, max_ulps) << name << " on [" << lo << ", " << hi << "]: worst at " << at;
}

TEST(DetMath, ExpWithinTwoUlps) {
  expect_close(
      "exp", det::exp, [](double x) { return std::exp(x); }, -700, 700, 2);
  expect_close(
      "exp", det::exp, [](double x) { return std::exp(x); }, -1, 1, 2);
  // Results in the subnormal range are scaled in two exact steps and rounded once, as ldexp does.
  expect_close(
      "exp", det::exp, [](double x) { return std::exp(x); }, -745, -708, 1);
  EXPECT_EQ(det::exp(0.0), 1.0);
  EXPECT_EQ(det::exp(1000.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(det::exp(-1000.0), 0.0);
  EXPECT_TRUE(std::isnan(det::exp(std::nan(""))));
}

TEST(DetMath, LogWithinTwoUlpsAndLog1pWithinThree) {
  expect_close(
      "log", det::log, [](double x) { return std::log(x); }, 1e-300, 1e300, 2);
  expect_close(
      "log", det::log, [](double x) { return std::log(x); }, 0.5, 2, 2);
  // log1p where log(1 + x) would cancel, and where the synthetic data uses it (-u, u in [0, 1)).
  expect_close(
      "log1p", det::log1p, [](double x) { return std::log1p(x); }, -1e-8, 1e-8, 3);
  expect_close(
      "log1p", det::log1p, [](double x) { return std::log1p(x); }, -0.999, 10, 3);
  // Subnormal arguments: their exponent read from the bits after an exact scaling.
  for (double x : {4.9406564584124654e-324, 1e-310, 2.2250738585072014e-308}) {
    EXPECT_LE(ulps(det::log(x), std::log(x)), 1) << x;
  }
  EXPECT_EQ(det::log(1.0), 0.0);
  EXPECT_EQ(det::log(0.0), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(det::log(-1.0)));
  EXPECT_EQ(det::log1p(0.0), 0.0);
}

TEST(DetMath, PowWithinRoundingOfItsExponent) {
  // RoPE: theta^(-2i/hd); AdamW's bias correction: beta^step; Zipf weights: (b + 1)^-s.
  for (int i = 0; i < 64; ++i) {
    const double y = -2.0 * i / 128;
    EXPECT_LE(ulps(det::pow(10000.0, y), std::pow(10000.0, y)), 16) << "y = " << y;
  }
  for (int step = 1; step < 5000; step += 7) {
    EXPECT_LE(ulps(det::pow(0.95, step), std::pow(0.95, step)), 4.0 + step * 0.1) << step;
  }
  EXPECT_EQ(det::pow(3.0, 0.0), 1.0);
  EXPECT_EQ(det::pow(0.0, 2.0), 0.0);
}

TEST(DetMath, SinCosWithinTwoUlpsOfTheirMagnitude) {
  // Angles of RoPE (positions up to 1e5 times ω <= 1), Box–Muller (2πu) and the schedule (πp).
  for (double hi : {7.0, 1e3, 1e5}) {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> u(-hi, hi);
    double worst = 0;
    for (int i = 0; i < 200000; ++i) {
      const double x = u(rng);
      // Absolute error against 2^-52: near a zero of sin or cos, ulps of the tiny result say
      // nothing of the reduction's accuracy.
      worst = std::max(worst, std::abs(det::sin(x) - std::sin(x)) * 0x1.0p52);
      worst = std::max(worst, std::abs(det::cos(x) - std::cos(x)) * 0x1.0p52);
    }
    EXPECT_LE(worst, hi > 1e4 ? 64.0 : 4.0) << "|x| <= " << hi;
  }
  EXPECT_EQ(det::sin(0.0), 0.0);
  EXPECT_EQ(det::cos(0.0), 1.0);
}

// The branch-free lanes return exp's and log1p's own bits over their domains: every binade of
// the argument (random mantissas), the ties of exp's rounding to the nearest multiple of ln 2,
// the edges of underflow and subnormals, and the edges of log's reduction.
uint64_t bits_of(double x) {
  return std::bit_cast<uint64_t>(x);
}

TEST(DetMath, ExpLanesAreExpOnNonPositiveArguments) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::vector<double> zs = {0.0,
                            -0.0,
                            -std::numeric_limits<double>::infinity(),
                            -745.2,
                            std::nextafter(-745.2, 0.0),
                            std::nextafter(-745.2, -1000.0),
                            -745.1332191019411,
                            -708.3964185322641,
                            -708.4,
                            -709.0,
                            -744.0,
                            -std::numeric_limits<double>::min(),
                            -std::numeric_limits<double>::denorm_min(),
                            -1e300};
  for (int k = -1100; k <= 0; ++k) {  // near v = k + 0.5, where the rounding of n turns
    const double z = (k + 0.5) / 1.44269504088896338700e+00;
    zs.push_back(z);
    zs.push_back(std::nextafter(z, 0.0));
    zs.push_back(std::nextafter(z, -2000.0));
  }
  for (int binade = -1074; binade <= 10; ++binade) {
    for (int i = 0; i < 40; ++i) zs.push_back(-std::ldexp(mantissa(rng), binade));
  }
  for (const double z : zs) {
    ASSERT_EQ(bits_of(det::exp_nonpositive_lanes(z)), bits_of(det::exp(z))) << "z = " << z;
  }
}

TEST(DetMath, Log1pLanesAreLog1pOnTheUnitInterval) {
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::vector<double> xs = {0.0,
                            1.0,
                            std::nextafter(1.0, 0.0),
                            0x1p-53,
                            0x1p-52,
                            std::nextafter(0x1p-53, 1.0),
                            0.41421356237309503,
                            0.41421356237309515,
                            0.4142135623730951,
                            0.5,
                            1e-300,
                            std::numeric_limits<double>::denorm_min()};
  for (int binade = -1074; binade <= -1; ++binade) {
    for (int i = 0; i < 40; ++i) xs.push_back(std::ldexp(mantissa(rng), binade));
  }
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int i = 0; i < 100000; ++i) xs.push_back(unit(rng));
  for (const double x : xs) {
    ASSERT_EQ(bits_of(det::log1p_unit_lanes(x)), bits_of(det::log1p(x))) << "x = " << x;
  }
  // Together, as softplus takes them: log1p(exp(-|x|)) over the logits' range and beyond.
  std::uniform_real_distribution<double> logit(-800.0, 800.0);
  for (int i = 0; i < 100000; ++i) {
    const double z = -std::abs(logit(rng));
    ASSERT_EQ(bits_of(det::log1p_unit_lanes(det::exp_nonpositive_lanes(z))),
              bits_of(det::log1p(det::exp(z))))
        << "z = " << z;
  }
}

// log over Box–Muller's (0, 1]: every binade down to the smallest normal (random mantissas), the
// edges of the reduction (sqrt(1/2) and its neighbours in each of several binades), 1 and the
// smallest draw 2^-53, and uniform draws as 1 − uniform makes them.
TEST(DetMath, LogLanesAreLogOnTheUnitInterval) {
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::vector<double> us = {1.0,     std::nextafter(1.0, 0.0),
                            0x1p-53, std::nextafter(0x1p-53, 1.0),
                            0.5,     std::numeric_limits<double>::min()};
  for (int binade = -1022; binade <= -1; ++binade) {
    for (int i = 0; i < 40; ++i) us.push_back(std::ldexp(mantissa(rng), binade));
    const double edge = std::ldexp(1.4142135623730951, binade);  // m = sqrt(1/2) after halving
    for (const double u : {edge, std::nextafter(edge, 0.0), std::nextafter(edge, 1.0)}) {
      us.push_back(u);
    }
  }
  for (int i = 0; i < 200000; ++i) {
    us.push_back(1.0 - static_cast<double>(rng() >> 11) * 0x1.0p-53);
  }
  for (const double u : us) {
    ASSERT_EQ(bits_of(det::log_unit_lanes(u)), bits_of(det::log(u))) << "u = " << u;
  }
}

// cos over both signs up to reduce_pio2's range: Box–Muller's [0, 2π), random values in every
// binade below 2^19·π, the ties of the quadrant's rounding (x·2/π at k + 1/2) and their neighbours,
// and the multiples of π/2 where the quadrant turns.
TEST(DetMath, CosLanesAreCosInTheReducedRange) {
  std::mt19937_64 rng(10);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_real_distribution<double> turn(0.0, 6.283185307179586);
  std::vector<double> xs = {0.0,    -0.0,    6.283185307179586,
                            1e-300, -1e-300, std::numeric_limits<double>::denorm_min()};
  for (int k = -2000; k <= 2000; ++k) {
    for (const double at : {(k + 0.5) * 1.5707963267948966, k * 1.5707963267948966}) {
      xs.push_back(at);
      xs.push_back(std::nextafter(at, 1e9));
      xs.push_back(std::nextafter(at, -1e9));
    }
  }
  for (int binade = -60; binade <= 20; ++binade) {
    for (int i = 0; i < 40; ++i) {
      const double x = std::ldexp(mantissa(rng), binade);
      if (x >= 0x1p19 * 3.141592653589793) continue;
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (int i = 0; i < 200000; ++i) xs.push_back(turn(rng));
  for (const double x : xs) {
    ASSERT_EQ(bits_of(det::cos_lanes(x)), bits_of(det::cos(x))) << "x = " << x;
  }
}

}  // namespace
}  // namespace moe
