// Every instruction-set level of the float elementwise kernels (model/simd.hpp) against its CPU
// twin: the same formula compiled here at the default level (SSE2, no FMA: -ffp-contract=off),
// compared bit for bit. A level this CPU lacks is reported as skipped, never passed.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "model/embedding.hpp"
#include "model/fast_exp.hpp"
#include "model/optimizer.hpp"
#include "model/params.hpp"
#include "model/rmsnorm.hpp"
#include "model/rng.hpp"
#include "model/router.hpp"
#include "model/simd.hpp"
#include "model/softmax_rows.hpp"
#include "model/swiglu.hpp"
#include "numeric/det_math.hpp"

namespace moe {
namespace {

class SimdLevels : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (!simd_level_supported(GetParam())) {
      GTEST_SKIP() << "this CPU has no " << simd_level_name(GetParam());
    }
    simd_level_force(GetParam());
  }
  void TearDown() override { simd_level_reset(); }
};

uint32_t bits(float x) {
  return std::bit_cast<uint32_t>(x);
}
uint64_t bits(double x) {
  return std::bit_cast<uint64_t>(x);
}

// The router's sqrt(softplus) scores: logits over the range a diverging router reaches, the
// underflow of exp (|x| > 745) and subnormal softplus values, zeros of both signs, infinities.
TEST_P(SimdLevels, SqrtSoftplusScoresMatchTheScalarFormulaBitwise) {
  ASSERT_EQ(simd_level(), GetParam());
  const int E = 64, N = 300;
  std::vector<float> x(static_cast<size_t>(N) * E), s(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float u = static_cast<float>(i) / static_cast<float>(x.size());
    x[i] = (i % 3 == 0) ? -900.0f + 1800.0f * u : 20.0f * std::sin(91.0f * u);
  }
  x[0] = 0.0f, x[1] = -0.0f, x[2] = std::numeric_limits<float>::infinity();
  x[3] = -std::numeric_limits<float>::infinity(), x[4] = -745.5f, x[5] = -700.0f;
  x[6] = std::numeric_limits<float>::denorm_min(), x[7] = -103.0f, x[8] = 88.0f;
  score_forward(s.data(), x.data(), N, E, ScoreFunc::kSqrtSoftplus);
  for (size_t i = 0; i < x.size(); ++i) {
    const double z = -std::abs(static_cast<double>(x[i]));
    const float softplus = std::max(x[i], 0.0f) + static_cast<float>(det::log1p(det::exp(z)));
    ASSERT_EQ(bits(s[i]), bits(std::sqrt(softplus))) << "x = " << x[i];
  }
}

// The sqrt(softplus) scores' backward: d_x += d_s·σ(x)/(2s) where s > 0, dx untouched where the
// score underflowed to 0 (its sign of zero kept), logits from -900 to 900 and zeros of both signs.
TEST_P(SimdLevels, SqrtSoftplusBackwardMatchesTheScalarFormulaBitwise) {
  ASSERT_EQ(simd_level(), GetParam());
  const int E = 64, N = 53;
  std::vector<float> x(static_cast<size_t>(N) * E), s(x.size()), ds(x.size()), dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float u = static_cast<float>(i) / static_cast<float>(x.size());
    x[i] = (i % 3 == 0) ? -900.0f + 1800.0f * u : 20.0f * std::sin(91.0f * u);
    ds[i] = std::cos(7.0f * static_cast<float>(i));
    dx[i] = i % 5 == 0 ? -0.0f : 0.01f * std::sin(3.0f * static_cast<float>(i));
  }
  x[0] = 0.0f, x[1] = -0.0f, x[2] = -745.5f, x[3] = -200.0f;
  score_forward(s.data(), x.data(), N, E, ScoreFunc::kSqrtSoftplus);
  ASSERT_EQ(s[2], 0.0f);  // an underflowed score, whose lane must keep dx
  std::vector<float> want = dx;
  for (size_t i = 0; i < x.size(); ++i) {
    if (s[i] > 0.0f) want[i] += ds[i] * stable_sigmoid(x[i]) / (2.0f * s[i]);
  }
  score_backward(dx.data(), ds.data(), x.data(), s.data(), N, E, ScoreFunc::kSqrtSoftplus);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(bits(dx[i]), bits(want[i])) << "x = " << x[i] << ", s = " << s[i];
  }
}

