// Routing math against hand-computed values: score functions at ordinary and extreme points,
// top-k order and ties, bias, combine weights, hash lookup, forced round-robin and the hash tables,
// grouped (node-limited) top-k, random routing and its skew, and the --force-balance names.
// Legend: N rows/tokens, D model width, E experts, K top-k, V vocab.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/router.hpp"
#include "model/simd.hpp"

namespace moe {
namespace {

using Idx = std::vector<int32_t>;

// Throws Exception whose message contains every one of `parts`.
template <class Exception, class Fn>
void expect_throw_naming(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "nothing thrown";
  } catch (const Exception& e) {
    const std::string what = e.what();
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << what;
  }
}

// ---- logits ------------------------------------------------------------------------------------

TEST(RouterLogits, MatchHandValuesAndIgnoreBatching) {
  const int N = 3, D = 2, E = 2;
  const float in[N * D] = {1, 2, -1, 0.5f, 0, 3};
  const float w_gate[D * E] = {0.5f, -1, 0.25f, 2};
  float logits[N * E];
  router_logits_forward(logits, in, w_gate, N, D, E);
  const float want[N * E] = {1.0f, 3.0f, -0.375f, 2.0f, 0.75f, 6.0f};
  for (int i = 0; i < N * E; ++i) EXPECT_EQ(logits[i], want[i]) << i;

  // A row's logits are bitwise the same whether it is routed alone or within a batch.
  const int N2 = 17, D2 = 128, E2 = 8;
  std::vector<float> x(N2 * D2), w(D2 * E2), batch(N2 * E2), alone(E2);
  for (int i = 0; i < N2 * D2; ++i) x[i] = std::sin(0.37f * i);
  for (int i = 0; i < D2 * E2; ++i) w[i] = std::cos(0.11f * i) * 0.1f;
  router_logits_forward(batch.data(), x.data(), w.data(), N2, D2, E2);
  for (int n = 0; n < N2; ++n) {
    router_logits_forward(alone.data(), x.data() + n * D2, w.data(), 1, D2, E2);
    for (int e = 0; e < E2; ++e) EXPECT_EQ(alone[e], batch[n * E2 + e]) << n << "," << e;
  }
}

// ---- score functions ---------------------------------------------------------------------------

TEST(ScoreForward, SqrtSoftplusValues) {
  const double x[5] = {0.0, 1.0, -100.0, 100.0, -1000.0};
  double s[5];
  score_forward(s, x, 1, 5, ScoreFunc::kSqrtSoftplus);
  EXPECT_DOUBLE_EQ(s[0], std::sqrt(std::log(2.0)));                  // 0.8325546111576977
  EXPECT_DOUBLE_EQ(s[1], std::sqrt(std::log(1.0 + std::exp(1.0))));  // 1.1409...
  EXPECT_NEAR(s[2], std::exp(-50.0), 1e-12 * std::exp(-50.0));       // sqrt(e^-100), not 0
  EXPECT_DOUBLE_EQ(s[3], 10.0);
  EXPECT_EQ(s[4], 0.0);  // softplus underflows to exactly 0 in double

  // Gradient σ(x)/(2s): finite everywhere, e^-50/2 at -100, 1/20 at 100, 0 once s is 0.
  const double d_s[5] = {1, 1, 1, 1, 1};
  double d_x[5] = {0, 0, 0, 0, 0};
  score_backward(d_x, d_s, x, s, 1, 5, ScoreFunc::kSqrtSoftplus);
  EXPECT_DOUBLE_EQ(d_x[0], 0.5 / (2.0 * std::sqrt(std::log(2.0))));
  EXPECT_NEAR(d_x[2], 0.5 * std::exp(-50.0), 1e-12 * std::exp(-50.0));
  EXPECT_DOUBLE_EQ(d_x[3], 0.05);
  EXPECT_EQ(d_x[4], 0.0);

  // Float: finite and non-negative at the extremes too.
  const float xf[4] = {-100.0f, 100.0f, -1000.0f, 1000.0f};
  float sf[4], dsf[4] = {1, 1, 1, 1}, dxf[4] = {0, 0, 0, 0};
  score_forward(sf, xf, 1, 4, ScoreFunc::kSqrtSoftplus);
  score_backward(dxf, dsf, xf, sf, 1, 4, ScoreFunc::kSqrtSoftplus);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(sf[i]) && sf[i] >= 0.0f && std::isfinite(dxf[i])) << xf[i];
  }
  EXPECT_FLOAT_EQ(sf[1], 10.0f);
  EXPECT_FLOAT_EQ(sf[3], std::sqrt(1000.0f));
}

