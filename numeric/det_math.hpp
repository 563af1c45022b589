// exp, log, log1p, pow, sin and cos written with IEEE additions, multiplications and divisions
// only, so that their bits are the same on every machine and C library. glibc chooses among
// builds of its own exp, log, pow, sin and cos by the CPU (an FMA build where the CPU has FMA),
// and they are not correctly rounded: the build chosen, or another glibc version, could change a
// last bit of a parameter's initial value, a token of the synthetic data or a RoPE angle, and
// then every bit after it. Everything in moe_rt whose value reaches a run's bits uses these.
//
// Accuracy: within a few units in the last place of double (tests/model/test_det_math.cpp checks
// them against the C library); the model rounds most results to float. The methods are the
// textbook ones: Cody–Waite argument reduction with split constants, then a Taylor or atanh
// series long enough that its truncation is below half an ulp. -ffp-contract=off (the project's
// default) keeps every a·b + c two roundings, so no build fuses them differently.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace moe::det {

namespace detail {

constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2, the high 32 bits (exact n·hi)
constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 − kLn2Hi
constexpr double kInvLn2 = 1.44269504088896338700e+00;
// π/2 as 33 + 33 bits and the rest: n·hi and n·mid are exact for |n| < 2^20.
constexpr double kPio2Hi = 1.57079632673412561417e+00;
constexpr double kPio2Mid = 6.07710050630396597660e-11;
constexpr double kPio2Lo = 2.02226624879595063154e-21;
constexpr double kTwoOverPi = 6.36619772367581382433e-01;

// 2^n for n in [-1022, 1023], from its exponent bits (exact).
inline double pow2(int n) {
  return std::bit_cast<double>(static_cast<uint64_t>(n + 1023) << 52);
}

// x·2^n for n in [-1074, 1024], rounded once (as ldexp, without the library call): in two exact
// steps where 2^n itself is no normal number.
inline double scale2(double x, int n) {
  if (n > 1023) return x * pow2(1023) * pow2(n - 1023);
  if (n < -1022) return x * pow2(n + 54) * pow2(-54);
  return x * pow2(n);
}

// Rounds to the nearest integer, ties away from zero, without the library.
inline double round_half_away(double x) {
  const double t = static_cast<double>(static_cast<int64_t>(x));  // toward zero
  const double f = x - t;
  if (f >= 0.5) return t + 1.0;
  if (f <= -0.5) return t - 1.0;
  return t;
}

// sin(r) and cos(r) for |r| <= π/4 by their Taylor series to r^21 and r^20 (truncation below
// 2^-60 relative there).
inline double sin_reduced(double r) {
  const double r2 = r * r;
  double p = 1.0 / 51090942171709440000.0;  // 1/21!
  p = p * r2 - 1.0 / 121645100408832000.0;  // 1/19!
  p = p * r2 + 1.0 / 355687428096000.0;     // 1/17!
  p = p * r2 - 1.0 / 1307674368000.0;       // 1/15!
  p = p * r2 + 1.0 / 6227020800.0;          // 1/13!
  p = p * r2 - 1.0 / 39916800.0;            // 1/11!
  p = p * r2 + 1.0 / 362880.0;              // 1/9!
  p = p * r2 - 1.0 / 5040.0;                // 1/7!
  p = p * r2 + 1.0 / 120.0;                 // 1/5!
  p = p * r2 - 1.0 / 6.0;                   // 1/3!
  return r + r * (r2 * p);
}

inline double cos_reduced(double r) {
  const double r2 = r * r;
  double p = 1.0 / 2432902008176640000.0;  // 1/20!
  p = p * r2 - 1.0 / 6402373705728000.0;   // 1/18!
  p = p * r2 + 1.0 / 20922789888000.0;     // 1/16!
  p = p * r2 - 1.0 / 87178291200.0;        // 1/14!
  p = p * r2 + 1.0 / 479001600.0;          // 1/12!
  p = p * r2 - 1.0 / 3628800.0;            // 1/10!
  p = p * r2 + 1.0 / 40320.0;              // 1/8!
  p = p * r2 - 1.0 / 720.0;                // 1/6!
  p = p * r2 + 1.0 / 24.0;                 // 1/4!
  p = p * r2 - 0.5;                        // 1/2!
  return 1.0 + r2 * p;
}

// x = n·π/2 + r, |r| <= π/4 (to rounding), accurate for |x| < 2^19·π (RoPE angles, schedules,
// Box–Muller); |x| < 2^62, which sin and cos check first.
inline double reduce_pio2(double x, int64_t& quadrant) {
  const double n = round_half_away(x * kTwoOverPi);
  quadrant = static_cast<int64_t>(n);
  return ((x - n * kPio2Hi) - n * kPio2Mid) - n * kPio2Lo;
}

// e^r for |r| <= ln2/2 (to rounding) by its Taylor series to r^14 (truncation below 2^-56
// relative).
inline double exp_reduced(double r) {
  double p = 1.0 / 87178291200.0;  // 1/14!
  p = p * r + 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  return 1.0 + (r + r * (r * p));
}

// log m for m in [sqrt(1/2), sqrt(2)): log m = 2·atanh(f), f = s/(2 + s), s = m − 1 (exact),
// |f| <= 0.1716: the series to f^25 (truncation below 2^-60 relative). 2f = s − f·s, so
// log m = s − (f·s − 2f·f²·(1/3 + …)): the exact s carries the result and only small corrections
// round.
inline double log_reduced(double m) {
  const double s = m - 1.0;
  const double f = s / (2.0 + s);
  const double f2 = f * f;
  double p = 1.0 / 25.0;
  for (int k = 23; k >= 3; k -= 2) p = p * f2 + 1.0 / k;
  return s - (f * s - 2.0 * f * (f2 * p));
}

}  // namespace detail