// The router's logits: each (row, expert) the plain loop's sum over d in order, of products and
// adds rounded one by one, for E = 8 (tiny) and 16 (rows 8 at a time), 64 (fine) and 128 (4 at a
// time, in blocks of 64) and 100 (a block of 64 and a part), rows of mixed magnitudes whose sums
// cancel, and zeros of both signs; N = 37 leaves rows over.
TEST_P(SimdLevels, RouterLogitsMatchThePlainLoopBitwise) {
  ASSERT_EQ(simd_level(), GetParam());
  const int N = 37, D = 24;
  for (int E : {8, 16, 64, 100, 128}) {
    std::vector<float> in(static_cast<size_t>(N) * D), w(static_cast<size_t>(D) * E);
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = std::ldexp(std::sin(1.7f * static_cast<float>(i)), static_cast<int>(i % 9) - 4);
    }
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.3f * std::cos(0.37f * static_cast<float>(i));
    in[0] = -0.0f, in[D] = 0.0f, w[1] = -0.0f;
    std::vector<float> logits(static_cast<size_t>(N) * E);
    router_logits_forward(logits.data(), in.data(), w.data(), N, D, E);
    for (int n = 0; n < N; ++n) {
      for (int e = 0; e < E; ++e) {
        float sum = 0.0f;
        for (int d = 0; d < D; ++d) sum += in[size_t(n) * D + d] * w[size_t(d) * E + e];
        ASSERT_EQ(bits(logits[size_t(n) * E + e]), bits(sum))
            << "E " << E << ", row " << n << ", expert " << e;
      }
    }
  }
}

// Normal, large and tiny inputs, with and without the clamp; output gradients of −0 act as +0; the
// backward gives back the forward's h in d_h's place, bit for bit.
TEST_P(SimdLevels, SwigluMatchesTheScalarFormulaBitwise) {
  ASSERT_EQ(simd_level(), GetParam());
  const int64_t n = 20000;
  std::vector<float> g(n), v(n), d_h(n), h(n), d_g(n), d_v(n), h_again(n);
  for (int64_t i = 0; i < n; ++i) {
    const float u = static_cast<float>(i) / n;
    g[i] = (i % 7 == 0) ? -100.0f + 200.0f * u : 12.0f * std::sin(37.0f * u);
    v[i] = 11.0f * std::cos(23.0f * u);
    d_h[i] = (i % 5 == 0) ? 1e-30f : std::sin(5.0f * u);
    if (i % 11 == 0) d_h[i] = (i % 2 == 0) ? -0.0f : 0.0f;
  }
  for (float limit : {10.0f, 0.0f}) {
    swiglu_forward(h.data(), g.data(), v.data(), n, limit);
    h_again = d_h;
    swiglu_backward(d_g.data(), d_v.data(), h_again.data(), g.data(), v.data(), n, limit);
    const float lim = limit > 0 ? limit : std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      const float gc = std::min(g[i], lim), vc = std::min(std::max(v[i], -lim), lim);
      const float sig = stable_sigmoid(gc);
      const float want_h = gc * sig * vc;
      const float dh = d_h[i] + 0.0f;  // −0 read as +0
      const float dg = dh * vc * sig * (1.0f + gc * (1.0f - sig));
      const float want_dg = g[i] <= lim ? dg : 0.0f;
      const float want_dv = (v[i] >= -lim && v[i] <= lim) ? dh * (gc * sig) : 0.0f;
      ASSERT_EQ(bits(h[i]), bits(want_h)) << "h[" << i << "], limit " << limit;
      ASSERT_EQ(bits(d_g[i]), bits(want_dg)) << "d_g[" << i << "], limit " << limit;
      ASSERT_EQ(bits(d_v[i]), bits(want_dv)) << "d_v[" << i << "], limit " << limit;
      ASSERT_EQ(bits(h_again[i]), bits(h[i])) << "h again[" << i << "], limit " << limit;
    }
  }
}