TEST(ScoreForward, SigmoidValues) {
  const double x[4] = {0.0, 2.0, -100.0, 100.0};
  double s[4];
  score_forward(s, x, 1, 4, ScoreFunc::kSigmoid);
  EXPECT_EQ(s[0], 0.5);
  EXPECT_DOUBLE_EQ(s[1], 0.8807970779778823);
  EXPECT_NEAR(s[2], 3.720075976020836e-44, 1e-12 * 3.720075976020836e-44);  // not 0
  EXPECT_EQ(s[3], 1.0);
  const float xf[2] = {-1000.0f, 1000.0f};
  float sf[2];
  score_forward(sf, xf, 1, 2, ScoreFunc::kSigmoid);
  EXPECT_EQ(sf[0], 0.0f);
  EXPECT_EQ(sf[1], 1.0f);
}

TEST(ScoreForward, SoftmaxValues) {
  const double x[6] = {1.0, 2.0, 3.0, -100.0, 0.0, 100.0};
  double s[6];
  score_forward(s, x, 2, 3, ScoreFunc::kSoftmax);
  EXPECT_DOUBLE_EQ(s[0], 0.09003057317038046);
  EXPECT_DOUBLE_EQ(s[1], 0.24472847105479764);
  EXPECT_DOUBLE_EQ(s[2], 0.6652409557748219);
  EXPECT_NEAR(s[3], std::exp(-200.0), 1e-12 * std::exp(-200.0));
  EXPECT_NEAR(s[4], std::exp(-100.0), 1e-12 * std::exp(-100.0));
  EXPECT_DOUBLE_EQ(s[5], 1.0);
  // Float logits of ±1000 would overflow exp without the max subtraction.
  const float xf[3] = {1000.0f, 1000.0f, -1000.0f};
  float sf[3];
  score_forward(sf, xf, 1, 3, ScoreFunc::kSoftmax);
  EXPECT_EQ(sf[0], 0.5f);
  EXPECT_EQ(sf[1], 0.5f);
  EXPECT_EQ(sf[2], 0.0f);
}

// ---- top-k -------------------------------------------------------------------------------------

TEST(RouteTopk, DescendingWithLowerIndexWinningTies) {
  const double scores[2 * 5] = {0.5, 0.9, 0.5, 0.9, 0.1,   // ties at 0.9 and at 0.5
                                0.3, 0.3, 0.3, 0.3, 0.3};  // all equal
  Idx idx(2 * 3);
  route_topk(idx.data(), scores, nullptr, 2, 5, 3);
  EXPECT_EQ(idx, (Idx{1, 3, 0, 0, 1, 2}));
}

TEST(RouteTopk, BiasChangesTheSelectionButNotTheScores) {
  const float scores[5] = {0.5f, 0.9f, 0.5f, 0.9f, 0.1f};
  const float bias[5] = {0.0f, 0.0f, 0.0f, -0.5f, 1.0f};  // biased: 0.5 0.9 0.5 0.4 1.1
  Idx idx(3);
  route_topk(idx.data(), scores, bias, 1, 5, 3);
  EXPECT_EQ(idx, (Idx{4, 1, 0}));
  // A bias that creates an exact tie (0.5 + 0.25 == 0.75): the lower expert index wins again.
  const double scores_d[3] = {0.5, 0.75, 0.25};
  const float bias_tie[3] = {0.25f, 0.0f, 0.0f};
  Idx idx2(2);
  route_topk(idx2.data(), scores_d, bias_tie, 1, 3, 2);
  EXPECT_EQ(idx2, (Idx{0, 1}));
  // Without the bias expert 1 leads.
  route_topk(idx2.data(), scores_d, nullptr, 1, 3, 2);
  EXPECT_EQ(idx2, (Idx{1, 0}));
}