// e^x. Overflow gives +inf, underflow 0 (through subnormals).
inline double exp(double x) {
  using namespace detail;
  if (x != x) return x;
  if (x > 709.782712893384) return std::numeric_limits<double>::infinity();
  if (x < -745.2) return 0.0;
  const double n = round_half_away(x * kInvLn2);
  const double r = (x - n * kLn2Hi) - n * kLn2Lo;  // |r| <= 0.3466 (to rounding)
  const double er = exp_reduced(r);
  return scale2(er, static_cast<int>(n));  // exact scaling (rounded once if subnormal)
}

// The natural logarithm: NaN below 0, -inf at 0.
inline double log(double x) {
  using namespace detail;
  if (x != x || x < 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) return -std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return x;
  // x = m·2^e, m in [0.5, 1), from the bits (subnormals scaled up by 2^54 first): exact.
  int e = 0;
  uint64_t bits = std::bit_cast<uint64_t>(x);
  if ((bits >> 52) == 0) {
    bits = std::bit_cast<uint64_t>(x * pow2(54));
    e = -54;
  }
  e += static_cast<int>(bits >> 52) - 1022;
  double m = std::bit_cast<double>((bits & 0x000fffffffffffffull) | (uint64_t{1022} << 52));
  if (m < 0.70710678118654752440) {
    m *= 2.0;
    --e;
  }
  const double log_m = log_reduced(m);
  const double de = static_cast<double>(e);
  return (de * kLn2Hi + log_m) + de * kLn2Lo;
}

// log(1 + x), accurate for small x: log(u)·x/(u − 1) with u = 1 + x rounded, which cancels the
// rounding of u (Goldberg's method); x itself when u is 1.
inline double log1p(double x) {
  const double u = 1.0 + x;
  if (u == 1.0) return x;
  if (u == std::numeric_limits<double>::infinity()) return u;
  return log(u) * (x / (u - 1.0));
}

// x^y for x > 0 (and 1 for y = 0, 0 for x = 0 and y > 0): e^(y·log x). Relative error about
// |y·log x|·2^-53 beyond the last ulp, ample for the model's uses (|y·log x| < 20 in RoPE).
inline double pow(double x, double y) {
  if (y == 0.0) return 1.0;
  if (x == 0.0 && y > 0.0) return 0.0;
  return exp(y * log(x));
}

inline double sin(double x) {
  // NaN for NaN and ±inf, as the C library; past 2^62 the quadrant no longer fits (no use here).
  if (!(std::abs(x) < 0x1p62)) return std::numeric_limits<double>::quiet_NaN();
  int64_t q = 0;
  const double r = detail::reduce_pio2(x, q);
  switch (q & 3) {
    case 0:
      return detail::sin_reduced(r);
    case 1:
      return detail::cos_reduced(r);
    case 2:
      return -detail::sin_reduced(r);
    default:
      return -detail::cos_reduced(r);
  }
}

inline double cos(double x) {
  // NaN for NaN and ±inf, as the C library; past 2^62 the quadrant no longer fits (no use here).
  if (!(std::abs(x) < 0x1p62)) return std::numeric_limits<double>::quiet_NaN();
  int64_t q = 0;
  const double r = detail::reduce_pio2(x, q);
  switch (q & 3) {
    case 0:
      return detail::cos_reduced(r);
    case 1:
      return -detail::sin_reduced(r);
    case 2:
      return -detail::cos_reduced(r);
    default:
      return detail::sin_reduced(r);
  }
}