// The masked softmax row and its backward as plain scalar loops, one row at a time: 16 lane
// accumulators, the lanes' max as std::max_element takes them and their sums in lane order.
void plain_softmax_row(float* pr, int first, int last, int n) {
  const int count = last - first + 1;
  const float* x = pr + first;
  float top[16], sum[16] = {};
  std::fill(top, top + 16, -std::numeric_limits<float>::infinity());
  int c0 = 0;
  for (; c0 + 16 <= count; c0 += 16) {
    for (int i = 0; i < 16; ++i) top[i] = std::max(top[i], x[c0 + i]);
  }
  for (int c = c0; c < count; ++c) top[0] = std::max(top[0], x[c]);
  const float z_max = *std::max_element(top, top + 16);
  for (int c = first; c <= last; ++c) pr[c] = fast_expf(pr[c] - z_max);
  for (c0 = 0; c0 + 16 <= count; c0 += 16) {
    for (int i = 0; i < 16; ++i) sum[i] += x[c0 + i];
  }
  for (int c = c0; c < count; ++c) sum[0] += x[c];
  float total = 0.0f;
  for (float part : sum) total += part;
  const float inv_sum = 1.0f / total;
  for (int c = first; c <= last; ++c) pr[c] *= inv_sum;
  std::fill(pr, pr + first, 0.0f);
  std::fill(pr + last + 1, pr + n, 0.0f);
}
void plain_softmax_row_backward(float* dr, const float* pr, int n) {
  float acc[16] = {};
  int c0 = 0;
  for (; c0 + 16 <= n; c0 += 16) {
    for (int i = 0; i < 16; ++i) acc[i] += pr[c0 + i] * dr[c0 + i];
  }
  for (int c = c0; c < n; ++c) acc[0] += pr[c] * dr[c];
  float p_dot_dp = 0.0f;
  for (float part : acc) p_dot_dp += part;
  for (int c = 0; c < n; ++c) dr[c] = pr[c] * (dr[c] - p_dot_dp);
}

// Rows of the lengths a query tile sees (up to 159 at deepseek4-tiny), every visible window, 1 to
// 9 rows a call (groups of four and what is left), rows further apart than their length, against
// each row alone in the plain loops above; row 1 has a zero of each sign as its largest values,
// row 2 a NaN among its visible scores (which the max skips and the exps carry).
TEST_P(SimdLevels, SoftmaxRowsMatchTheScalarFormulaBitwise) {
  for (int n : {1, 15, 16, 17, 64, 159}) {
    for (int first = 0; first < n; first += 7) {
      for (int last = first; last < n; last += 11) {
        for (int rows : {1, 4, 9}) {
          const int64_t ld = n + 3;
          std::vector<float> p(size_t(rows) * ld), want, d(p.size()), d_want;
          for (int r = 0; r < rows; ++r) {
            for (int c = 0; c < ld; ++c) {
              p[r * ld + c] =
                  3.0f * std::sin(0.37f * c + n + 1.3f * r) - (c % 13 == r % 13 ? 90.0f : 0.0f);
              d[r * ld + c] = std::cos(0.11f * c * n + 0.7f * r);
            }
          }
          if (rows > 2) {
            std::fill(&p[ld + first], &p[ld + last + 1], -2.0f);
            p[ld + last] = 0.0f;
            p[ld + first] = -0.0f;
            p[2 * ld + (first + last) / 2] = std::numeric_limits<float>::quiet_NaN();
          }
          want = p;
          d_want = d;
          softmax_rows_masked(p.data(), ld, rows, first, last, n);
          softmax_rows_backward(d.data(), p.data(), ld, rows, n);
          for (int r = 0; r < rows; ++r) {
            plain_softmax_row(want.data() + r * ld, first, last, n);
            plain_softmax_row_backward(d_want.data() + r * ld, want.data() + r * ld, n);
          }
          for (size_t i = 0; i < p.size(); ++i) {
            ASSERT_EQ(bits(p[i]), bits(want[i])) << "n " << n << " [" << first << ", " << last
                                                 << "] " << rows << " rows, element " << i;
            ASSERT_EQ(bits(d[i]), bits(d_want[i]))
                << "backward, " << rows << " rows, element " << i;
          }
        }
      }
    }
  }
}