// A NaN ranks after every number, NaNs by index: valid, deterministic experts for a diverged row.
TEST(RouteTopk, NaNRanksLastAndBadKIsRejected) {
  const double scores[3] = {0.1, std::nan(""), 0.3};
  Idx idx(2);
  route_topk(idx.data(), scores, nullptr, 1, 3, 2);
  EXPECT_EQ(idx, (Idx{2, 0}));
  const double nans[3] = {std::nan(""), 0.5, std::nan("")};
  Idx idx3(3);
  route_topk(idx3.data(), nans, nullptr, 1, 3, 3);
  EXPECT_EQ(idx3, (Idx{1, 0, 2}));
  EXPECT_THROW(route_topk(idx.data(), scores, nullptr, 1, 3, 4), std::invalid_argument);
}

// The total order written as a sort: larger values first, equal ones (+0 and -0 too) by index,
// NaNs after every number, among themselves by index.
template <class T> Idx sorted_by_rank(const std::vector<T>& v) {
  Idx order(v.size());
  for (size_t i = 0; i < v.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const bool nan_a = std::isnan(v[a]), nan_b = std::isnan(v[b]);
    if (nan_a || nan_b) return nan_a == nan_b ? a < b : nan_b;
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  return order;
}

// Random rows drawn from a few values (ties everywhere), signed zeros, the largest finite values
// (whose sums overflow) and a subnormal, and with `non_finite` infinities and NaNs.
template <class T> std::vector<T> tied_values(std::mt19937& rng, size_t n, bool non_finite) {
  const T pool[] = {T(0.5),
                    T(0.25),
                    T(0.125),
                    T(0),
                    T(-0.0),
                    T(-0.25),
                    T(1),
                    std::numeric_limits<T>::max(),
                    -std::numeric_limits<T>::max(),
                    std::numeric_limits<T>::denorm_min()};
  // NaNs of both signs: x86's arithmetic makes the negative one.
  const T odd[] = {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                   std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()};
  std::vector<T> v(n);
  for (T& x : v) {
    x = pool[rng() % std::size(pool)];
    if (non_finite && rng() % 8 == 0) x = odd[rng() % std::size(odd)];
  }
  return v;
}

template <class T> void expect_topk_is_the_sort(uint32_t seed) {
  std::mt19937 rng(seed);
  // Up to 64 experts top-k goes by ranks, above by insertion; rows that are not whole vectors.
  for (int E : {1, 5, 8, 17, 63, 64, 65, 100}) {
    std::vector<int> ks;
    for (int K = 0; K <= std::min(E, 9); ++K) ks.push_back(K);
    for (int K : {E / 2, E - 1, E}) {
      if (K > 9) ks.push_back(K);
    }
    for (int K : ks) {
      for (int trial = 0; trial < 20; ++trial) {
        const std::vector<T> row = tied_values<T>(rng, E, trial % 2 == 1);
        std::vector<float> bias(E);
        for (float& b : bias) b = 0.125f * static_cast<float>(static_cast<int>(rng() % 5) - 2);
        const bool biased = trial % 4 >= 2;
        std::vector<T> value(row);
        for (int e = 0; e < E; ++e) value[e] = biased ? row[e] + T(bias[e]) : row[e];
        const Idx order = sorted_by_rank(value);
        Idx got(K);
        route_topk(got.data(), row.data(), biased ? bias.data() : nullptr, 1, E, K);
        ASSERT_EQ(got, Idx(order.begin(), order.begin() + K)) << "E=" << E << " K=" << K;
      }
    }
  }
}

// Every K of rows full of ties, signed zeros, infinities and NaNs, with and without a bias: the
// first K of the total order, at every instruction-set level this CPU has (float rows rank at
// the level, model/simd.hpp).
TEST(RouteTopk, IsTheFirstKOfTheTotalOrder) {
  struct LevelReset {
    ~LevelReset() { simd_level_reset(); }
  } reset;
  for (SimdLevel level : {SimdLevel::kSse2, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!simd_level_supported(level)) continue;
    simd_level_force(level);
    SCOPED_TRACE(simd_level_name(level));
    expect_topk_is_the_sort<float>(11);
    expect_topk_is_the_sort<double>(12);
  }
}

// ---- route weights -----------------------------------------------------------------------------

TEST(RouteWeights, HandExample) {
  const double scores[4] = {0.1, 0.2, 0.3, 0.4};
  const int32_t sel[2] = {3, 1};
  double w[2];
  route_weights_forward(w, scores, sel, 1, 4, 2, 1.5f);
  EXPECT_DOUBLE_EQ(w[0], 1.0);  // 0.4 / 0.6 · 1.5
  EXPECT_DOUBLE_EQ(w[1], 0.5);  // 0.2 / 0.6 · 1.5

  // d_w = (1, 0): d_s3 += 1.5·(1/0.6 − 0.4/0.36), d_s1 += 1.5·(−0.4/0.36), others untouched.
  const double d_w[2] = {1.0, 0.0};
  double d_s[4] = {7, 7, 7, 7};
  route_weights_backward(d_s, d_w, scores, sel, 1, 4, 2, 1.5f);
  EXPECT_EQ(d_s[0], 7.0);
  EXPECT_NEAR(d_s[1] - 7.0, -1.5 * 0.4 / 0.36, 1e-12);
  EXPECT_EQ(d_s[2], 7.0);
  EXPECT_NEAR(d_s[3] - 7.0, 1.5 * (1.0 / 0.6 - 0.4 / 0.36), 1e-12);
}

TEST(RouteWeights, AllZeroScoresGiveZeroNotNaN) {
  const float scores[3] = {0.0f, 0.0f, 0.0f};
  const int32_t sel[2] = {0, 2};
  float w[2];
  route_weights_forward(w, scores, sel, 1, 3, 2, 1.5f);
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_EQ(w[1], 0.0f);
}

// ---- hash and round-robin ----------------------------------------------------------------------

TEST(RouteHash, LooksUpTheTokenRow) {
  const int V = 4, K = 2;
  const int32_t table[V * K] = {0, 1, 2, 3, 3, 0, 1, 2};
  const int32_t tokens[3] = {2, 0, 3};
  Idx idx(3 * K);
  route_hash(idx.data(), tokens, table, 3, K, V);
  EXPECT_EQ(idx, (Idx{3, 0, 0, 1, 1, 2}));
  const int32_t bad[2] = {1, 4};
  expect_throw_naming<std::out_of_range>([&] { route_hash(idx.data(), bad, table, 2, K, V); },
                                         {"token id 4", "V=4"});
  const int32_t negative[1] = {-1};
  expect_throw_naming<std::out_of_range>([&] { route_hash(idx.data(), negative, table, 1, K, V); },
                                         {"token id -1"});
}

TEST(RouteRoundRobin, ExactIdsForSmallCase) {
  Idx idx(3 * 3);
  route_round_robin(idx.data(), 5, 3, 4, 3);  // slots 15..23 mod 4
  EXPECT_EQ(idx, (Idx{3, 0, 1, 2, 3, 0, 1, 2, 3}));
}

TEST(RouteRoundRobin, ExactlyBalancedOverAStepSplitAcrossRanks) {
  // T = 4 ranks · 6 tokens = 24, K = 3, E = 8: T·K = 72 = 9·8, so every expert gets exactly 9.
  const int ranks = 4, N = 6, K = 3, E = 8;
  std::vector<int> count(E, 0);
  for (int r = 0; r < ranks; ++r) {
    Idx idx(N * K);
    route_round_robin(idx.data(), int64_t{r} * N, N, E, K);
    for (int32_t e : idx) ++count[e];
  }
  for (int e = 0; e < E; ++e) EXPECT_EQ(count[e], ranks * N * K / E) << "expert " << e;
  // Within a token the K experts are distinct whenever K <= E.
  Idx idx(N * K);
  route_round_robin(idx.data(), 1'000'000'007LL, N, E, K);  // large offset: int64 arithmetic
  for (int n = 0; n < N; ++n) {
    EXPECT_NE(idx[n * K], idx[n * K + 1]);
    EXPECT_NE(idx[n * K + 1], idx[n * K + 2]);
    EXPECT_NE(idx[n * K], idx[n * K + 2]);
  }
  EXPECT_EQ(idx[0], static_cast<int32_t>((1'000'000'007LL * K) % E));
}

// ---- hash tables -------------------------------------------------------------------------------

TEST(HashTable, RowsHoldKDistinctExpertsAndAreUniform) {
  const int V = 2048, E = 8, K = 3;
  Idx table(V * K);
  hash_table_init(table.data(), V, E, K, 1234, 0);
  EXPECT_NO_THROW(hash_table_validate(table.data(), V, E, K));
  // Uniform over rows (token ids), whatever the token frequencies: each expert appears about
  // V·K/E = 768 times; the standard deviation is about 22, the bound ±10% is over 3 sigma.
  std::vector<int> count(E, 0);
  for (int32_t e : table) ++count[e];
  for (int e = 0; e < E; ++e) EXPECT_NEAR(count[e], V * K / E, V * K / E / 10) << "expert " << e;
}

TEST(HashTable, DeterministicAndDifferentPerLayerAndSeed) {
  const int V = 512, E = 16, K = 4;
  Idx a(V * K), b(V * K), other_layer(V * K), other_seed(V * K);
  hash_table_init(a.data(), V, E, K, 7, 1);
  hash_table_init(b.data(), V, E, K, 7, 1);
  hash_table_init(other_layer.data(), V, E, K, 7, 2);
  hash_table_init(other_seed.data(), V, E, K, 8, 1);
  EXPECT_EQ(a, b);
  int rows_differing_layer = 0, rows_differing_seed = 0;
  for (int v = 0; v < V; ++v) {
    rows_differing_layer += !std::equal(&a[v * K], &a[v * K] + K, &other_layer[v * K]);
    rows_differing_seed += !std::equal(&a[v * K], &a[v * K] + K, &other_seed[v * K]);
  }
  // Two random ordered K-subsets of 16 agree with probability 1/(16·15·14·13) per row.
  EXPECT_GT(rows_differing_layer, V * 9 / 10);
  EXPECT_GT(rows_differing_seed, V * 9 / 10);
  // A row is a function of (seed, layer, row) alone: a smaller table is a prefix.
  Idx prefix(100 * K);
  hash_table_init(prefix.data(), 100, E, K, 7, 1);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), a.begin()));
  // K = E: every row is a permutation.
  Idx full(V * E);
  hash_table_init(full.data(), V, E, E, 7, 1);
  EXPECT_NO_THROW(hash_table_validate(full.data(), V, E, E));
  EXPECT_THROW(hash_table_init(full.data(), V, E, E + 1, 7, 1), std::invalid_argument);
}

TEST(HashTable, ValidateNamesTheBadRow) {
  const int V = 3, E = 4, K = 2;
  Idx table = {0, 1, 2, 3, 1, 0};
  EXPECT_NO_THROW(hash_table_validate(table.data(), V, E, K));
  table[3] = 4;
  expect_throw_naming<std::invalid_argument>([&] { hash_table_validate(table.data(), V, E, K); },
                                             {"row 1", "expert 4"});
  table[3] = 3;
  table[5] = -1;
  expect_throw_naming<std::invalid_argument>([&] { hash_table_validate(table.data(), V, E, K); },
                                             {"row 2", "expert -1"});
  table[5] = 1;
  expect_throw_naming<std::invalid_argument>([&] { hash_table_validate(table.data(), V, E, K); },
                                             {"row 2", "twice"});
}

// ---- grouped, random and forced routing --------------------------------------------------------

TEST(GroupedTopK, OnlyExpertsOfTheBestGroupsAreSelected) {
  // E = 6 in G = 3 groups {0,1}, {2,3}, {4,5}; K = 2, M = 1 group, top K/M = 2 per group score.
  // Group sums: (0.9 + 0.1), (0.6 + 0.6), (0.95 + 0.0): group 1 wins although expert 4 is best.
  const std::vector<double> s = {0.9, 0.1, 0.6, 0.6, 0.95, 0.0};
  std::vector<int32_t> idx(2);
  route_topk_grouped(idx.data(), s.data(), nullptr, 1, 6, 2, 3, 1);
  EXPECT_EQ(idx, (std::vector<int32_t>{2, 3}));
  // With M = 2 groups of top-1 each: groups 2 (0.95) and 0 (0.9) -> experts 4, 0.
  route_topk_grouped(idx.data(), s.data(), nullptr, 1, 6, 2, 3, 2);
  EXPECT_EQ(idx, (std::vector<int32_t>{4, 0}));
  // A bias moves the choice of groups.
  const std::vector<float> bias = {0, 0, 0, 0, 0, 1.0f};
  route_topk_grouped(idx.data(), s.data(), bias.data(), 1, 6, 2, 3, 1);
  EXPECT_EQ(idx, (std::vector<int32_t>{5, 4}));
  EXPECT_THROW(route_topk_grouped(idx.data(), s.data(), nullptr, 1, 6, 2, 4, 1),
               std::invalid_argument);
}

// Grouped top-k against its definition on rows full of ties: a group's score is the sum of its
// best K/M (from +0, best first), the best M groups by that score in the total order, then the
// best K of those groups' experts. Rows with infinities or NaNs route to K distinct experts, the
// same alone as among other rows.
template <class T>
void expect_grouped_is_its_definition(int E, int G, int M, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  const int per_group = E / G, top_in_group = K / M, N = 200;
  std::vector<T> rows;
  std::vector<bool> finite_row(N);
  for (int t = 0; t < N; ++t) {
    finite_row[t] = t % 4 != 3;
    const std::vector<T> row = tied_values<T>(rng, E, !finite_row[t]);
    rows.insert(rows.end(), row.begin(), row.end());
  }
  for (bool with_bias : {false, true}) {
    std::vector<float> bias(E, 0.0f);
    for (float& b : bias) b = with_bias ? 0.125f * static_cast<float>(rng() % 5) : 0.0f;
    const float* b = with_bias ? bias.data() : nullptr;
    Idx got(static_cast<size_t>(N) * K);
    route_topk_grouped(got.data(), rows.data(), b, N, E, K, G, M);
    for (int t = 0; t < N; ++t) {
      const Idx mine(got.begin() + t * K, got.begin() + (t + 1) * K);
      Idx alone(K);
      route_topk_grouped(alone.data(), &rows[static_cast<size_t>(t) * E], b, 1, E, K, G, M);
      ASSERT_EQ(mine, alone) << "row " << t;
      if (!finite_row[t]) {
        Idx distinct(mine);
        std::sort(distinct.begin(), distinct.end());
        ASSERT_TRUE(std::adjacent_find(distinct.begin(), distinct.end()) == distinct.end())
            << "row " << t;
        ASSERT_TRUE(distinct.front() >= 0 && distinct.back() < E) << "row " << t;
        continue;
      }
      std::vector<T> value(E);
      for (int e = 0; e < E; ++e) value[e] = rows[static_cast<size_t>(t) * E + e] + T(bias[e]);
      std::vector<T> group_score(G, T(0));
      for (int g = 0; g < G; ++g) {
        const std::vector<T> in_group(value.begin() + g * per_group,
                                      value.begin() + (g + 1) * per_group);
        const Idx order = sorted_by_rank(in_group);
        for (int j = 0; j < top_in_group; ++j) group_score[g] += in_group[order[j]];
      }
      const Idx groups = sorted_by_rank(group_score);
      std::vector<T> kept_value(value);
      for (int j = M; j < G; ++j) {
        for (int e = 0; e < per_group; ++e) {
          kept_value[groups[j] * per_group + e] = -std::numeric_limits<T>::infinity();
        }
      }
      const Idx order = sorted_by_rank(kept_value);
      ASSERT_EQ(mine, Idx(order.begin(), order.begin() + K))
          << "row " << t << " E=" << E << " G=" << G << " M=" << M << " K=" << K;
    }
  }
}

TEST(GroupedTopK, IsItsDefinitionOnRowsOfTies) {
  expect_grouped_is_its_definition<float>(64, 8, 4, 8, 21);  // deepseek4-fine
  expect_grouped_is_its_definition<double>(64, 8, 4, 8, 22);
  expect_grouped_is_its_definition<float>(12, 4, 2, 4, 23);
  expect_grouped_is_its_definition<float>(6, 3, 3, 3, 24);
  expect_grouped_is_its_definition<float>(8, 4, 2, 4, 25);  // the kept groups' experts are K
}

std::vector<int64_t> random_loads(const RandomRouting& skew, int N, int E, int K) {
  std::vector<int32_t> idx(static_cast<size_t>(N) * K);
  route_random(idx.data(), 77, 0, N, E, K, skew);
  std::vector<int64_t> load(E, 0);
  for (int t = 0; t < N; ++t) {
    for (int j = 0; j < K; ++j) {
      for (int i = 0; i < j; ++i) EXPECT_NE(idx[t * K + i], idx[t * K + j]) << "token " << t;
      ++load[idx[t * K + j]];
    }
  }
  return load;
}

TEST(RandomRouting, DistinctDeterministicAndIndependentOfTheSplit) {
  const int N = 40, E = 8, K = 3;
  std::vector<int32_t> whole(N * K), halves(N * K);
  route_random(whole.data(), 5, 100, N, E, K, {});
  route_random(halves.data(), 5, 100, N / 2, E, K, {});
  route_random(halves.data() + N / 2 * K, 5, 100 + N / 2, N / 2, E, K, {});
  EXPECT_EQ(whole, halves);
  const std::vector<int64_t> load = random_loads({}, 20000, E, K);
  for (int64_t c : load) EXPECT_NEAR(c, 20000.0 * K / E, 20000.0 * K / E * 0.05);
}

TEST(RandomRouting, SkewIsControlled) {
  const int N = 20000, E = 8, K = 3;
  const std::vector<int64_t> zipf = random_loads({1.5, 0.0}, N, E, K);
  EXPECT_GT(zipf[0], zipf[E - 1] * 2);
  // hot:0.5 -> expert 0 is first for half the tokens, and drawn uniformly for the other half:
  // expected load N·(0.5 + 0.5·K/E).
  const std::vector<int64_t> hot = random_loads({0.0, 0.5}, N, E, K);
  EXPECT_NEAR(hot[0], N * (0.5 + 0.5 * K / E), N * 0.02);
  // The tokens that lose the hot coin draw their first slot uniformly, expert 0 included, so
  // expert 0's share of first slots is h + (1 − h)/E (0.3875 at h = 0.3), not h.
  std::vector<int32_t> idx(static_cast<size_t>(N) * K);
  route_random(idx.data(), 77, 0, N, E, K, {0.0, 0.3});
  int64_t first_slot_hot = 0;
  for (int t = 0; t < N; ++t) first_slot_hot += idx[static_cast<size_t>(t) * K] == 0;
  EXPECT_NEAR(static_cast<double>(first_slot_hot) / N, 0.3 + 0.7 / E, 0.015);
}

TEST(ForcedRouting, ParsesEveryMode) {
  EXPECT_FALSE(forced_routing_from_name("none").forced);
  EXPECT_TRUE(forced_routing_from_name("round-robin").round_robin);
  const ForcedRouting r = forced_routing_from_name("random");
  EXPECT_TRUE(r.forced);
  EXPECT_FALSE(r.round_robin);
  EXPECT_EQ(forced_routing_from_name("zipf:1.2").skew.zipf_alpha, 1.2);
  EXPECT_EQ(forced_routing_from_name("hot:0.25").skew.hot_fraction, 0.25);
  EXPECT_THROW(forced_routing_from_name("hot:2"), ConfigError);
  EXPECT_THROW(forced_routing_from_name("zipf:"), ConfigError);
  EXPECT_THROW(forced_routing_from_name("balanced"), ConfigError);
}

}  // namespace
}  // namespace moe
