// CPU ops of model/: finite-difference gradient checks in double for linear, rmsnorm, swiglu, the
// score functions and the route weights; float-vs-double agreement of each forward; the checked
// GEMM against a naive triple loop, and its refusals.
// Legend: N rows/tokens, D model width, I/O linear input/output width, E experts, K top-k,
// n elements of an elementwise op; M, N, K also name a GEMM's dimensions in the GEMM tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "fd_check.hpp"
#include "model/blas.hpp"
#include "model/gemm/gemm.hpp"
#include "model/linear.hpp"
#include "model/optimizer.hpp"
#include "model/params.hpp"
#include "model/rmsnorm.hpp"
#include "model/rng.hpp"
#include "model/router.hpp"
#include "model/swiglu.hpp"

namespace moe {
namespace {

using fd_check::dot;
using fd_check::expect_grad_near;
using fd_check::numeric_grad;
using fd_check::Vec;

// Float forward vs double forward, relative to max(1, |double|): about 100 float ulps, enough for
// sums of a few dozen terms and for exp/log/sqrt, far below any real error.
constexpr double kFloatTol = 1e-5;

Vec random_normal(size_t n, uint64_t seed, double scale = 1.0) {
  return fd_check::normal_vector("tests.model.ops", n, seed, scale);
}

Vec random_uniform(size_t n, uint64_t seed, double lo, double hi) {
  const uint64_t stream = rng_stream(seed, "tests.model.ops.uniform");
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * rng_uniform(stream, i);
  return v;
}

// A copy of a test vector in the element type T.
template <class T> std::vector<T> as(const Vec& v) {
  return std::vector<T>(v.begin(), v.end());
}

// Runs `forward`, a lambda templated on the element type T (called with a T value) that returns
// the op's output as std::vector<T>, in double and in float, and compares the two.
template <class Forward> void expect_float_agrees(const Forward& forward, const char* what) {
  const Vec d = forward(double{});
  const std::vector<float> f = forward(float{});
  ASSERT_EQ(f.size(), d.size());
  for (size_t i = 0; i < d.size(); ++i) {
    EXPECT_NEAR(f[i], d[i], kFloatTol * std::max(1.0, std::abs(d[i]))) << what << "[" << i << "]";
  }
}

// ---- linear ------------------------------------------------------------------------------------

TEST(LinearGrad, MatchesFiniteDifferences) {
  const int N = 5, I = 7, O = 4;
  Vec in = random_normal(N * I, 1), weight = random_normal(I * O, 2), r = random_normal(N * O, 3);
  Vec out(N * O);
  auto loss = [&] {
    linear_forward(out.data(), in.data(), weight.data(), N, I, O);
    return dot(out, r);
  };
  const Vec prior_in = random_normal(N * I, 4), prior_w = random_normal(I * O, 5);
  Vec d_in = prior_in, d_weight = prior_w;
  linear_backward(d_in.data(), d_weight.data(), r.data(), in.data(), weight.data(), N, I, O);
  expect_grad_near(d_in, prior_in, numeric_grad(in, loss), "d_in");
  expect_grad_near(d_weight, prior_w, numeric_grad(weight, loss), "d_weight");
  // d_in == nullptr skips the input gradient and still adds the weight gradient.
  Vec d_weight_only = prior_w;
  linear_backward<double>(nullptr, d_weight_only.data(), r.data(), in.data(), weight.data(), N, I,
                          O);
  EXPECT_EQ(d_weight_only, d_weight);
}

// ---- rmsnorm -----------------------------------------------------------------------------------

TEST(RmsNormGrad, MatchesFiniteDifferences) {
  const int N = 4, D = 16;
  const float eps = 1e-6f;
  Vec in = random_normal(N * D, 21), r = random_normal(N * D, 23), weight = random_normal(D, 22);
  Vec out(N * D), rstd(N);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), in.data(), weight.data(), N, D, eps);
    return dot(out, r);
  };
  const Vec prior_in = random_normal(N * D, 24), prior_w = random_normal(D, 25);
  Vec d_in = prior_in, d_weight = prior_w;
  loss();
  rmsnorm_backward(d_in.data(), d_weight.data(), r.data(), in.data(), weight.data(), rstd.data(), N,
                   D);
  expect_grad_near(d_in, prior_in, numeric_grad(in, loss), "d_in");
  expect_grad_near(d_weight, prior_w, numeric_grad(weight, loss), "d_weight");
}