// RMSNorm (the backward's row groups at each level) against one row at a time in the plain
// formula (compiled here: SSE2): row counts that leave a short last group (1, 7, 13 and 69, the
// last above the threads' cut-off) and widths that are not a whole number of lanes, term blocks
// or weight-column blocks (37, 200).
template <class T> struct PlainRmsnorm {
  std::vector<T> out, rstd, d_in, d_weight;
  PlainRmsnorm(const std::vector<T>& in, const std::vector<T>& w, const std::vector<T>& d_out,
               const std::vector<T>& d_in0, int N, int D, float eps)
      : out(in.size()), rstd(static_cast<size_t>(N)), d_in(d_in0), d_weight(w.size(), T(0)) {
    for (int n = 0; n < N; ++n) {
      const T* x = &in[static_cast<size_t>(n) * D];
      double sum_sq = 0.0;
      for (int d = 0; d < D; ++d) sum_sq += double(x[d]) * double(x[d]);
      rstd[n] = T(1.0 / std::sqrt(sum_sq / D + double(eps)));
      for (int d = 0; d < D; ++d) out[static_cast<size_t>(n) * D + d] = x[d] * rstd[n] * w[d];
    }
    for (int n = 0; n < N; ++n) {
      const size_t at = static_cast<size_t>(n) * D;
      const T r = rstd[n];
      double dot = 0.0;
      for (int d = 0; d < D; ++d) dot += double(d_out[at + d] * w[d]) * double(in[at + d] * r);
      const T mean_gx = T(dot / D);
      for (int d = 0; d < D; ++d) {
        d_in[at + d] += r * (d_out[at + d] * w[d] - in[at + d] * r * mean_gx);
      }
    }
    for (int d = 0; d < D; ++d) {
      for (int n = 0; n < N; ++n) {
        const size_t at = static_cast<size_t>(n) * D + d;
        d_weight[d] += d_out[at] * (in[at] * rstd[n]);
      }
    }
  }
};

template <class T> void expect_rmsnorm_rows_plain(int N, int D) {
  const size_t ND = static_cast<size_t>(N) * D;
  std::vector<T> in(ND), d_out(ND), d_in0(ND), w(static_cast<size_t>(D));
  for (size_t i = 0; i < ND; ++i) {
    in[i] = T(2.5 * std::sin(0.731 * double(i) + 0.2)) * (i % 17 == 0 ? T(40) : T(1));
    d_out[i] = T(std::cos(0.377 * double(i)));
    d_in0[i] = T(0.01 * std::sin(double(i)));
  }
  for (int d = 0; d < D; ++d) w[d] = T(0.5 + 0.01 * d);
  const float eps = 1e-6f;
  const PlainRmsnorm<T> want(in, w, d_out, d_in0, N, D, eps);
  std::vector<T> out(ND), rstd(static_cast<size_t>(N)), d_in = d_in0, d_weight(w.size(), T(0));
  rmsnorm_forward(out.data(), rstd.data(), in.data(), w.data(), N, D, eps);
  rmsnorm_backward(d_in.data(), d_weight.data(), d_out.data(), in.data(), w.data(), rstd.data(), N,
                   D);
  const std::string where = "N " + std::to_string(N) + " D " + std::to_string(D);
  for (int n = 0; n < N; ++n) {
    ASSERT_EQ(bits(rstd[n]), bits(want.rstd[n])) << where << " row " << n;
  }
  for (size_t i = 0; i < ND; ++i) {
    ASSERT_EQ(bits(out[i]), bits(want.out[i])) << where << " out " << i;
    ASSERT_EQ(bits(d_in[i]), bits(want.d_in[i])) << where << " d_in " << i;
  }
  for (int d = 0; d < D; ++d) {
    ASSERT_EQ(bits(d_weight[d]), bits(want.d_weight[d])) << where << " d_w " << d;
  }
}

TEST_P(SimdLevels, RmsnormRowGroupsMatchThePlainRowLoopBitwise) {
  for (int N : {1, 7, 13, 69}) {
    for (int D : {1, 37, 128, 200}) {
      expect_rmsnorm_rows_plain<float>(N, D);
      expect_rmsnorm_rows_plain<double>(N, D);
    }
  }
}