// Branch-free versions of exp and log1p over the ranges a softplus needs, and of log and cos over
// the ranges a Box–Muller draw needs, for loops the compiler vectorises: the same operations in
// the same order as their models above, the branches turned into selects whose both sides are
// computed (a side not taken may overflow or divide 0 by 0; moe_model builds with
// -fno-trapping-math, and nothing unmasks the exceptions), so each returns the same bits as its
// model wherever its domain holds (tests/model/test_det_math.cpp compares them over every binade
// and the edges).

namespace detail {

// round_half_away's value as a double, without the int64 conversion (equal for |v| < 2^63; trunc
// is exact). -inf stays -inf and NaN NaN, where the conversion has no value.
inline double round_half_away_lanes(double v) {
  const double t = std::trunc(v);
  const double f = v - t;
  return f <= -0.5 ? t - 1.0 : (f >= 0.5 ? t + 1.0 : t);
}

// log(m·2^e) for m in [0.5, 1) and an integer-valued e, as log combines them: m doubled (and e one
// less) below sqrt(1/2), then log_reduced.
inline double log_from_parts_lanes(double m, double e) {
  const bool low = m < 0.70710678118654752440;
  m = low ? m * 2.0 : m;
  e = low ? e - 1.0 : e;
  const double log_m = log_reduced(m);
  return (e * kLn2Hi + log_m) + e * kLn2Lo;
}

}  // namespace detail

// exp(z) for z <= 0, -inf included. A NaN gives a NaN (its sign and payload unspecified).
inline double exp_nonpositive_lanes(double z) {
  using namespace detail;
  const double n = round_half_away_lanes(z * kInvLn2);  // |z / ln 2| < 1076
  const double r = (z - n * kLn2Hi) - n * kLn2Lo;
  const double er = exp_reduced(r);
  // 2^k from its exponent bits, k an integer-valued double in [-1022, 1023]: k + 1023 + 2^52 holds
  // k + 1023 in its low bits (exact), shifted into the exponent field. Outside that range the bits
  // are garbage, and the select below does not take them.
  auto pow2_of = [](double k) {
    const uint64_t biased = std::bit_cast<uint64_t>(k + (1023.0 + 0x1p52)) & 0x7ffull;
    return std::bit_cast<double>(biased << 52);
  };
  const double normal = er * pow2_of(n);
  const double subnormal = er * pow2_of(n + 54.0) * pow2_of(-54.0);  // scale2's two exact steps
  const double scaled = n < -1022.0 ? subnormal : normal;
  return z < -745.2 ? 0.0 : scaled;
}

// log1p(x) for x in [0, 1] (an exp of a non-positive number): 1 + x is in [1, 2], so log's
// special cases never arise and its exponent is 1 or 2 (found by a compare, not from the bits).
inline double log1p_unit_lanes(double x) {
  using namespace detail;
  const double u = 1.0 + x;
  // log(u) as log computes it: u = m·2^e with m in [0.5, 1) (u/2 for u < 2, u/4 for u = 2: exact).
  const double log_u = log_from_parts_lanes(u < 2.0 ? u * 0.5 : u * 0.25, u < 2.0 ? 1.0 : 2.0);
  // u == 1 returns x itself; the division is then 0/0, which the select drops.
  const double result = log_u * (x / (u - 1.0));
  return u == 1.0 ? x : result;
}

// log(u) for u in [2^-1022, 1] (normal and at most 1: Box–Muller's 1 − uniform): log's special
// cases never arise there, and the exponent comes from the bits without an integer conversion.
inline double log_unit_lanes(double u) {
  using namespace detail;
  const uint64_t bits = std::bit_cast<uint64_t>(u);
  // The biased exponent k (1 … 1023) as a double: k + 2^52 from its bits, less 2^52 (exact).
  const double k = std::bit_cast<double>((bits >> 52) | 0x4330000000000000ull) - 0x1p52;
  const double m = std::bit_cast<double>((bits & 0x000fffffffffffffull) | (uint64_t{1022} << 52));
  return log_from_parts_lanes(m, k - 1022.0);
}

// cos(x) for |x| < 2^19·π (reduce_pio2's accurate range): both reduced series are computed and
// the quadrant selects one, negated where cos negates it.
inline double cos_lanes(double x) {
  using namespace detail;
  const double n = round_half_away_lanes(x * kTwoOverPi);  // |2x / π| < 2^20
  const double r = ((x - n * kPio2Hi) - n * kPio2Mid) - n * kPio2Lo;
  // The quadrant n mod 4 in [0, 4), as the int64's low two bits give it for either sign.
  const double q = n - 4.0 * std::floor(n * 0.25);
  const double c = cos_reduced(r), s = sin_reduced(r);
  return q == 0.0 ? c : (q == 1.0 ? -s : (q == 2.0 ? -c : s));
}

}  // namespace moe::det