TEST(RmsNormForward, HandValues) {
  // Row (3, 4): mean(x²) = 12.5, rstd = 1/sqrt(12.5); gain (1, 2).
  const double in[2] = {3.0, 4.0}, weight[2] = {1.0, 2.0}, rstd_want = 1.0 / std::sqrt(12.5);
  double out[2], rstd[1];
  rmsnorm_forward(out, rstd, in, weight, 1, 2, 0.0f);
  EXPECT_DOUBLE_EQ(rstd[0], rstd_want);
  EXPECT_DOUBLE_EQ(out[0], 3.0 * rstd_want);
  EXPECT_DOUBLE_EQ(out[1], 8.0 * rstd_want);
}

// ---- swiglu ------------------------------------------------------------------------------------

// g, v uniform in [-3, 3], moved at least 0.05 away from the clamp's kinks (g = limit,
// |v| = limit), where the one-sided derivatives differ and a central difference straddles both.
void swiglu_inputs(Vec& g, Vec& v, int64_t n, float limit) {
  g = random_uniform(n, 31, -3.0, 3.0);
  v = random_uniform(n, 32, -3.0, 3.0);
  if (limit <= 0.0f) return;
  for (int64_t i = 0; i < n; ++i) {
    if (std::abs(g[i] - limit) < 0.05) g[i] += 0.1;
    if (std::abs(std::abs(v[i]) - limit) < 0.05) v[i] += v[i] > 0 ? 0.1 : -0.1;
  }
}

void check_swiglu_grad(float limit) {
  const int64_t n = 96;
  Vec g, v;
  swiglu_inputs(g, v, n, limit);
  if (limit > 0.0f) {  // the inputs must exercise both clamps, or the test would prove little
    EXPECT_GE(std::count_if(g.begin(), g.end(), [&](double x) { return x > limit; }), 10);
    EXPECT_GE(std::count_if(v.begin(), v.end(), [&](double x) { return std::abs(x) > limit; }), 10);
  }
  const Vec r = random_normal(n, 33);
  Vec h(n);
  auto loss = [&] {
    swiglu_forward(h.data(), g.data(), v.data(), n, limit);
    return dot(h, r);
  };
  // d_g, d_v are written, not added: stale values must not survive. d_h's place receives h.
  Vec d_g(n, 1e30), d_v(n, 1e30), d_h_h = r;
  swiglu_backward(d_g.data(), d_v.data(), d_h_h.data(), g.data(), v.data(), n, limit);
  loss();
  EXPECT_EQ(d_h_h, h);
  expect_grad_near(d_g, {}, numeric_grad(g, loss), "d_g");
  expect_grad_near(d_v, {}, numeric_grad(v, loss), "d_v");
}

TEST(SwigluGrad, MatchesFiniteDifferencesWithAndWithoutClamp) {
  for (float limit : {1.5f, 0.0f}) {
    SCOPED_TRACE(limit);
    check_swiglu_grad(limit);
  }
}

TEST(SwigluGrad, ClampedEntriesHaveZeroGradient) {
  const double g[3] = {12.0, 0.5, 0.5}, v[3] = {1.0, 11.0, -11.0};
  double h[3], d_g[3], d_v[3], d_h[3] = {1.0, 1.0, 1.0};
  swiglu_forward(h, g, v, 3, 10.0f);
  swiglu_backward(d_g, d_v, d_h, g, v, 3, 10.0f);
  const double silu_half = 0.5 / (1.0 + std::exp(-0.5));
  EXPECT_DOUBLE_EQ(h[0], 10.0 / (1.0 + std::exp(-10.0)) * 1.0);  // g clamped to 10
  EXPECT_DOUBLE_EQ(h[1], silu_half * 10.0);                      // v clamped to 10
  EXPECT_DOUBLE_EQ(h[2], silu_half * -10.0);                     // v clamped to -10
  // Zero exactly where a clamp is active, non-zero where the same element's other input passes.
  EXPECT_EQ(d_g[0], 0.0);
  EXPECT_EQ(d_v[1], 0.0);
  EXPECT_EQ(d_v[2], 0.0);
  EXPECT_TRUE(d_v[0] != 0.0 && d_g[1] != 0.0 && d_g[2] != 0.0);
}

// A NaN in either projection stays a NaN in h: a diverging run must not look finite.
TEST(SwigluForward, NanInEitherInputGivesNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float limit : {10.0f, 0.0f}) {
    const float g[2] = {nan, 1.0f}, v[2] = {1.0f, nan};
    float h[2];
    swiglu_forward(h, g, v, 2, limit);
    EXPECT_TRUE(std::isnan(h[0]) && std::isnan(h[1])) << "limit " << limit;
  }
}