// The LM head's cross-entropy rows against the plain formula (std::max_element's max, compiled
// here): vocabularies that are and are not a multiple of the lanes, a row whose largest logit is
// zero of either sign (the first zero is the max), one whose exp underflows but at one column,
// and large negative logits; the rows go four at a time, the ninth alone.
TEST_P(SimdLevels, CrossEntropyRowsMatchThePlainFormulaBitwise) {
  for (int V : {1, 7, 37, 2048}) {
    const int N = 9;  // two groups of four rows, and one row alone
    std::vector<float> z(static_cast<size_t>(N) * V), dz(z.size()), want(z.size());
    std::vector<int32_t> y(N);
    std::vector<double> loss(N);
    for (int t = 0; t < N; ++t) {
      y[t] = (t * 13 + 5) % V;
      for (int v = 0; v < V; ++v) {
        z[static_cast<size_t>(t) * V + v] = 6.0f * std::sin(0.73f * v + 1.9f * t) - 30.0f * t;
      }
    }
    // Max −0 first, then +0 in a lane whose partial max comes first.
    float* r3 = &z[3 * static_cast<size_t>(V)];
    std::fill(r3, r3 + V, -2.0f);
    if (V > 20) r3[20] = 0.0f;
    r3[V > 20 ? 5 : 0] = -0.0f;
    float* r4 = &z[4 * static_cast<size_t>(V)];  // every exp but the max's underflows
    std::fill(r4, r4 + V, -200.0f);
    r4[V / 2] = 0.0f;
    const double scale = 1.0 / 777.0;
    const double total =
        cross_entropy_forward_backward(dz.data(), loss.data(), z.data(), y.data(), N, V, scale);
    double want_total = 0;
    for (int t = 0; t < N; ++t) {
      const float* zt = &z[static_cast<size_t>(t) * V];
      float* wt = &want[static_cast<size_t>(t) * V];
      const float zmax = *std::max_element(zt, zt + V);
      for (int v = 0; v < V; ++v) wt[v] = fast_expf(zt[v] - zmax);
      double part[8] = {};
      int v0 = 0;
      for (; v0 + 8 <= V; v0 += 8) {
        for (int i = 0; i < 8; ++i) part[i] += static_cast<double>(wt[v0 + i]);
      }
      for (int v = v0; v < V; ++v) part[0] += static_cast<double>(wt[v]);
      double sum = 0;
      for (double p : part) sum += p;
      const double row = det::log(sum) + static_cast<double>(zmax) - static_cast<double>(zt[y[t]]);
      ASSERT_EQ(std::bit_cast<uint64_t>(loss[t]), std::bit_cast<uint64_t>(row))
          << "V " << V << " row " << t;
      want_total += row;
      const float factor = static_cast<float>(scale / sum);
      for (int v = 0; v < V; ++v) wt[v] *= factor;
      wt[y[t]] -= static_cast<float>(scale);
      for (int v = 0; v < V; ++v) {
        ASSERT_EQ(bits(dz[static_cast<size_t>(t) * V + v]), bits(wt[v]))
            << "V " << V << " row " << t << " column " << v;
      }
    }
    ASSERT_EQ(std::bit_cast<uint64_t>(total), std::bit_cast<uint64_t>(want_total)) << "V " << V;
  }
}

// param_init's normal draws (float and double arenas, tensors whose lengths leave every tail of a
// vector, one range cut inside a tensor): init_std · rng_normal at each element's counter.
TEST_P(SimdLevels, ParamInitDrawsTheScalarNormals) {
  ASSERT_EQ(simd_level(), GetParam());
  ParamLayout l;
  l.add("w", 5003, ParamInit::kNormal, 0.02f);
  l.add("ones", 9, ParamInit::kOnes);
  for (int n = 1; n <= 17; ++n) {
    std::string name = "t";  // a literal + to_string trips GCC 12's -Wrestrict
    name += std::to_string(n);
    l.add(name, static_cast<size_t>(n), ParamInit::kNormal, 1.5f);
  }
  std::vector<float> f(l.num_elements);
  std::vector<double> d(l.num_elements), cut(l.num_elements, -9.0);
  param_init(std::span<float>(f), l, 21);
  param_init(std::span<double>(d), l, 21);
  param_init_range(std::span<double>(cut), l, 21, 11, 4000);
  for (const ParamEntry& e : l.entries) {
    if (e.init != ParamInit::kNormal) continue;
    const uint64_t stream = rng_stream(21, e.name);
    for (size_t i = 0; i < e.count; ++i) {
      const double want = e.init_std * rng_normal(stream, i);
      ASSERT_EQ(bits(f[e.offset + i]), bits(static_cast<float>(want))) << e.name << " " << i;
      ASSERT_EQ(std::bit_cast<uint64_t>(d[e.offset + i]), std::bit_cast<uint64_t>(want))
          << e.name << " " << i;
      const size_t at = e.offset + i;
      ASSERT_EQ(std::bit_cast<uint64_t>(cut[at]),
                std::bit_cast<uint64_t>(at >= 11 && at < 4000 ? want : -9.0))
          << e.name << " " << i;
    }
  }
}