TEST(SwigluForward, FiniteForLargeInputs) {
  const float g[4] = {-1e4f, 1e4f, -100.0f, 100.0f}, v[4] = {1.0f, 1.0f, 2.0f, 2.0f};
  float h[4], d_g[4], d_v[4], d_h[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  swiglu_forward(h, g, v, 4, 0.0f);
  swiglu_backward(d_g, d_v, d_h, g, v, 4, 0.0f);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(h[i]) && std::isfinite(d_g[i]) && std::isfinite(d_v[i])) << i;
  }
  EXPECT_EQ(h[0], -0.0f);
  EXPECT_FLOAT_EQ(h[1], 1e4f);
  EXPECT_FLOAT_EQ(d_g[3], 2.0f);  // silu'(x) → 1 for large x
}

// ---- score functions ---------------------------------------------------------------------------

TEST(ScoreGrad, MatchesFiniteDifferencesForEachScoreFunc) {
  const int N = 3, E = 6;
  Vec logits = random_normal(N * E, 41, 2.0);
  logits[1] = -30.0;  // deep in sqrtsoftplus's exponential tail and sigmoid's saturation
  logits[8] = 25.0;
  const Vec r = random_normal(N * E, 42), prior = random_normal(N * E, 43);
  Vec scores(N * E);
  for (ScoreFunc f : {ScoreFunc::kSqrtSoftplus, ScoreFunc::kSigmoid, ScoreFunc::kSoftmax}) {
    auto loss = [&] {
      score_forward(scores.data(), logits.data(), N, E, f);
      return dot(scores, r);
    };
    Vec d_logits = prior;
    loss();
    score_backward(d_logits.data(), r.data(), logits.data(), scores.data(), N, E, f);
    expect_grad_near(d_logits, prior, numeric_grad(logits, loss), score_func_name(f));
  }
}

// ---- route weights -----------------------------------------------------------------------------

TEST(RouteWeightsGrad, MatchesFiniteDifferences) {
  const int N = 3, E = 6, K = 3;
  const float route_scale = 1.5f;
  Vec scores = random_uniform(N * E, 51, 0.05, 1.0);
  const int32_t expert_idx[N * K] = {4, 0, 2, 1, 5, 3, 2, 3, 0};
  const Vec r = random_normal(N * K, 52);
  Vec weights(N * K);
  auto loss = [&] {
    route_weights_forward(weights.data(), scores.data(), expert_idx, N, E, K, route_scale);
    return dot(weights, r);
  };
  const Vec prior = random_normal(N * E, 53);
  Vec d_scores = prior;
  route_weights_backward(d_scores.data(), r.data(), scores.data(), expert_idx, N, E, K,
                         route_scale);
  // Unselected experts have numeric gradient 0: their prior must come back unchanged.
  expect_grad_near(d_scores, prior, numeric_grad(scores, loss), "d_scores");
}

// ---- float vs double --------------------------------------------------------------------------

// Every forward in float against the same forward in double, on the same double-drawn inputs.
TEST(FloatForward, AgreesWithDouble) {
  const int N = 6, D = 128, O = 33, E = 16, K = 3;
  const int64_t n = 200;
  const Vec in = random_normal(N * D, 11, 3.0), weight = random_normal(D * O, 12, 0.2);
  const Vec gain = random_normal(D, 13), logits = random_normal(N * E, 14, 3.0);
  const Vec scores = random_uniform(N * E, 15, 0.01, 2.0);
  std::vector<int32_t> expert_idx(N * K);
  route_round_robin(expert_idx.data(), 0, N, E, K);
  expect_float_agrees(
      [&]<class T>(T) {
        std::vector<T> out(N * O);
        linear_forward(out.data(), as<T>(in).data(), as<T>(weight).data(), N, D, O);
        return out;
      },
      "linear");
  expect_float_agrees(
      [&]<class T>(T) {
        std::vector<T> out(N * D + N);  // out, then rstd
        rmsnorm_forward(out.data(), out.data() + N * D, as<T>(in).data(), as<T>(gain).data(), N, D,
                        1e-6f);
        return out;
      },
      "rmsnorm out|rstd");
  for (float limit : {0.0f, 1.5f}) {
    Vec g, v;
    swiglu_inputs(g, v, n, limit);
    expect_float_agrees(
        [&]<class T>(T) {
          std::vector<T> h(n);
          swiglu_forward(h.data(), as<T>(g).data(), as<T>(v).data(), n, limit);
          return h;
        },
        limit > 0 ? "swiglu clamped" : "swiglu");
  }
  for (ScoreFunc f : {ScoreFunc::kSqrtSoftplus, ScoreFunc::kSigmoid, ScoreFunc::kSoftmax}) {
    expect_float_agrees(
        [&]<class T>(T) {
          std::vector<T> out(N * E);
          score_forward(out.data(), as<T>(logits).data(), N, E, f);
          return out;
        },
        score_func_name(f));
  }
  expect_float_agrees(
      [&]<class T>(T) {
        std::vector<T> w(N * K);
        route_weights_forward(w.data(), as<T>(scores).data(), expert_idx.data(), N, E, K, 1.5f);
        return w;
      },
      "route weights");
}

// ---- gemm --------------------------------------------------------------------------------------

template <class T> void check_gemm_against_naive(int M, int N, int K, double tol) {
  const double alpha = 0.7, beta = 0.3;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      const Vec a = random_normal(size_t(M) * K, 61), b = random_normal(size_t(K) * N, 62);
      const Vec c0 = random_normal(size_t(M) * N, 63);
      std::vector<T> c = as<T>(c0);
      gemm<T>(trans_a, trans_b, M, N, K, T(alpha), as<T>(a).data(), as<T>(b).data(), T(beta),
              c.data());
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          double acc = 0.0;
          for (int k = 0; k < K; ++k) {
            const double a_ik = trans_a ? a[size_t(k) * M + i] : a[size_t(i) * K + k];
            const double b_kj = trans_b ? b[size_t(j) * K + k] : b[size_t(k) * N + j];
            acc += double(T(a_ik)) * double(T(b_kj));
          }
          const double want = alpha * acc + beta * double(T(c0[size_t(i) * N + j]));
          EXPECT_NEAR(c[size_t(i) * N + j], want, tol * std::max(1.0, std::abs(want)))
              << "trans_a=" << trans_a << " trans_b=" << trans_b << " at (" << i << "," << j << ")";
        }
      }
    }
  }
}

// Tolerances relative to max(1, |C|): K ≤ 41 products of O(1) numbers.
TEST(Gemm, TransposesMatchNaiveLoop) {
  check_gemm_against_naive<double>(7, 5, 3, 1e-13);
  check_gemm_against_naive<double>(37, 29, 41, 1e-12);
  check_gemm_against_naive<float>(7, 5, 3, 1e-6);
  check_gemm_against_naive<float>(37, 29, 41, 1e-5);
}

TEST(Gemm, EmptyDimensions) {
  // M == 0 or N == 0: nothing to do, not even a pointer check.
  EXPECT_NO_THROW(gemm<double>(false, false, 0, 5, 3, 1.0, nullptr, nullptr, 0.0, nullptr));
  EXPECT_NO_THROW(gemm<double>(false, false, 5, 0, 3, 1.0, nullptr, nullptr, 0.0, nullptr));
  // K == 0: C = beta·C.
  std::vector<float> c = {1.0f, -2.0f, 4.0f, 8.0f};
  gemm<float>(false, false, 2, 2, 0, 1.0f, nullptr, nullptr, 0.5f, c.data());
  EXPECT_EQ(c, (std::vector<float>{0.5f, -1.0f, 2.0f, 4.0f}));
  // beta == 0 clears C, NaN included.
  c = {std::numeric_limits<float>::quiet_NaN(), 1.0f, 2.0f, 3.0f};
  gemm<float>(true, true, 2, 2, 0, 1.0f, nullptr, nullptr, 0.0f, c.data());
  EXPECT_EQ(c, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));
}

// The message names the routine, the shapes and the caller's file.
void expect_blas_error(const std::function<void()>& call, const std::string& routine,
                       const std::string& shape) {
  try {
    call();
    ADD_FAILURE() << "no BlasError for " << shape;
  } catch (const BlasError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(routine), std::string::npos) << what;
    EXPECT_NE(what.find(shape), std::string::npos) << what;
    EXPECT_NE(what.find("test_ops.cpp:"), std::string::npos) << what;
  }
}