// AdamW over tensors with and without weight decay, of lengths that leave every vector width a
// remainder, against its formula written out here, for two steps (the bias corrections differ):
// gradients of both signs, zeros of both signs, values near float's range and subnormals.
TEST_P(SimdLevels, AdamwMatchesThePlainLoopBitwise) {
  ASSERT_EQ(simd_level(), GetParam());
  ParamLayout l;
  l.add("w", 1003, ParamInit::kNormal, 0.02f);
  l.add("norm", 37, ParamInit::kOnes, 0.0f, false);
  l.add("v", 5, ParamInit::kNormal, 0.02f);
  const size_t n = l.num_elements;
  std::vector<float> p(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    const float u = static_cast<float>(i) / static_cast<float>(n);
    p[i] = 0.7f * std::sin(37.0f * u) + ((i % 11 == 0) ? 3e4f : 0.0f);
    g[i] = (i % 7 == 0) ? 1e-3f * std::cos(53.0f * u) : 40.0f * std::sin(91.0f * u);
  }
  g[0] = 0.0f, g[1] = -0.0f, g[2] = 1e30f, g[3] = -1e30f, g[4] = 1e-40f, g[5] = -1e-41f;
  p[6] = 0.0f, p[7] = -0.0f, p[8] = 1e-42f;
  const AdamWConfig c{};
  AdamWState s, want;
  adamw_state_init(s, n);
  adamw_state_init(want, n);
  std::vector<float> got = p, plain = p;
  const float lr = 3e-3f, scale = 0.5f;
  for (int64_t step = 1; step <= 2; ++step) {
    adamw_update(std::span<float>(got), std::span<const float>(g), s, l, c, lr, scale, step);
    const double bc1 = 1.0 - det::pow(static_cast<double>(c.beta1), static_cast<double>(step));
    const double bc2 = 1.0 - det::pow(static_cast<double>(c.beta2), static_cast<double>(step));
    const float step_size = static_cast<float>(lr / bc1);
    const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    for (const ParamEntry& e : l.entries) {
      const float decay = e.weight_decay ? lr * c.weight_decay : 0.0f;
      for (size_t i = e.offset; i < e.offset + e.count; ++i) {
        const float gi = g[i] * scale;
        want.m[i] = c.beta1 * want.m[i] + (1.0f - c.beta1) * gi;
        want.v[i] = c.beta2 * want.v[i] + (1.0f - c.beta2) * gi * gi;
        plain[i] -= decay * plain[i] +
                    step_size * want.m[i] / (std::sqrt(want.v[i]) * inv_sqrt_bc2 + c.eps);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(got[i]), bits(plain[i])) << "step " << step << " element " << i;
      ASSERT_EQ(bits(s.m[i]), bits(want.m[i])) << "step " << step << " element " << i;
      ASSERT_EQ(bits(s.v[i]), bits(want.v[i])) << "step " << step << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, SimdLevels,
                         ::testing::Values(SimdLevel::kSse2, SimdLevel::kAvx2, SimdLevel::kAvx512),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           return std::string(simd_level_name(info.param));
                         });

TEST(SimdLevel, ForcingALevelTheCpuLacksIsAnError) {
  if (simd_level_supported(SimdLevel::kAvx512)) GTEST_SKIP() << "this CPU has every level";
  EXPECT_THROW(simd_level_force(SimdLevel::kAvx512), std::invalid_argument);
}

}  // namespace
}  // namespace moe