TEST(Gemm, RefusesBadArguments) {
  float cf[4] = {0};
  double cd[4] = {0};
  expect_blas_error([&] { gemm<float>(false, false, -1, 2, 2, 1.0f, cf, cf, 0.0f, cf); }, "sgemm",
                    "M=-1 N=2 K=2");
  expect_blas_error([&] { gemm<double>(false, true, 2, -3, -1, 1.0, cd, cd, 0.0, cd); }, "dgemm",
                    "M=2 N=-3 K=-1");
  expect_blas_error([&] { gemm<float>(false, false, 2, 2, 2, 1.0f, nullptr, cf, 0.0f, cf); },
                    "sgemm", "M=2 N=2 K=2");
  expect_blas_error([&] { gemm<float>(false, false, 2, 2, 2, 1.0f, cf, cf, 0.0f, nullptr); },
                    "sgemm", "M=2 N=2 K=2");
  // 65536² elements do not fit in an int.
  expect_blas_error([&] { gemm<float>(false, false, 65536, 65536, 1, 1.0f, cf, cf, 0.0f, cf); },
                    "sgemm", "M=65536");
}

TEST(Blas, ThreadsAndInfo) {
  EXPECT_THROW(blas_set_threads(0), BlasError);
  const std::string info = blas_info();
  EXPECT_NE(info.find("fixed-order FMA"), std::string::npos) << info;
  EXPECT_NE(info.find(gemm_level_name(gemm_level())), std::string::npos) << info;
}

// A rank updates its share of the replicated parameters (adamw_update_range) and the shares are
// then gathered: any split gives the bits of one update of the whole arena, across tensors with
// and without weight decay.
TEST(AdamW, UpdatingSharesGivesTheBitsOfOneWholeUpdate) {
  ParamLayout layout;
  layout.add("a", 1000, ParamInit::kNormal, 0.02f);
  layout.add("norm", 300, ParamInit::kOnes, 0.0f, false);
  layout.add("b", 777, ParamInit::kNormal, 0.02f);
  const size_t n = layout.num_elements;
  std::vector<float> params(n), grads(n);
  param_init(std::span<float>(params), layout, 3);
  param_init(std::span<float>(grads), layout, 4);
  const AdamWConfig cfg;
  std::vector<float> whole = params;
  AdamWState whole_state;
  adamw_state_init(whole_state, n);
  for (int step = 1; step <= 3; ++step) {
    adamw_update(whole, grads, whole_state, layout, cfg, 1e-2f, 0.7f, step);
  }
  for (const std::vector<size_t>& cuts :
       {std::vector<size_t>{0, n}, {0, 999, 1000, 1301, n}, {0, 17, 1500, n}}) {
    std::vector<float> shared = params;
    AdamWState state;
    adamw_state_init(state, n);
    for (int step = 1; step <= 3; ++step) {
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        adamw_update_range(shared, grads, state, layout, cfg, 1e-2f, 0.7f, step, cuts[k],
                           cuts[k + 1]);
      }
    }
    EXPECT_EQ(std::memcmp(shared.data(), whole.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(state.m.data(), whole_state.m.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(state.v.data(), whole_state.v.data(), n * sizeof(float)), 0);
  }
  EXPECT_THROW(adamw_update_range(whole, grads, whole_state, layout, cfg, 1e-2f, 1.0f, 1, 5, n + 1),
               std::invalid_argument);
}

// The norm's chunks, summed in order from 0, are sum_squares, bit for bit (the trainer adds
// chunks that different ranks computed); and sum_squares itself keeps the bits it had when the
// norm was one call on every rank (the values below, computed then).
TEST(SumSquares, ChunksAddedInOrderAreTheWholeSum) {
  const std::vector<std::pair<size_t, uint64_t>> golden = {
      {5, 0x3df6f5175811f514ull},
      {size_t{1} << 16, 0x433348ef7c5ffed2ull},
      {(size_t{1} << 18) + 3, 0x43534b2dd84b68c1ull},
      {5000000, 0x439700e9eee6c4baull}};
  for (const auto& [n, bits] : golden) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i)
      x[i] = std::ldexp(1.0f + float(i % 97) / 97.0f, int(i % 41) - 20);
    const SumSquaresChunks chunks = sum_squares_chunks(n);
    double total = 0.0;
    for (size_t c = 0; c < chunks.count; ++c) {
      total += sum_squares_chunk(std::span<const float>(x), chunks, c);
    }
    const double whole = sum_squares(std::span<const float>(x));
    EXPECT_EQ(std::bit_cast<uint64_t>(whole), bits) << "n = " << n;
    EXPECT_EQ(std::bit_cast<uint64_t>(total), bits) << "n = " << n;
  }
  EXPECT_EQ(sum_squares_chunks(0).count, 0u);
}

}  // namespace
}  // namespace moe
